"""Decoding over a KV cache, contiguous or in pages: flash-attn's ``flash_attn_with_kvcache``,
exactly (``kvcache_attention_forward``), the reference of the decode kernels. Its argument checks
are ``checks.py`` (on arrays) and ``arguments.py`` (the pure-Python checker both twins share);
the pages it reads, ``pages.py``; a layer's page pool, ``PagedKVCache``, ``cache.py``.

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
same attention on the gathered, rotated keys (tests/numpy_attention/decode/test_paged.py shows
it).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size, L_b the keys of sequence b.

Derivation: docs/decoding.md (the semantics: arguments, alignments, block tables); the scores:
docs/derivations/attention.md and the pages it links.
Tests: tests/numpy_attention/decode/test_paged.py (against a plain torch reference of flash-attn's
semantics written in the test, in float64; the gradient on the gathered keys).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..functional import attention_forward
from ..grad_mode import no_grad
from ..rope import rotate_pairs
from .checks import DecodeCall, check_call
from .pages import read_tokens, write_tokens

__all__ = ["KVCacheOutput", "kvcache_attention_forward", "rotate_new_tokens"]


class KVCacheOutput(NamedTuple):
    """What ``kvcache_attention_forward`` returns.

    out: (B, s_q, H, Dv) in q's dtype. lse: (B, H, s_q), natural log, in the compute dtype
    (float32 for float16), -inf for a query with nothing to attend to; None unless asked for.
    """

    out: np.ndarray
    lse: np.ndarray | None


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
    call, q, k, v = check_call(
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
    call: DecodeCall, q: np.ndarray, k: np.ndarray | None
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
