"""The decode caches of the linear-attention layers in torch, the twins of
``numpy_attention.linear_cache``: per sequence the short convolution's last W - 1 inputs (C, W-1)
and the recurrent state (H, K, V), contiguous (``LinearStateCache``) or in a pool of rows shared by
the sequences being served, sequence b in row ``slot_ids[b]`` (``PagedLinearStateCache``, vLLM's
state indices). States are kept in float32 (float64 for a float64 layer), never in half precision
(ollama #15865). The protocol is the NumPy twin's: ``length``, ``check``, ``read``, ``write``.

Shape legend: B sequences, H heads, K key width, V value width, C convolution channels, W taps,
S pool slots.

Tests: tests/torch_attention/test_linear_cache.py; in the layers, their tests.
"""

from __future__ import annotations

from typing import Any

import torch

from numpy_attention.linear_cache import _StateCache as _NumpyShapes

from . import validation

__all__ = ["LinearStateCache", "PagedLinearStateCache", "padding_keep", "state_dtype"]


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for a float64 layer, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class _StateCache:
    """Both caches' shapes, checks and ``length``; the checks are the NumPy twin's words."""

    _rows: int

    def _build(
        self,
        rows: int,
        heads: int,
        key_dim: int,
        value_dim: int,
        conv_dim: int | None,
        conv_width: int | None,
        dtype: torch.dtype,
        device: Any,
    ) -> None:
        # The shapes are checked by the NumPy twin's constructor (same rules, same words).
        shapes = _NumpyShapes(1, heads, key_dim, value_dim, conv_dim, conv_width, "float32")
        self.heads, self.key_dim, self.value_dim = shapes.heads, shapes.key_dim, shapes.value_dim
        self.conv_dim, self.conv_width = shapes.conv_dim, shapes.conv_width
        self.dtype = state_dtype(dtype)
        self.length = 0
        options = {"dtype": self.dtype, "device": device}
        self._states = torch.zeros(rows, self.heads, self.key_dim, self.value_dim, **options)
        self._convs = (
            None
            if self.conv_dim is None or self.conv_width is None
            else torch.zeros(rows, self.conv_dim, self.conv_width - 1, **options)
        )

    @property
    def batch(self) -> int:
        raise NotImplementedError

    def check(
        self,
        batch: int,
        heads: int,
        key_dim: int,
        value_dim: int,
        conv_dim: int | None,
        conv_width: int | None,
    ) -> None:
        """Raise unless this cache holds a layer of these shapes for ``batch`` sequences."""
        _NumpyShapes.check(self, batch, heads, key_dim, value_dim, conv_dim, conv_width)  # type: ignore[arg-type]

    def _checked(self, conv_state: Any, state: torch.Tensor, n: int) -> None:
        name = type(self).__name__
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        expected = (self.batch, self.heads, self.key_dim, self.value_dim)
        if tuple(state.shape) != expected:
            raise ValueError(f"{name}.write: state must be {expected}, got {tuple(state.shape)}")
        if self._convs is None:
            if conv_state is not None:
                raise ValueError(f"{name}.write: this cache holds no convolution state")
            return
        conv_shape = (self.batch, *self._convs.shape[1:])
        if conv_state is None or tuple(conv_state.shape) != conv_shape:
            got = None if conv_state is None else tuple(conv_state.shape)
            raise ValueError(f"{name}.write: conv_state must be {conv_shape}, got {got}")


class LinearStateCache(_StateCache):
    """The states of one linear-attention layer for ``batch`` sequences, zeros at first.

    Args:
        batch: B.
        heads, key_dim, value_dim: the recurrent state's (H, K, V).
        conv_dim, conv_width: the short convolution's C and W; None (both) without one.
        dtype: the layer's dtype; states are kept in ``state_dtype(dtype)``.
        device: where the states live.
    """

    def __init__(
        self,
        batch: int,
        heads: int,
        key_dim: int,
        value_dim: int,
        *,
        conv_dim: int | None = None,
        conv_width: int | None = None,
        dtype: torch.dtype = torch.float64,
        device: Any = None,
    ) -> None:
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        self._batch = batch
        self._build(batch, heads, key_dim, value_dim, conv_dim, conv_width, dtype, device)

    @property
    def batch(self) -> int:
        return self._batch

    def read(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Copies: (B, C, W-1) or None, and (B, H, K, V)."""
        return (None if self._convs is None else self._convs.clone()), self._states.clone()

    def write(self, conv_state: torch.Tensor | None, state: torch.Tensor, n: int) -> None:
        """Store the states after ``n`` more tokens (detached, cast to the cache's dtype)."""
        self._checked(conv_state, state, n)
        self._states.copy_(state.detach())
        if self._convs is not None and conv_state is not None:
            self._convs.copy_(conv_state.detach())
        self.length += n


class PagedLinearStateCache(_StateCache):
    """The states of one linear-attention layer in a pool of ``num_slots`` rows, sequence b's in
    row ``slot_ids[b]``.

    Args:
        slot_ids: (B,) distinct pool rows.
        num_slots: S.
        heads, key_dim, value_dim, conv_dim, conv_width, dtype, device: as
            ``LinearStateCache``'s.
    """

    def __init__(
        self,
        slot_ids: Any,
        num_slots: int,
        heads: int,
        key_dim: int,
        value_dim: int,
        *,
        conv_dim: int | None = None,
        conv_width: int | None = None,
        dtype: torch.dtype = torch.float64,
        device: Any = None,
    ) -> None:
        slots = torch.as_tensor(slot_ids)
        if slots.dim() != 1 or slots.numel() == 0 or slots.dtype.is_floating_point:
            raise ValueError(f"slot_ids must be a non-empty 1-D integer array, got {slot_ids!r}")
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        if int(slots.min()) < 0 or int(slots.max()) >= num_slots:
            raise ValueError(f"slot_ids must lie in [0, {num_slots}), got {slots.tolist()}")
        if len(set(slots.tolist())) != slots.numel():
            raise ValueError(
                f"slot_ids must be distinct (two sequences would share one state), got "
                f"{slots.tolist()}"
            )
        self.slot_ids = slots.to(device=device, dtype=torch.long)
        self._build(num_slots, heads, key_dim, value_dim, conv_dim, conv_width, dtype, device)

    @property
    def batch(self) -> int:
        return int(self.slot_ids.numel())

    @property
    def pool(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The whole pool: (S, C, W-1) or None, (S, H, K, V)."""
        return self._convs, self._states

    def read(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The sequences' rows gathered: (B, C, W-1) or None, (B, H, K, V)."""
        convs = None if self._convs is None else self._convs[self.slot_ids]
        return convs, self._states[self.slot_ids]

    def write(self, conv_state: torch.Tensor | None, state: torch.Tensor, n: int) -> None:
        """Scatter the sequences' states after ``n`` more tokens into their rows."""
        self._checked(conv_state, state, n)
        self._states[self.slot_ids] = state.detach().to(self.dtype)
        if self._convs is not None and conv_state is not None:
            self._convs[self.slot_ids] = conv_state.detach().to(self.dtype)
        self.length += n


def padding_keep(
    mask: Any, batch: int, m: int, tokens: int, x: torch.Tensor, cached: bool
) -> torch.Tensor | None:
    """The NumPy twin's ``padding_keep``: the key padding mask (B, M), True = padding, M = T or
    the cache's length plus T, as the multiplier (B, T, 1) of the call's inputs (x's dtype and
    device); None without a mask."""
    if mask is None:
        return None
    mask = validation.bool_tensor("key_padding_mask", mask, x.device)
    if tuple(mask.shape) != (batch, m):
        tokens_seen = "the cache's length after this call" if cached else "x's T"
        raise ValueError(
            f"key_padding_mask is (B, M), M = {tokens_seen}: expected {(batch, m)}, got "
            f"{tuple(mask.shape)}"
        )
    return (~mask[:, m - tokens :, None]).to(x.dtype)  # (B, T, 1)
