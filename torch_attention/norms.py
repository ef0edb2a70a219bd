"""RMS normalization in torch, the twin of ``numpy_attention.norms`` (used for QK-norm, which
Qwen3 applies per head on the head width, before RoPE). The backward is autograd's.

Shape legend: "..." leading axes, D the normalized width.

Derivation: docs/derivations/rmsnorm.md.
Tests: tests/torch_attention/test_norms.py; in the layer, tests/torch_attention/test_grouped.py.
"""

from __future__ import annotations

import torch
from torch import nn

from . import validation
from .module import Module


class RMSNorm(Module):
    """RMS normalization of the last axis with a learned scale: ``weight`` (D,), ones.

    y = w * x / sqrt(mean(x^2) + eps), computed in x's dtype (Hugging Face's computes in float32
    whatever the input's dtype). Qwen3's QK-norm applies it per head on D.

    Args:
        dim: D, the width normalized.
        eps: > 0, added to the mean square under the root.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = validation.positive_int("dim", dim)
        self.eps = validation.finite_real("eps", eps)
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.weight = nn.Parameter(torch.ones(self.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D)."""
        x = validation.layer_input("x", x, self.dim, None, self.weight.dtype, "RMSNorm")
        mean_square = (x * x).mean(dim=-1, keepdim=True)  # (..., 1)
        inv_rms = 1 / torch.sqrt(mean_square + self.eps)  # (..., 1)
        return x * inv_rms * self.weight

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"
