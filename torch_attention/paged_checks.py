"""The checks of ``paged.kvcache_attention``'s arguments in torch, and what they resolve to: the
twin of ``numpy_attention.paged_checks`` (the same refusals and messages, made before anything
is written), leaving ``DecodeCall``: each sequence's pages in order, its length, the first key
any of its queries can see, and the score options of ``functional.attention``. Lengths, tables
and indices may live on any device: they are read on the host (one sync per call).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, P page size.

Derivation: docs/decoding.md (sections 2 to 4).
Tests: tests/torch_attention/test_paged_checks.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from . import validation

__all__ = ["DecodeCall", "check_call", "compute_dtype"]

_HALF = (torch.float16, torch.bfloat16)


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


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a decode call computes in: float32 for half inputs, else theirs."""
    return torch.float32 if dtype in _HALF else dtype


def check_call(
    q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
    cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
    alibi_slopes, return_lse,
) -> DecodeCall:  # fmt: skip
    """Every argument of ``kvcache_attention`` checked, before anything is written (the NumPy
    twin's checks and messages)."""
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if (k is None) != (v is None):
        raise ValueError("k and v are appended together: give both or neither")
    if k is not None:
        tensors["k"], tensors["v"] = k, v
    for name, t in tensors.items():
        validation.float_tensor(name, t)
        if t.ndim != 4:
            raise ValueError(f"{name} must have 4 axes, got shape {tuple(t.shape)}")
    validation.same_dtype(**tensors)
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(
            f"q, the caches, k and v must share one device, got {sorted(map(str, devices))}"
        )
    batch, s_q, heads, width = q.shape
    blocks, size, kv_heads = k_cache.shape[:3]
    if v_cache.shape[:3] != k_cache.shape[:3] or k_cache.shape[-1] != width or width == 0:
        raise ValueError(
            f"k_cache and v_cache must share their first 3 axes, and k_cache the head width "
            f"D > 0 of q: got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache "
            f"{tuple(v_cache.shape)}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)})"
        )
    s_new = 0
    if k is not None:
        if tuple(k.shape[:3]) != (batch, k.shape[1], kv_heads) or v.shape[:3] != k.shape[:3]:
            raise ValueError(
                f"k and v must be (B, s_new, H_kv, W) with B = {batch} and H_kv = {kv_heads}, "
                f"got k {tuple(k.shape)} and v {tuple(v.shape)}"
            )
        if k.shape[-1] != width or v.shape[-1] != v_cache.shape[-1]:
            raise ValueError(
                f"k and v must have the head widths of k_cache and v_cache, got k "
                f"{tuple(k.shape)}, v {tuple(v.shape)}, k_cache {tuple(k_cache.shape)}, v_cache "
                f"{tuple(v_cache.shape)}"
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
        per_sequence = torch.as_tensor(block_table).shape[1]
        where = "its block table holds"
    else:
        rows = list(range(batch))
        if cache_batch_idx is not None:
            rows = _indices("cache_batch_idx", cache_batch_idx, (batch,))
        pages = [[row] for row in rows]  # a contiguous cache is one page per row
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
    for b, total in enumerate(totals):
        for i, page in enumerate(pages[b][: -(-total // size)]):
            if not 0 <= page < blocks:
                what = (
                    f"block_table[{b}, {i}]" if block_table is not None else f"cache_batch_idx[{b}]"
                )
                pool = "pages" if block_table is not None else "rows"
                raise ValueError(
                    f"sequence {b}: {what} = {page} is not one of the cache's {blocks} {pool}"
                )
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
    causal = validation.flag("causal", causal)
    left, right = _window(window_size)
    if left is not None:  # keys left of the first query's window are hidden from every query
        lo = [max(first, total - s_q - left) for first, total in zip(lo, totals, strict=True)]
    lo = [min(first, total) for first, total in zip(lo, totals, strict=True)]
    # flash-attn drops a window side that spans the whole cache before deciding where q turns
    local = any(side is not None and side < capacity for side in (left, right))
    rotary = _rotary(rotary_cos, rotary_sin, k is not None, width, q)
    q_moves = causal or local
    if rotary is not None:
        last = max(s_new, s_q if q_moves else 1)
        for b in range(batch):
            if seqlens[b] + last > rotary[0].shape[0]:
                raise ValueError(
                    f"sequence {b}: rotary positions reach {seqlens[b] + last - 1}, but "
                    f"rotary_cos and rotary_sin have {rotary[0].shape[0]} rows"
                )
    scale = 1.0 / math.sqrt(width) if softmax_scale is None else softmax_scale
    cap = validation.finite_real("softcap", softcap)
    if cap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    slopes = None
    if alibi_slopes is not None:
        slopes = validation.float_tensor("alibi_slopes", torch.as_tensor(alibi_slopes))
        if tuple(slopes.shape) not in ((heads,), (batch, heads)) or not bool(
            torch.isfinite(slopes).all()
        ):
            raise ValueError(
                f"alibi_slopes must be finite, (H,) = ({heads},) or (B, H) = ({batch}, {heads}); "
                f"got shape {tuple(slopes.shape)}"
            )
        slopes = slopes.to(q.device)
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
    return DecodeCall(pages, seqlens, s_new, lo, rotary, q_moves, interleaved, options, slopes)


def _lengths(name: str, value: Any, batch: int, scalar: bool = True) -> list[int]:
    """A length per sequence (>= 0) from integers (B,) (or one int when ``scalar``)."""
    if scalar and isinstance(value, int) and not isinstance(value, bool):
        value = [value] * batch
    lengths = _indices(name, value, (batch,))
    for b, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"sequence {b}: {name} is negative ({length})")
    return lengths


def _indices(name: str, value: Any, shape: tuple[int | None, ...]) -> Any:
    """Integers of ``shape`` (None: any size) as (nested) Python lists; ``TypeError`` for another
    dtype, ``ValueError`` for another shape."""
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer array, got dtype {tensor.dtype}")
    if tensor.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(tensor.shape, shape, strict=True)
    ):
        wanted = tuple("any" if want is None else want for want in shape)
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(tensor.shape)}")
    return tensor.tolist()


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
        side = validation.integer(f"window_size[{i}]", side)
        if side < -1:
            raise ValueError(f"window_size[{i}] must be >= 0, or -1 for unbounded, got {side}")
        sides.append(None if side == -1 else side)
    return sides[0], sides[1]


def _rotary(
    cos: Any, sin: Any, appends: bool, width: int, q: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """cos and sin (seqlen_ro, rotary_dim / 2) in q's compute dtype on its device."""
    if cos is None and sin is None:
        return None
    if cos is None or sin is None:
        raise ValueError("rotary_cos and rotary_sin go together: give both or neither")
    cos = validation.float_tensor("rotary_cos", cos)
    sin = validation.float_tensor("rotary_sin", sin)
    if cos.ndim != 2 or cos.shape != sin.shape or not 0 < 2 * cos.shape[1] <= width:
        raise ValueError(
            f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2) with rotary_dim "
            f"<= D = {width}, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if not appends:
        raise ValueError("rotary embeds the new keys: give k and v with rotary_cos and rotary_sin")
    compute = compute_dtype(q.dtype)
    return cos.to(q.device, compute), sin.to(q.device, compute)
