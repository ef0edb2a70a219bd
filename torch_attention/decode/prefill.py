"""Prefill over pages in torch, the twin of ``numpy_attention.decode.prefill``: ragged queries of
B sequences, packed on one axis, against keys in a pool of pages (``paged_prefill``), and the
same attention split at a prefix of pages every sequence shares (``cascade_prefill``), on any
device.

The same semantics, checks and messages as the NumPy twin (docs/decoding.md, "Prefill over pages
and the serving APIs"): sequence b owns query rows qo_indptr[b]:qo_indptr[b + 1] (n_b) and
kv_lens[b] keys, its queries' own tokens included; key t lies in page block_table[b, t // P],
slot t % P; query i sits at p_i = kv_lens[b] - n_b + i (bottom-right). Every score rule is
``functional.attention``'s with ``align="bottom-right"``, per sequence, on the keys it can see
(``pages.read_tokens``); the refusals are ``numpy_attention.decode.serving_arguments``'s, the
pure-Python checker both twins call. The cascade merges (``merge.merge_attention``) every query's
unmasked attention over the shared prefix, with the sinks, and each sequence's attention over its
own keys.

Dtypes: float16 and bfloat16 are attended in float32 (``functional.attention``'s rule) and
returned in their dtype; lse float32. Tables and lengths may live on any device: they are read on
the host (one sync per call). Runs under ``torch.no_grad()``: a serving kernel has no backward.

Shape legend: T packed query tokens, B sequences, n_b the queries of sequence b, H query heads,
H_kv key/value heads, D head width, Dv value head width, P page size.

Derivation: docs/decoding.md ("Prefill over pages and the serving APIs").
Tests: tests/torch_attention/decode/test_prefill.py (against the NumPy twin in float64; float32,
float16 and bfloat16).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from numpy_attention.decode.serving_arguments import PrefillPlan, check_prefix, plan_prefill

from .. import validation
from ..functional import attention
from ..merge import merge_attention
from ..rules import compute_dtype
from .checks import _integers
from .pages import read_tokens

__all__ = [
    "PrefillCall",
    "PrefillOutput",
    "attend_cascade",
    "attend_pages",
    "cascade_prefill",
    "check_prefill",
    "paged_prefill",
]


class PrefillOutput(NamedTuple):
    """What ``paged_prefill`` returns: out (T, H, Dv) in q's dtype; lse (T, H), natural log,
    float32 for half inputs, or None unless asked for."""

    out: torch.Tensor
    lse: torch.Tensor | None


class PrefillCall(NamedTuple):
    """A prefill's tensors and plan, checked."""

    plan: PrefillPlan
    q: torch.Tensor  # (T, H, D)
    k_pages: torch.Tensor  # (num_pages, P, H_kv, D)
    v_pages: torch.Tensor  # (num_pages, P, H_kv, Dv)
    sinks: torch.Tensor | None  # (H,)


def paged_prefill(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    *,
    qo_indptr: Any,
    block_table: Any,
    kv_lens: Any,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    return_lse: bool = False,
) -> PrefillOutput:
    """Attention of B sequences' packed queries over their keys in pages;
    ``numpy_attention.decode.prefill.paged_prefill_forward``'s twin (the same arguments, shapes
    and errors; tables and lengths as integer tensors, arrays or lists).

    Returns:
        ``PrefillOutput(out, lse)``: out (T, H, Dv) in q's dtype, lse (T, H) or None.
    """
    call = check_prefill(
        q, k_pages, v_pages, qo_indptr, block_table, kv_lens, softmax_scale, causal,
        window_left, softcap, sinks, return_lse,
    )  # fmt: skip
    out, lse = attend_pages(call, call.plan.lo, sinks=call.sinks)
    return PrefillOutput(out, lse if return_lse else None)


def cascade_prefill(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    *,
    qo_indptr: Any,
    block_table: Any,
    kv_lens: Any,
    prefix_len: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    return_lse: bool = False,
) -> PrefillOutput:
    """``paged_prefill`` as a cascade over a shared prefix of ``prefix_len`` keys;
    ``numpy_attention.decode.prefill.cascade_prefill_forward``'s twin."""
    call = check_prefill(
        q, k_pages, v_pages, qo_indptr, block_table, kv_lens, softmax_scale, causal,
        window_left, softcap, sinks, return_lse,
    )  # fmt: skip
    prefix = check_prefix(call.plan, prefix_len, k_pages.shape[1])
    out, lse = attend_cascade(call, prefix)
    return PrefillOutput(out, lse if return_lse else None)


def check_prefill(
    q, k_pages, v_pages, qo_indptr, block_table, kv_lens, softmax_scale, causal, window_left,
    softcap, sinks, return_lse,
) -> PrefillCall:  # fmt: skip
    """Every argument checked (the NumPy twin's checks and messages): the tensors here
    (floating, one dtype, one device, finite sinks), the rest by ``plan_prefill``."""
    given = {"q": q, "k_pages": k_pages, "v_pages": v_pages, "sinks": sinks}
    tensors = {name: validation.float_tensor(name, t) for name, t in given.items() if t is not None}
    validation.same_dtype(**tensors)
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(
            f"q, the pages and sinks must share one device, got {sorted(map(str, devices))}"
        )
    plan = plan_prefill(
        q=tuple(q.shape),
        k_pages=tuple(k_pages.shape),
        v_pages=tuple(v_pages.shape),
        qo_indptr=_integers(qo_indptr),
        block_table=_integers(block_table),
        kv_lens=_integers(kv_lens),
        softmax_scale=softmax_scale,
        causal=validation.flag("causal", causal),
        window_left=window_left,
        softcap=softcap,
        sinks=None if sinks is None else tuple(sinks.shape),
    )
    if sinks is not None and not bool(torch.isfinite(sinks).all()):
        raise ValueError("sinks must be finite logits (None for no sinks)")
    validation.flag("return_lse", return_lse)
    return PrefillCall(plan, q, k_pages, v_pages, sinks)


def attend_pages(
    call: PrefillCall, lo: list[int], *, sinks: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's queries over its keys [lo[b], kv_lens[b]) with the plan's score options:
    out (T, H, Dv) in q's dtype, lse (T, H) in the compute dtype (rows of no sequence: 0, -inf)."""
    q, k_pages, v_pages, plan = call.q, call.k_pages, call.v_pages, call.plan
    out = q.new_zeros(tuple(q.shape[:2]) + (v_pages.shape[-1],))  # (T, H, Dv)
    lse = q.new_full(tuple(q.shape[:2]), float("-inf"), dtype=compute_dtype(q.dtype))  # (T, H)
    with torch.no_grad():
        for b, pages in enumerate(plan.pages):
            start, stop = plan.starts[b], plan.starts[b + 1]
            if start == stop:
                continue
            keys = read_tokens(k_pages, pages, lo[b], plan.kv_lens[b])  # (M, H_kv, D)
            values = read_tokens(v_pages, pages, lo[b], plan.kv_lens[b])  # (M, H_kv, Dv)
            result = attention(
                q[start:stop].transpose(0, 1)[None],  # (n_b, H, D) -> (1, H, n_b, D)
                keys.transpose(0, 1)[None],  # (M, H_kv, D) -> (1, H_kv, M, D)
                values.transpose(0, 1)[None],
                sinks=sinks,
                return_lse=True,
                **plan.options,
            )
            out[start:stop] = result.out[0].transpose(0, 1)  # (H, n_b, Dv) -> (n_b, H, Dv)
            lse[start:stop] = result.lse[0].T  # (H, n_b) -> (n_b, H)
    return out, lse


def attend_cascade(call: PrefillCall, prefix_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cascade of a checked call (``check_prefix`` passed): out (T, H, Dv) in q's dtype,
    lse (T, H) in the compute dtype."""
    q, plan = call.q, call.plan
    shared = plan.pages[0] if plan.pages else []
    keys = read_tokens(call.k_pages, shared, 0, prefix_len)  # (prefix_len, H_kv, D)
    values = read_tokens(call.v_pages, shared, 0, prefix_len)
    unmasked = {**plan.options, "causal": False, "window": None}
    with torch.no_grad():
        head = attention(
            q.transpose(0, 1)[None],  # (T, H, D) -> (1, H, T, D): every query, one call
            keys.transpose(0, 1)[None],  # (prefix_len, H_kv, D) -> (1, H_kv, prefix_len, D)
            values.transpose(0, 1)[None],
            sinks=call.sinks,  # once, here
            return_lse=True,
            **unmasked,
        )
        tail_out, tail_lse = attend_pages(call, [max(lo, prefix_len) for lo in plan.lo], sinks=None)
        merged = merge_attention(
            head.out[0].transpose(0, 1),
            head.lse[0].T,
            tail_out,
            tail_lse,  # (T, H, Dv), (T, H)
        )
    return merged.out, merged.lse
