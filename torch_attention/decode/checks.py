"""The checks of ``paged.kvcache_attention``'s arguments on tensors, and the call they leave,
``DecodeCall``: the twin of ``numpy_attention.decode.checks``. What only tensors can say
(floating, one dtype, one device) is checked here; every other refusal of the decode contract is
``numpy_attention.decode.arguments.plan_call``'s, the pure-Python checker both twins call (the
same refusals and messages, made before anything is written), fed the shapes and integer tables
read from the tensors. Lengths, tables and indices may live on any device: they are read on the
host (one sync per call).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, P page size.

Derivation: docs/decoding.md (sections 2 to 4).
Tests: tests/torch_attention/decode/test_checks.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from numpy_attention.decode.arguments import Integers, plan_call

from .. import validation
from ..rules import compute_dtype

__all__ = ["DecodeCall", "check_call"]


class DecodeCall(NamedTuple):
    """One call's arguments, checked: every sequence's pages and the keys it attends."""

    pages: list[list[int]]  # the pages of each sequence in order (contiguous: [row])
    seqlens: list[int]  # before the new tokens
    s_new: int
    lo: list[int]  # the first key any query of the sequence can see
    rotary: tuple[torch.Tensor, torch.Tensor] | None  # cos, sin (seqlen_ro, rotary_dim / 2)
    q_moves: bool  # rotate query i at seqlens + i (causal or windowed), else all at seqlens
    interleaved: bool
    options: dict[str, Any]  # functional.attention's keywords, but alibi_slopes
    slopes: torch.Tensor | None  # (H,) or (B, H)


def check_call(
    q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
    cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
    alibi_slopes, return_lse,
) -> DecodeCall:  # fmt: skip
    """Every argument of ``kvcache_attention`` checked, before anything is written (the NumPy
    twin's checks and messages)."""
    given = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v}
    tensors = {name: validation.float_tensor(name, t) for name, t in given.items() if t is not None}
    validation.same_dtype(**tensors)
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(
            f"q, the caches, k and v must share one device, got {sorted(map(str, devices))}"
        )
    tables = {
        name: None if value is None else validation.float_tensor(name, value)
        for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin))
    }
    slopes = None
    if alibi_slopes is not None:
        slopes = validation.float_tensor("alibi_slopes", torch.as_tensor(alibi_slopes))
    plan = plan_call(
        q=tuple(q.shape),
        k_cache=tuple(k_cache.shape),
        v_cache=tuple(v_cache.shape),
        k=None if k is None else tuple(k.shape),
        v=None if v is None else tuple(v.shape),
        rotary_cos=_shape(tables["rotary_cos"]),
        rotary_sin=_shape(tables["rotary_sin"]),
        cache_seqlens=_integers(cache_seqlens),
        cache_batch_idx=None if cache_batch_idx is None else _integers(cache_batch_idx),
        cache_leftpad=None if cache_leftpad is None else _integers(cache_leftpad),
        block_table=None if block_table is None else _integers(block_table),
        softmax_scale=softmax_scale,
        causal=validation.flag("causal", causal),
        window_size=window_size,
        softcap=softcap,
        alibi_slopes=_shape(slopes),
        alibi_finite=slopes is None or bool(torch.isfinite(slopes).all()),
    )
    cos, sin = tables["rotary_cos"], tables["rotary_sin"]
    rotary = None
    if cos is not None and sin is not None:
        compute = compute_dtype(q.dtype)
        rotary = cos.to(q.device, compute), sin.to(q.device, compute)
    interleaved = validation.flag("rotary_interleaved", rotary_interleaved)
    validation.flag("return_lse", return_lse)
    return DecodeCall(
        pages=plan.pages,
        seqlens=plan.seqlens,
        s_new=plan.s_new,
        lo=plan.lo,
        rotary=rotary,
        q_moves=plan.q_moves,
        interleaved=interleaved,
        options=plan.options,
        slopes=None if slopes is None else slopes.to(q.device),
    )


def _shape(tensor: torch.Tensor | None) -> tuple[int, ...] | None:
    return None if tensor is None else tuple(tensor.shape)


def _integers(value: Any) -> Integers:
    """An integer argument as ``plan_call`` reads it: dtype, shape and values (on the host)."""
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    integral = not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)
    values = tensor.tolist() if integral else None
    return Integers(str(tensor.dtype), integral, tuple(tensor.shape), values)
