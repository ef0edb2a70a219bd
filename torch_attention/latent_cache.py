"""The caches of multi-head latent attention in torch, the twin of
``numpy_attention.latent_cache``: ``LatentCache`` (contiguous) and ``PagedLatentCache`` (pages of
a shared pool, FlashMLA's layout), on any device, and ``attend_latents``, the absorbed form's
attention over one call's rows without a cache. Per token both hold the normed latent c_kv (L)
and the rotated shared key k_rope (R) as one row [c_kv, k_rope].

``latent.MultiHeadLatentAttention`` decodes over either through the NumPy twin's protocol:
``length``; ``check_append(batch, n, kv_lora_rank, qk_rope_head_dim, dtype, device)`` (before
any work, writes nothing); ``append(c_kv, k_rope)``, every cached row (B, M, L + R) for the
expanded form; ``attend(q, c_kv, k_rope, **options)``, the absorbed form's attention of q
(B, H, N, L + R) over the rows as one shared key head, out (B, H, N, L). As the layer does, the
attention takes the whole rows as values and keeps the output's first L columns (the same
numbers: torch's CPU SDPA takes its fast path only when V is as wide as K).

Shape legend: B sequences, N new tokens, M cached tokens after them, L ``kv_lora_rank``, R
``qk_rope_head_dim``, H query heads, P page size.

Derivation: docs/derivations/latent.md, docs/decoding.md (section 6).
Tests: tests/torch_attention/test_latent_cache.py.
"""

from __future__ import annotations

from typing import Any

import torch

# The indexer width's rules are pure Python: the NumPy twin's.
from numpy_attention.latent_cache import check_index, index_width

from . import validation
from .decode.cache import attend_per_sequence
from .decode.pages import PagePool, read_tokens
from .functional import attention

__all__ = ["LatentCache", "PagedLatentCache", "attend_latents"]


class LatentCache:
    """Preallocated latents of one MLA layer, for decoding: per token the normed latent c (L)
    and the rotated shared key k_pe (R), one (B, max_len, L + R) tensor ``latent`` on ``device``
    whose rows are [c, k_pe]; ``c_kv`` and ``k_rope`` are views of its parts.

    Args:
        batch: B.
        max_len: the most tokens the cache holds.
        kv_lora_rank: L.
        qk_rope_head_dim: R.
        dtype: a floating torch dtype, that of the layer it serves.
        device: where the tensor lives (the layer's device); None for torch's default.
        index_head_dim: DI, for a DSA layer: ``index_keys`` (B, max_len, DI) holds its
            indexer's keys; None (no indexer) holds none.
    """

    def __init__(
        self,
        batch: int,
        max_len: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
        index_head_dim: int | None = None,
    ) -> None:
        batch = validation.positive_int("batch", batch)
        self.max_len = validation.positive_int("max_len", max_len)
        self.kv_lora_rank = validation.positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_rope_head_dim = validation.positive_int("qk_rope_head_dim", qk_rope_head_dim)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"LatentCache needs a floating torch dtype, got {dtype!r}")
        width = self.kv_lora_rank + self.qk_rope_head_dim
        self.latent = torch.zeros((batch, self.max_len, width), dtype=dtype, device=device)
        self.index_head_dim = index_width(index_head_dim)
        self.index_keys = (
            None
            if self.index_head_dim is None
            else torch.zeros(batch, self.max_len, self.index_head_dim, dtype=dtype, device=device)
        )
        self._length = 0

    @property
    def c_kv(self) -> torch.Tensor:
        """The normed latents, (B, max_len, L): a view."""
        return self.latent[..., : self.kv_lora_rank]

    @property
    def k_rope(self) -> torch.Tensor:
        """The rotated shared keys, (B, max_len, R): a view."""
        return self.latent[..., self.kv_lora_rank :]

    @property
    def length(self) -> int:
        """How many positions are filled."""
        return self._length

    @property
    def dtype(self) -> torch.dtype:
        return self.latent.dtype

    @property
    def device(self) -> torch.device:
        return self.latent.device

    def check_append(
        self,
        batch: int,
        n: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """Raise unless n tokens of a layer with this kv_lora_rank and qk_rope_head_dim fit:
        B, L and R the cache's, ``length + n <= max_len``, its dtype and device. Writes
        nothing."""
        cache_batch, rank, rope = self.latent.shape[0], self.kv_lora_rank, self.qk_rope_head_dim
        held = (
            f"(B, max_len, kv_lora_rank + qk_rope_head_dim) = ({cache_batch}, {self.max_len}, "
            f"{rank} + {rope})"
        )
        _check_fields(self, held, (batch, cache_batch), kv_lora_rank, qk_rope_head_dim, dtype)
        if torch.device(device) != self.device:
            raise ValueError(f"the cache lives on {self.device}, got latents on {device}")
        needed = self._length + n
        if needed > self.max_len:
            raise ValueError(
                f"the cache is too short: max_len = {self.max_len}, but {self._length} cached "
                f"+ {n} new tokens need a length of {needed}"
            )

    def append(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
        """Write c_kv (B, N, L) and k_rope (B, N, R) after what is cached (detached: the cache
        is for inference); nothing is written when they are refused.

        Returns:
            every cached row so far, (B, length, L + R): a view of ``latent``.
        """
        c_kv, k_rope = _latents(c_kv, k_rope)
        batch, n, rank = c_kv.shape
        self.check_append(batch, n, rank, k_rope.shape[-1], c_kv.dtype, c_kv.device)
        start, stop = self._length, self._length + n
        self.latent[:, start:stop, : self.kv_lora_rank] = c_kv.detach()
        self.latent[:, start:stop, self.kv_lora_rank :] = k_rope.detach()
        self._length = stop
        return self.latent[:, :stop]

    def attend(
        self, q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, **options: Any
    ) -> torch.Tensor:
        """Append c_kv (B, N, L) and k_rope (B, N, R), then attend q (B, H, N, L + R) over every
        cached row as one shared key head (the layer passes ``enable_gqa=True``): values the
        rows, the output's first L columns kept.

        Returns:
            out (B, H, N, L).
        """
        rows = self.append(c_kv, k_rope)[:, None]  # (B, 1, M, L+R), views
        return attention(q, rows, rows, **options)[..., : self.kv_lora_rank]

    def check_index(self, index_head_dim: int | None) -> None:
        """Raise unless the cache holds indexer keys of this width (None: none)."""
        check_index(self.index_head_dim, index_head_dim)

    def index_append(self, keys: torch.Tensor) -> torch.Tensor:
        """Write an indexer's keys (B, N, DI) at the positions the next ``append`` takes
        (detached); return every one so far, (B, length + N, DI), a view. ``length`` is
        unchanged (the NumPy twin's)."""
        if self.index_keys is None:
            raise ValueError("this cache holds no indexer keys (built without index_head_dim)")
        keys = _index_keys(keys, self.index_head_dim, self.dtype)
        batch, n = keys.shape[:2]
        self.check_append(
            batch, n, self.kv_lora_rank, self.qk_rope_head_dim, keys.dtype, keys.device
        )
        stop = self._length + n
        self.index_keys[:, self._length : stop] = keys.detach()
        return self.index_keys[:, :stop]

    def reset(self) -> None:
        """Forget every cached position (a new sequence); the tensor is kept."""
        self._length = 0

    def __repr__(self) -> str:
        return (
            f"LatentCache(shape={tuple(self.latent.shape)}, kv_lora_rank={self.kv_lora_rank}, "
            f"dtype={self.dtype}, device={self.device}, length={self._length})"
        )


class PagedLatentCache(PagePool):
    """The latents of one MLA layer in pages of a shared pool, FlashMLA's layout; the twin of
    ``numpy_attention.latent_cache.PagedLatentCache``: ``latent`` (num_blocks, P, 1, L + R) on
    ``device``, ``c_kv`` and ``k_rope`` views of its parts, ``decode.pages.PagePool``'s bookkeeping.

    Args: those of the NumPy twin, with a torch ``dtype``, and
        device: where the pool lives (the layer's device); None for torch's default.
    """

    def __init__(
        self,
        num_blocks: int,
        page_size: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        index_head_dim: int | None = None,
    ) -> None:
        super().__init__(num_blocks, page_size)
        self.kv_lora_rank = validation.positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_rope_head_dim = validation.positive_int("qk_rope_head_dim", qk_rope_head_dim)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"PagedLatentCache needs a floating torch dtype, got {dtype!r}")
        shape = (len(self._owned), self.page_size, 1, self.kv_lora_rank + self.qk_rope_head_dim)
        self.latent = torch.zeros(shape, dtype=dtype, device=device)
        self.index_head_dim = index_width(index_head_dim)
        self.index_keys = (
            None
            if self.index_head_dim is None
            else torch.zeros(shape[:-1] + (self.index_head_dim,), dtype=dtype, device=device)
        )

    @property
    def c_kv(self) -> torch.Tensor:
        """The normed latents, (num_blocks, P, 1, L): a view."""
        return self.latent[..., : self.kv_lora_rank]

    @property
    def k_rope(self) -> torch.Tensor:
        """The rotated shared keys, (num_blocks, P, 1, R): a view."""
        return self.latent[..., self.kv_lora_rank :]

    @property
    def dtype(self) -> torch.dtype:
        return self.latent.dtype

    @property
    def device(self) -> torch.device:
        return self.latent.device

    def check_append(
        self,
        batch: int,
        n: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """Raise unless n tokens of a layer with this kv_lora_rank and qk_rope_head_dim fit: L
        and R the cache's, B its sequences' (any B for an empty cache), its dtype and device,
        enough free pages. Writes nothing."""
        held = (
            f"{self.batch or 'B'} sequences of (page_size, kv_lora_rank + qk_rope_head_dim) = "
            f"({self.page_size}, {self.kv_lora_rank} + {self.qk_rope_head_dim})"
        )
        batches = (batch, self.batch or batch)  # an empty cache starts any number of sequences
        _check_fields(self, held, batches, kv_lora_rank, qk_rope_head_dim, dtype)
        if torch.device(device) != self.device:
            raise ValueError(f"the cache lives on {self.device}, got latents on {device}")
        self._check_room(batch, n)

    def _check_reserve(self, batch: int, n: int) -> None:
        rank, rope = self.kv_lora_rank, self.qk_rope_head_dim
        self.check_append(batch, n, rank, rope, self.dtype, self.device)

    def append(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
        """Write c_kv (B, N, L) and k_rope (B, N, R) after what is cached (detached; the first
        append starts B sequences); nothing is written when they are refused.

        Returns:
            every cached row so far, (B, length, L + R): each sequence's pages gathered, a copy.
        """
        self._append(c_kv, k_rope)
        return torch.stack([self._read(self.latent, b)[:, 0] for b in range(self.batch)])

    def attend(
        self, q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, **options: Any
    ) -> torch.Tensor:
        """Append c_kv (B, N, L) and k_rope (B, N, R), then attend q (B, H, N, L + R) over every
        cached row as one shared key head, per sequence on its pages (a view of one run)
        (``decode.cache.attend_per_sequence``, options split by sequence): values the rows, the
        output's first L columns kept. ``LatentCache.attend``'s twin over pages.

        Returns:
            out (B, H, N, L).
        """
        self._append(c_kv, k_rope)

        def read(b: int) -> tuple[torch.Tensor, torch.Tensor]:
            rows = self._read(self.latent, b).transpose(0, 1)[None]  # (1, 1, M, L+R)
            return rows, rows

        return attend_per_sequence(q, read, **options)[..., : self.kv_lora_rank]

    def check_index(self, index_head_dim: int | None) -> None:
        """Raise unless the cache holds indexer keys of this width (None: none)."""
        check_index(self.index_head_dim, index_head_dim)

    def index_append(self, keys: torch.Tensor) -> torch.Tensor:
        """Write an indexer's keys (B, N, DI) into the pages the next ``append`` writes its
        rows to (reserving them); return every one so far, (B, length + N, DI), gathered.
        ``length`` is unchanged (the NumPy twin's)."""
        if self.index_keys is None:
            raise ValueError("this cache holds no indexer keys (built without index_head_dim)")
        keys = _index_keys(keys, self.index_head_dim, self.dtype)
        batch, n = keys.shape[:2]
        self.reserve(batch, n)
        self._write(self.index_keys, keys[:, :, None])
        stop = self._length + n
        return torch.stack(
            [read_tokens(self.index_keys, table, 0, stop)[:, 0] for table in self._tables]
        )

    def _append(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> None:
        """Check, reserve the pages, write, advance: ``append`` without reading back."""
        c_kv, k_rope = _latents(c_kv, k_rope)
        batch, n, rank = c_kv.shape
        self.check_append(batch, n, rank, k_rope.shape[-1], c_kv.dtype, c_kv.device)
        self.reserve(batch, n)
        self._write(self.c_kv, c_kv[:, :, None])  # (B, N, 1, L) into (pages, P, 1, L) views
        self._write(self.k_rope, k_rope[:, :, None])
        self.advance(n)

    def __repr__(self) -> str:
        return (
            f"PagedLatentCache(pages={self.latent.shape[0]} x {self.page_size}, "
            f"kv_lora_rank={self.kv_lora_rank}, qk_rope_head_dim={self.qk_rope_head_dim}, "
            f"dtype={self.dtype}, device={self.device}, sequences={self.batch}, "
            f"length={self._length})"
        )


def _latents(c_kv: Any, k_rope: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """c_kv (B, N, L) and k_rope (B, N, R) as float tensors of one dtype, or a clear error."""
    c_kv = validation.float_tensor("c_kv", c_kv)
    k_rope = validation.float_tensor("k_rope", k_rope)
    if c_kv.ndim != 3 or k_rope.ndim != 3 or k_rope.shape[:-1] != c_kv.shape[:-1]:
        raise ValueError(
            f"c_kv must be (B, N, L) and k_rope (B, N, R), got c_kv {tuple(c_kv.shape)} and "
            f"k_rope {tuple(k_rope.shape)}"
        )
    validation.same_dtype(c_kv=c_kv, k_rope=k_rope)
    return c_kv, k_rope


def _index_keys(keys: Any, width: int | None, dtype: torch.dtype) -> torch.Tensor:
    """An indexer's keys (B, N, DI) as a float tensor of the cache's dtype, or a clear error."""
    keys = validation.float_tensor("keys", keys)
    if keys.ndim != 3 or keys.shape[-1] != width:
        raise ValueError(
            f"indexer keys must be (B, N, DI) = (B, N, {width}), got {tuple(keys.shape)}"
        )
    if keys.dtype != dtype:
        raise TypeError(f"the cache holds {dtype}, got indexer keys of {keys.dtype}")
    return keys


def _check_fields(
    cache: LatentCache | PagedLatentCache,
    held: str,
    batches: tuple[int, int],
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    dtype: torch.dtype,
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
    q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, **options: Any
) -> torch.Tensor:
    """The absorbed form's attention without a cache: q (B, H, N, L + R) over this call's rows
    [c_kv, k_rope] ((B, N, L) and (B, N, R)) as one shared key head, values c_kv, out
    (B, H, N, L): what either cache's ``attend`` computes over every row it holds.

    The values are the whole rows and the output's first L columns are kept (its last R,
    probabilities times k_rope, dropped): the same numbers as values c_kv, but torch's CPU SDPA
    takes its fast path only when V is as wide as K: at DeepSeek-V2-Lite's sizes a decode step's
    attention was measured at 16 ms this way and 530 ms with V = c_kv.
    """
    rows = torch.cat([c_kv, k_rope], dim=-1)[:, None]  # (B, 1, N, L+R)
    return attention(q, rows, rows, **options)[..., : c_kv.shape[-1]]
