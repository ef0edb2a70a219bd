"""A layer's KV cache in torch, on any device: the twin of ``numpy_attention.decode.cache``,
contiguous (``KVCache``) or in pages of a shared pool (``PagedKVCache``), each with ``attend``,
the cache's side of the layer's protocol, and ``attend_per_sequence``, the attention over any
paged cache one sequence at a time that ``latent_cache.PagedLatentCache`` shares.

Shape legend: B sequences, H query heads, H_kv key/value heads, N new tokens, M cached tokens
after them, D head width, Dv value head width, P page size.

Derivation: docs/decoding.md (section 6, a layer's pages).
Tests: tests/torch_attention/decode/test_cache.py, tests/torch_attention/test_grouped.py (the
layer over either cache; pages equal to the contiguous cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import validation
from ..functional import attention
from ..scores import AttentionOutput
from .pages import PagePool

__all__ = ["KVCache", "PagedKVCache", "attend_per_sequence"]


class KVCache:
    """Preallocated keys and values of one attention layer, for decoding one token at a time.

    ``k`` (B, H_kv, max_len, D) and ``v`` (B, H_kv, max_len, Dv) are tensors on ``device`` of
    which the first ``length`` positions are filled; keys are stored after RoPE.

    Args:
        batch: B.
        num_kv_heads: H_kv.
        max_len: the most tokens the cache holds.
        head_dim: D.
        dtype: a floating torch dtype, that of the layer it serves.
        device: where the tensors live (the layer's device); None for torch's default.
        v_head_dim: Dv, the values' width; None for D (MiMo-V2-Flash's values are narrower).
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
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
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"KVCache needs a floating torch dtype, got {dtype!r}")
        self.max_len = max_len
        shape = (batch, num_kv_heads, max_len)
        self.k = torch.zeros(shape + (head_dim,), dtype=dtype, device=device)
        self.v = torch.zeros(shape + (v_head_dim,), dtype=dtype, device=device)
        self._length = 0

    @property
    def length(self) -> int:
        """How many positions are filled."""
        return self._length

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    def check_append(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> None:
        """Raise unless keys of ``shape`` (B, H_kv, N, D), ``dtype`` and ``device`` fit: B, H_kv
        and D the cache's, ``length + N <= max_len``. Writes nothing."""
        batch, heads, _, width = self.k.shape
        if len(shape) != 4 or (shape[0], shape[1], shape[3]) != (batch, heads, width):
            raise ValueError(
                f"the cache holds (B, H_kv, max_len, D) = {tuple(self.k.shape)}; keys and values "
                f"to append must be ({batch}, {heads}, N, {width}), got {tuple(shape)}"
            )
        if dtype != self.dtype:
            raise TypeError(f"the cache holds {self.dtype}, got keys and values of {dtype}")
        if torch.device(device) != self.device:
            raise ValueError(f"the cache lives on {self.device}, got keys and values on {device}")
        needed = self._length + shape[2]
        if needed > self.max_len:
            raise ValueError(
                f"the cache is too short: max_len = {self.max_len}, but {self._length} cached "
                f"+ {shape[2]} new tokens need a length of {needed}"
            )

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k (B, H_kv, N, D) and v (B, H_kv, N, Dv) after what is cached (detached: the
        cache is for inference); nothing is written when they are refused.

        Returns:
            keys (B, H_kv, length, D) and values (B, H_kv, length, Dv) so far: views of the
            cache.
        """
        k = validation.float_tensor("k", k)
        v = validation.float_tensor("v", v)
        validation.same_dtype(k=k, v=v)
        self.check_append(tuple(k.shape), k.dtype, k.device)
        if k.shape[:3] != v.shape[:3] or v.ndim != 4 or v.shape[3] != self.v.shape[3]:
            raise ValueError(
                f"k and v must be (B, H_kv, N, D) and (B, H_kv, N, Dv) with Dv = "
                f"{self.v.shape[3]}, got k {tuple(k.shape)} and v {tuple(v.shape)}"
            )
        start, stop = self._length, self._length + k.shape[2]
        self.k[:, :, start:stop] = k.detach()
        self.v[:, :, start:stop] = v.detach()
        self._length = stop
        return self.k[:, :, :stop], self.v[:, :, :stop]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        value_map: Callable[[torch.Tensor], torch.Tensor] | None = None,
        **options: Any,
    ) -> Any:
        """Append k (B, H_kv, N, D), v (B, H_kv, N, Dv) and attend q (B, H, N, D) over
        everything cached: ``functional.attention(q, keys, values, **options)``. The cache's
        side of the layer's protocol, shared with ``PagedKVCache.attend`` (which reads its keys
        from pages). ``value_map`` turns the values read into those attended (the NumPy
        twin's)."""
        keys, values = self.append(k, v)  # (B, H_kv, M, D), (B, H_kv, M, Dv): all cached so far
        if value_map is not None:
            values = value_map(values)
        return attention(q, keys, values, **options)

    def reset(self) -> None:
        """Forget every cached position (a new sequence); the tensors are kept."""
        self._length = 0

    def __repr__(self) -> str:
        return (
            f"KVCache(shape={tuple(self.k.shape)}, v_head_dim={self.v.shape[3]}, "
            f"dtype={self.dtype}, device={self.device}, length={self._length})"
        )


class PagedKVCache(PagePool):
    """The keys and values of one attention layer in pages of a shared pool; the twin of
    ``numpy_attention.decode.cache.PagedKVCache`` (the same allocation, ``pages.PagePool``'s).

    ``k`` (num_blocks, P, H_kv, D) and ``v`` (num_blocks, P, H_kv, Dv) live on ``device``.

    Args: those of the NumPy twin, with a torch ``dtype``, and
        device: where the pool lives (the layer's device); None for torch's default.
    """

    def __init__(
        self,
        num_blocks: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(num_blocks, page_size)
        num_kv_heads = validation.positive_int("num_kv_heads", num_kv_heads)
        head_dim = validation.positive_int("head_dim", head_dim)
        v_head_dim = validation.positive_int(
            "v_head_dim", head_dim if v_head_dim is None else v_head_dim
        )
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"PagedKVCache needs a floating torch dtype, got {dtype!r}")
        shape = (len(self._owned), self.page_size, num_kv_heads)
        self.k = torch.zeros(shape + (head_dim,), dtype=dtype, device=device)
        self.v = torch.zeros(shape + (v_head_dim,), dtype=dtype, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    def check_append(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> None:
        """Raise unless keys of ``shape`` (B, H_kv, N, D), ``dtype`` and ``device`` fit: H_kv
        and D the cache's, B its sequences' (any B for an empty cache), enough free pages.
        Writes nothing."""
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
        if torch.device(device) != self.device:
            raise ValueError(f"the cache lives on {self.device}, got keys and values on {device}")
        self._check_room(batch, shape[2])

    def _check_reserve(self, batch: int, n: int) -> None:
        self.check_append((batch, self.k.shape[2], n, self.k.shape[3]), self.dtype, self.device)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k (B, H_kv, N, D) and v (B, H_kv, N, Dv) after what is cached (detached: the
        cache is for inference); nothing is written when they are refused."""
        k = validation.float_tensor("k", k)
        v = validation.float_tensor("v", v)
        if k.shape[:3] != v.shape[:3] or v.ndim != 4 or v.shape[3] != self.v.shape[3]:
            raise ValueError(
                f"k and v must be (B, H_kv, N, D) and (B, H_kv, N, Dv) with Dv = "
                f"{self.v.shape[3]}, got k {tuple(k.shape)} and v {tuple(v.shape)}"
            )
        validation.same_dtype(k=k, v=v)
        self.check_append(tuple(k.shape), k.dtype, k.device)
        self.reserve(k.shape[0], k.shape[2])
        self._write(self.k, k.transpose(1, 2))  # (B, H_kv, N, D) -> (B, N, H_kv, D)
        self._write(self.v, v.transpose(1, 2))
        self.advance(k.shape[2])

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        value_map: Callable[[torch.Tensor], torch.Tensor] | None = None,
        **options: Any,
    ) -> Any:
        """Append k, v (B, H_kv, N, D) and attend q (B, H, N, D) over everything cached: per
        sequence, ``functional.attention(q_b, keys, values, **options)`` on its pages (a view
        when they are one run of the pool, as the pool's allocation keeps them);
        a (B, M) ``key_padding_mask`` and (B, ...) masks are split by sequence; ``value_map``
        as ``KVCache.attend``'s, on each sequence's values. The twin of the NumPy cache's
        ``attend``, and ``KVCache.attend``'s partner in the layer.

        Returns:
            what ``functional.attention`` returns: out (B, H, N, Dv), or ``AttentionOutput``
            with ``return_lse=True``.
        """
        self.append(k, v)

        def read(b: int) -> tuple[torch.Tensor, torch.Tensor]:
            keys = self._read(self.k, b).transpose(0, 1)[None]  # (M, H_kv, D) -> (1, H_kv, M, D)
            values = self._read(self.v, b).transpose(0, 1)[None]
            return keys, values if value_map is None else value_map(values)

        return attend_per_sequence(q, read, **options)

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sequence's keys and values, (B, H_kv, length, D) and (B, H_kv, length, Dv):
        copies, in the contiguous cache's layout."""
        keys = [self._read(self.k, b).transpose(0, 1) for b in range(self.batch)]
        values = [self._read(self.v, b).transpose(0, 1) for b in range(self.batch)]
        if not keys:
            shape = (0, self.k.shape[2], self._length)
            return self.k.new_zeros(shape + (self.k.shape[3],)), self.v.new_zeros(
                shape + (self.v.shape[3],)
            )
        return torch.stack(keys), torch.stack(values)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(pages={self.k.shape[0]} x {self.page_size}, kv_heads={self.k.shape[2]}, "
            f"head_dim={self.k.shape[3]}, v_head_dim={self.v.shape[3]}, dtype={self.dtype}, "
            f"device={self.device}, sequences={self.batch}, length={self._length})"
        )


def attend_per_sequence(
    q: torch.Tensor,
    read: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    **options: Any,
) -> Any:
    """``functional.attention(q[b:b+1], *read(b), **options)`` for each sequence b of q (B, H, N,
    D), concatenated; the twin of the NumPy function: ``read(b)`` gives the sequence's keys and
    values, (1, H_kv, M, D) and (1, H_kv, M, Dv); options holding one entry per sequence are
    split by sequence.

    Returns:
        what ``functional.attention`` returns: out (B, H, N, Dv), or ``AttentionOutput`` with
        ``return_lse=True``.
    """
    batch = q.shape[0]
    outs, lses = [], []
    for b in range(batch):
        own = {
            name: value[b : b + 1] if _per_sequence(name, value, batch) else value
            for name, value in options.items()
        }
        result = attention(q[b : b + 1], *read(b), **own)
        if isinstance(result, AttentionOutput):
            outs.append(result.out)
            lses.append(result.lse)
        else:
            outs.append(result)
    out = torch.cat(outs)
    return AttentionOutput(out, torch.cat(lses)) if lses else out


# Options of ``functional.attention`` that may hold one entry per sequence on their first axis,
# by the rank they have then: split by ``attend_per_sequence``.
_PER_SEQUENCE = {
    "key_padding_mask": 2,
    "attn_mask": 4,
    "dropout_mask": 4,
    "alibi_slopes": 2,
    "chunk_start": 1,
}


def _per_sequence(name: str, value: Any, batch: int) -> bool:
    rank = _PER_SEQUENCE.get(name)
    return (
        rank is not None
        and isinstance(value, torch.Tensor)
        and value.ndim == rank
        and value.shape[0] == batch
    )
