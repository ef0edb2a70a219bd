"""The caches of multi-head latent attention, for decoding: ``LatentCache`` (contiguous) and
``PagedLatentCache`` (pages of a shared pool, FlashMLA's layout); and ``attend_latents``, the
absorbed form's attention over one call's rows without a cache. Per token both hold what
transformers 5 caches for DeepSeek-V3: the normed latent c_kv (L) and the rotated shared key
k_rope (R), one head, as one row [c_kv, k_rope]: L + R numbers a token, against the 2 H_kv D of
a ``KVCache``.

``latent.MultiHeadLatentAttention`` decodes over either through one protocol, four members both
caches have:

    length                                     tokens cached so far (the new queries' offset)
    check_append(batch, n, kv_lora_rank,       raise unless n tokens of this layer fit; writes
                 qk_rope_head_dim, dtype)      nothing (the layer calls it before any work)
    append(c_kv, k_rope) -> rows (B, M, L+R)   write, and return every cached row (the
                                               expanded form expands them with kv_b_proj)
    attend(q, c_kv, k_rope, **options)         write, then attention_forward(q, rows,
        -> AttentionOutput                     rows[..., :L], **options): the absorbed form,
                                               MQA over the rows, values their first L columns

A DSA layer (``index_topk``) also caches its indexer's rotated keys, DI numbers a token, in a
cache built with ``index_head_dim=DI`` (transformers' ``update_indexer``), through two more:

    check_index(index_head_dim)                raise unless the cache holds indexer keys of
                                               that width (None: it holds none)
    index_append(keys) -> (B, M, DI)           write this call's keys (B, N, DI) at the
                                               positions the latents' append takes next, and
                                               return every one; ``length`` is unchanged
                                               (the latents' append that follows advances it)

The contiguous cache's rows are views of its array; the paged cache reads each sequence's pages
(a view when they are consecutive in the pool) and attends sequence by sequence, as
``PagedKVCache.attend`` does, so the two give the same numbers.

Shape legend: B sequences, N new tokens, M cached tokens after them, L ``kv_lora_rank``, R
``qk_rope_head_dim``, H query heads, P page size.

Derivation: docs/derivations/latent.md (what is cached, the absorbed attention),
docs/decoding.md (section 6, the latent layer over pages).
Tests: tests/numpy_attention/test_latent_cache.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import validation
from .decode.cache import attend_per_sequence
from .decode.pages import PagePool, read_tokens
from .functional import attention_forward
from .scores import AttentionOutput

__all__ = ["LatentCache", "PagedLatentCache", "attend_latents"]


class LatentCache:
    """Preallocated latents of one MLA layer, for decoding: per token the normed latent c (L) and
    the rotated shared key k_pe (R), what transformers 5 caches for DeepSeek-V3, one head.

    ``latent`` is one (B, max_len, L + R) array, each row [c, k_pe]: the keys of the absorbed
    attention as they are (its values are the first L columns), and FlashMLA's layout.
    ``c_kv`` and ``k_rope`` are views of its two parts. L + R numbers a token, against the
    2 * H_kv * D of a ``KVCache``.

    Args:
        batch: B.
        max_len: the most tokens the cache holds.
        kv_lora_rank: L.
        qk_rope_head_dim: R.
        dtype: a floating dtype, that of the layer it serves.
        index_head_dim: DI, for a DSA layer: ``index_keys`` (B, max_len, DI) holds its
            indexer's keys; None (no indexer) holds none.
    """

    def __init__(
        self,
        batch: int,
        max_len: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: Any,
        index_head_dim: int | None = None,
    ) -> None:
        batch = validation.positive_int("batch", batch)
        self.max_len = validation.positive_int("max_len", max_len)
        self.kv_lora_rank = validation.positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_rope_head_dim = validation.positive_int("qk_rope_head_dim", qk_rope_head_dim)
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise TypeError(f"LatentCache needs a floating dtype, got {dtype}")
        width = self.kv_lora_rank + self.qk_rope_head_dim
        self.latent = np.zeros((batch, self.max_len, width), dtype=dtype)
        self.index_head_dim = index_width(index_head_dim)
        self.index_keys = (
            None
            if self.index_head_dim is None
            else np.zeros((batch, self.max_len, self.index_head_dim), dtype=dtype)
        )
        self._length = 0

    @property
    def c_kv(self) -> np.ndarray:
        """The normed latents, (B, max_len, L): a view."""
        return self.latent[..., : self.kv_lora_rank]

    @property
    def k_rope(self) -> np.ndarray:
        """The rotated shared keys, (B, max_len, R): a view."""
        return self.latent[..., self.kv_lora_rank :]

    @property
    def length(self) -> int:
        """How many positions are filled."""
        return self._length

    @property
    def dtype(self) -> np.dtype:
        return self.latent.dtype

    def check_append(
        self, batch: int, n: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype: np.dtype
    ) -> None:
        """Raise unless n tokens of a layer with this kv_lora_rank and qk_rope_head_dim fit:
        B, L and R the cache's, ``length + n <= max_len``, the cache's dtype. Writes nothing."""
        cache_batch, rank, rope = self.latent.shape[0], self.kv_lora_rank, self.qk_rope_head_dim
        held = (
            f"(B, max_len, kv_lora_rank + qk_rope_head_dim) = ({cache_batch}, {self.max_len}, "
            f"{rank} + {rope})"
        )
        _check_fields(self, held, (batch, cache_batch), kv_lora_rank, qk_rope_head_dim, dtype)
        needed = self._length + n
        if needed > self.max_len:
            raise ValueError(
                f"the cache is too short: max_len = {self.max_len}, but {self._length} cached "
                f"+ {n} new tokens need a length of {needed}"
            )

    def append(self, c_kv: np.ndarray, k_rope: np.ndarray) -> np.ndarray:
        """Write c_kv (B, N, L) and k_rope (B, N, R) after what is cached; nothing is written
        when they are refused.

        Returns:
            every cached row so far, (B, length, L + R): a view of ``latent``.
        """
        c_kv, k_rope = _latents(c_kv, k_rope)
        batch, n, rank = c_kv.shape
        self.check_append(batch, n, rank, k_rope.shape[-1], c_kv.dtype)
        start, stop = self._length, self._length + n
        self.latent[:, start:stop, : self.kv_lora_rank] = c_kv
        self.latent[:, start:stop, self.kv_lora_rank :] = k_rope
        self._length = stop
        return self.latent[:, :stop]

    def attend(
        self, q: np.ndarray, c_kv: np.ndarray, k_rope: np.ndarray, **options: Any
    ) -> AttentionOutput:
        """Append c_kv (B, N, L) and k_rope (B, N, R), then attend q (B, H, N, L + R) over every
        cached row as one shared key head: ``attention_forward(q, rows, rows[..., :L],
        **options)`` on views of ``latent`` (the layer passes ``enable_gqa=True``). The
        absorbed form's side of the protocol (module docstring).

        Returns:
            ``AttentionOutput``: out (B, H, N, L).
        """
        rows = self.append(c_kv, k_rope)[:, None]  # (B, 1, M, L+R), views
        return attention_forward(q, rows, rows[..., : self.kv_lora_rank], **options)

    def check_index(self, index_head_dim: int | None) -> None:
        """Raise unless the cache holds indexer keys of this width (None: none)."""
        check_index(self.index_head_dim, index_head_dim)

    def index_append(self, keys: np.ndarray) -> np.ndarray:
        """Write an indexer's keys (B, N, DI) at the positions the next ``append`` takes; return
        every one so far, (B, length + N, DI), a view. ``length`` is unchanged."""
        if self.index_keys is None:
            raise ValueError("this cache holds no indexer keys (built without index_head_dim)")
        keys = _index_keys(keys, self.index_head_dim, self.dtype)
        self.check_append(keys.shape[0], keys.shape[1], self.kv_lora_rank,
                          self.qk_rope_head_dim, keys.dtype)  # fmt: skip
        stop = self._length + keys.shape[1]
        self.index_keys[:, self._length : stop] = keys
        return self.index_keys[:, :stop]

    def reset(self) -> None:
        """Forget every cached position (a new sequence); the array is kept."""
        self._length = 0

    def __repr__(self) -> str:
        return (
            f"LatentCache(shape={self.latent.shape}, kv_lora_rank={self.kv_lora_rank}, "
            f"dtype={self.dtype}, length={self._length})"
        )


class PagedLatentCache(PagePool):
    """The latents of one MLA layer in pages of a shared pool: FlashMLA's paged cache, one head
    of rows [c, k_pe] per token, with ``decode.pages.PagePool``'s bookkeeping (``reserve``,
    ``advance``, ``block_table``, ``cache_seqlens``, ``reset``; a sequence's pages consecutive
    while the pool allows).

    ``latent`` (num_blocks, P, 1, L + R) is the pool; ``c_kv`` and ``k_rope`` are views of its
    parts. So ``kvcache_attention_forward(q, cache.latent, cache.c_kv,
    cache_seqlens=cache.cache_seqlens, block_table=cache.block_table, softmax_scale=...,
    causal=True)`` is FlashMLA's decode over it (values the first L columns of the keys, no
    second copy).

    The first ``append`` (or ``reserve``) of B sequences starts them; every later one writes the
    same number of tokens to each, so they share one ``length`` (the layer's decode step).

    Args:
        num_blocks: pages in the pool.
        page_size: P, tokens per page (FlashMLA's: 64).
        kv_lora_rank: L.
        qk_rope_head_dim: R.
        dtype: a floating dtype, that of the layer it serves.
        index_head_dim: DI, for a DSA layer: ``index_keys`` (num_blocks, P, 1, DI), pages of
            its indexer's keys under the same block table; None holds none.
    """

    def __init__(
        self,
        num_blocks: int,
        page_size: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: Any = np.float32,
        index_head_dim: int | None = None,
    ) -> None:
        super().__init__(num_blocks, page_size)
        self.kv_lora_rank = validation.positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_rope_head_dim = validation.positive_int("qk_rope_head_dim", qk_rope_head_dim)
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise TypeError(f"PagedLatentCache needs a floating dtype, got {dtype}")
        width = self.kv_lora_rank + self.qk_rope_head_dim
        self.latent = np.zeros((len(self._owned), self.page_size, 1, width), dtype=dtype)
        self.index_head_dim = index_width(index_head_dim)
        self.index_keys = (
            None
            if self.index_head_dim is None
            else np.zeros((len(self._owned), self.page_size, 1, self.index_head_dim), dtype)
        )

    @property
    def c_kv(self) -> np.ndarray:
        """The normed latents, (num_blocks, P, 1, L): a view."""
        return self.latent[..., : self.kv_lora_rank]

    @property
    def k_rope(self) -> np.ndarray:
        """The rotated shared keys, (num_blocks, P, 1, R): a view."""
        return self.latent[..., self.kv_lora_rank :]

    @property
    def dtype(self) -> np.dtype:
        return self.latent.dtype

    def check_append(
        self, batch: int, n: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype: np.dtype
    ) -> None:
        """Raise unless n tokens of a layer with this kv_lora_rank and qk_rope_head_dim fit: L
        and R the cache's, B its sequences' (any B for an empty cache), the cache's dtype,
        enough free pages. Writes nothing."""
        held = (
            f"{self.batch or 'B'} sequences of (page_size, kv_lora_rank + qk_rope_head_dim) = "
            f"({self.page_size}, {self.kv_lora_rank} + {self.qk_rope_head_dim})"
        )
        batches = (batch, self.batch or batch)  # an empty cache starts any number of sequences
        _check_fields(self, held, batches, kv_lora_rank, qk_rope_head_dim, dtype)
        self._check_room(batch, n)

    def _check_reserve(self, batch: int, n: int) -> None:
        self.check_append(batch, n, self.kv_lora_rank, self.qk_rope_head_dim, self.dtype)

    def append(self, c_kv: np.ndarray, k_rope: np.ndarray) -> np.ndarray:
        """Write c_kv (B, N, L) and k_rope (B, N, R) after what is cached (the first append
        starts B sequences); nothing is written when they are refused.

        Returns:
            every cached row so far, (B, length, L + R): each sequence's pages gathered, a copy.
        """
        self._append(c_kv, k_rope)
        rows = [self._read(self.latent, b)[:, 0] for b in range(self.batch)]  # (M, L+R) each
        return np.stack(rows)

    def attend(
        self, q: np.ndarray, c_kv: np.ndarray, k_rope: np.ndarray, **options: Any
    ) -> AttentionOutput:
        """Append c_kv (B, N, L) and k_rope (B, N, R), then attend q (B, H, N, L + R) over every
        cached row as one shared key head, per sequence: ``attention_forward(q_b, rows,
        rows[..., :L], **options)`` on its rows read from the pages (a view when they are
        consecutive), a (B, M) ``key_padding_mask`` and (B, ...) masks split by sequence
        (``decode.cache.attend_per_sequence``). ``LatentCache.attend``'s twin over pages.

        Returns:
            ``AttentionOutput``: out (B, H, N, L).
        """
        self._append(c_kv, k_rope)
        rank = self.kv_lora_rank

        def read(b: int) -> tuple[np.ndarray, np.ndarray]:
            rows = self._read(self.latent, b, scratch=0).swapaxes(0, 1)[None]  # (1, 1, M, L+R)
            return rows, rows[..., :rank]  # values: a view of the keys, no second copy

        return attend_per_sequence(q, read, **options)

    def check_index(self, index_head_dim: int | None) -> None:
        """Raise unless the cache holds indexer keys of this width (None: none)."""
        check_index(self.index_head_dim, index_head_dim)

    def index_append(self, keys: np.ndarray) -> np.ndarray:
        """Write an indexer's keys (B, N, DI) into the pages the next ``append`` writes its
        rows to (reserving them); return every one so far, (B, length + N, DI), gathered from
        each sequence's pages. ``length`` is unchanged."""
        if self.index_keys is None:
            raise ValueError("this cache holds no indexer keys (built without index_head_dim)")
        keys = _index_keys(keys, self.index_head_dim, self.dtype)
        batch, n = keys.shape[:2]
        self.reserve(batch, n)
        self._write(self.index_keys, keys[:, :, None])
        stop = self._length + n
        return np.stack(
            [
                read_tokens(self.index_keys, np.asarray(table, np.int64), 0, stop)[:, 0]
                for table in self._tables
            ]
        )

    def _append(self, c_kv: np.ndarray, k_rope: np.ndarray) -> None:
        """Check, reserve the pages, write, advance: ``append`` without reading back."""
        c_kv, k_rope = _latents(c_kv, k_rope)
        batch, n, rank = c_kv.shape
        self.check_append(batch, n, rank, k_rope.shape[-1], c_kv.dtype)
        self.reserve(batch, n)
        self._write(self.c_kv, c_kv[:, :, None])  # (B, N, 1, L) into (pages, P, 1, L) views
        self._write(self.k_rope, k_rope[:, :, None])
        self.advance(n)

    def __repr__(self) -> str:
        return (
            f"PagedLatentCache(pages={self.latent.shape[0]} x {self.page_size}, "
            f"kv_lora_rank={self.kv_lora_rank}, qk_rope_head_dim={self.qk_rope_head_dim}, "
            f"dtype={self.dtype}, sequences={self.batch}, length={self._length})"
        )


def _latents(c_kv: Any, k_rope: Any) -> tuple[np.ndarray, np.ndarray]:
    """c_kv (B, N, L) and k_rope (B, N, R) as float arrays of one dtype, or a clear error."""
    c_kv = validation.float_array("c_kv", c_kv)
    k_rope = validation.float_array("k_rope", k_rope)
    if c_kv.ndim != 3 or k_rope.shape[:-1] != c_kv.shape[:-1] or k_rope.ndim != 3:
        raise ValueError(
            f"c_kv must be (B, N, L) and k_rope (B, N, R), got c_kv {c_kv.shape} and "
            f"k_rope {k_rope.shape}"
        )
    validation.same_dtype(c_kv=c_kv, k_rope=k_rope)
    return c_kv, k_rope


def index_width(index_head_dim: Any) -> int | None:
    """A cache's indexer key width DI, checked; None: it holds no indexer keys."""
    return (
        None
        if index_head_dim is None
        else validation.positive_int("index_head_dim", index_head_dim)
    )


def check_index(held: int | None, given: int | None) -> None:
    """A DSA layer's indexer width against a cache's (None: no indexer, no keys held)."""
    if held == given:
        return
    if given is None:
        raise ValueError(
            f"the cache holds indexer keys (index_head_dim={held}), but the layer has no indexer"
        )
    raise ValueError(
        f"the layer's indexer caches keys of width index_head_dim={given}, but the cache holds "
        f"{'none (build it with index_head_dim=' + str(given) + ')' if held is None else held}"
    )


def _index_keys(keys: Any, width: int | None, dtype: np.dtype) -> np.ndarray:
    """An indexer's keys (B, N, DI) as a float array of the cache's dtype, or a clear error."""
    keys = validation.float_array("keys", keys)
    if keys.ndim != 3 or keys.shape[-1] != width:
        raise ValueError(f"indexer keys must be (B, N, DI) = (B, N, {width}), got {keys.shape}")
    if keys.dtype != dtype:
        raise TypeError(f"the cache holds {dtype}, got indexer keys of {keys.dtype}")
    return keys


def _check_fields(
    cache: LatentCache | PagedLatentCache,
    held: str,
    batches: tuple[int, int],
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    dtype: np.dtype,
) -> None:
    """Raise, naming the field, unless the batch (given, the cache's), kv_lora_rank,
    qk_rope_head_dim and dtype are the cache's; ``held`` describes what it holds."""
    for name, given, own in (
        ("batch", *batches),
        ("kv_lora_rank", kv_lora_rank, cache.kv_lora_rank),
        ("qk_rope_head_dim", qk_rope_head_dim, cache.qk_rope_head_dim),
    ):
        if given != own:
            raise ValueError(f"the cache holds {held}; {name} {given} does not fit its {own}")
    if dtype != cache.dtype:
        raise TypeError(f"the cache holds {cache.dtype}, got latents of {dtype}")


def attend_latents(
    q: np.ndarray, c_kv: np.ndarray, k_rope: np.ndarray, **options: Any
) -> AttentionOutput:
    """The absorbed form's attention without a cache: q (B, H, N, L + R) over this call's rows
    [c_kv, k_rope] ((B, N, L) and (B, N, R)) as one shared key head, values c_kv:
    ``attention_forward(q, rows, rows[..., :L], **options)``, what either cache's ``attend``
    computes over every row it holds."""
    rows = np.concatenate([c_kv, k_rope], axis=-1)[:, None]  # (B, 1, N, L+R)
    return attention_forward(q, rows, rows[..., : c_kv.shape[-1]], **options)
