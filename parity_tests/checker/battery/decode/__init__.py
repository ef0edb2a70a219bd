"""The decode family's cases (``case``: a batch of sequences over a contiguous or paged cache)
and the builder of their batteries (``generate``: the covering array sized to meet every length
around a page edge, appends across a page, every head width).

Tests: tests/checker/battery/decode/
"""
