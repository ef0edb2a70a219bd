"""The checks of ``paged.kvcache_attention_forward``'s arguments on NumPy arrays, and the call
they leave, ``DecodeCall``: what only arrays can say (floating, one dtype, caches that can be
written in place) is checked here; every other refusal of the decode contract is
``arguments.plan_call``'s, the pure-Python checker the torch twin calls too, fed the shapes and
integer tables read from the arrays.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, P page size.

Derivation: docs/decoding.md (sections 2 to 4).
Tests: tests/numpy_attention/decode/test_checks.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .. import validation
from .arguments import Integers, plan_call

__all__ = ["DecodeCall", "check_call"]


class DecodeCall(NamedTuple):
    """One call's arguments, checked: every sequence's pages and the keys it attends."""

    pages: list[np.ndarray]  # per sequence, its pages in order, int64 (contiguous: [row])
    seqlens: np.ndarray  # (B,) int64, before the new tokens
    s_new: int
    lo: np.ndarray  # (B,) int64: the first key any query of the sequence can see
    rotary: tuple[np.ndarray, np.ndarray] | None  # cos, sin (seqlen_ro, rotary_dim / 2), compute
    q_moves: bool  # rotate query i at seqlens + i (causal or windowed), else all at seqlens
    interleaved: bool  # rotary pairs (x_2i, x_2i+1), else (x_i, x_i+rotary_dim/2)
    options: dict[str, Any]  # attention_forward's keywords, but alibi_slopes
    slopes: np.ndarray | None  # (H,) or (B, H)
    compute: np.dtype


def check_call(
    q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
    cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
    alibi_slopes, return_lse,
) -> tuple[DecodeCall, np.ndarray, np.ndarray | None, np.ndarray | None]:  # fmt: skip
    """Every argument of ``kvcache_attention_forward`` checked, before anything is written:
    the call, and q, k, v as arrays."""
    arrays = {"q": validation.float_array("q", q)}
    for name, value in (("k", k), ("v", v)):
        if value is not None:
            arrays[name] = validation.float_array(name, value)
    if k is not None and v is not None:
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(cache, np.ndarray):
                raise TypeError(f"{name} must be a NumPy array: the new k and v are written in it")
    arrays["k_cache"] = validation.float_array("k_cache", k_cache)
    arrays["v_cache"] = validation.float_array("v_cache", v_cache)
    dtype = validation.same_dtype(**arrays)
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    tables = {
        name: None if value is None else validation.float_array(name, value)
        for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin))
    }
    slopes = None if alibi_slopes is None else validation.float_array("alibi_slopes", alibi_slopes)
    plan = plan_call(
        q=arrays["q"].shape,
        k_cache=arrays["k_cache"].shape,
        v_cache=arrays["v_cache"].shape,
        k=None if k is None else arrays["k"].shape,
        v=None if v is None else arrays["v"].shape,
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
        alibi_finite=slopes is None or bool(np.all(np.isfinite(slopes))),
    )
    cos, sin = tables["rotary_cos"], tables["rotary_sin"]
    call = DecodeCall(
        pages=[np.asarray(pages, np.int64) for pages in plan.pages],
        seqlens=np.asarray(plan.seqlens, np.int64),
        s_new=plan.s_new,
        lo=np.asarray(plan.lo, np.int64),
        rotary=None if cos is None or sin is None else (cos.astype(compute), sin.astype(compute)),
        q_moves=plan.q_moves,
        interleaved=validation.flag("rotary_interleaved", rotary_interleaved),
        options=plan.options,
        slopes=slopes,
        compute=compute,
    )
    validation.flag("return_lse", return_lse)
    return call, arrays["q"], arrays.get("k"), arrays.get("v")


def _shape(array: np.ndarray | None) -> tuple[int, ...] | None:
    return None if array is None else array.shape


def _integers(value: Any) -> Integers:
    """An integer argument as ``plan_call`` reads it: dtype, shape and values."""
    array = np.asarray(value)
    integral = array.dtype.kind in "iu"
    return Integers(str(array.dtype), integral, array.shape, array.tolist() if integral else None)
