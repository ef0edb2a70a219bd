"""The decode caches of the linear-attention layers (gated DeltaNet, KDA, lightning): per sequence
a fixed-size state, whatever the context's length, in place of a softmax layer's growing keys and
values:

    conv_state   (C, W-1)   the last W - 1 inputs of the layer's short convolution (none for
                            lightning attention, which has no convolution)
    state        (H, K, V)  the recurrent state S after the sequence's last token

``LinearStateCache`` holds them contiguously, one row per batch element. ``PagedLinearStateCache``
holds a pool of ``num_slots`` rows shared by the sequences being served, sequence b in pool row
``slot_ids[b]`` (vLLM's state indices for its Mamba and GDN layers: a sequence's state is one
page of its own, however long the sequence); both give the same numbers.

The state is kept in float32, or float64 for a float64 layer, never in half precision: a bfloat16
state is ollama #15865's bug, Qwen3.5 collapsing after a few tokens (the recurrence rounds S every
token; the error grows with the context).

A layer decodes through one protocol, five members both caches have:

    length                              tokens taken so far (the same for every sequence)
    check(batch, heads, key_dim,        raise unless the cache was built for this layer and
          value_dim, conv_dim,          batch (writes nothing; the layer calls it before any
          conv_width)                   work)
    read() -> (conv_state, state)       copies: (B, C, W-1) or None, and (B, H, K, V)
    write(conv_state, state, n)         store both after n more tokens; length += n

Shape legend: B sequences, H heads, K key width, V value width, C convolution channels, W its
taps, S pool slots.

Tests: tests/numpy_attention/test_linear_cache.py; in the layers, their tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import validation

__all__ = ["LinearStateCache", "PagedLinearStateCache", "padding_keep", "state_dtype"]


def state_dtype(dtype: Any) -> np.dtype:
    """The dtype a state is kept in for a layer of ``dtype``: float64 for float64, else float32."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


class _StateCache:
    """What both caches share: the shapes they were built for, the checks, ``length``."""

    def __init__(
        self,
        rows: int,
        heads: int,
        key_dim: int,
        value_dim: int,
        conv_dim: int | None,
        conv_width: int | None,
        dtype: Any,
    ) -> None:
        self.heads = validation.positive_int("heads", heads)
        self.key_dim = validation.positive_int("key_dim", key_dim)
        self.value_dim = validation.positive_int("value_dim", value_dim)
        if (conv_dim is None) != (conv_width is None):
            raise ValueError(
                f"conv_dim and conv_width go together (a layer with a short convolution has "
                f"both, one without neither), got conv_dim={conv_dim}, conv_width={conv_width}"
            )
        self.conv_dim = None if conv_dim is None else validation.positive_int("conv_dim", conv_dim)
        self.conv_width = (
            None if conv_width is None else validation.positive_int("conv_width", conv_width)
        )
        self.dtype = state_dtype(dtype)
        self.length = 0
        self._states = np.zeros((rows, self.heads, self.key_dim, self.value_dim), self.dtype)
        self._convs = (
            None
            if self.conv_dim is None or self.conv_width is None
            else np.zeros((rows, self.conv_dim, self.conv_width - 1), self.dtype)
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
        name = type(self).__name__
        got = (self.batch, self.heads, self.key_dim, self.value_dim, self.conv_dim, self.conv_width)
        wanted = (batch, heads, key_dim, value_dim, conv_dim, conv_width)
        labels = ("batch", "heads", "key_dim", "value_dim", "conv_dim", "conv_width")
        wrong = [
            f"{label} {have} (the layer's call has {want})"
            for label, have, want in zip(labels, got, wanted, strict=True)
            if have != want
        ]
        if wrong:
            raise ValueError(f"{name} was built for another layer or batch: {', '.join(wrong)}")

    def _checked(
        self, conv_state: Any, state: Any, n: int
    ) -> tuple[np.ndarray | None, np.ndarray, int]:
        name = type(self).__name__
        n = validation.positive_int("n", n)
        state = validation.float_array("state", state)
        expected = (self.batch, self.heads, self.key_dim, self.value_dim)
        if state.shape != expected:
            raise ValueError(f"{name}.write: state must be {expected}, got {state.shape}")
        if self._convs is None:
            if conv_state is not None:
                raise ValueError(f"{name}.write: this cache holds no convolution state")
            return None, state, n
        conv_state = validation.float_array("conv_state", conv_state)
        conv_shape = (self.batch, *self._convs.shape[1:])
        if conv_state.shape != conv_shape:
            raise ValueError(
                f"{name}.write: conv_state must be {conv_shape}, got {conv_state.shape}"
            )
        return conv_state, state, n


class LinearStateCache(_StateCache):
    """The states of one linear-attention layer for ``batch`` sequences, one row each, zeros
    before the first token.

    Args:
        batch: B.
        heads, key_dim, value_dim: the recurrent state's (H, K, V).
        conv_dim, conv_width: the short convolution's channels C and taps W; None (both) for a
            layer without one.
        dtype: the layer's dtype; the states are kept in ``state_dtype(dtype)``.
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
        dtype: Any = np.float64,
    ) -> None:
        self._batch = validation.positive_int("batch", batch)
        super().__init__(self._batch, heads, key_dim, value_dim, conv_dim, conv_width, dtype)

    @property
    def batch(self) -> int:
        return self._batch

    def read(self) -> tuple[np.ndarray | None, np.ndarray]:
        """Copies of the convolution state (B, C, W-1) (None without one) and the state
        (B, H, K, V)."""
        return (None if self._convs is None else self._convs.copy()), self._states.copy()

    def write(self, conv_state: Any, state: Any, n: int) -> None:
        """Store the states after ``n`` more tokens (cast to the cache's dtype)."""
        conv_state, state, n = self._checked(conv_state, state, n)
        self._states[...] = state
        if self._convs is not None:
            self._convs[...] = conv_state
        self.length += n


class PagedLinearStateCache(_StateCache):
    """The states of one linear-attention layer in a pool of ``num_slots`` rows: sequence b's in
    row ``slot_ids[b]``; the other rows belong to other requests and are neither read nor written.

    Args:
        slot_ids: (B,) distinct pool rows, one per sequence of the calls.
        num_slots: S, the pool's rows.
        heads, key_dim, value_dim, conv_dim, conv_width, dtype: as ``LinearStateCache``'s.
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
        dtype: Any = np.float64,
    ) -> None:
        num_slots = validation.positive_int("num_slots", num_slots)
        slots = np.asarray(slot_ids)
        if slots.ndim != 1 or slots.size == 0 or slots.dtype.kind not in "iu":
            raise ValueError(f"slot_ids must be a non-empty 1-D integer array, got {slot_ids!r}")
        if slots.min() < 0 or slots.max() >= num_slots:
            raise ValueError(f"slot_ids must lie in [0, {num_slots}), got {slots.tolist()}")
        if len(set(slots.tolist())) != slots.size:
            raise ValueError(
                f"slot_ids must be distinct (two sequences would share one state), got "
                f"{slots.tolist()}"
            )
        self.slot_ids = slots.astype(np.int64)
        super().__init__(num_slots, heads, key_dim, value_dim, conv_dim, conv_width, dtype)

    @property
    def batch(self) -> int:
        return int(self.slot_ids.size)

    @property
    def pool(self) -> tuple[np.ndarray | None, np.ndarray]:
        """The whole pool (views): convolution states (S, C, W-1) or None, states (S, H, K, V)."""
        return self._convs, self._states

    def read(self) -> tuple[np.ndarray | None, np.ndarray]:
        """The sequences' rows gathered from the pool: (B, C, W-1) or None, (B, H, K, V)."""
        convs = None if self._convs is None else self._convs[self.slot_ids]
        return convs, self._states[self.slot_ids]

    def write(self, conv_state: Any, state: Any, n: int) -> None:
        """Scatter the sequences' states after ``n`` more tokens into their pool rows."""
        conv_state, state, n = self._checked(conv_state, state, n)
        self._states[self.slot_ids] = state
        if self._convs is not None:
            self._convs[self.slot_ids] = conv_state
        self.length += n


def padding_keep(
    mask: Any, batch: int, m: int, tokens: int, dtype: np.dtype, cached: bool
) -> np.ndarray | None:
    """A linear-attention layer's key padding mask (B, M), True = padding, M the tokens seen
    after this call (the cache's length plus T, or T without a cache), as the multiplier of the
    call's inputs (B, T, 1): 1 on the last T columns' real tokens, 0 on their padding
    (transformers' ``apply_mask_to_padding_states``); None without a mask. One convention for
    every layer that keeps these caches, the one ``key_padding_mask`` has across the package."""
    if mask is None:
        return None
    mask = validation.bool_array("key_padding_mask", mask)
    if mask.shape != (batch, m):
        tokens_seen = "the cache's length after this call" if cached else "x's T"
        raise ValueError(
            f"key_padding_mask is (B, M), M = {tokens_seen}: expected {(batch, m)}, got "
            f"{mask.shape}"
        )
    return (~mask[:, m - tokens :, None]).astype(dtype)  # (B, T, 1)
