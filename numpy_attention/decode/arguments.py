"""The decode contract's argument checks, in pure Python: every refusal of flash-attn's
``flash_attn_with_kvcache`` semantics, written once for both twins (``kvcache_attention_forward``
here, ``torch_attention.decode.paged.kvcache_attention``), and the plan of the call they leave.

Each twin reads its own arrays or tensors into what this module needs (shapes, the dtype name
and values of an integer table, whether slopes are finite) and checks what only it can (floating
dtypes, one dtype, one device); everything else is checked here, in one order, with one message
per refusal, before anything is written: a length past the cache's capacity or the block table
(flash-attn #2709), a page id outside the pool, a negative length, a non-integer table, two
sequences writing one slot, a rotary table too short. No NumPy and no torch: the messages cannot
drift apart between the twins.

The plan, ``DecodePlan``: each sequence's pages in order (a contiguous cache is one page of
``capacity`` tokens per row), its length, the first key any of its queries can see, and the score
options of ``attention_forward`` / ``functional.attention`` (aligned bottom-right).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, P page size, L_b the keys of sequence b.

Derivation: docs/decoding.md (section 2, the arguments; section 3, capacity; section 4, why
reading the keys from the first one visible is exact).
Tests: tests/numpy_attention/decode/test_arguments.py; through each twin,
tests/numpy_attention/decode/test_checks.py and tests/torch_attention/decode/test_checks.py.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

__all__ = ["DecodePlan", "Integers", "plan_call"]

Shape = tuple[int, ...]


class Integers(NamedTuple):
    """An integer argument (lengths, indices, a block table) as a twin reads it."""

    dtype: str  # as the twin names it, for the message
    integral: bool  # whether that dtype is an integer one (bool is not)
    shape: Shape
    values: Any  # (nested) Python lists of int, or an int for shape (); None unless integral


class DecodePlan(NamedTuple):
    """One call's arguments, checked: every sequence's pages and the keys it attends."""

    pages: list[list[int]]  # (B, pages per sequence): each sequence's pages in order
    seqlens: list[int]  # (B,), before the new tokens
    s_new: int
    lo: list[int]  # (B,): the first key any query of the sequence can see
    q_moves: bool  # rotate query i at seqlens + i (causal or windowed), else all at seqlens
    options: dict[str, Any]  # the score options (causal, window, align, scale, softcap, GQA)


def plan_call(
    *,
    q: Shape,
    k_cache: Shape,
    v_cache: Shape,
    k: Shape | None,
    v: Shape | None,
    rotary_cos: Shape | None,
    rotary_sin: Shape | None,
    cache_seqlens: Integers,
    cache_batch_idx: Integers | None,
    cache_leftpad: Integers | None,
    block_table: Integers | None,
    softmax_scale: Any,
    causal: bool,
    window_size: Any,
    softcap: Any,
    alibi_slopes: Shape | None,
    alibi_finite: bool,
) -> DecodePlan:
    """Every argument of a decode call checked, before anything is written; what it resolves to.

    Args:
        q, k_cache, v_cache, k, v: the shapes of the arrays (k, v: None when nothing is
            appended), already checked floating and of one dtype by the twin.
        rotary_cos, rotary_sin: the shapes of the rotary tables, or None.
        cache_seqlens: the lengths before the new tokens: (B,), or shape () for one length.
        cache_batch_idx, cache_leftpad, block_table: as given, or None.
        softmax_scale, window_size, softcap: as given.
        causal: a bool, checked by the twin.
        alibi_slopes: the shape of the slopes, or None; alibi_finite: whether all are finite.

    Raises:
        TypeError, ValueError: naming the argument, the shapes or the sequence.
    """
    if (k is None) != (v is None):
        raise ValueError("k and v are appended together: give both or neither")
    for name, shape in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if shape is not None and len(shape) != 4:
            raise ValueError(f"{name} must have 4 axes, got shape {shape}")
    batch, s_q, heads, width = q
    blocks, size, kv_heads = k_cache[:3]
    if v_cache[:3] != k_cache[:3] or k_cache[-1] != width or width == 0:
        raise ValueError(
            f"k_cache and v_cache must share their first 3 axes, and k_cache the head width "
            f"D > 0 of q: got q {q}, k_cache {k_cache}, v_cache {v_cache}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {q}, k_cache {k_cache})"
        )
    s_new = 0
    if k is not None and v is not None:
        if k[:3] != (batch, k[1], kv_heads) or v[:3] != k[:3]:
            raise ValueError(
                f"k and v must be (B, s_new, H_kv, W) with B = {batch} and H_kv = {kv_heads}, "
                f"got k {k} and v {v}"
            )
        if k[-1] != width or v[-1] != v_cache[-1]:
            raise ValueError(
                f"k and v must have the head widths of k_cache and v_cache, got k {k}, v {v}, "
                f"k_cache {k_cache}, v_cache {v_cache}"
            )
        s_new = k[1]

    seqlens = _lengths("cache_seqlens", cache_seqlens, batch, scalar=True)
    if block_table is not None:
        if cache_batch_idx is not None or cache_leftpad is not None:
            raise ValueError(
                "cache_batch_idx and cache_leftpad index a contiguous cache: flash-attn refuses "
                "them with a block_table, and so does this reference"
            )
        pages = _indices("block_table", block_table, (batch, None))
        per_sequence = block_table.shape[1]
        where = "its block table holds"
    else:
        rows = list(range(batch))
        if cache_batch_idx is not None:
            rows = _indices("cache_batch_idx", cache_batch_idx, (batch,))
        pages = [[row] for row in rows]  # a contiguous cache is one page of capacity per row
        per_sequence = 1
        where = "the cache holds"
    capacity = per_sequence * size
    totals = [length + s_new for length in seqlens]
    for b, total in enumerate(totals):
        if total > capacity:
            raise ValueError(
                f"sequence {b}: cache_seqlens {seqlens[b]} + {s_new} new tokens = {total} keys, "
                f"but {where} {capacity} ({per_sequence} x {size}); flash-attn would read and "
                f"write out of bounds there (flash-attn #2709)"
            )
    _check_pages(pages, totals, size, blocks, paged=block_table is not None)
    if k is not None:
        _check_distinct_writes(pages, seqlens, s_new, size)

    lo = [0] * batch
    if cache_leftpad is not None:
        lo = _lengths("cache_leftpad", cache_leftpad, batch, scalar=False)
        for b in range(batch):
            if lo[b] > seqlens[b]:
                raise ValueError(
                    f"sequence {b}: cache_leftpad {lo[b]} is past its cache_seqlens {seqlens[b]}"
                )
    left, right = _window(window_size)
    if left is not None:  # keys left of the first query's window are hidden from every query
        lo = [max(first, total - s_q - left) for first, total in zip(lo, totals, strict=True)]
    lo = [min(first, total) for first, total in zip(lo, totals, strict=True)]
    # flash-attn drops a window side that spans the whole cache before deciding where q turns
    local = any(side is not None and side < capacity for side in (left, right))
    q_moves = causal or local
    rotates = _rotary(rotary_cos, rotary_sin, k is not None, width)
    if rotates and rotary_cos is not None:
        rows_ro = rotary_cos[0]
        last = max(s_new, s_q if q_moves else 1)
        for b in range(batch):
            if seqlens[b] + last > rows_ro:
                raise ValueError(
                    f"sequence {b}: rotary positions reach {seqlens[b] + last - 1}, but "
                    f"rotary_cos and rotary_sin have {rows_ro} rows"
                )
    scale = 1.0 / math.sqrt(width) if softmax_scale is None else softmax_scale
    cap = _finite_real("softcap", softcap)
    if cap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    if alibi_slopes is not None and (
        alibi_slopes not in ((heads,), (batch, heads)) or not alibi_finite
    ):
        raise ValueError(
            f"alibi_slopes must be finite, (H,) = ({heads},) or (B, H) = ({batch}, {heads}); "
            f"got shape {alibi_slopes}"
        )
    options = {
        "causal": causal,
        "window": None if left is None and right is None else (left, right),
        "align": "bottom-right",
        "scale": _finite_real("softmax_scale", scale),
        "softcap": cap,
        "enable_gqa": True,
    }
    return DecodePlan(pages, seqlens, s_new, lo, q_moves, options)


def _lengths(name: str, value: Integers, batch: int, *, scalar: bool) -> list[int]:
    """A length per sequence (>= 0) from integers (B,), or from one integer when ``scalar``."""
    if scalar and value.integral and value.shape == ():
        value = Integers(value.dtype, True, (batch,), [value.values] * batch)
    lengths = _indices(name, value, (batch,))
    for b, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"sequence {b}: {name} is negative ({length})")
    return lengths


def _indices(name: str, value: Integers, shape: tuple[int | None, ...]) -> Any:
    """The values of integers of ``shape`` (None: any size); ``TypeError`` for another dtype (a
    float or bool table would index something else), ``ValueError`` for another shape."""
    if not value.integral:
        raise TypeError(f"{name} must be an integer array, got dtype {value.dtype}")
    if len(value.shape) != len(shape) or any(
        want is not None and got != want for got, want in zip(value.shape, shape, strict=True)
    ):
        wanted = tuple("any" if want is None else want for want in shape)
        raise ValueError(f"{name} must have shape {wanted}, got {value.shape}")
    return value.values


def _check_pages(
    pages: list[list[int]], totals: list[int], size: int, blocks: int, *, paged: bool
) -> None:
    """Every page a sequence reads or writes (the first ceil(L_b / P) of its table) exists."""
    for b, total in enumerate(totals):
        for i, page in enumerate(pages[b][: -(-total // size)]):
            if not 0 <= page < blocks:
                what = f"block_table[{b}, {i}]" if paged else f"cache_batch_idx[{b}]"
                pool = "pages" if paged else "rows"
                raise ValueError(
                    f"sequence {b}: {what} = {page} is not one of the cache's {blocks} {pool}"
                )


def _check_distinct_writes(
    pages: list[list[int]], seqlens: list[int], s_new: int, size: int
) -> None:
    """No two sequences write the same cache slot (the result would depend on the order)."""
    owner: dict[tuple[int, int], int] = {}
    for b, start in enumerate(seqlens):
        for t in range(start, start + s_new):
            slot = (pages[b][t // size], t % size)
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
        if isinstance(side, bool) or not isinstance(side, numbers.Integral):
            raise TypeError(f"window_size[{i}] must be an int, got {side!r}")
        if side < -1:
            raise ValueError(f"window_size[{i}] must be >= 0, or -1 for unbounded, got {side}")
        sides.append(None if side == -1 else int(side))
    return sides[0], sides[1]


def _finite_real(name: str, value: Any) -> float:
    """A finite real number (not a bool), as float: ``validation.finite_real``'s rule."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _rotary(cos: Shape | None, sin: Shape | None, appends: bool, width: int) -> bool:
    """Whether the call rotates: cos and sin both (seqlen_ro, rotary_dim / 2) with rotary_dim
    even and <= D, given with new keys; or neither."""
    if cos is None and sin is None:
        return False
    if cos is None or sin is None:
        raise ValueError("rotary_cos and rotary_sin go together: give both or neither")
    if len(cos) != 2 or cos != sin or not 0 < 2 * cos[1] <= width:
        raise ValueError(
            f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2) with rotary_dim "
            f"<= D = {width}, got {cos} and {sin}"
        )
    if not appends:
        raise ValueError("rotary embeds the new keys: give k and v with rotary_cos and rotary_sin")
    return True
