"""The checks of ``paged.kvcache_attention_forward``'s arguments, and what they resolve to: every
refusal of the decode contract, made before anything is written (a length past the cache's
capacity or the block table, flash-attn #2709; a page id outside the pool; a negative length; a
non-integer table; two sequences writing one slot; a rotary table too short), and the call they
leave, ``DecodeCall``: each sequence's pages in order, its length, the first key any of its
queries can see, and the score options of ``attention_forward``.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, P page size, L_b the keys of sequence b.

Derivation: docs/decoding.md (section 2, the arguments; section 3, capacity; section 4, why
reading the keys from the first one visible is exact).
Tests: tests/numpy_attention/test_paged_checks.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import validation

__all__ = ["DecodeCall", "check_call"]


class DecodeCall(NamedTuple):
    """One call's arguments, checked: every sequence's pages and the keys it attends."""

    pages: np.ndarray  # (B, max pages): the pages of each sequence in order (contiguous: [row])
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
    q = validation.float_array("q", q)
    arrays = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if (k is None) != (v is None):
        raise ValueError("k and v are appended together: give both or neither")
    if k is not None:
        arrays["k"], arrays["v"] = validation.float_array("k", k), validation.float_array("v", v)
        for name in ("k_cache", "v_cache"):
            if not isinstance(arrays[name], np.ndarray):
                raise TypeError(f"{name} must be a NumPy array: the new k and v are written in it")
    for name in ("k_cache", "v_cache"):
        arrays[name] = validation.float_array(name, arrays[name])
    for name, t in arrays.items():
        if t.ndim != 4:
            raise ValueError(f"{name} must have 4 axes, got shape {t.shape}")
    dtype = validation.same_dtype(**arrays)
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    k_cache, v_cache = arrays["k_cache"], arrays["v_cache"]
    batch, s_q, heads, width = q.shape
    blocks, size, kv_heads = k_cache.shape[:3]
    if v_cache.shape[:3] != k_cache.shape[:3] or k_cache.shape[-1] != width or width == 0:
        raise ValueError(
            f"k_cache and v_cache must share their first 3 axes, and k_cache the head width "
            f"D > 0 of q: got q {q.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {q.shape}, k_cache {k_cache.shape})"
        )
    s_new = 0
    if k is not None:
        k, v = arrays["k"], arrays["v"]
        if k.shape[:3] != (batch, k.shape[1], kv_heads) or v.shape[:3] != k.shape[:3]:
            raise ValueError(
                f"k and v must be (B, s_new, H_kv, W) with B = {batch} and H_kv = {kv_heads}, "
                f"got k {k.shape} and v {v.shape}"
            )
        if k.shape[-1] != width or v.shape[-1] != v_cache.shape[-1]:
            raise ValueError(
                f"k and v must have the head widths of k_cache and v_cache, got k {k.shape}, "
                f"v {v.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape}"
            )
        s_new = k.shape[1]

    seqlens = _lengths("cache_seqlens", cache_seqlens, batch)
    if block_table is not None:
        if cache_batch_idx is not None or cache_leftpad is not None:
            raise ValueError(
                "cache_batch_idx and cache_leftpad index a contiguous cache: flash-attn refuses "
                "them with a block_table, and so does this reference"
            )
        pages = _indices("block_table", block_table, (batch, None))
        where = "its block table holds"
    else:
        rows = np.arange(batch)
        if cache_batch_idx is not None:
            rows = _indices("cache_batch_idx", cache_batch_idx, (batch,))
        pages = rows[:, None]  # a contiguous cache is one page of ``capacity`` tokens per row
        where = "the cache holds"
    capacity = pages.shape[1] * size
    totals = seqlens + s_new
    for b in np.flatnonzero(totals > capacity):
        raise ValueError(
            f"sequence {b}: cache_seqlens {seqlens[b]} + {s_new} new tokens = {totals[b]} keys, "
            f"but {where} {capacity} ({pages.shape[1]} x {size}); flash-attn would read and "
            f"write out of bounds there (flash-attn #2709)"
        )
    _check_pages(pages, totals, size, blocks, "block_table" if block_table is not None else None)
    if k is not None:
        _check_distinct_writes(pages, seqlens, s_new, size)

    lo = np.zeros(batch, np.int64)
    if cache_leftpad is not None:
        lo = _lengths("cache_leftpad", cache_leftpad, batch, scalar=False)
        for b in np.flatnonzero(lo > seqlens):
            raise ValueError(
                f"sequence {b}: cache_leftpad {lo[b]} is past its cache_seqlens {seqlens[b]}"
            )
    causal = validation.flag("causal", causal)
    left, right = _window(window_size)
    if left is not None:  # keys left of the first query's window are hidden from every query
        lo = np.maximum(lo, totals - s_q - left)
    lo = np.minimum(lo, totals)
    # flash-attn drops a window side that spans the whole cache before deciding where q turns
    local = any(side is not None and side < capacity for side in (left, right))
    rotary = _rotary(rotary_cos, rotary_sin, k is not None, width, compute)
    q_moves = causal or local
    if rotary is not None:
        last = max(s_new, s_q if q_moves else 1)
        for b in np.flatnonzero(seqlens + last > len(rotary[0])):
            raise ValueError(
                f"sequence {b}: rotary positions reach {seqlens[b] + last - 1}, but rotary_cos "
                f"and rotary_sin have {len(rotary[0])} rows"
            )
    scale = 1.0 / math.sqrt(width) if softmax_scale is None else softmax_scale
    cap = validation.finite_real("softcap", softcap)
    if cap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    slopes = None if alibi_slopes is None else validation.float_array("alibi_slopes", alibi_slopes)
    if slopes is not None and (
        slopes.shape not in ((heads,), (batch, heads)) or not np.all(np.isfinite(slopes))
    ):
        raise ValueError(
            f"alibi_slopes must be finite, (H,) = ({heads},) or (B, H) = ({batch}, {heads}); "
            f"got shape {slopes.shape}"
        )
    options = {
        "causal": causal,
        "window": None if left is None and right is None else (left, right),
        "align": "bottom-right",
        "scale": validation.finite_real("softmax_scale", scale),
        "softcap": cap,
        "enable_gqa": True,
    }
    interleaved = validation.flag("rotary_interleaved", rotary_interleaved)
    validation.flag("return_lse", return_lse)
    call = DecodeCall(
        pages, seqlens, s_new, lo, rotary, q_moves, interleaved, options, slopes, compute
    )
    return call, q, k, v


def _lengths(name: str, value: Any, batch: int, scalar: bool = True) -> np.ndarray:
    """A length per sequence, (B,) int64 >= 0, from integers (B,) (or one int when ``scalar``)."""
    if scalar and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = np.full(batch, value)
    lengths = _indices(name, value, (batch,))
    for b in np.flatnonzero(lengths < 0):
        raise ValueError(f"sequence {b}: {name} is negative ({lengths[b]})")
    return lengths


def _indices(name: str, value: Any, shape: tuple[int | None, ...]) -> np.ndarray:
    """An integer array of ``shape`` (None: any size) as int64; ``TypeError`` for another dtype
    (a float or bool table would index something else), ``ValueError`` for another shape."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {array.dtype}")
    if array.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(array.shape, shape, strict=True)
    ):
        wanted = tuple("any" if want is None else want for want in shape)
        raise ValueError(f"{name} must have shape {wanted}, got {array.shape}")
    return array.astype(np.int64)


def _check_pages(
    pages: np.ndarray, totals: np.ndarray, size: int, blocks: int, table: str | None
) -> None:
    """Every page a sequence reads or writes (the first ceil(L_b / P) of its table) exists."""
    for b, total in enumerate(totals):
        used = pages[b, : -(-int(total) // size)]
        bad = np.flatnonzero((used < 0) | (used >= blocks))
        if bad.size:
            what = f"block_table[{b}, {bad[0]}]" if table else f"cache_batch_idx[{b}]"
            pool = "pages" if table else "rows"
            raise ValueError(
                f"sequence {b}: {what} = {used[bad[0]]} is not one of the cache's {blocks} {pool}"
            )


def _check_distinct_writes(pages: np.ndarray, seqlens: np.ndarray, s_new: int, size: int) -> None:
    """No two sequences write the same cache slot (the result would depend on the order)."""
    owner: dict[tuple[int, int], int] = {}
    for b, start in enumerate(seqlens):
        for t in range(int(start), int(start) + s_new):
            slot = (int(pages[b, t // size]), t % size)
            if slot in owner:
                raise ValueError(
                    f"sequences {owner[slot]} and {b} both write page/row {slot[0]}, slot "
                    f"{slot[1]}: their new keys would overwrite each other"
                )
            owner[slot] = b


def _window(value: Any) -> tuple[int | None, int | None]:
    """flash-attn's ``window_size`` (left, right), -1 for an unbounded side, as None sides."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"window_size must be (left, right), got {value!r}")
    sides = []
    for i, side in enumerate(value):
        side = validation.integer(f"window_size[{i}]", side)
        if side < -1:
            raise ValueError(f"window_size[{i}] must be >= 0, or -1 for unbounded, got {side}")
        sides.append(None if side == -1 else side)
    return sides[0], sides[1]


def _rotary(
    cos: Any, sin: Any, appends: bool, width: int, compute: np.dtype
) -> tuple[np.ndarray, np.ndarray] | None:
    """cos and sin (seqlen_ro, rotary_dim / 2) in the compute dtype, rotary_dim even and <= D."""
    if cos is None and sin is None:
        return None
    if cos is None or sin is None:
        raise ValueError("rotary_cos and rotary_sin go together: give both or neither")
    cos, sin = validation.float_array("rotary_cos", cos), validation.float_array("rotary_sin", sin)
    if cos.ndim != 2 or cos.shape != sin.shape or not 0 < 2 * cos.shape[1] <= width:
        raise ValueError(
            f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2) with rotary_dim "
            f"<= D = {width}, got {cos.shape} and {sin.shape}"
        )
    if not appends:
        raise ValueError("rotary embeds the new keys: give k and v with rotary_cos and rotary_sin")
    return cos.astype(compute), sin.astype(compute)
