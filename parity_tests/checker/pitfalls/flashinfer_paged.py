"""Broken kernels with the "flashinfer_paged" spec's signature (a factory of FlashInfer-like
wrappers), one mistake each: ``_Wrapper`` is FlashInfer's plan/run over the plain computation of
``golden.serving_baseline.plain_paged``, correct but for its mistake.

Shape legend: T query tokens, H query heads, H_kv key/value heads, D head width, P page size.

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_serving.py
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..golden.serving_baseline import plain_paged
from . import Pitfall

SPEC = "flashinfer_paged"


class _Wrapper:
    """FlashInfer's ``plan``/``run`` with ``mistakes`` (``plain_paged``'s, and "lse_natural":
    lse in natural log; "last_page_full": every last page read as full; "hnd_as_nhd": an HND
    cache read as NHD)."""

    def __init__(self, kv_layout: str, mistakes: frozenset[str]) -> None:
        self.layout, self.mistakes = kv_layout, mistakes

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, causal=False, sm_scale=None,
             window_left=-1, logits_soft_cap=None, **_: Any) -> None:  # fmt: skip
        indptr, indices = paged_kv_indptr.tolist(), paged_kv_indices.tolist()
        last = paged_kv_last_page_len.tolist()
        self.pages = [indices[indptr[b] : indptr[b + 1]] for b in range(len(indptr) - 1)]
        full = "last_page_full" in self.mistakes
        self.kv_lens = [0 if not pages else (len(pages) - 1) * page_size +
                        (page_size if full else last[b]) for b, pages in enumerate(self.pages)]
        self.qo_indptr = qo_indptr.tolist()
        self.options = {"causal": causal, "window_left": window_left, "scale": sm_scale,
                        "softcap": logits_soft_cap or 0.0}  # fmt: skip

    def run(self, q, paged_kv_cache, *, return_lse=False, sinks=None):
        if isinstance(paged_kv_cache, torch.Tensor):
            k, v = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
        else:
            k, v = paged_kv_cache
        if self.layout == "HND":
            if "hnd_as_nhd" in self.mistakes:  # the same memory read with NHD's strides
                k, v = (t.reshape(t.shape[0], t.shape[2], t.shape[1], t.shape[3]) for t in (k, v))
            else:
                k, v = k.transpose(1, 2), v.transpose(1, 2)
        out, lse = plain_paged(q, k, v, self.qo_indptr, self.pages, self.kv_lens, sinks=sinks,
                               mistakes=self.mistakes, **self.options)  # fmt: skip
        if not return_lse:
            return out
        base = 1.0 if "lse_natural" in self.mistakes else math.log(2.0)
        return out, lse / base  # the compute dtype: float32 for half inputs


def fi_lse_natural(kv_layout):
    """lse returned in natural log where FlashInfer's is base 2 (a merge of such states weighs
    them wrongly)."""
    return _Wrapper(kv_layout, frozenset({"lse_natural"}))


def fi_last_page_full(kv_layout):
    """paged_kv_last_page_len ignored: every sequence's last page read as full."""
    return _Wrapper(kv_layout, frozenset({"last_page_full"}))


def fi_causal_top_left(kv_layout):
    """Causal aligned top-left in every sequence (query i sees keys 0..i): right for a whole
    prefill, wrong for a chunk or a decode step."""
    return _Wrapper(kv_layout, frozenset({"top_left"}))


def fi_hnd_as_nhd(kv_layout):
    """An HND cache read with NHD's strides."""
    return _Wrapper(kv_layout, frozenset({"hnd_as_nhd"}))


def fi_page_ids_16bit(kv_layout):
    """Page ids truncated to 16 bits (ROCm ATOM #702's class): pools past 65,536 pages."""
    return _Wrapper(kv_layout, frozenset({"ids16"}))


def fi_page_past_128(kv_layout):
    """Slots past 128 of a page read from slot % 128 (FlashInfer #4347, pages > 128)."""
    return _Wrapper(kv_layout, frozenset({"page128"}))


def fi_far_logits_masked(kv_layout):
    """Finite scores far below zero (< -3000) read as masked: those rows come out zero
    (FlashInfer #4450)."""
    return _Wrapper(kv_layout, frozenset({"far_masked"}))


def fi_sink_dropped(kv_layout):
    """The sinks left out of the denominator."""
    return _Wrapper(kv_layout, frozenset({"no_sink"}))


def fi_window_one_more(kv_layout):
    """window_left + 1 keys left of the query where window_left are."""
    return _Wrapper(kv_layout, frozenset({"window_plus"}))


def fi_width_64(kv_layout):
    """At D = 64 the scale of D = 128 (one head width never tested: FlashInfer #4748)."""
    return _Wrapper(kv_layout, frozenset({"scale64"}))


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
