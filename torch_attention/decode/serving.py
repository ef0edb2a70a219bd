"""The serving engines' conventions over ``prefill.py`` in torch, the twin of
``numpy_attention.decode.serving``: FlashInfer's CSR page tables, paged prefill (as a function,
``flashinfer_paged``, and as its plan/run wrapper, ``PagedPrefillWrapper``) and cascade merge
(``merge_state``, ``merge_states``, base-2 lse), and vLLM's metadata with its slot writes
(``vllm_paged``), on any device.

The same semantics, checks and messages as the NumPy twin (docs/decoding.md, "Prefill over pages
and the serving APIs"); every refusal is ``numpy_attention.decode.serving_arguments``'s, made
before anything is written. ``PagedPrefillWrapper`` mirrors FlashInfer's
``BatchPrefillWithPagedKVCacheWrapper``: ``plan`` keeps and checks the metadata (int32, the CSR
table, the heads), ``run`` attends; the kernel checker's "flashinfer_paged" spec calls a kernel
through that signature.

Shape legend: T packed query tokens, B sequences, S merged states, H query heads, H_kv key/value
heads, D head width, Dv value head width, P page size.

Derivation: docs/decoding.md ("Prefill over pages and the serving APIs").
Tests: tests/torch_attention/decode/test_serving.py (against the NumPy twin in float64; float16
and bfloat16).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from numpy_attention.decode.serving_arguments import (
    check_int32,
    check_kv_layout,
    csr_pages,
    paged_kv_cache_shapes,
    plan_vllm,
)

from .. import validation
from ..merge import merge_attention
from ..rules import compute_dtype
from .checks import _integers
from .prefill import PrefillCall, attend_cascade, attend_pages, paged_prefill

__all__ = [
    "PagedPrefillWrapper",
    "csr_block_table",
    "flashinfer_paged",
    "merge_state",
    "merge_states",
    "vllm_paged",
]

LN2 = math.log(2.0)


def csr_block_table(
    paged_kv_indptr: Any,
    paged_kv_indices: Any,
    paged_kv_last_page_len: Any,
    page_size: int,
    num_pages: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's CSR page table as block_table (B, most pages) int64, padded with 0, and
    kv_lens (B,) int64, on paged_kv_indptr's device; ``numpy_attention``'s twin."""
    pages, lengths = csr_pages(
        _integers(paged_kv_indptr),
        _integers(paged_kv_indices),
        _integers(paged_kv_last_page_len),
        page_size,
        num_pages,
    )
    device = paged_kv_indptr.device if isinstance(paged_kv_indptr, torch.Tensor) else None
    width = max(map(len, pages), default=0)
    table = [held + [0] * (width - len(held)) for held in pages]
    return (
        torch.tensor(table, dtype=torch.int64, device=device).reshape(len(pages), width),
        torch.tensor(lengths, dtype=torch.int64, device=device),
    )


def flashinfer_paged(
    q: torch.Tensor,
    paged_kv_cache: Any,
    *,
    qo_indptr: Any,
    paged_kv_indptr: Any,
    paged_kv_indices: Any,
    paged_kv_last_page_len: Any,
    kv_layout: str = "NHD",
    causal: bool = False,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = 0.0,
    sinks: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's paged prefill in one call; ``numpy_attention``'s ``flashinfer_paged_forward``
    twin. Returns out (T, H, Dv), or (out, lse) with lse (T, H) in base 2 (float32 for half)."""
    k_pages, v_pages = nhd_pages(paged_kv_cache, kv_layout)
    qo = _integers(qo_indptr)
    if len(qo.shape) != 1:
        raise ValueError(f"qo_indptr must be 1-D, got shape {qo.shape}")
    check_int32("qo_indptr", qo)
    block_table, kv_lens = csr_block_table(
        paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, k_pages.shape[1], len(k_pages)
    )
    result = paged_prefill(
        q,
        k_pages,
        v_pages,
        qo_indptr=qo_indptr,
        block_table=block_table,
        kv_lens=kv_lens,
        softmax_scale=sm_scale,
        causal=causal,
        window_left=window_left,
        softcap=0.0 if logits_soft_cap is None else logits_soft_cap,
        sinks=sinks_like(sinks, q),
        return_lse=True,
    )
    if not validation.flag("return_lse", return_lse) or result.lse is None:
        return result.out
    return result.out, result.lse / LN2  # log2(sum exp) = ln(sum exp) / ln 2


def nhd_pages(paged_kv_cache: Any, kv_layout: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's ``paged_kv_cache`` as key and value pools (num_pages, P, H_kv, D|Dv): views,
    axes swapped for HND."""
    if isinstance(paged_kv_cache, (tuple, list)):
        tensors = [
            validation.float_tensor(f"paged_kv_cache[{i}]", t) for i, t in enumerate(paged_kv_cache)
        ]
    else:
        tensors = [validation.float_tensor("paged_kv_cache", paged_kv_cache)]
    fused, hnd = paged_kv_cache_shapes([tuple(t.shape) for t in tensors], kv_layout)
    k_pages, v_pages = (tensors[0][:, 0], tensors[0][:, 1]) if fused else tensors
    if hnd:  # (num_pages, H_kv, P, W) -> (num_pages, P, H_kv, W), a view
        k_pages, v_pages = k_pages.transpose(1, 2), v_pages.transpose(1, 2)
    return k_pages, v_pages


def sinks_like(sinks: Any, q: Any) -> torch.Tensor | None:
    """FlashInfer's and vLLM's sinks are float32 whatever q's dtype: any floating sinks, in
    q's dtype and on its device (``numpy_attention``'s ``sinks_like`` twin)."""
    if sinks is None:
        return None
    sinks = validation.float_tensor("sinks", sinks)
    if isinstance(q, torch.Tensor) and q.is_floating_point():
        return sinks.to(q.device, q.dtype)
    return sinks


def merge_state(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's ``merge_state``: v (T, H, D) and base-2 s (T, H) of two states over
    disjoint keys merged; ``numpy_attention``'s twin, on ``merge.merge_attention``."""
    for name, v, s in (("a", v_a, s_a), ("b", v_b, s_b)):
        v = validation.float_tensor(f"v_{name}", v)
        s = validation.float_tensor(f"s_{name}", s)
        if v.ndim != 3 or s.shape != v.shape[:2]:
            raise ValueError(
                f"v_{name} must be (T, H, D) and s_{name} (T, H), got {tuple(v.shape)} and "
                f"{tuple(s.shape)}"
            )
    merged = merge_attention(v_a, s_a * LN2, v_b, s_b * LN2)  # base 2 -> natural log
    return merged.out, merged.lse / LN2


def merge_states(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's ``merge_states``: v (T, S, H, D) and base-2 s (T, S, H) merged into (T, H, D)
    and (T, H), in float32 at least and rounded once; S = 0 or all -inf: v 0, s -inf."""
    v, s = validation.float_tensor("v", v), validation.float_tensor("s", s)
    if v.ndim != 4 or s.shape != v.shape[:3]:
        raise ValueError(
            f"v must be (T, S, H, D) and s (T, S, H), got {tuple(v.shape)} and {tuple(s.shape)}"
        )
    compute = torch.promote_types(torch.float32, v.dtype)
    out = v.new_zeros(v.shape[:1] + v.shape[2:], dtype=compute)  # (T, H, D): the empty state
    lse = s.new_full(s.shape[:1] + s.shape[2:], float("-inf"))  # (T, H), natural log
    for i in range(v.shape[1]):  # an empty state weighs 0: merging into it is exact
        out, lse = merge_attention(out, lse, v[:, i].to(compute), s[:, i] * LN2)
    return out.to(v.dtype), lse / LN2


def vllm_paged(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    *,
    query_start_loc: Any,
    seq_lens: Any,
    block_table: Any,
    slot_mapping: Any,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    common_prefix_len: int = 0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """vLLM's paged attention step: the step's keys and values written into kv_cache (2,
    num_blocks, P, H_kv, D) at ``slot_mapping`` in place (-1 skipped), then the attention of
    ``paged_prefill`` (a cascade with ``common_prefix_len`` > 0); ``numpy_attention``'s
    ``vllm_paged_forward`` twin. Returns out (T, H, D), or (out, lse natural log (T, H))."""
    sinks = sinks_like(sinks, query)
    given = {"query": query, "key": key, "value": value, "kv_cache": kv_cache, "sinks": sinks}
    tensors = {name: validation.float_tensor(name, t) for name, t in given.items() if t is not None}
    validation.same_dtype(**tensors)
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(
            f"query, key, value, kv_cache and sinks must share one device, got "
            f"{sorted(map(str, devices))}"
        )
    plan = plan_vllm(
        query=tuple(query.shape),
        key=tuple(key.shape),
        value=tuple(value.shape),
        kv_cache=tuple(kv_cache.shape),
        query_start_loc=_integers(query_start_loc),
        seq_lens=_integers(seq_lens),
        block_table=_integers(block_table),
        slot_mapping=_integers(slot_mapping),
        softmax_scale=softmax_scale,
        causal=validation.flag("causal", causal),
        window_left=window_left,
        softcap=softcap,
        sinks=None if sinks is None else tuple(sinks.shape),
        common_prefix_len=common_prefix_len,
    )
    if sinks is not None and not bool(torch.isfinite(sinks).all()):
        raise ValueError("sinks must be finite logits (None for no sinks)")
    return_lse = validation.flag("return_lse", return_lse)

    size = kv_cache.shape[2]
    kept = [t for t, slot in enumerate(plan.slots) if slot >= 0]
    where = torch.tensor([plan.slots[t] for t in kept], dtype=torch.int64, device=query.device)
    rows = torch.tensor(kept, dtype=torch.int64, device=query.device)
    with torch.no_grad():
        kv_cache[0, where // size, where % size] = key[rows]
        kv_cache[1, where // size, where % size] = value[rows]

    call = PrefillCall(plan.prefill, query[: plan.tokens], kv_cache[0], kv_cache[1], sinks)
    if plan.prefix_len:
        head_out, head_lse = attend_cascade(call, plan.prefix_len)
    else:
        head_out, head_lse = attend_pages(call, plan.prefill.lo, sinks=sinks)
    out = query.new_zeros(tuple(query.shape[:2]) + (kv_cache.shape[-1],))  # padding rows: 0
    lse = query.new_full(tuple(query.shape[:2]), float("-inf"), dtype=compute_dtype(query.dtype))
    out[: plan.tokens], lse[: plan.tokens] = head_out, head_lse
    return (out, lse) if return_lse else out


class PagedPrefillWrapper:
    """FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper``: ``plan`` once per batch's metadata,
    ``run`` per layer. The workspace buffer is accepted and unused (a reference needs no
    scratch).

    Args:
        float_workspace_buffer: FlashInfer's scratch tensor; ignored.
        kv_layout: "NHD" (num_pages, P, H_kv, D) or "HND" (num_pages, H_kv, P, D).
    """

    def __init__(self, float_workspace_buffer: Any = None, kv_layout: str = "NHD") -> None:
        check_kv_layout(kv_layout)
        self.kv_layout = kv_layout
        self._plan: dict[str, Any] | None = None

    def plan(
        self,
        qo_indptr: Any,
        paged_kv_indptr: Any,
        paged_kv_indices: Any,
        paged_kv_last_page_len: Any,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        causal: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        head_dim_vo: int | None = None,
        q_data_type: Any = None,
        kv_data_type: Any = None,
    ) -> None:
        """Keep the batch's metadata, checked: int32 CSR arrays (the page ids against the pool
        at ``run``, which knows it), heads H a multiple of H_kv, positive sizes."""
        heads = validation.positive_int("num_qo_heads", num_qo_heads)
        kv_heads = validation.positive_int("num_kv_heads", num_kv_heads)
        if heads % kv_heads:
            raise ValueError(f"num_qo_heads {heads} must be a multiple of num_kv_heads {kv_heads}")
        qo = _integers(qo_indptr)
        if len(qo.shape) != 1:
            raise ValueError(f"qo_indptr must be 1-D, got shape {qo.shape}")
        check_int32("qo_indptr", qo)
        size = validation.positive_int("page_size", page_size)
        csr_pages(
            _integers(paged_kv_indptr),
            _integers(paged_kv_indices),
            _integers(paged_kv_last_page_len),
            size,
            sys.maxsize,
        )
        width = validation.positive_int("head_dim_qk", head_dim_qk)
        self._plan = {
            "qo_indptr": qo_indptr,
            "paged_kv_indptr": paged_kv_indptr,
            "paged_kv_indices": paged_kv_indices,
            "paged_kv_last_page_len": paged_kv_last_page_len,
            "causal": validation.flag("causal", causal),
            "sm_scale": sm_scale,
            "window_left": window_left,
            "logits_soft_cap": logits_soft_cap,
            "shape": (heads, kv_heads, width, size, head_dim_vo),
            "dtypes": (q_data_type, kv_data_type),
        }

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        *,
        sinks: torch.Tensor | None = None,
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The planned batch's attention: ``flashinfer_paged`` with the kept metadata, after
        checking q and the cache against the plan's heads, widths, page size and dtypes.

        Returns:
            out (T, H, Dv), or (out, lse) with lse (T, H) in base 2.
        """
        if self._plan is None:
            raise RuntimeError("PagedPrefillWrapper.run needs plan(...) first")
        planned = dict(self._plan)
        heads, kv_heads, width, size, width_vo = planned.pop("shape")
        q_dtype, kv_dtype = planned.pop("dtypes")
        k_pages, v_pages = nhd_pages(paged_kv_cache, self.kv_layout)
        got = (q.shape[1:], k_pages.shape[1:])
        if got != ((heads, width), (size, kv_heads, width)) or (
            width_vo is not None and v_pages.shape[-1] != width_vo
        ):
            raise ValueError(
                f"q (T, {heads}, {width}) and pages (P = {size}, H_kv = {kv_heads}, D = {width}, "
                f"Dv = {width_vo}) were planned, got q {tuple(q.shape)} and k pages "
                f"{tuple(k_pages.shape)}, v pages {tuple(v_pages.shape)} (NHD)"
            )
        for name, want, tensor in (
            ("q_data_type", q_dtype, q),
            ("kv_data_type", kv_dtype, k_pages),
        ):
            want = getattr(torch, want) if isinstance(want, str) else want  # "float16"
            if want is not None and tensor.dtype != want:
                raise TypeError(f"{name} {want} was planned, got {tensor.dtype}")
        return flashinfer_paged(
            q, paged_kv_cache, kv_layout=self.kv_layout, sinks=sinks, return_lse=return_lse,
            **planned,
        )  # fmt: skip
