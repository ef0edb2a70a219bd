"""Broken kernels with the "flashinfer_paged" spec's signature (a factory of FlashInfer-like
wrappers), one mistake each: ``_Wrapper`` is FlashInfer's plan/run over the plain computation of
``golden.serving_baseline.plain_paged``, correct but for its mistake.

Shape legend: T query tokens, H query heads, H_kv key/value heads, D head width, P page size.

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_serving.py
"""

from __future__ import annotations

from ..golden.serving_baseline import PlainWrapper
from . import Pitfall

SPEC = "flashinfer_paged"


def fi_lse_natural(kv_layout):
    """lse returned in natural log where FlashInfer's is base 2 (a merge of such states weighs
    them wrongly)."""
    return PlainWrapper(kv_layout, frozenset({"lse_natural"}))


def fi_last_page_full(kv_layout):
    """paged_kv_last_page_len ignored: every sequence's last page read as full."""
    return PlainWrapper(kv_layout, frozenset({"last_page_full"}))


def fi_causal_top_left(kv_layout):
    """Causal aligned top-left in every sequence (query i sees keys 0..i): right for a whole
    prefill, wrong for a chunk or a decode step."""
    return PlainWrapper(kv_layout, frozenset({"top_left"}))


def fi_hnd_as_nhd(kv_layout):
    """An HND cache read with NHD's strides."""
    return PlainWrapper(kv_layout, frozenset({"hnd_as_nhd"}))


def fi_page_ids_16bit(kv_layout):
    """Page ids truncated to 16 bits (ROCm ATOM #702's class): pools past 65,536 pages."""
    return PlainWrapper(kv_layout, frozenset({"ids16"}))


def fi_page_past_128(kv_layout):
    """Slots past 128 of a page read from slot % 128 (FlashInfer #4347, pages > 128)."""
    return PlainWrapper(kv_layout, frozenset({"page128"}))


def fi_far_logits_masked(kv_layout):
    """Finite scores far below zero (< -3000) read as masked: those rows come out zero
    (FlashInfer #4450)."""
    return PlainWrapper(kv_layout, frozenset({"far_masked"}))


def fi_sink_dropped(kv_layout):
    """The sinks left out of the denominator."""
    return PlainWrapper(kv_layout, frozenset({"no_sink"}))


def fi_window_one_more(kv_layout):
    """window_left + 1 keys left of the query where window_left are."""
    return PlainWrapper(kv_layout, frozenset({"window_plus"}))


def fi_width_64(kv_layout):
    """At D = 64 the scale of D = 128 (one head width never tested: FlashInfer #4748)."""
    return PlainWrapper(kv_layout, frozenset({"scale64"}))


_MIXED = "flashinfer-mixed-p16-h4-4-d64-causal"
_DECODE_WINDOW = "flashinfer-decode-p64-h8-2-d64-causal-window-layoutHND"
PITFALLS = {
    "fi_lse_natural": Pitfall(fi_lse_natural, _MIXED, "lse", SPEC),
    "fi_last_page_full": Pitfall(fi_last_page_full, _MIXED, "out", SPEC),
    "fi_causal_top_left": Pitfall(fi_causal_top_left, _MIXED, "out", SPEC),
    "fi_hnd_as_nhd": Pitfall(fi_hnd_as_nhd, _DECODE_WINDOW, "out", SPEC),
    "fi_page_ids_16bit": Pitfall(fi_page_ids_16bit, "flashinfer-mixed-p1-h2-2-d64-pool70000",
                                 "out", SPEC),
    "fi_page_past_128": Pitfall(fi_page_past_128, "flashinfer-decode-p144-h4-4-d64", "out", SPEC),
    "fi_far_logits_masked": Pitfall(fi_far_logits_masked, "flashinfer-prefill-p1-h4-4-d64-shifted",
                                    "out", SPEC),
    "fi_sink_dropped": Pitfall(
        fi_sink_dropped, "flashinfer-mixed-p16-h8-2-d64-softcap-sinks-outliers-layoutHND-cache5d",
        "out", SPEC),
    "fi_window_one_more": Pitfall(fi_window_one_more, _DECODE_WINDOW, "out", SPEC),
    "fi_width_64": Pitfall(fi_width_64, _MIXED, "out", SPEC),
}
