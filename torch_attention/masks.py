"""Masks as boolean "may attend" tensors that broadcast against the scores (..., N, M).

The twin of ``numpy_attention.masks``. Conventions (docs/design.md): ``key_padding_mask`` is bool
(B, M) with True = padding, never attended; ``attn_mask`` follows
``F.scaled_dot_product_attention``: bool True = may attend, or a float mask added to the scores;
``causal`` is aligned top-left, query i sees keys j <= i, also when N != M. Every mask is built on
the device of the tensors it will meet.

``to_sdpa`` (torch only) is the one place where these masks are translated into SDPA's single
``attn_mask`` (see docs/torch-backends.md).

Tests: tests/torch_attention/test_masks.py.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import validation


def causal_mask(n: int, m: int, device: torch.device) -> torch.Tensor:
    """Bool (N, M), True where query i may see key j (j <= i). Built per call: nothing is kept
    between calls (a cache of (N, N) masks would pin every size ever used)."""
    return torch.ones(n, m, dtype=torch.bool, device=device).tril()


def causal_buffer(
    context_length: int, dtype: torch.dtype = torch.float32, device: Any = None
) -> torch.Tensor:
    """The book's ``mask`` buffer: triu(ones(L, L), diagonal=1), 1 = masked (a future key)."""
    return torch.ones(context_length, context_length, dtype=dtype, device=device).triu(1)


def check_causal_buffer(name: str, mask: Any) -> None:
    """``ValueError`` unless ``mask`` is the book's causal buffer of some length L: a loaded
    buffer with a hole in its upper triangle would let the model see future tokens."""
    mask = torch.as_tensor(mask)
    if mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
        raise ValueError(
            f"{name} must be a square (L, L) causal buffer, got shape {tuple(mask.shape)}"
        )
    if not torch.equal(mask != 0, causal_buffer(mask.shape[0], torch.bool, mask.device)):
        raise ValueError(
            f"{name} is not the causal buffer triu(ones(L, L), diagonal=1) (1 = a future key): "
            "a model with it would see future tokens, or miss past ones"
        )


def key_padding_allowed(
    key_padding_mask: Any, q_shape: tuple[int, ...], m: int, device: torch.device
) -> torch.Tensor:
    """Turn a (B, M) padding mask (True = pad) into "may attend", shaped to broadcast on scores.

    It applies along the first axis of q: q (B, N, D) sees it as (B, 1, M), q (B, H, N, D) as
    (B, 1, 1, M).
    """
    key_padding_mask = validation.bool_tensor("key_padding_mask", key_padding_mask, device)
    q_shape = tuple(q_shape)
    if len(q_shape) < 3:
        raise ValueError(
            f"key_padding_mask needs a batched q (B, ..., N, D); got q of shape {q_shape}"
        )
    expected = (q_shape[0], m)
    if tuple(key_padding_mask.shape) != expected:
        raise ValueError(
            f"key_padding_mask must have shape (B, M) = {expected} for q {q_shape} and M = {m}, "
            f"got {tuple(key_padding_mask.shape)}"
        )
    return ~key_padding_mask.reshape((q_shape[0],) + (1,) * (len(q_shape) - 2) + (m,))


def split_attn_mask(
    attn_mask: Any, score_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Split an SDPA-style ``attn_mask`` into (allowed, bias): bool masks are "may attend",
    float masks are added to the scores (cast to the compute ``dtype``, never promoting it).

    A bool mask and a float bias are one float mask: the bias with -inf where the bool mask is
    False. Several tensors given together are refused, naming that rule.
    """
    if isinstance(attn_mask, (tuple, list)) and any(
        torch.as_tensor(part).ndim > 0 for part in attn_mask
    ):
        raise TypeError(
            "attn_mask must be one tensor, bool (True = may attend) or float (added to the "
            f"scores), got a {type(attn_mask).__name__} of {len(attn_mask)} tensors; to combine "
            "a bool mask with a float bias, pass torch.where(bool_mask, bias, -torch.inf)"
        )
    attn_mask = torch.as_tensor(attn_mask, device=device)
    if attn_mask.dtype == torch.bool:
        validation.broadcasts_to("attn_mask", attn_mask, score_shape)
        return attn_mask, None
    if attn_mask.is_floating_point():
        validation.broadcasts_to("attn_mask", attn_mask, score_shape)
        return None, attn_mask.to(dtype)
    raise TypeError(f"attn_mask must be bool (True = may attend) or float, got {attn_mask.dtype}")


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of the "may attend" masks that are present (None when there are none)."""
    present = [mask for mask in masks if mask is not None]
    if not present:
        return None
    return functools.reduce(torch.logical_and, present)


def to_sdpa(
    allowed: torch.Tensor | None, bias: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One SDPA ``attn_mask`` from our (allowed, bias), and the rows that can attend anything.

    SDPA takes a single mask: bool "may attend" when there is no float bias, else a float mask
    with -inf where not allowed (a *replacement*: the bias itself is never added to -inf). A query
    row with nothing to attend to is opened to every key (so no kernel computes a softmax over
    nothing) and reported in ``row_valid``, bool broadcasting to (..., N, 1), for the caller to
    zero the output there.

    Returns:
        (sdpa_mask, row_valid), both None when there is no mask at all.
    """
    if allowed is None:
        return bias, None
    row_valid = allowed.any(dim=-1, keepdim=True)  # (..., N, M) -> (..., N, 1)
    opened = allowed | ~row_valid
    if bias is None:
        return opened, row_valid
    return bias.masked_fill(~opened, float("-inf")), row_valid
