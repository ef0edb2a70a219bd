"""The "flashinfer_paged" spec: FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` (and its
decode wrapper, a batch of one query per sequence): ``wrapper = kernel(kv_layout)``, then
``wrapper.plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
num_qo_heads, num_kv_heads, head_dim_qk, page_size, causal=..., window_left=...,
logits_soft_cap=..., q_data_type=..., kv_data_type=...)`` and ``wrapper.run(q,
paged_kv_cache, return_lse=..., sinks=...)`` -> out (T, H, D), or (out, lse) with lse (T, H)
float32 in base 2. The CSR arrays are int32 (``paged_kv_indices`` longer than the indptr says:
a buffer with spare entries), the cache NHD (pages, P, H_kv, D) or HND (pages, H_kv, P, D), as a
(k, v) pair or one (pages, 2, ...) tensor; the scale FlashInfer's default 1 / sqrt(D) (not
passed). ``kernel`` is the user's factory of a wrapper for a layout (docs/kernel-verification.md
shows the adapter for a CUDA FlashInfer), the twin's ``PagedPrefillWrapper`` the built-in one.

Its factors: the batch (mixed prefill/decode, all decode, all prefill), causal, GQA, window,
softcap, sinks, pages of 1, 16, 64, 128, 144 and 256 tokens, the layout, the cache's form and
the values (Gaussian, outlier channels, shifted keys). Its features: ``causal``, ``gqa``,
``window``, ``softcap``, ``sinks`` and ``lse``.

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..battery.serving import BATCHES, VALUES, PagedCase
from ..running.calls import BadResult
from ._serving import PagedSpec

FEATURE_FACTORS = {name: name for name in ("causal", "gqa", "window", "softcap", "sinks")}


class FlashInferPagedSpec(PagedSpec):
    name = "flashinfer_paged"
    signature = (
        "kernel(kv_layout) -> wrapper; wrapper.plan(qo_indptr, paged_kv_indptr, "
        "paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk, "
        "page_size, causal=False, window_left=-1, logits_soft_cap=None, ...); "
        "wrapper.run(q, paged_kv_cache, return_lse=False, sinks=None)"
    )
    features = frozenset({"causal", "gqa", "window", "softcap", "sinks", "lse"})
    factors = {
        "batch": BATCHES,
        **{name: ("off", "on") for name in FEATURE_FACTORS},
        "page": ("16", "1", "64", "128", "144", "256"),
        "layout": ("NHD", "HND"),
        "cache": ("pair", "5d"),
        "values": VALUES,
    }
    feature_factors = FEATURE_FACTORS

    def values_of(self, case: Any) -> dict[str, str]:
        return {**self.paged_values(case), "layout": case.layout, "cache": case.cache}

    def case_of(self, row: Mapping[str, str], d: int) -> PagedCase:
        return self.paged_case(row, d, layout=row["layout"], cache=row["cache"])

    def call(self, kernel: Callable[..., Any], case: PagedCase, given: dict[str, torch.Tensor],
             want_lse: bool, options: Mapping[str, Any]) -> Any:  # fmt: skip
        wrapper = kernel(case.layout)
        plan: dict[str, Any] = {"causal": case.causal, "q_data_type": given["q"].dtype,
                                "kv_data_type": given["k_pages"].dtype}  # fmt: skip
        if case.window >= 0:
            plan["window_left"] = case.window
        if case.softcap:
            plan["logits_soft_cap"] = case.softcap
        wrapper.plan(
            given["qo_indptr"], given["paged_kv_indptr"], given["paged_kv_indices"],
            given["paged_kv_last_page_len"], case.heads, case.heads_kv, case.d, case.page_size,
            **plan,
        )  # fmt: skip
        run: dict[str, Any] = {"return_lse": True} if want_lse else {}
        if case.sinks:
            run["sinks"] = given["sinks"]
        return wrapper.run(given["q"], paged_cache(case, given), **run)

    def results(self, case: PagedCase, result: Any, given: dict[str, torch.Tensor],
                want_lse: bool) -> dict:  # fmt: skip
        shape = (case.tokens, case.heads, case.dv)
        if not want_lse:
            return {"out": (result, shape)}
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise BadResult(f"the kernel returned {type(result).__name__}, the flashinfer_paged "
                            "spec expects (out, lse) with return_lse=True")  # fmt: skip
        return {"out": (result[0], shape), "lse": (result[1], shape[:2])}

    def targets(self, device: Any, dtypes: tuple[str, ...]) -> list[Any]:
        from ..targets.builtin import Target
        from ..targets.serving import flashinfer_wrapper, plain_flashinfer_wrapper

        return [Target("PagedPrefillWrapper", flashinfer_wrapper, dtypes, self.name),
                Target("plain_flashinfer_wrapper", plain_flashinfer_wrapper, dtypes, self.name)]


def paged_cache(case: PagedCase, given: dict[str, torch.Tensor]) -> Any:
    """The pools in the case's layout and form: a (k, v) pair or one (pages, 2, ...) tensor,
    NHD (pages, P, H_kv, D) or HND (pages, H_kv, P, D), contiguous."""
    k, v = given["k_pages"], given["v_pages"]
    if case.layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    if case.cache == "5d":
        return torch.stack([k, v], dim=1)
    return k, v


SPEC = FlashInferPagedSpec()
