"""The attention family's cases (``case``), factors and rules (``space``), sizes (``sizes``), the
builder of their default battery (``generate``), the quick battery (``quick``), the hand-written
cases (``handwritten``), the fuzzer's draw (``fuzz``) and the kernel's limits on them (``limits``).

Tests: tests/checker/battery/attention/
"""
