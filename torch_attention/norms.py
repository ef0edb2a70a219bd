"""The norms of QK-norm in torch, the twins of ``numpy_attention.norms``: RMSNorm and LayerNorm
(with or without a bias), a weight of shape (D,) or (H, D) (a weight per head), scale
(offset + w). The backward is autograd's.

Shape legend: "..." leading axes, D the normalized width, W the weight's shape (the trailing axes
of x).

Derivation: docs/derivations/rmsnorm.md, docs/derivations/layernorm.md.
Tests: tests/torch_attention/test_norms.py; in the layer, tests/torch_attention/test_grouped.py.
"""

from __future__ import annotations

import torch
from torch import nn

from numpy_attention.norms import L2NORM_EPS

from . import validation
from .module import Module


class _Norm(Module):
    """A norm of the last axis with a learned scale ``offset + weight``; ``weight`` of shape W,
    at ``1 - weight_offset`` (the scale starts at one). Computed in x's dtype (Hugging Face's
    norms compute in float32 whatever the input's dtype)."""

    def __init__(
        self, dim: int | tuple[int, ...], eps: float = 1e-6, *, weight_offset: float = 0.0
    ) -> None:
        super().__init__()
        if isinstance(dim, (tuple, list)):
            if not dim:
                raise ValueError("dim must be a positive int or a non-empty tuple of them, got ()")
            self.dim: int | tuple[int, ...] = tuple(
                validation.positive_int(f"dim[{i}]", d) for i, d in enumerate(dim)
            )
        else:
            self.dim = validation.positive_int("dim", dim)
        self.eps = validation.finite_real("eps", eps)
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.weight_offset = validation.finite_real("weight_offset", weight_offset)
        self.weight = nn.Parameter(torch.full(self.shape, 1.0 - self.weight_offset))

    @property
    def shape(self) -> tuple[int, ...]:
        """The weight's shape W: (dim,) or dim."""
        return self.dim if isinstance(self.dim, tuple) else (self.dim,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., *W) -> (..., *W), normalized over the last axis."""
        name = type(self).__name__
        x = validation.layer_input("x", x, self.shape[-1], None, self.weight.dtype, name)
        if tuple(x.shape[x.ndim - len(self.shape) :]) != self.shape:
            raise ValueError(
                f"{name} of weight {self.shape} needs x (..., *{self.shape}), got {tuple(x.shape)}"
            )
        return self._normalize(x) * (self.weight + self.weight_offset)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        offset = f", weight_offset={self.weight_offset}" if self.weight_offset else ""
        return f"dim={self.dim}, eps={self.eps}{offset}"


class RMSNorm(_Norm):
    """RMS normalization of the last axis: y = (offset + w) * x / sqrt(mean(x^2) + eps).

    Args:
        dim: the weight's shape W: D, or a tuple such as (H, D) (a weight per head).
        eps: > 0, added to the mean square under the root.
        weight_offset: the scale is (offset + w): 0, or Gemma's 1.
    """

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        mean_square = (x * x).mean(dim=-1, keepdim=True)  # (..., 1)
        return x / torch.sqrt(mean_square + self.eps)


class LayerNorm(_Norm):
    """Layer normalization of the last axis: y = (offset + w) * (x - mean(x)) / sqrt(var(x) +
    eps) (+ b), var the biased variance; without a bias Cohere's QK-norm, with one
    ``nn.LayerNorm``'s (Persimmon's): parameter ``bias`` of the weight's shape, zeros.

    Args:
        dim: the weight's shape W: D, or a tuple such as (H, D) (Cohere's weight per head).
        eps: > 0, added to the variance under the root.
        weight_offset: the scale is (offset + w).
        bias: a learned bias b added after the scale.
    """

    def __init__(
        self,
        dim: int | tuple[int, ...],
        eps: float = 1e-6,
        *,
        weight_offset: float = 0.0,
        bias: bool = False,
    ) -> None:
        super().__init__(dim, eps, weight_offset=weight_offset)
        self.has_bias = validation.flag("bias", bias)
        self.bias = nn.Parameter(torch.zeros(self.shape)) if self.has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., *W) -> (..., *W), normalized over the last axis (plus the bias)."""
        out = super().forward(x)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return super().extra_repr() + (", bias=True" if self.has_bias else "")

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(dim=-1, keepdim=True)  # (..., D)
        variance = (centered * centered).mean(dim=-1, keepdim=True)  # (..., 1)
        return centered / torch.sqrt(variance + self.eps)


class WeightlessRMSNorm(Module):
    """RMS normalization of the last axis without a learned scale, y = x / sqrt(mean(x^2) + eps)
    (nanochat's QK-norm, Llama 4's ``L2Norm``): no parameter.

    Args:
        dim: D, the normalized width.
        eps: > 0, added to the mean square under the root.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = validation.positive_int("dim", dim)
        self.eps = validation.finite_real("eps", eps)
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D), normalized over the last axis."""
        x = validation.layer_input("x", x, self.dim, None, None, type(self).__name__)
        mean_square = (x * x).mean(dim=-1, keepdim=True)  # (..., 1)
        return x / torch.sqrt(mean_square + self.eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last axis (transformers' and fla's ``l2norm``)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)
