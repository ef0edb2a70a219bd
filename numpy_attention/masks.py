"""Masks as boolean "may attend" arrays that broadcast against the scores (..., N, M).

Conventions (docs/design.md): ``key_padding_mask`` is bool (B, M) with True = padding, never
attended; ``attn_mask`` follows ``F.scaled_dot_product_attention``: bool True = may attend, or a
float mask added to the scores; ``causal`` is aligned top-left, query i sees keys j <= i, also
when N != M.

Derivation: docs/derivations/attention.md (masks in the pipeline), windows.md.
Tests: tests/numpy_attention/test_masks.py.
"""

from __future__ import annotations

import functools

import numpy as np

from . import validation


def causal_mask(n: int, m: int) -> np.ndarray:
    """Bool (N, M), True where query i may see key j (j <= i). Built per call: N * M bytes, and
    nothing is kept between calls (a cache of (N, N) masks would pin every size ever used)."""
    return np.tri(n, m, dtype=bool)


def causal_buffer(context_length: int, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """The book's ``mask`` buffer: triu(ones(L, L), diagonal=1), 1 = masked (a future key)."""
    return np.triu(np.ones((context_length, context_length), dtype=dtype), k=1)


def check_causal_buffer(name: str, mask: np.ndarray) -> None:
    """``ValueError`` unless ``mask`` is the book's causal buffer of some length L: a loaded
    buffer with a hole in its upper triangle would let the model see future tokens."""
    mask = np.asarray(mask)
    if mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
        raise ValueError(f"{name} must be a square (L, L) causal buffer, got shape {mask.shape}")
    if not np.array_equal(mask != 0, causal_buffer(mask.shape[0], bool)):
        raise ValueError(
            f"{name} is not the causal buffer triu(ones(L, L), diagonal=1) (1 = a future key): "
            "a model with it would see future tokens, or miss past ones"
        )


def key_padding_allowed(
    key_padding_mask: np.ndarray, q_shape: tuple[int, ...], m: int
) -> np.ndarray:
    """Turn a (B, M) padding mask (True = pad) into "may attend", shaped to broadcast on scores.

    It applies along the first axis of q: q (B, N, D) sees it as (B, 1, M), q (B, H, N, D) as
    (B, 1, 1, M).
    """
    key_padding_mask = validation.bool_array("key_padding_mask", key_padding_mask)
    if len(q_shape) < 3:
        raise ValueError(
            f"key_padding_mask needs a batched q (B, ..., N, D); got q of shape {q_shape}"
        )
    expected = (q_shape[0], m)
    if key_padding_mask.shape != expected:
        raise ValueError(
            f"key_padding_mask must have shape (B, M) = {expected} for q {q_shape} and M = {m}, "
            f"got {key_padding_mask.shape}"
        )
    return ~key_padding_mask.reshape((q_shape[0],) + (1,) * (len(q_shape) - 2) + (m,))


def split_attn_mask(
    attn_mask: np.ndarray, score_shape: tuple[int, ...], dtype: np.dtype
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Split an SDPA-style ``attn_mask`` into (allowed, bias): bool masks are "may attend",
    float masks are added to the scores (cast to the compute dtype, never promoting it).

    A bool mask and a float bias are one float mask: the bias with -inf where the bool mask is
    False. Several arrays given together are refused, naming that rule.
    """
    if isinstance(attn_mask, (tuple, list)) and any(np.ndim(part) > 0 for part in attn_mask):
        raise TypeError(
            "attn_mask must be one array, bool (True = may attend) or float (added to the "
            f"scores), got a {type(attn_mask).__name__} of {len(attn_mask)} arrays; to combine a "
            "bool mask with a float bias, pass np.where(bool_mask, bias, -np.inf)"
        )
    attn_mask = np.asarray(attn_mask)
    if attn_mask.dtype == np.bool_:
        validation.broadcasts_to("attn_mask", attn_mask, score_shape)
        return attn_mask, None
    if np.issubdtype(attn_mask.dtype, np.floating):
        validation.broadcasts_to("attn_mask", attn_mask, score_shape)
        return None, attn_mask.astype(dtype, copy=False)
    raise TypeError(f"attn_mask must be bool (True = may attend) or float, got {attn_mask.dtype}")


def combine(*masks: np.ndarray | None) -> np.ndarray | None:
    """Logical AND of the "may attend" masks that are present (None when there are none)."""
    present = [mask for mask in masks if mask is not None]
    if not present:
        return None
    return functools.reduce(np.logical_and, present)
