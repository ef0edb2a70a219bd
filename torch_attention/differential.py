"""Differential attention in torch, the twin of ``numpy_attention.differential`` (Hugging Face's
``diffllama``): each query head reads both halves of the value heads side by side, and each pair
of query heads (h, h + H/2) is combined as

    lambda = exp(sum(lambda_q1 * lambda_k1)) - exp(sum(lambda_q2 * lambda_k2)) + lambda_init
    Y_h    = (1 - lambda_init) * rmsnorm(O_h - lambda * O_(h + H/2))     (over 2D, no weight)

Shape legend: B batch, H query heads, H_kv key/value heads (even), N queries, M keys, D head
width.

Derivation: docs/derivations/differential.md (the NumPy twin's backward; autograd here).
Tests: tests/torch_attention/test_differential.py (against the NumPy pair); in the layer,
tests/torch_attention/test_grouped.py.
"""

from __future__ import annotations

import torch

from numpy_attention.differential import (  # the rules are pure Python, shared
    LAMBDA_NAMES,
    LAMBDA_STD,
    check_differential,
    lambda_init_from_depth,
)

__all__ = [
    "LAMBDA_NAMES",
    "LAMBDA_STD",
    "check_differential",
    "differential",
    "differential_values",
    "lambda_init_from_depth",
]


def differential_values(v: torch.Tensor) -> torch.Tensor:
    """V'_j = [v_(j mod H_kv/2) | v_(H_kv/2 + j mod H_kv/2)]: (B, H_kv, M, D) -> (B, H_kv, M,
    2D)."""
    half = v.shape[1] // 2
    pair = torch.cat([v[:, :half], v[:, half:]], dim=-1)  # (B, H_kv/2, M, 2D)
    return torch.cat([pair, pair], dim=1)  # -> (B, H_kv, M, 2D)


def differential(
    heads: torch.Tensor,
    lambdas: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    lambda_init: float,
    eps: float,
) -> torch.Tensor:
    """Y_h = (1 - lambda_init) * rmsnorm(O_h - lambda * O_(h + H/2)), for h < H/2.

    Args:
        heads: O (B, H, N, 2D), each query head's attention over ``differential_values``.
        lambdas: lambda_q1, lambda_k1, lambda_q2, lambda_k2, each (D,).
        lambda_init: the layer's constant.
        eps: > 0, the norm's.

    Returns:
        Y (B, H/2, N, 2D), in heads' dtype (computed in it, as the NumPy twin).
    """
    q1, k1, q2, k2 = lambdas
    lambda_full = torch.exp((q1 * k1).sum()) - torch.exp((q2 * k2).sum()) + lambda_init
    half = heads.shape[1] // 2
    diff = heads[:, :half] - lambda_full * heads[:, half:]  # (B, H/2, N, 2D)
    mean_square = (diff * diff).mean(dim=-1, keepdim=True)  # (B, H/2, N, 1)
    return (1 - lambda_init) * diff / torch.sqrt(mean_square + eps)
