"""Linear and Dropout: the pure forward/backward pairs and the thin layers that hold them; and
one Linear per head (``head_linear_forward`` / ``_backward``, latent attention's absorbed maps).

Shape legend: "..." leading axes, C_in / C_out the feature widths.

Derivation: docs/derivations/linear.md (Linear and Dropout).
Tests: tests/numpy_attention/test_layers.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import validation
from .module import Module

# -- linear -----------------------------------------------------------------------------------


class LinearCtx(NamedTuple):
    x: np.ndarray  # (..., C_in)
    weight: np.ndarray  # (C_out, C_in)


def linear_forward(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None
) -> tuple[np.ndarray, LinearCtx]:
    """y = x W^T + b, with torch's layout: weight (C_out, C_in), bias (C_out,)."""
    flat = x.reshape(-1, x.shape[-1])  # (..., C_in) -> (R, C_in): one BLAS call, not one per row
    out = flat @ weight.T  # (R, C_in) @ (C_in, C_out) -> (R, C_out)
    if bias is not None:
        out += bias  # in place: no second (R, C_out) array
    return out.reshape(*x.shape[:-1], weight.shape[0]), LinearCtx(x, weight)  # -> (..., C_out)


def linear_backward(dout: np.ndarray, ctx: LinearCtx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx = dy W;  dW = dy^T x (summed over every leading axis);  db = sum of dy.

    Derivation: docs/derivations/linear.md.

    Returns:
        dx (..., C_in), dweight (C_out, C_in), dbias (C_out,).
    """
    x, weight = ctx
    dx = dout @ weight  # (..., C_out) @ (C_out, C_in) -> (..., C_in)
    flat_dout = dout.reshape(-1, dout.shape[-1])  # (..., C_out) -> (R, C_out)
    flat_x = x.reshape(-1, x.shape[-1])  # (..., C_in) -> (R, C_in)
    dweight = flat_dout.T @ flat_x  # (C_out, R) @ (R, C_in) -> (C_out, C_in)
    dbias = flat_dout.sum(axis=0)
    return dx, dweight, dbias


class HeadLinearCtx(NamedTuple):
    x: np.ndarray  # (B, H, N, I)
    weight: np.ndarray  # (H, O, I)


def head_linear_forward(x: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, HeadLinearCtx]:
    """One linear map per head, no bias: y_h = x_h W_h^T, x (B, H, N, I), weight (H, O, I) ->
    y (B, H, N, O). The absorbed form's W_UK^T and W_UV."""
    return x @ weight.swapaxes(-1, -2), HeadLinearCtx(x, weight)  # (B,H,N,I) @ (H,I,O)


def head_linear_backward(dout: np.ndarray, ctx: HeadLinearCtx) -> tuple[np.ndarray, np.ndarray]:
    """Linear's backward, head by head: dx_h = dy_h W_h;  dW_h = sum over (B, N) of dy_h^T x_h.
    Derivation: docs/derivations/linear.md.

    Returns:
        dx (B, H, N, I) and dweight (H, O, I).
    """
    dx = dout @ ctx.weight  # (B, H, N, O) @ (H, O, I) -> (B, H, N, I)
    dweight = np.einsum("bhno,bhni->hoi", dout, ctx.x)  # sums over B and N
    return dx, dweight


class Linear(Module):
    """``nn.Linear``'s twin: parameters ``weight`` (C_out, C_in) and ``bias`` (C_out,).

    Initialised as torch does by default: weight and bias uniform in [-1/sqrt(C_in), 1/sqrt(C_in)]
    (kaiming_uniform with a = sqrt(5) reduces to that bound), drawn from ``rng``; float32.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        in_features = validation.positive_int("in_features", in_features)
        out_features = validation.positive_int("out_features", out_features)
        bias = validation.flag("bias", bias)
        rng = np.random.default_rng(rng)
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        weight = rng.uniform(-bound, bound, (out_features, in_features))
        self.register_parameter("weight", weight.astype(np.float32))
        if bias:
            self.register_parameter(
                "bias", rng.uniform(-bound, bound, out_features).astype(np.float32)
            )
        self.has_bias = bias

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., C_in) -> (..., C_out)."""
        x = validation.layer_input("x", x, self.in_features, None, self.weight.dtype, "Linear")
        out, ctx = linear_forward(x, self.weight, self.bias if self.has_bias else None)
        self._save_ctx(ctx, out)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout (..., C_out) -> dx (..., C_in); adds dweight and dbias into the grads."""
        dout, ctx = self._pop_ctx(dout)
        dx, dweight, dbias = linear_backward(dout, ctx)
        self._accumulate("weight", dweight)
        if self.has_bias:
            self._accumulate("bias", dbias)
        return dx


# -- dropout ----------------------------------------------------------------------------------


class DropoutCtx(NamedTuple):
    keep: np.ndarray | None  # bool keep-mask, or None when dropout is the identity
    rescale: Any  # 1 / (1 - p) in x's dtype


def dropout_forward(
    x: np.ndarray, p: float, keep: np.ndarray | None
) -> tuple[np.ndarray, DropoutCtx]:
    """Inverted dropout: y = x * keep / (1 - p). ``keep=None`` is the identity."""
    rescale = x.dtype.type(1.0 / (1.0 - p))
    if keep is None:
        return x, DropoutCtx(None, rescale)
    return x * keep * rescale, DropoutCtx(keep, rescale)


def dropout_backward(dout: np.ndarray, ctx: DropoutCtx) -> np.ndarray:
    """dx = dy * keep / (1 - p): the kept entries pass the gradient, scaled like the forward."""
    if ctx.keep is None:
        return dout
    return dout * ctx.keep * ctx.rescale


def dropout_keep_mask(
    name: str,
    p: float,
    shape: tuple[int, ...],
    training: bool,
    mask: np.ndarray | None,
    rng: np.random.Generator,
) -> np.ndarray | None:
    """The keep-mask a dropout in ``training`` mode uses: the explicit ``mask`` (checked by
    ``validation.keep_mask``, exactly ``shape``), one drawn from ``rng`` with P(keep) = 1 - p,
    or None where dropout is the identity."""
    if mask is not None:
        if not training:
            raise ValueError(f"{name} was given in eval mode, where dropout is the identity")
        return validation.keep_mask(name, mask, p, shape, exact=True)
    if not training or p == 0.0:
        return None
    return rng.random(shape) >= p


class Dropout(Module):
    """Inverted dropout with its own ``np.random.Generator``; the identity in eval mode.

    ``forward(x, mask=None)`` takes an explicit bool keep-mask shaped like x (True = kept), so
    tests and parity runs can share one mask with torch.
    """

    def __init__(self, p: float = 0.5, *, rng: np.random.Generator | int | None = None) -> None:
        super().__init__()
        self.p = validation.dropout_p(p, "p")
        self.rng = np.random.default_rng(rng)

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        x = validation.float_array("x", x)
        keep = dropout_keep_mask("mask", self.p, x.shape, self.training, mask, self.rng)
        out, ctx = dropout_forward(x, self.p, keep)
        self._save_ctx(ctx, out)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dout shaped like x -> dx = dout * keep / (1 - p) (dout itself in eval mode)."""
        return dropout_backward(*self._pop_ctx(dout))
