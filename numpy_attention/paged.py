"""Decoding over a KV cache, contiguous or in pages: flash-attn's ``flash_attn_with_kvcache``,
exactly (``kvcache_attention_forward``), and ``PagedKVCache``, the page pool and block table a
serving engine keeps for one attention layer.

A decode kernel reads the keys and values of earlier tokens from a cache, writes this call's new
ones into it, and attends. What each argument means, with pictures of a block table:
docs/decoding.md. In brief, for sequence b with L_b = cache_seqlens[b] + s_new keys:

- the new k, v are written in place at cache positions [cache_seqlens[b], L_b);
- the cache of sequence b is row ``cache_batch_idx[b]`` (default b) of a contiguous cache
  (B_cache, capacity, H_kv, D), or, with ``block_table``, the pages ``block_table[b, 0]``,
  ``block_table[b, 1]``, ... of a pool (num_blocks, page_size, H_kv, D), in that order: position
  t lies in page ``block_table[b, t // page_size]`` at slot ``t % page_size``;
- rotary rotates the new key i at position cache_seqlens[b] + i, and query i at the same
  position when causal or windowed, else every query at cache_seqlens[b];
- query i sits at key position p_i = L_b - s_q + i (bottom-right): causal sees j <= p_i, a
  window (left, right) p_i - left <= j <= p_i + right, ALiBi subtracts slope * |p_i - j|; keys
  before ``cache_leftpad[b]`` are hidden.

Every rule of the scores is the one score pipeline's (``functional.attention_forward`` with
``align="bottom-right"``): this module only finds each sequence's keys. A contiguous cache is
read as one page per row, so both layouts take one path. Keys [lo, L_b) of a sequence are a view
of the pool when their pages are consecutive in it (``PagedKVCache`` allocates that way when it
can), and are gathered otherwise; lo skips what no query can see (leftpad, the keys left of the
first query's window). Any suffix [lo, L_b) of the key axis, aligned bottom-right, puts p_i at
the same absolute position, so the suffix read is exact.

Forward only: a decode kernel has no backward. Its gradient is ``attention_backward`` of the
same attention on the gathered, rotated keys (tests/numpy_attention/test_paged.py shows it).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size, L_b the keys of sequence b.

Derivation: docs/decoding.md (the semantics: arguments, alignments, block tables); the scores:
docs/derivations/attention.md and the pages it links.
Tests: tests/numpy_attention/test_paged.py (against a plain torch reference of flash-attn's
semantics written in the test, in float64), tests/numpy_attention/test_grouped.py (the layer
over pages).
"""

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple

import numpy as np

from . import validation
from .functional import attention_forward
from .grad_mode import no_grad
from .rope import rotate_pairs
from .scores import AttentionOutput

__all__ = ["KVCacheOutput", "PagedKVCache", "kvcache_attention_forward"]


class KVCacheOutput(NamedTuple):
    """What ``kvcache_attention_forward`` returns.

    out: (B, s_q, H, Dv) in q's dtype. lse: (B, H, s_q), natural log, in the compute dtype
    (float32 for float16), -inf for a query with nothing to attend to; None unless asked for.
    """

    out: np.ndarray
    lse: np.ndarray | None


class _Call(NamedTuple):
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


def kvcache_attention_forward(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    *,
    k: np.ndarray | None = None,
    v: np.ndarray | None = None,
    rotary_cos: np.ndarray | None = None,
    rotary_sin: np.ndarray | None = None,
    cache_seqlens: Any,
    cache_batch_idx: np.ndarray | None = None,
    cache_leftpad: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: np.ndarray | None = None,
    return_lse: bool = False,
) -> KVCacheOutput:
    """flash-attn's ``flash_attn_with_kvcache``: append k, v to the cache in place, then attend.

    For each sequence b (L_b = cache_seqlens[b] + s_new): write k[b], v[b] (rotated keys) at
    cache positions [cache_seqlens[b], L_b); then O = softmax(S) V over the cache's keys
    [0, L_b) with the score pipeline of ``attention_forward`` aligned bottom-right (query i at
    p_i = L_b - s_q + i), keys before cache_leftpad[b] hidden.

    Args:
        q: (B, s_q, H, D) queries.
        k_cache: (B_cache, capacity, H_kv, D), or with ``block_table`` the page pool
            (num_blocks, P, H_kv, D); written in place when k is given.
        v_cache: the same with Dv: (B_cache, capacity, H_kv, Dv) or (num_blocks, P, H_kv, Dv).
        k: (B, s_new, H_kv, D) new keys, or None (nothing appended).
        v: (B, s_new, H_kv, Dv) new values; given with k.
        rotary_cos: (seqlen_ro, rotary_dim / 2), rotary_dim <= D even; needs k. The first
            rotary_dim coordinates of the new keys and of q are rotated.
        rotary_sin: the same shape as rotary_cos.
        cache_seqlens: int, or integers (B,): each sequence's length before the new tokens.
        cache_batch_idx: integers (B,): the cache row of each sequence (default b); distinct when
            appending; not with ``block_table`` (flash-attn refuses it too).
        cache_leftpad: integers (B,): keys before it are hidden, 0 <= leftpad <= cache_seqlens;
            not with ``block_table`` (flash-attn refuses it too).
        block_table: integers (B, max_blocks): the pages of each sequence, in order.
        softmax_scale: multiplies q k^T; default 1 / sqrt(D).
        causal: query i sees keys j <= p_i.
        window_size: (left, right), -1 for an unbounded side: p_i - left <= j <= p_i + right.
        softcap: > 0 caps the scores, softcap * tanh(S / softcap); 0 = off.
        rotary_interleaved: pairs (x_2i, x_2i+1) (GPT-J, flash-attn's default) when True, else
            (x_i, x_i+rotary_dim/2) (GPT-NeoX, Hugging Face's rotate_half).
        alibi_slopes: (H,) or (B, H): S -= slope * |p_i - j|.
        return_lse: also return lse (B, H, s_q).

    Returns:
        ``KVCacheOutput(out, lse)``: out (B, s_q, H, Dv) in q's dtype, lse (B, H, s_q) or None.

    Raises:
        TypeError, ValueError: naming the argument, the shapes, or the sequence, before anything
            is written: a length beyond the cache's capacity or the block table
            (cache_seqlens + s_new > max_blocks * P), a page id outside the pool, a negative
            length, a non-integer table, a rotary table too short for the positions.
    """
    call, q, k, v = _check_call(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, return_lse,
    )  # fmt: skip
    q, k = _rotated(call, q, k)
    if k is not None and v is not None:
        for b in range(len(q)):
            positions = np.arange(call.seqlens[b], call.seqlens[b] + call.s_new)
            write_tokens(k_cache, call.pages[b], positions, k[b])
            write_tokens(v_cache, call.pages[b], positions, v[b])
    outs: list[np.ndarray] = []
    lses: list[np.ndarray] = []
    for b in range(len(q)):
        hi = int(call.seqlens[b]) + call.s_new
        # views, or gathered into this thread's two buffers, used up before the next sequence
        keys = read_tokens(k_cache, call.pages[b], int(call.lo[b]), hi, scratch=0)  # (M, H_kv, D)
        values = read_tokens(v_cache, call.pages[b], int(call.lo[b]), hi, scratch=1)
        slopes = call.slopes if call.slopes is None or call.slopes.ndim == 1 else call.slopes[b]
        with no_grad():  # forward only: nothing kept
            result = attention_forward(
                q[b].swapaxes(0, 1)[None],  # (s_q, H, D) -> (1, H, s_q, D)
                keys.swapaxes(0, 1)[None],  # (M, H_kv, D) -> (1, H_kv, M, D), a view
                values.swapaxes(0, 1)[None],
                alibi_slopes=slopes,
                return_lse=True,
                **call.options,
            )
        outs.append(result.out[0].swapaxes(0, 1))  # (H, s_q, Dv) -> (s_q, H, Dv)
        if result.lse is not None:  # always: asked for
            lses.append(result.lse[0])  # (H, s_q)
    out = np.stack(outs) if outs else np.zeros(q.shape[:3] + v_cache.shape[-1:], q.dtype)
    lse = None
    if return_lse:
        lse = np.stack(lses) if lses else np.zeros((0, q.shape[2], q.shape[1]), call.compute)
    return KVCacheOutput(out, lse)


def _rotated(
    call: _Call, q: np.ndarray, k: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """q and the new keys rotated as the call says; unchanged without rotary."""
    if call.rotary is None or k is None:
        return q, k
    return rotate_new_tokens(
        q, k, *call.rotary, call.seqlens, moves=call.q_moves, interleaved=call.interleaved
    )


def rotate_new_tokens(
    q: np.ndarray,
    k: np.ndarray,
    rotary_cos: np.ndarray,
    rotary_sin: np.ndarray,
    cache_seqlens: np.ndarray,
    *,
    moves: bool,
    interleaved: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """flash-attn's rotary of a decode call: the new key i of sequence b at position
    cache_seqlens[b] + i; query i there too when ``moves`` (causal or windowed), else at
    cache_seqlens[b]. Only the first rotary_dim = 2 * rotary_cos.shape[1] coordinates turn.

    Args: q (B, s_q, H, D), k (B, s_new, H_kv, D), rotary_cos and rotary_sin (seqlen_ro,
        rotary_dim / 2) in the compute dtype, cache_seqlens (B,) integers; no checks (the
        caller's).

    Returns:
        q and k rotated in the tables' dtype, then rounded to their own (as a cache stores keys
        and flash-attn's kernel reads the rotated query).
    """
    width = 2 * rotary_cos.shape[-1]
    offsets = np.arange(q.shape[1]) if moves else np.zeros(q.shape[1], np.int64)
    rotated = []
    for x, steps in ((q, offsets), (k, np.arange(k.shape[1]))):
        positions = np.asarray(cache_seqlens)[:, None] + steps[None, :]  # (B, s)
        cos, sin = rotary_cos[positions][:, :, None], rotary_sin[positions][:, :, None]
        part = x[..., :width].astype(rotary_cos.dtype)  # cos, sin: (B, s, 1, rot / 2)
        turned = rotate_pairs(part, cos, sin, interleaved=interleaved)
        rotated.append(np.concatenate([turned.astype(x.dtype), x[..., width:]], axis=-1))
    return rotated[0], rotated[1]


def read_tokens(
    pool: np.ndarray, pages: np.ndarray, lo: int, hi: int, scratch: int | None = None
) -> np.ndarray:
    """Tokens [lo, hi) of the sequence whose pages, in order, are ``pages``, (hi - lo, H_kv, W).

    pool: (num_pages, P, H_kv, W). A view when the pages holding them are consecutive in the
    pool; otherwise the pages are gathered, into a new array, or with ``scratch`` (a slot
    number) into this thread's buffer of that slot, reused from call to call: the result is
    then valid until the next gather into the same slot. A fresh array of a cache's size costs
    a page fault per 4 KiB when first written: measured, gathering 16 MiB of keys took 4.6 ms
    into new arrays, 1.8 ms into a reused buffer.
    """
    size = pool.shape[1]
    if hi <= lo:
        return pool[:0, :0].reshape((0,) + pool.shape[2:])
    first, last = lo // size, -(-hi // size)  # the pages covering [lo, hi)
    ids = pages[first:last]
    if np.all(np.diff(ids) == 1):  # one run of pages: a view, nothing copied
        tokens = pool[ids[0] : ids[-1] + 1].reshape((-1,) + pool.shape[2:])
    elif scratch is None:
        tokens = pool[ids].reshape((-1,) + pool.shape[2:])  # (pages * P, H_kv, W), gathered
    else:
        out = _buffer(scratch, (len(ids),) + pool.shape[1:], pool.dtype)
        # the ids were checked against the pool: "clip" never clips, and spares take's buffer
        np.take(pool, ids, axis=0, out=out, mode="clip")
        tokens = out.reshape((-1,) + pool.shape[2:])  # (pages * P, H_kv, W)
    return tokens[lo - first * size : hi - first * size]


_GATHERED = threading.local()


def _buffer(slot: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """This thread's buffer number ``slot``, grown to hold ``shape`` of ``dtype``, as that."""
    buffers = getattr(_GATHERED, "buffers", None)
    if buffers is None:
        buffers = _GATHERED.buffers = {}
    size = math.prod(shape)
    buffer = buffers.get(slot)
    if buffer is None or buffer.dtype != dtype or buffer.size < size:
        buffer = buffers[slot] = np.empty(size, dtype)
    return buffer[:size].reshape(shape)


def write_tokens(pool: np.ndarray, pages: np.ndarray, positions: np.ndarray, tokens: Any) -> None:
    """Write ``tokens`` (len(positions), H_kv, W) at ``positions`` of the sequence whose pages
    are ``pages``, in place: position t goes to page pages[t // P], slot t % P."""
    size = pool.shape[1]
    pool[pages[positions // size], positions % size] = tokens


def _check_call(
    q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
    cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
    alibi_slopes, return_lse,
) -> tuple[_Call, np.ndarray, np.ndarray | None, np.ndarray | None]:  # fmt: skip
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
    call = _Call(pages, seqlens, s_new, lo, rotary, q_moves, interleaved, options, slopes, compute)
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


# -- the page pool ------------------------------------------------------------------------------


class PagedKVCache:
    """The keys and values of one attention layer in pages of a shared pool, as a serving engine
    keeps them: each sequence holds a list of pages (its row of the block table) and a length.

    ``k`` (num_blocks, P, H_kv, D) and ``v`` (num_blocks, P, H_kv, Dv) are the pool, in
    flash-attn's paged layout, so ``kvcache_attention_forward(q, cache.k, cache.v,
    cache_seqlens=cache.cache_seqlens, block_table=cache.block_table, ...)`` reads it. Keys are
    stored after RoPE. A sequence's next page is the one after its last when that one is free
    (so its pages stay consecutive and are read in place), else the lowest free page.

    The first ``append`` (or ``reserve``) of B sequences starts them; every later one writes the
    same number of tokens to each, so they share one ``length`` (the layer's decode step).

    Args:
        num_blocks: pages in the pool.
        page_size: P, tokens per page.
        num_kv_heads: H_kv.
        head_dim: D.
        v_head_dim: Dv; None for D.
        dtype: a floating dtype, that of the layer it serves.
    """

    def __init__(
        self,
        num_blocks: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int | None = None,
        dtype: Any = np.float32,
    ) -> None:
        num_blocks = validation.positive_int("num_blocks", num_blocks)
        self.page_size = validation.positive_int("page_size", page_size)
        num_kv_heads = validation.positive_int("num_kv_heads", num_kv_heads)
        head_dim = validation.positive_int("head_dim", head_dim)
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        v_head_dim = validation.positive_int("v_head_dim", v_head_dim)
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise TypeError(f"PagedKVCache needs a floating dtype, got {dtype}")
        self.k = np.zeros((num_blocks, self.page_size, num_kv_heads, head_dim), dtype=dtype)
        self.v = np.zeros((num_blocks, self.page_size, num_kv_heads, v_head_dim), dtype=dtype)
        self._owned = np.zeros(num_blocks, dtype=bool)
        self._tables: list[list[int]] = []
        self._length = 0

    @property
    def length(self) -> int:
        """How many tokens every sequence holds."""
        return self._length

    @property
    def dtype(self) -> np.dtype:
        return self.k.dtype

    @property
    def batch(self) -> int:
        """How many sequences the cache holds (0 before the first append)."""
        return len(self._tables)

    @property
    def cache_seqlens(self) -> np.ndarray:
        """(B,) int32: every sequence's length, as flash-attn's ``cache_seqlens`` wants it."""
        return np.full(self.batch, self._length, dtype=np.int32)

    @property
    def block_table(self) -> np.ndarray:
        """(B, pages held) int32: each sequence's pages in order, as flash-attn's
        ``block_table`` wants it."""
        return np.array(self._tables, dtype=np.int32).reshape(self.batch, -1)

    def check_append(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Raise unless keys of ``shape`` (B, H_kv, N, D) and ``dtype`` fit: H_kv and D the
        cache's, B its sequences' (any B for an empty cache), enough free pages. Writes
        nothing."""
        _, _, heads, width = self.k.shape
        batch = self.batch or (shape[0] if len(shape) == 4 else -1)
        if len(shape) != 4 or (shape[0], shape[1], shape[3]) != (batch, heads, width):
            raise ValueError(
                f"the cache holds {self.batch or 'B'} sequences of (H_kv, D) = ({heads}, "
                f"{width}); keys and values to append must be ({batch}, {heads}, N, {width}), "
                f"got {tuple(shape)}"
            )
        if dtype != self.dtype:
            raise TypeError(f"the cache holds {self.dtype}, got keys and values of {dtype}")
        needed = batch * self._new_pages(shape[2])
        free = int(np.count_nonzero(~self._owned))
        if needed > free:
            raise ValueError(
                f"the cache is full: {batch} sequences of {self._length} tokens need {needed} "
                f"more pages of {self.page_size} for {shape[2]} new tokens, {free} are free"
            )

    def reserve(self, batch: int, n: int) -> None:
        """Give each of the ``batch`` sequences the pages for ``n`` more tokens (starting the
        sequences if there are none), without changing their length: what an engine does
        before a kernel writes the tokens in place (then ``advance(n)``)."""
        self.check_append((batch, self.k.shape[2], n, self.k.shape[3]), self.dtype)
        if not self._tables:
            self._tables = [[] for _ in range(batch)]
        new = self._new_pages(n)
        for table in self._tables:  # one sequence at a time, so that its new pages are a run
            for _ in range(new):
                table.append(self._take_page(table[-1] + 1 if table else 0))

    def advance(self, n: int) -> None:
        """Count ``n`` more tokens in every sequence, once they have been written (by a kernel
        given ``block_table`` and ``cache_seqlens``) into the pages ``reserve`` gave."""
        n = validation.non_negative_int("n", n)
        held = len(self._tables[0]) * self.page_size if self._tables else 0
        if self._length + n > held:
            raise ValueError(
                f"the sequences hold pages for {held} tokens, {self._length} + {n} do not fit: "
                "reserve them first"
            )
        self._length += n

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Write k (B, H_kv, N, D) and v (B, H_kv, N, Dv) after what is cached (the first append
        starts B sequences); nothing is written when they are refused."""
        k = validation.float_array("k", k)
        v = validation.float_array("v", v)
        if k.shape[:3] != v.shape[:3] or v.ndim != 4 or v.shape[3] != self.v.shape[3]:
            raise ValueError(
                f"k and v must be (B, H_kv, N, D) and (B, H_kv, N, Dv) with Dv = "
                f"{self.v.shape[3]}, got k {k.shape} and v {v.shape}"
            )
        validation.same_dtype(k=k, v=v)
        self.check_append(k.shape, k.dtype)
        self.reserve(k.shape[0], k.shape[2])
        positions = np.arange(self._length, self._length + k.shape[2])
        tables = self.block_table.astype(np.int64)
        for b in range(len(k)):
            write_tokens(self.k, tables[b], positions, k[b].swapaxes(0, 1))  # -> (N, H_kv, D)
            write_tokens(self.v, tables[b], positions, v[b].swapaxes(0, 1))
        self.advance(k.shape[2])

    def attend(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, **options: Any
    ) -> AttentionOutput:
        """Append k, v (B, H_kv, N, D) and attend q (B, H, N, D) over everything cached: per
        sequence, ``attention_forward(q_b, keys, values, **options)`` on its keys read from the
        pages (a view when they are consecutive). ``options`` are ``attention_forward``'s (the
        layer passes ``align="bottom-right"``); a (B, M) ``key_padding_mask`` and a (B, ...)
        ``dropout_mask`` are split by sequence. The cache's side of the layer's protocol,
        beside ``KVCache.attend``; nothing is kept for a backward.

        Returns:
            ``AttentionOutput(out (B, H, N, Dv), lse (B, H, N) or None, None)``.
        """
        self.append(k, v)
        tables = self.block_table.astype(np.int64)
        outs: list[np.ndarray] = []
        lses: list[np.ndarray] = []
        for b in range(self.batch):
            own = {
                name: value[b : b + 1] if _per_sequence(name, value, self.batch) else value
                for name, value in options.items()
            }
            keys = read_tokens(self.k, tables[b], 0, self._length, scratch=0)  # (M, H_kv, D)
            values = read_tokens(self.v, tables[b], 0, self._length, scratch=1)
            with no_grad():
                result = attention_forward(
                    q[b : b + 1], keys.swapaxes(0, 1)[None], values.swapaxes(0, 1)[None], **own
                )
            outs.append(result.out)
            if result.lse is not None:  # asked for
                lses.append(result.lse)
        lse = np.concatenate(lses) if lses else None
        return AttentionOutput(np.concatenate(outs), lse, None)

    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """Every sequence's keys and values, (B, H_kv, length, D) and (B, H_kv, length, Dv):
        copies, in the contiguous cache's layout."""
        tables = self.block_table.astype(np.int64)
        keys = [read_tokens(self.k, t, 0, self._length).swapaxes(0, 1) for t in tables]
        values = [read_tokens(self.v, t, 0, self._length).swapaxes(0, 1) for t in tables]
        shape = (0, self.k.shape[2], self._length)
        if not keys:
            return np.zeros(shape + self.k.shape[3:], self.dtype), np.zeros(
                shape + self.v.shape[3:], self.dtype
            )
        return np.stack(keys), np.stack(values)

    def reset(self) -> None:
        """Forget every sequence and free every page (the pool's arrays are kept)."""
        self._owned[:] = False
        self._tables = []
        self._length = 0

    def _new_pages(self, n: int) -> int:
        """Pages each sequence needs for ``n`` more tokens."""
        held = len(self._tables[0]) if self._tables else 0
        return max(0, -(-(self._length + n) // self.page_size) - held)

    def _take_page(self, preferred: int) -> int:
        """``preferred`` if it is a free page, else the lowest free page; now owned."""
        if not (preferred < len(self._owned) and not self._owned[preferred]):
            preferred = int(np.flatnonzero(~self._owned)[0])
        self._owned[preferred] = True
        return preferred

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(pages={self.k.shape[0]} x {self.page_size}, kv_heads={self.k.shape[2]}, "
            f"head_dim={self.k.shape[3]}, v_head_dim={self.v.shape[3]}, dtype={self.dtype}, "
            f"sequences={self.batch}, length={self._length})"
        )


# Options of ``attention_forward`` that may hold one entry per sequence on their first axis, by
# the rank they have then: split by ``PagedKVCache.attend``.
_PER_SEQUENCE = {"key_padding_mask": 2, "attn_mask": 4, "dropout_mask": 4, "alibi_slopes": 2}


def _per_sequence(name: str, value: Any, batch: int) -> bool:
    """Whether option ``name`` holds one entry per sequence on its first axis."""
    rank = _PER_SEQUENCE.get(name)
    return (
        rank is not None
        and isinstance(value, np.ndarray)
        and value.ndim == rank
        and value.shape[0] == batch
    )
