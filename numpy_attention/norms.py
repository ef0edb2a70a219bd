"""The norms of QK-norm: RMSNorm and LayerNorm (with or without a bias), each a pure pair
``x_forward`` / ``x_backward`` and a thin layer holding its weight (and LayerNorm's bias); and the
weightless L2 norm the linear-attention layers (gated DeltaNet, KDA) put on q and k,
y = x / sqrt(sum(x^2) + 1e-6), a pure pair ``l2norm_forward`` / ``l2norm_backward``.

    RMSNorm:    x_hat = x / sqrt(mean(x^2) + eps)                 over the last axis
    LayerNorm:  x_hat = (x - mean(x)) / sqrt(var(x) + eps)        var the biased variance
    both:       y = (offset + w) * x_hat
    LayerNorm with a bias (Persimmon's, ``nn.LayerNorm``'s):  y = (offset + w) * x_hat + b

with a learned weight w. ``weight_offset`` is 0 for the plain weight of Llama, Qwen3 and OLMo 2
(w starts at ones); Gemma's norms scale by (1 + w) (w starts at zeros), ``weight_offset=1``, so
that Gemma's stored weight loads as it is. The weight's shape is the trailing shape of x it
scales: (D,) shared by every row, or (H, D) for a weight per head (Cohere's QK-norm), the norm
always over the last axis alone. Where these norms sit in today's attention (per head or over the
whole projection, before RoPE) is ``grouped.py``'s.

Dtypes: float32 in, float32 out, computed in float32 (eps cast to it, no float64 intermediate).
Hugging Face's norms compute in float32 whatever the input's dtype; these compute in the input's
dtype, so float64 stays float64.

Shape legend: "..." leading axes (B, N or B, H, N), D the normalized width, W the weight's shape
(D,) or (H, D), the trailing axes of x (and the bias's).

Derivation: docs/derivations/rmsnorm.md (RMSNorm, the (1 + w) weight, a weight per head),
docs/derivations/layernorm.md (LayerNorm, its bias).
Tests: tests/numpy_attention/test_norms.py; as QK-norm, tests/numpy_attention/test_grouped.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import validation
from .module import Module


class NormCtx(NamedTuple):
    x_hat: np.ndarray  # the normalized x, (..., D)
    inv_std: np.ndarray  # 1 / rms (RMSNorm) or 1 / std (LayerNorm), (..., 1)
    scale: np.ndarray  # offset + w, W


def rmsnorm_forward(
    x: np.ndarray, weight: np.ndarray, eps: float = 1e-6, *, weight_offset: float = 0.0
) -> tuple[np.ndarray, NormCtx]:
    """y = (offset + w) * x / sqrt(mean(x^2) + eps), over the last axis.

    Args:
        x: (..., D).
        weight: W = (D,) or the trailing shape of x, e.g. (H, D); in x's dtype.
        eps: > 0, added to the mean square under the root.
        weight_offset: added to the weight (Gemma's 1: y = (1 + w) * x_hat).

    Returns:
        y (..., D) in x's dtype and the ctx for ``rmsnorm_backward``.
    """
    x, scale, eps = _check(x, weight, eps, weight_offset)
    mean_square = np.mean(x * x, axis=-1, keepdims=True)  # (..., 1)
    inv_rms = 1 / np.sqrt(mean_square + x.dtype.type(eps))  # (..., 1)
    x_hat = x * inv_rms  # (..., D)
    return x_hat * scale, NormCtx(x_hat, inv_rms, scale)


def rmsnorm_backward(dout: np.ndarray, ctx: NormCtx) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of x and of the weight.

    g = dy * (offset + w);  dx = (g - x_hat * mean(g * x_hat)) / rms;
    dw = sum over the rows of dy * x_hat (the offset is a constant). Derivation:
    docs/derivations/rmsnorm.md.

    Args:
        dout: (..., D), the forward's output shape.
        ctx: from ``rmsnorm_forward``.

    Returns:
        dx (..., D) and dweight W.
    """
    x_hat, inv_rms, scale = ctx
    dout = validation.grad_output(dout, x_hat.shape, x_hat.dtype)
    dweight = _weight_grad(dout, x_hat, scale.shape)  # forward: y = (offset + w) * x_hat
    dx_hat = dout * scale
    # forward: x_hat = x / rms, rms depending on every x of the row
    dx = inv_rms * (dx_hat - x_hat * np.mean(dx_hat * x_hat, axis=-1, keepdims=True))
    return dx, dweight


def layernorm_forward(
    x: np.ndarray,
    weight: np.ndarray,
    eps: float = 1e-5,
    *,
    weight_offset: float = 0.0,
    bias: np.ndarray | None = None,
) -> tuple[np.ndarray, NormCtx]:
    """y = (offset + w) * (x - mean(x)) / sqrt(var(x) + eps) (+ b), over the last axis: without
    a bias Cohere's LayerNorm (``torch.nn.functional.layer_norm`` with ``bias=None``), with one
    ``nn.LayerNorm``'s (Persimmon's QK-norm).

    Args:
        x: (..., D).
        weight: W = (D,) or the trailing shape of x, e.g. (H, D); in x's dtype.
        eps: > 0, added to the (biased) variance under the root.
        weight_offset: added to the weight.
        bias: None, or b of the weight's shape W and x's dtype, added after the scale. Its
            gradient is ``layernorm_bias_backward``'s (the ctx does not need it).

    Returns:
        y (..., D) in x's dtype and the ctx for ``layernorm_backward``.
    """
    x, scale, eps = _check(x, weight, eps, weight_offset)
    centered = x - np.mean(x, axis=-1, keepdims=True)  # (..., D)
    variance = np.mean(centered * centered, axis=-1, keepdims=True)  # (..., 1)
    inv_std = 1 / np.sqrt(variance + x.dtype.type(eps))  # (..., 1)
    x_hat = centered * inv_std  # (..., D)
    out = x_hat * scale
    if bias is not None:
        out = out + _check_bias(bias, x, scale.shape)
    return out, NormCtx(x_hat, inv_std, scale)


def layernorm_backward(dout: np.ndarray, ctx: NormCtx) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of x and of the weight.

    g = dy * (offset + w);  dx = (g - mean(g) - x_hat * mean(g * x_hat)) / std;
    dw = sum over the rows of dy * x_hat. Derivation: docs/derivations/layernorm.md.

    Args:
        dout: (..., D), the forward's output shape.
        ctx: from ``layernorm_forward``.

    Returns:
        dx (..., D) and dweight W.
    """
    x_hat, inv_std, scale = ctx
    dout = validation.grad_output(dout, x_hat.shape, x_hat.dtype)
    dweight = _weight_grad(dout, x_hat, scale.shape)  # forward: y = (offset + w) * x_hat
    dx_hat = dout * scale
    # forward: x_hat = (x - mean) / std; the mean takes back mean(g), std the part along x_hat
    mean_g = np.mean(dx_hat, axis=-1, keepdims=True)
    mean_gx = np.mean(dx_hat * x_hat, axis=-1, keepdims=True)
    return inv_std * (dx_hat - mean_g - x_hat * mean_gx), dweight


def layernorm_bias_backward(dout: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Gradient of LayerNorm's bias: forward y = (offset + w) * x_hat + b, b broadcast over every
    row, so db = sum over the rows of dy (every leading axis the bias does not have).
    Derivation: docs/derivations/layernorm.md.

    Args:
        dout: (..., *W), the forward's output shape.
        shape: W, the bias's shape (the trailing axes of dout).

    Returns:
        dbias W.
    """
    return dout.reshape((-1, *shape)).sum(axis=0)


def _check(
    x: np.ndarray, weight: np.ndarray, eps: float, weight_offset: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """x and the scale (offset + w) in x's dtype, checked; eps checked."""
    x = validation.float_array("x", x)
    weight = validation.float_array("weight", weight)
    if weight.ndim < 1 or x.ndim < weight.ndim or x.shape[x.ndim - weight.ndim :] != weight.shape:
        raise ValueError(
            "the norm needs x (..., D) and a weight of x's trailing shape ((D,) or e.g. (H, D)), "
            f"got x {x.shape} and weight {weight.shape}"
        )
    validation.same_dtype(x=x, weight=weight)
    offset = validation.finite_real("weight_offset", weight_offset)
    return x, weight + x.dtype.type(offset), _check_eps(eps)


def _check_bias(bias: np.ndarray, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """LayerNorm's bias checked: the weight's shape W and x's dtype."""
    bias = validation.float_array("bias", bias)
    if bias.shape != shape:
        raise ValueError(f"the bias must have the weight's shape {shape}, got {bias.shape}")
    validation.same_dtype(x=x, bias=bias)
    return bias


def _weight_grad(dout: np.ndarray, x_hat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """sum over the rows of dout * x_hat, W: every leading axis the weight does not have."""
    return (dout * x_hat).reshape((-1, *shape)).sum(axis=0)


def _check_eps(eps: float) -> float:
    eps = validation.finite_real("eps", eps)
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    return eps


class _Norm(Module):
    """The layer of a norm pair: parameter ``weight`` of shape ``dim``, float32, at
    ``1 - weight_offset`` (so that the scale starts at one)."""

    _forward = staticmethod(rmsnorm_forward)
    _backward = staticmethod(rmsnorm_backward)

    def __init__(
        self, dim: int | tuple[int, ...], eps: float = 1e-6, *, weight_offset: float = 0.0
    ) -> None:
        super().__init__()
        self.dim = _check_dim(dim)
        self.eps = _check_eps(eps)
        self.weight_offset = validation.finite_real("weight_offset", weight_offset)
        start = np.full(self.shape, 1.0 - self.weight_offset, dtype=np.float32)
        self.register_parameter("weight", start)

    @property
    def shape(self) -> tuple[int, ...]:
        """The weight's shape W: (dim,) or dim."""
        return self.dim if isinstance(self.dim, tuple) else (self.dim,)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., *W) -> (..., *W), normalized over the last axis."""
        x = self._checked_input(x)
        out, ctx = self._forward(x, self.weight, self.eps, weight_offset=self.weight_offset)
        self._save_ctx(ctx, out)
        return out

    def _checked_input(self, x: np.ndarray) -> np.ndarray:
        """x checked as (..., *W) in the weight's dtype."""
        name = type(self).__name__
        x = validation.layer_input("x", x, self.shape[-1], None, self.weight.dtype, name)
        if x.shape[x.ndim - len(self.shape) :] != self.shape:
            raise ValueError(
                f"{name} of weight {self.shape} needs x (..., *{self.shape}), got {x.shape}"
            )
        return x

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout (..., *W) -> dx (..., *W); adds dweight into the grads."""
        dout, ctx = self._pop_ctx(dout)
        dx, dweight = self._backward(dout, ctx)
        self._accumulate("weight", dweight)
        return dx


def _check_dim(dim: int | tuple[int, ...]) -> int | tuple[int, ...]:
    if isinstance(dim, (tuple, list)):
        if not dim:
            raise ValueError("dim must be a positive int or a non-empty tuple of them, got ()")
        return tuple(validation.positive_int(f"dim[{i}]", d) for i, d in enumerate(dim))
    return validation.positive_int("dim", dim)


class RMSNorm(_Norm):
    """RMS normalization of the last axis with a learned scale: parameter ``weight`` (the
    state-dict key of Hugging Face's ``q_norm.weight`` / ``k_norm.weight``).

    Args:
        dim: the weight's shape W: D (one weight of width D for every row), or a tuple such as
            (H, D) (a weight per head: x (..., H, D)); the norm is over the last axis.
        eps: > 0, added to the mean square under the root.
        weight_offset: the scale is (offset + w): 0 (Llama, Qwen3, OLMo 2; w starts at ones) or
            Gemma's 1 (w starts at zeros).
    """


class LayerNorm(_Norm):
    """Layer normalization of the last axis with a learned scale: parameter ``weight``, and with
    ``bias`` a parameter ``bias`` of the weight's shape, zeros at initialisation. Without a bias
    Cohere's QK-norm (``CohereLayerNorm``); with one ``nn.LayerNorm``'s (Persimmon's QK-norm).

    Args:
        dim: the weight's shape W: D, or a tuple such as (H, D) (Cohere's weight per head); the
            norm is over the last axis.
        eps: > 0, added to the variance under the root.
        weight_offset: the scale is (offset + w).
        bias: a learned bias b added after the scale, y = (offset + w) * x_hat + b.
    """

    _forward = staticmethod(layernorm_forward)
    _backward = staticmethod(layernorm_backward)

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
        if self.has_bias:
            self.register_parameter("bias", np.zeros(self.shape, dtype=np.float32))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., *W) -> (..., *W), normalized over the last axis (plus the bias)."""
        if not self.has_bias:
            return super().forward(x)
        x = self._checked_input(x)
        out, ctx = layernorm_forward(
            x, self.weight, self.eps, weight_offset=self.weight_offset, bias=self.bias
        )
        self._save_ctx(ctx, out)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout (..., *W) -> dx (..., *W); adds dweight (and dbias) into the grads."""
        if not self.has_bias:
            return super().backward(dout)
        dout, ctx = self._pop_ctx(dout)
        dx, dweight = layernorm_backward(dout, ctx)
        self._accumulate("weight", dweight)
        self._accumulate("bias", layernorm_bias_backward(dout, self.shape))
        return dx


class WeightlessRMSNorm(Module):
    """RMS normalization of the last axis without a learned scale, y = x / sqrt(mean(x^2) + eps):
    nanochat's QK-norm and Llama 4's ``L2Norm`` (which, despite its name, divides by the root
    mean square, not the Euclidean norm). No parameter; the pure pair runs with the constant
    scale 1, whose gradient is not kept.

    Args:
        dim: D, the normalized width.
        eps: > 0, added to the mean square under the root.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = validation.positive_int("dim", dim)
        self.eps = _check_eps(eps)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., D) -> (..., D), normalized over the last axis."""
        x = validation.layer_input("x", x, self.dim, None, None, type(self).__name__)
        ones = np.ones(self.dim, dtype=x.dtype)  # the constant scale: y = 1 * x_hat
        out, ctx = rmsnorm_forward(x, ones, self.eps)
        self._save_ctx(ctx, out)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout (..., D) -> dx (..., D); no parameter to add a gradient to."""
        dout, ctx = self._pop_ctx(dout)
        return rmsnorm_backward(dout, ctx)[0]


# -- the L2 norm of the linear-attention layers' q and k ----------------------------------------

L2NORM_EPS = 1e-6  # transformers' l2norm (and fla's): under the root, not a clamp


class L2NormCtx(NamedTuple):
    y: np.ndarray  # x / sqrt(sum(x^2) + eps), (..., D)
    inv_norm: np.ndarray  # 1 / sqrt(sum(x^2) + eps), (..., 1)


def l2norm_forward(x: np.ndarray, eps: float = L2NORM_EPS) -> tuple[np.ndarray, L2NormCtx]:
    """y = x / sqrt(sum(x^2) + eps) over the last axis (transformers' and fla's ``l2norm``)."""
    inv_norm = 1 / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + x.dtype.type(eps))  # (..., 1)
    y = x * inv_norm
    return y, L2NormCtx(y, inv_norm)


def l2norm_backward(dy: np.ndarray, ctx: L2NormCtx) -> np.ndarray:
    """dx = (dy - y sum(dy y)) / sqrt(sum(x^2) + eps): the chain rule through y = x n,
    n = (sum(x^2) + eps)^-1/2, dn/dx = -n^3 x.
    Derivation: docs/derivations/gated-deltanet-layer.md ("The L2 norm")."""
    return ctx.inv_norm * (dy - ctx.y * np.sum(dy * ctx.y, axis=-1, keepdims=True))
