"""RMSNorm: the pure pair ``rmsnorm_forward`` / ``rmsnorm_backward`` and the thin layer holding its
weight.

    rms = sqrt(mean(x^2) + eps) over the last axis;  x_hat = x / rms;  y = w * x_hat

with a plain weight w (ones at initialisation), as Llama and Qwen3 write it. Gemma's norms
scale by (1 + w) instead: a weight stored for that form loads here as 1 + w. Qwen3's QK-norm is
this layer applied per head on the head width D, before RoPE (``grouped.py``).

Dtypes: float32 in, float32 out, computed in float32 (eps cast to it, no float64 intermediate).
Hugging Face's RMSNorm computes in float32 whatever the input's dtype; this one computes in the
input's dtype, so float64 stays float64.

Shape legend: "..." leading axes (B, N or B, H, N), D the normalized width.

Derivation: docs/derivations/rmsnorm.md.
Tests: tests/numpy_attention/test_norms.py; as QK-norm, tests/numpy_attention/test_grouped.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import validation
from .module import Module


class RMSNormCtx(NamedTuple):
    x_hat: np.ndarray  # x / rms, (..., D)
    inv_rms: np.ndarray  # 1 / rms, (..., 1)
    weight: np.ndarray  # (D,)


def rmsnorm_forward(
    x: np.ndarray, weight: np.ndarray, eps: float = 1e-6
) -> tuple[np.ndarray, RMSNormCtx]:
    """y = w * x / sqrt(mean(x^2) + eps), over the last axis.

    Args:
        x: (..., D).
        weight: (D,), in x's dtype.
        eps: > 0, added to the mean square under the root.

    Returns:
        y (..., D) in x's dtype and the ctx for ``rmsnorm_backward``.
    """
    x = validation.float_array("x", x)
    weight = validation.float_array("weight", weight)
    if x.ndim < 1 or weight.shape != x.shape[-1:]:
        raise ValueError(
            f"RMSNorm needs x (..., D) and weight (D,), got x {x.shape} and weight {weight.shape}"
        )
    validation.same_dtype(x=x, weight=weight)
    eps = _check_eps(eps)
    mean_square = np.mean(x * x, axis=-1, keepdims=True)  # (..., 1)
    inv_rms = 1 / np.sqrt(mean_square + x.dtype.type(eps))  # (..., 1)
    x_hat = x * inv_rms  # (..., D)
    return x_hat * weight, RMSNormCtx(x_hat, inv_rms, weight)


def rmsnorm_backward(dout: np.ndarray, ctx: RMSNormCtx) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of x and of the weight.

    g = dy * w;  dx = (g - x_hat * mean(g * x_hat)) / rms;  dw = sum over rows of dy * x_hat.
    Derivation: docs/derivations/rmsnorm.md.

    Args:
        dout: (..., D), the forward's output shape.
        ctx: from ``rmsnorm_forward``.

    Returns:
        dx (..., D) and dweight (D,).
    """
    x_hat, inv_rms, weight = ctx
    dout = validation.grad_output(dout, x_hat.shape, x_hat.dtype)
    flat_dout = dout.reshape(-1, dout.shape[-1])  # (..., D) -> (R, D)
    dweight = (flat_dout * x_hat.reshape(flat_dout.shape)).sum(axis=0)  # forward: y = w * x_hat
    dx_hat = dout * weight
    # forward: x_hat = x / rms, rms depending on every x of the row
    dx = inv_rms * (dx_hat - x_hat * np.mean(dx_hat * x_hat, axis=-1, keepdims=True))
    return dx, dweight


def _check_eps(eps: float) -> float:
    eps = validation.finite_real("eps", eps)
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    return eps


class RMSNorm(Module):
    """RMS normalization of the last axis with a learned scale: parameter ``weight`` (D,), ones,
    float32 (the state-dict key of Hugging Face's ``q_norm.weight`` / ``k_norm.weight``).

    Args:
        dim: D, the width normalized.
        eps: > 0, added to the mean square under the root.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = validation.positive_int("dim", dim)
        self.eps = _check_eps(eps)
        self.register_parameter("weight", np.ones(self.dim, dtype=np.float32))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., D) -> (..., D)."""
        x = validation.layer_input("x", x, self.dim, None, self.weight.dtype, "RMSNorm")
        out, ctx = rmsnorm_forward(x, self.weight, self.eps)
        self._save_ctx(ctx, out)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout (..., D) -> dx (..., D); adds dweight into the grads."""
        dout, ctx = self._pop_ctx(dout)
        dx, dweight = rmsnorm_backward(dout, ctx)
        self._accumulate("weight", dweight)
        return dx
