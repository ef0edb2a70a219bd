"""A layer's KV cache, as the layer decodes over it: contiguous (``KVCache``, preallocated
(B, H_kv, max_len, D) arrays) or in pages of a shared pool, as a serving engine keeps them
(``PagedKVCache``); each with ``attend``, the cache's side of the layer's protocol (append this
call's keys and values, attend over everything cached), and ``attend_per_sequence``, the
attention over any paged cache one sequence at a time that ``latent_cache.PagedLatentCache``
shares. Both caches give ``GroupedQueryAttention`` equal results.

Shape legend: B sequences, H query heads, H_kv key/value heads, N new tokens, M cached tokens
after them, D head width, Dv value head width, P page size.

Derivation: docs/decoding.md (section 6, a layer's pages); the scores:
docs/derivations/attention.md; the layer's cache: docs/derivations/grouped.md.
Tests: tests/numpy_attention/decode/test_cache.py, tests/numpy_attention/test_grouped.py (the
layer over either cache; pages equal to the contiguous cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import validation
from ..functional import attention_forward
from ..grad_mode import no_grad
from ..scores import AttentionOutput
from .pages import PagePool

__all__ = ["KVCache", "PagedKVCache", "attend_per_sequence"]


class KVCache:
    """Preallocated keys and values of one attention layer, for decoding one token at a time.

    ``k`` (B, H_kv, max_len, D) and ``v`` (B, H_kv, max_len, Dv) are arrays of which the first
    ``length`` positions are filled. Keys are stored after RoPE, so a cached key never needs
    rotating again.

    Args:
        batch: B.
        num_kv_heads: H_kv.
        max_len: the most tokens the cache holds.
        head_dim: D.
        dtype: a floating dtype, that of the layer it serves.
        v_head_dim: Dv, the values' width; None for D (MiMo-V2-Flash's values are narrower).
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: Any,
        *,
        v_head_dim: int | None = None,
    ) -> None:
        batch = validation.positive_int("batch", batch)
        num_kv_heads = validation.positive_int("num_kv_heads", num_kv_heads)
        max_len = validation.positive_int("max_len", max_len)
        head_dim = validation.positive_int("head_dim", head_dim)
        v_head_dim = validation.positive_int(
            "v_head_dim", head_dim if v_head_dim is None else v_head_dim
        )
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise TypeError(f"KVCache needs a floating dtype, got {dtype}")
        self.max_len = max_len
        self.k = np.zeros((batch, num_kv_heads, max_len, head_dim), dtype=dtype)
        self.v = np.zeros((batch, num_kv_heads, max_len, v_head_dim), dtype=dtype)
        self._length = 0

    @property
    def length(self) -> int:
        """How many positions are filled."""
        return self._length

    @property
    def dtype(self) -> np.dtype:
        return self.k.dtype

    def check_append(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Raise unless keys of ``shape`` (B, H_kv, N, D) and ``dtype`` fit: B, H_kv and D the
        cache's, ``length + N <= max_len``, the cache's dtype. Writes nothing."""
        batch, heads, _, width = self.k.shape
        if len(shape) != 4 or (shape[0], shape[1], shape[3]) != (batch, heads, width):
            raise ValueError(
                f"the cache holds (B, H_kv, max_len, D) = {self.k.shape}; keys and values to "
                f"append must be ({batch}, {heads}, N, {width}), got {tuple(shape)}"
            )
        if dtype != self.dtype:
            raise TypeError(f"the cache holds {self.dtype}, got keys and values of {dtype}")
        needed = self._length + shape[2]
        if needed > self.max_len:
            raise ValueError(
                f"the cache is too short: max_len = {self.max_len}, but {self._length} cached "
                f"+ {shape[2]} new tokens need a length of {needed}"
            )

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write k (B, H_kv, N, D) and v (B, H_kv, N, Dv) after what is cached; nothing is
        written when they are refused.

        Returns:
            keys (B, H_kv, length, D) and values (B, H_kv, length, Dv) so far: views of the
            cache.
        """
        k = validation.float_array("k", k)
        v = validation.float_array("v", v)
        validation.same_dtype(k=k, v=v)
        self.check_append(k.shape, k.dtype)
        if k.shape[:3] != v.shape[:3] or v.ndim != 4 or v.shape[3] != self.v.shape[3]:
            raise ValueError(
                f"k and v must be (B, H_kv, N, D) and (B, H_kv, N, Dv) with Dv = "
                f"{self.v.shape[3]}, got k {k.shape} and v {v.shape}"
            )
        start, stop = self._length, self._length + k.shape[2]
        self.k[:, :, start:stop] = k
        self.v[:, :, start:stop] = v
        self._length = stop
        return self.k[:, :, :stop], self.v[:, :, :stop]

    def attend(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        *,
        value_map: Callable[[np.ndarray], np.ndarray] | None = None,
        **options: Any,
    ) -> AttentionOutput:
        """Append k (B, H_kv, N, D), v (B, H_kv, N, Dv) and attend q (B, H, N, D) over
        everything cached: ``attention_forward(q, keys, values, **options)``. The cache's side
        of the layer's protocol, shared with ``PagedKVCache.attend`` (which reads its keys from
        pages). ``value_map`` turns the values read (B, H_kv, M, Dv) into those attended
        (differential attention's halves side by side); the cache keeps v as given."""
        keys, values = self.append(k, v)  # (B, H_kv, M, D), (B, H_kv, M, Dv): all cached so far
        if value_map is not None:
            values = value_map(values)
        return attention_forward(q, keys, values, **options)

    def reset(self) -> None:
        """Forget every cached position (a new sequence); the arrays are kept."""
        self._length = 0

    def __repr__(self) -> str:
        return (
            f"KVCache(shape={self.k.shape}, v_head_dim={self.v.shape[3]}, dtype={self.dtype}, "
            f"length={self._length})"
        )


class PagedKVCache(PagePool):
    """The keys and values of one attention layer in pages of a shared pool, as a serving engine
    keeps them: each sequence holds a list of pages (its row of the block table) and a length
    (``pages.PagePool``'s bookkeeping: ``reserve``, ``advance``, ``block_table``,
    ``cache_seqlens``, ``reset``).

    ``k`` (num_blocks, P, H_kv, D) and ``v`` (num_blocks, P, H_kv, Dv) are the pool, in
    flash-attn's paged layout, so ``kvcache_attention_forward(q, cache.k, cache.v,
    cache_seqlens=cache.cache_seqlens, block_table=cache.block_table, ...)`` reads it. Keys are
    stored after RoPE. Each sequence's pages are one run of the pool, in a region of its own
    (``pages.PagePool``'s allocation), so they are read in place.

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
        super().__init__(num_blocks, page_size)
        num_kv_heads = validation.positive_int("num_kv_heads", num_kv_heads)
        head_dim = validation.positive_int("head_dim", head_dim)
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        v_head_dim = validation.positive_int("v_head_dim", v_head_dim)
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise TypeError(f"PagedKVCache needs a floating dtype, got {dtype}")
        num_blocks = len(self._owned)
        self.k = np.zeros((num_blocks, self.page_size, num_kv_heads, head_dim), dtype=dtype)
        self.v = np.zeros((num_blocks, self.page_size, num_kv_heads, v_head_dim), dtype=dtype)

    @property
    def dtype(self) -> np.dtype:
        return self.k.dtype

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
        self._check_room(batch, shape[2])

    def _check_reserve(self, batch: int, n: int) -> None:
        self.check_append((batch, self.k.shape[2], n, self.k.shape[3]), self.dtype)

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
        self._write(self.k, k.swapaxes(1, 2))  # (B, H_kv, N, D) -> (B, N, H_kv, D)
        self._write(self.v, v.swapaxes(1, 2))
        self.advance(k.shape[2])

    def attend(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        *,
        value_map: Callable[[np.ndarray], np.ndarray] | None = None,
        **options: Any,
    ) -> AttentionOutput:
        """Append k, v (B, H_kv, N, D) and attend q (B, H, N, D) over everything cached: per
        sequence, ``attention_forward(q_b, keys, values, **options)`` on its keys read from the
        pages (a view when they are consecutive). ``options`` are ``attention_forward``'s (the
        layer passes ``align="bottom-right"``); a (B, M) ``key_padding_mask`` and a (B, ...)
        ``dropout_mask`` are split by sequence. ``value_map`` as ``KVCache.attend``'s, applied
        to each sequence's values read. The cache's side of the layer's protocol,
        beside ``KVCache.attend``; nothing is kept for a backward.

        Returns:
            ``AttentionOutput(out (B, H, N, Dv), lse (B, H, N) or None, None)``.
        """
        self.append(k, v)

        def read(b: int) -> tuple[np.ndarray, np.ndarray]:
            # views, or gathered into this thread's two buffers, used up before the next one
            keys = self._read(self.k, b, scratch=0)  # (M, H_kv, D)
            values = self._read(self.v, b, scratch=1).swapaxes(0, 1)[None]  # (1, H_kv, M, Dv)
            if value_map is not None:
                values = value_map(values)
            return keys.swapaxes(0, 1)[None], values  # (1, H_kv, M, D), values

        return attend_per_sequence(q, read, **options)

    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """Every sequence's keys and values, (B, H_kv, length, D) and (B, H_kv, length, Dv):
        copies, in the contiguous cache's layout."""
        keys = [self._read(self.k, b).swapaxes(0, 1) for b in range(self.batch)]
        values = [self._read(self.v, b).swapaxes(0, 1) for b in range(self.batch)]
        shape = (0, self.k.shape[2], self._length)
        if not keys:
            return np.zeros(shape + self.k.shape[3:], self.dtype), np.zeros(
                shape + self.v.shape[3:], self.dtype
            )
        return np.stack(keys), np.stack(values)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(pages={self.k.shape[0]} x {self.page_size}, kv_heads={self.k.shape[2]}, "
            f"head_dim={self.k.shape[3]}, v_head_dim={self.v.shape[3]}, dtype={self.dtype}, "
            f"sequences={self.batch}, length={self._length})"
        )


def attend_per_sequence(
    q: np.ndarray,
    read: Callable[[int], tuple[np.ndarray, np.ndarray]],
    **options: Any,
) -> AttentionOutput:
    """``attention_forward(q[b:b+1], *read(b), **options)`` for each sequence b of q (B, H, N,
    D), concatenated: the attention over a paged cache, whose sequences' keys and values
    ``read(b)`` gives as (1, H_kv, M, D) and (1, H_kv, M, Dv). Options holding one entry per
    sequence (a (B, M) ``key_padding_mask``, (B, ...) masks and ALiBi slopes) are split by
    sequence. Nothing is kept for a backward.

    Returns:
        ``AttentionOutput(out (B, H, N, Dv), lse (B, H, N) or None, None)``.
    """
    batch = len(q)
    outs: list[np.ndarray] = []
    lses: list[np.ndarray] = []
    for b in range(batch):
        own = {
            name: value[b : b + 1] if _per_sequence(name, value, batch) else value
            for name, value in options.items()
        }
        with no_grad():
            result = attention_forward(q[b : b + 1], *read(b), **own)
        outs.append(result.out)
        if result.lse is not None:  # asked for
            lses.append(result.lse)
    lse = np.concatenate(lses) if lses else None
    return AttentionOutput(np.concatenate(outs), lse, None)


# Options of ``attention_forward`` that may hold one entry per sequence on their first axis, by
# the rank they have then: split by ``attend_per_sequence``.
_PER_SEQUENCE = {
    "key_padding_mask": 2,
    "attn_mask": 4,
    "dropout_mask": 4,
    "alibi_slopes": 2,
    "chunk_start": 1,
}


def _per_sequence(name: str, value: Any, batch: int) -> bool:
    """Whether option ``name`` holds one entry per sequence on its first axis."""
    rank = _PER_SEQUENCE.get(name)
    return (
        rank is not None
        and isinstance(value, np.ndarray)
        and value.ndim == rank
        and value.shape[0] == batch
    )
