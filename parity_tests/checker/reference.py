"""The checker's same-dtype baseline Bl: textbook attention in torch, in the inputs' dtype, with
no upcasting and autograd's backward.

The bound of every judged tensor is relative to how far this baseline lands from the float64
golden (``checker.kernels``), so the baseline must be plain: no fused kernel, no float32
accumulation of half-precision inputs. The pitfalls (``checker.pitfalls``) are built from the same
pieces, each with one step broken.

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value width.

Tests: tests/checker/test_reference.py
"""

from __future__ import annotations

import math

import torch


def attention_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """S = Q K^T * scale, plus a float mask, -inf where a bool mask or the causal mask forbids.

    Args:
        query: (B, H, N, D); key: (B, H, M, D); attn_mask: bool (True = may attend) or float,
            broadcasting to (B, H, N, M). ``scale`` defaults to 1 / sqrt(D).

    Returns:
        scores (B, H, N, M) in the inputs' dtype.
    """
    n, m, d = query.shape[-2], key.shape[-2], query.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (query @ key.transpose(-2, -1)) * scale  # (B, H, N, D) @ (B, H, D, M) -> (B, H, N, M)
    if is_causal:
        causal = torch.ones(n, m, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~causal, -math.inf)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, -math.inf)
    elif attn_mask is not None:
        scores = scores + attn_mask
    return scores


def masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the keys (last axis); a fully masked row (all -inf) gets weights 0, not NaN."""
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True).detach()
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


def plain_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """The baseline Bl: textbook attention in the inputs' dtype, no upcasting, autograd backward.

    S = Q K^T * scale (+ float mask, -inf where masked); P = softmax(S), 0 on fully masked rows;
    P' = P * keep / (1 - p); O = P' V. Without an explicit bool ``keep`` (B, H, N, M), dropout
    draws it from torch's generator.

    Args:
        query: (B, H, N, D); key: (B, H, M, D); value: (B, H, M, Dv).

    Returns:
        (B, H, N, Dv).
    """
    probs = masked_softmax(attention_scores(query, key, attn_mask, is_causal, scale))
    if dropout_p:
        if keep is None:
            keep = torch.rand(probs.shape, device=probs.device) >= dropout_p
        probs = probs * keep.to(probs.dtype) * (1.0 / (1.0 - dropout_p))
    return probs @ value  # (B, H, N, M) @ (B, H, M, Dv) -> (B, H, N, Dv)
