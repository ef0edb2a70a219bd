"""The serving engines' conventions over ``prefill.py``: FlashInfer's paged prefill and cascade
merge, and vLLM's attention metadata, each a thin translation into ``paged_prefill_forward`` or
``cascade_prefill_forward`` (the one reference), so that a kernel behind either API is judged by
the same attention.

- FlashInfer (``csr_block_table``, ``flashinfer_paged_forward``): a sequence's pages are a CSR
  row, paged_kv_indices[paged_kv_indptr[b]:paged_kv_indptr[b + 1]], its length (pages - 1) * P +
  paged_kv_last_page_len[b]; all metadata int32; the cache NHD (num_pages, P, H_kv, D) or HND
  (num_pages, H_kv, P, D), as a (k, v) pair or one (num_pages, 2, ...) array; lse in base 2.
- FlashInfer's cascade operator (``merge_state``, ``merge_states``):
  ``merge.merge_attention_forward`` with base-2 lse, s = lse / ln 2.
- vLLM (``vllm_paged_forward``): ``query_start_loc`` (the queries' CSR), ``seq_lens`` (keys,
  the step's tokens included), ``block_table``, ``slot_mapping`` (where each new token is
  written: slot s is block s // P, offset s % P; -1 skips it); block 0 is the null block;
  ``common_prefix_len`` > 0 runs the cascade.

Every refusal is ``serving_arguments``'s (pure Python, shared with the torch twin), made before
anything is written.

Shape legend: T packed query tokens, B sequences, S merged states, H query heads, H_kv key/value
heads, D head width, Dv value head width, P page size.

Derivation: docs/decoding.md ("Prefill over pages and the serving APIs").
Tests: tests/numpy_attention/decode/test_serving.py.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import validation
from ..grad_mode import no_grad
from ..merge import merge_attention_forward
from .checks import _integers
from .prefill import PrefillCall, attend_cascade, attend_pages, paged_prefill_forward
from .serving_arguments import check_int32, csr_pages, paged_kv_cache_shapes, plan_vllm

__all__ = [
    "csr_block_table",
    "flashinfer_paged_forward",
    "merge_state",
    "merge_states",
    "vllm_paged_forward",
]

LN2 = math.log(2.0)


def csr_block_table(
    paged_kv_indptr: Any,
    paged_kv_indices: Any,
    paged_kv_last_page_len: Any,
    page_size: int,
    num_pages: int,
) -> tuple[np.ndarray, np.ndarray]:
    """FlashInfer's CSR page table as a block table and lengths.

    Args:
        paged_kv_indptr: (B + 1,) int32, from 0, never decreasing, at most len(indices).
        paged_kv_indices: (nnz,) int32 page ids in [0, num_pages).
        paged_kv_last_page_len: (B,) int32, in [1, P] (0 for a sequence with no pages).
        page_size: P.
        num_pages: the pages in the pool.

    Returns:
        block_table (B, most pages of a sequence) int64, each row its pages then 0s, and
        kv_lens (B,) int64, (pages - 1) * P + last_page_len.

    Raises:
        TypeError, ValueError: ``serving_arguments.csr_pages``'s, naming the array and sequence.
    """
    pages, lengths = csr_pages(
        _integers(paged_kv_indptr),
        _integers(paged_kv_indices),
        _integers(paged_kv_last_page_len),
        page_size,
        num_pages,
    )
    table = np.zeros((len(pages), max(map(len, pages), default=0)), np.int64)  # (B, max pages)
    for b, held in enumerate(pages):
        table[b, : len(held)] = held
    return table, np.asarray(lengths, np.int64).reshape(len(pages))


def flashinfer_paged_forward(
    q: np.ndarray,
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
    sinks: np.ndarray | None = None,
    return_lse: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` (plan, then run) in one call.

    Args:
        q: (T, H, D), sequence b's queries rows qo_indptr[b]:qo_indptr[b + 1].
        paged_kv_cache: a (k, v) pair of (num_pages, P, H_kv, D|Dv) ("NHD") or (num_pages,
            H_kv, P, D|Dv) ("HND"), or one array (num_pages, 2, P, H_kv, D) / (num_pages, 2,
            H_kv, P, D).
        qo_indptr: (B + 1,) int32, ending at T.
        paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len: the CSR page table, int32
            (``csr_block_table``).
        kv_layout: "NHD" or "HND".
        causal, window_left: ``paged_prefill_forward``'s (bottom-right).
        sm_scale: multiplies q k^T; default 1 / sqrt(D).
        logits_soft_cap: > 0 caps the scores; 0 or None = off.
        sinks: (H,) sink logits, any floating dtype (FlashInfer's are float32), used in q's.
        return_lse: also return lse.

    Returns:
        out (T, H, Dv) in q's dtype, or (out, lse) with lse (T, H) in base 2 (log2 of the sum
        of exp of the scores), float32 for float16 inputs, else q's dtype.
    """
    k_pages, v_pages = nhd_pages(paged_kv_cache, kv_layout)
    qo = _integers(qo_indptr)
    if len(qo.shape) != 1:
        raise ValueError(f"qo_indptr must be 1-D, got shape {qo.shape}")
    check_int32("qo_indptr", qo)
    block_table, kv_lens = csr_block_table(
        paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, k_pages.shape[1], len(k_pages)
    )
    result = paged_prefill_forward(
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


def nhd_pages(paged_kv_cache: Any, kv_layout: Any) -> tuple[np.ndarray, np.ndarray]:
    """FlashInfer's ``paged_kv_cache`` as key and value pools (num_pages, P, H_kv, D|Dv): views,
    axes swapped for HND."""
    if isinstance(paged_kv_cache, (tuple, list)):
        arrays = [
            validation.float_array(f"paged_kv_cache[{i}]", a) for i, a in enumerate(paged_kv_cache)
        ]
    else:
        arrays = [validation.float_array("paged_kv_cache", paged_kv_cache)]
    fused, hnd = paged_kv_cache_shapes([a.shape for a in arrays], kv_layout)
    k_pages, v_pages = (arrays[0][:, 0], arrays[0][:, 1]) if fused else arrays
    if hnd:  # (num_pages, H_kv, P, W) -> (num_pages, P, H_kv, W), a view
        k_pages, v_pages = k_pages.swapaxes(1, 2), v_pages.swapaxes(1, 2)
    return k_pages, v_pages


def sinks_like(sinks: Any, q: Any) -> np.ndarray | None:
    """FlashInfer's and vLLM's sinks are float32 whatever q's dtype: any floating sinks, in
    q's dtype (exact from float32 to float32 or float64; rounded to it for float16 q)."""
    if sinks is None:
        return None
    sinks = validation.float_array("sinks", sinks)
    dtype = np.asarray(q).dtype
    return sinks.astype(dtype) if dtype.kind == "f" else sinks


def merge_state(
    v_a: np.ndarray, s_a: np.ndarray, v_b: np.ndarray, s_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """FlashInfer's ``merge_state``: two attention states over disjoint keys merged into the
    state over their union; ``merge.merge_attention_forward`` with base-2 lse.

    Args:
        v_a: (T, H, D) attention output over key set A.
        s_a: (T, H) its lse in base 2 (-inf: nothing seen, weight 0).
        v_b, s_b: the same over key set B.

    Returns:
        (v, s): v (T, H, D) in v_a's dtype, s (T, H) base 2 in s_a's dtype; both -inf: v 0, s
        -inf.
    """
    for name, v, s in (("a", v_a, s_a), ("b", v_b, s_b)):
        v = validation.float_array(f"v_{name}", v)
        s = validation.float_array(f"s_{name}", s)
        if v.ndim != 3 or s.shape != v.shape[:2]:
            raise ValueError(
                f"v_{name} must be (T, H, D) and s_{name} (T, H), got {v.shape} and {s.shape}"
            )
    with no_grad():
        merged = merge_attention_forward(
            v_a,
            np.asarray(s_a) * LN2,
            v_b,
            np.asarray(s_b) * LN2,  # base 2 -> natural log
        )
    return merged.out, merged.lse / LN2


def merge_states(v: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FlashInfer's ``merge_states``: S attention states over disjoint keys merged into one.

    Args:
        v: (T, S, H, D) the states' outputs.
        s: (T, S, H) their lse in base 2.

    Returns:
        (v, s): (T, H, D) in v's dtype (merged in float32 for float16, rounded once) and (T, H)
        base 2 in s's dtype; S = 0 or all -inf: v 0, s -inf.
    """
    v, s = validation.float_array("v", v), validation.float_array("s", s)
    if v.ndim != 4 or s.shape != v.shape[:3]:
        raise ValueError(f"v must be (T, S, H, D) and s (T, S, H), got {v.shape} and {s.shape}")
    compute = np.result_type(np.float32, v.dtype)
    out = np.zeros(v.shape[:1] + v.shape[2:], compute)  # (T, H, D): the empty state
    lse = np.full(s.shape[:1] + s.shape[2:], -np.inf, s.dtype)  # (T, H), natural log
    with no_grad():
        for i in range(v.shape[1]):  # an empty state weighs 0: merging into it is exact
            out, lse, _ = merge_attention_forward(out, lse, v[:, i].astype(compute), s[:, i] * LN2)
    return out.astype(v.dtype), lse / LN2


def vllm_paged_forward(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    kv_cache: np.ndarray,
    *,
    query_start_loc: Any,
    seq_lens: Any,
    block_table: Any,
    slot_mapping: Any,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
    common_prefix_len: int = 0,
    return_lse: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """vLLM's paged attention step: write this step's keys and values into the cache at
    ``slot_mapping``, in place, then attend as ``paged_prefill_forward``.

    Args:
        query: (T, H, D); sequence b's rows query_start_loc[b]:query_start_loc[b + 1]; rows
            past query_start_loc[-1] are padding (out 0, lse -inf).
        key, value: (T, H_kv, D) this step's tokens.
        kv_cache: (2, num_blocks, P, H_kv, D), keys [0] and values [1]; written in place.
        query_start_loc: (B + 1,) integers from 0, never decreasing, at most T.
        seq_lens: (B,) integers: each sequence's keys, this step's tokens included.
        block_table: (B, max_blocks) integers; the first ceil(seq_lens[b] / P) of each row are
            read and may not be 0 (block 0 is vLLM's null block); the rest are ignored.
        slot_mapping: (T,) integers: token t's key and value go to block slot // P, offset
            slot % P; -1 skips it. No two tokens share a slot; none lies in block 0.
        softmax_scale, causal, window_left, softcap: ``paged_prefill_forward``'s.
        sinks: (H,) sink logits, any floating dtype (vLLM's are float32), used in query's.
        common_prefix_len: > 0 attends the first common_prefix_len keys (whole blocks, the same
            in every row, at most every seq_lens[b] - n_b; no window) as a cascade.
        return_lse: also return lse (T, H), natural log.

    Returns:
        out (T, H, D) in query's dtype, or (out, lse).

    Raises:
        TypeError, ValueError: before anything is written: a slot outside the pool, in block 0,
            or written twice; lengths past the table; query_start_loc decreasing; a non-integer
            table; block 0 among a sequence's blocks; a bad common prefix.
    """
    given = {"query": query, "key": key, "value": value, "kv_cache": kv_cache}
    arrays = {name: validation.float_array(name, a) for name, a in given.items()}
    if not isinstance(kv_cache, np.ndarray):
        raise TypeError(
            "kv_cache must be a NumPy array: the step's keys and values are written in it"
        )
    sink_logits = sinks_like(sinks, arrays["query"])
    if sink_logits is not None:
        arrays["sinks"] = sink_logits
    dtype = validation.same_dtype(**arrays)
    plan = plan_vllm(
        query=arrays["query"].shape,
        key=arrays["key"].shape,
        value=arrays["value"].shape,
        kv_cache=kv_cache.shape,
        query_start_loc=_integers(query_start_loc),
        seq_lens=_integers(seq_lens),
        block_table=_integers(block_table),
        slot_mapping=_integers(slot_mapping),
        softmax_scale=softmax_scale,
        causal=validation.flag("causal", causal),
        window_left=window_left,
        softcap=softcap,
        sinks=None if sinks is None else arrays["sinks"].shape,
        common_prefix_len=common_prefix_len,
    )
    if sinks is not None and not np.all(np.isfinite(arrays["sinks"])):
        raise ValueError("sinks must be finite logits (None for no sinks)")
    return_lse = validation.flag("return_lse", return_lse)

    slots = np.asarray(plan.slots, np.int64).reshape(-1)  # (T,)
    kept = slots >= 0
    size = kv_cache.shape[2]
    kv_cache[0, slots[kept] // size, slots[kept] % size] = arrays["key"][kept]
    kv_cache[1, slots[kept] // size, slots[kept] % size] = arrays["value"][kept]

    q = arrays["query"]
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    call = PrefillCall(
        plan.prefill, q[: plan.tokens], kv_cache[0], kv_cache[1], sink_logits, compute
    )
    if plan.prefix_len:
        head_out, head_lse = attend_cascade(call, plan.prefix_len)
    else:
        head_out, head_lse = attend_pages(call, plan.prefill.lo, sinks=sink_logits)
    out = np.zeros(q.shape[:2] + kv_cache.shape[-1:], q.dtype)  # (T, H, D): padding rows 0
    lse = np.full(q.shape[:2], -np.inf, compute)  # (T, H)
    out[: plan.tokens], lse[: plan.tokens] = head_out, head_lse
    return (out, lse) if return_lse else out
