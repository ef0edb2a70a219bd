"""The causal short convolution of the linear-attention layers (Qwen3-Next's gated DeltaNet, Kimi
Linear's KDA): a depthwise 1-D convolution over time, each channel its own W taps, reading the
current token and the W - 1 before it, then a SiLU:

    xx = [conv_state^T ; x]                    (B, W-1+T, C): the W - 1 inputs before x, then x
    pre[b, t, c] = bias[c] + sum_j w[c, j] xx[b, t + j, c]       j = 0 .. W-1 (j = W-1: token t)
    y = silu(pre) = pre * sigmoid(pre)         (or y = pre without an activation)
    new_state = the last W - 1 rows of xx, as (B, C, W-1)

The state is what decoding carries from one call to the next (zeros before the first token, which
is ``nn.Conv1d``'s left padding of W - 1 in transformers' full forward); the layers keep it in
``linear_cache.LinearStateCache``. A state of (B, C, W-1) is the least that carries the window
(transformers' cache keeps W columns, fla's W, vLLM's W - 1).

Backward, each line differentiating one forward line:

    dpre = dy * silu'(pre),  silu'(z) = s (1 + z (1 - s)),  s = sigmoid(z)
    dxx[b, t + j, c] += w[c, j] dpre[b, t, c]      (pre reads xx at t + j with tap j)
    dw[c, j] = sum_{b, t} dpre[b, t, c] xx[b, t + j, c]
    dbias[c] = sum_{b, t} dpre[b, t, c]
    dx = dxx[:, W-1:],  dconv_state = dxx[:, :W-1] as (B, C, W-1)

Shape legend: B batch, T tokens, C channels, W taps (the kernel size).

Derivation: docs/derivations/short-conv.md.
Tests: tests/numpy_attention/test_short_conv.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation
from .gate import _sigmoid
from .grad_mode import is_grad_enabled
from .module import Module

__all__ = [
    "CONV_ACTIVATIONS",
    "ShortConv",
    "ShortConvCtx",
    "short_conv_backward",
    "short_conv_forward",
]

CONV_ACTIVATIONS = ("silu", None)


class ShortConvCtx(NamedTuple):
    xx: np.ndarray  # (B, W-1+T, C): the state's inputs, then x
    weight: np.ndarray  # (C, W)
    pre: np.ndarray  # (B, T, C): before the activation
    activation: str | None
    has_bias: bool
    has_state: bool


def short_conv_forward(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    activation: str | None = "silu",
    conv_state: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, ShortConvCtx | None]:
    """The causal depthwise convolution, then the activation.

    Args:
        x: (B, T, C) token-major inputs.
        weight: (C, W) the taps (``nn.Conv1d``'s depthwise weight (C, 1, W) squeezed); tap W - 1
            multiplies the current token.
        bias: (C,) or None.
        activation: ``"silu"`` or None.
        conv_state: (B, C, W-1) the W - 1 inputs before x (oldest first); None is zeros.

    Returns:
        y (B, T, C), the state after x (B, C, W-1), and the backward's ctx (None under
        ``no_grad()``).
    """
    x, weight, bias, conv_state = _check(x, weight, bias, activation, conv_state)
    batch, tokens, channels = x.shape
    width = weight.shape[1]
    start = (
        np.zeros((batch, width - 1, channels), dtype=x.dtype)
        if conv_state is None
        else conv_state.transpose(0, 2, 1)
    )
    xx = np.concatenate([start, x], axis=1)  # (B, W-1+T, C)
    pre = np.zeros_like(x) if bias is None else np.broadcast_to(bias, x.shape).copy()
    for j in range(width):
        pre += weight[:, j] * xx[:, j : j + tokens]  # tap j reads token t + j - (W - 1)
    y = pre * _sigmoid(pre) if activation == "silu" else pre.copy()
    new_state = xx[:, tokens:].transpose(0, 2, 1).copy()  # the last W - 1 rows
    ctx = None
    if is_grad_enabled():
        ctx = ShortConvCtx(xx, weight, pre, activation, bias is not None, conv_state is not None)
    return y, new_state, ctx


def short_conv_backward(
    dy: np.ndarray, ctx: ShortConvCtx
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Gradients of x, the weight, the bias (None without one) and the incoming state (None
    when none was given). Derivation: docs/derivations/short-conv.md.

    Args:
        dy: (B, T, C), the gradient of y.
        ctx: ``short_conv_forward``'s.

    Returns:
        dx (B, T, C), dweight (C, W), dbias (C,) or None, dconv_state (B, C, W-1) or None.
    """
    xx, weight, pre, activation, has_bias, has_state = ctx
    tokens = pre.shape[1]
    dy = validation.grad_output(dy, pre.shape, pre.dtype)
    if activation == "silu":
        s = _sigmoid(pre)
        dpre = dy * s * (1 + pre * (1 - s))  # forward: y = pre * sigmoid(pre)
    else:
        dpre = dy
    width = weight.shape[1]
    dxx = np.zeros_like(xx)
    dweight = np.empty_like(weight)
    for j in range(width):  # forward: pre += w[:, j] * xx[:, j : j + T]
        dxx[:, j : j + tokens] += weight[:, j] * dpre
        dweight[:, j] = np.einsum("btc,btc->c", dpre, xx[:, j : j + tokens])
    dbias = dpre.sum(axis=(0, 1)) if has_bias else None
    dstate = dxx[:, : width - 1].transpose(0, 2, 1).copy() if has_state else None
    return dxx[:, width - 1 :].copy(), dweight, dbias, dstate


def _check(
    x: Any, weight: Any, bias: Any, activation: Any, conv_state: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    x = validation.float_array("x", x)
    weight = validation.float_array("weight", weight)
    if x.ndim != 3:
        raise ValueError(f"short_conv: x must be (B, T, C), got shape {x.shape}")
    if weight.ndim != 2 or weight.shape[0] != x.shape[2] or weight.shape[1] < 1:
        raise ValueError(
            f"short_conv: weight must be (C, W) with C = {x.shape[2]} (x's channels), got shape "
            f"{weight.shape}"
        )
    if activation not in CONV_ACTIVATIONS:
        raise ValueError(f"short_conv: activation must be 'silu' or None, got {activation!r}")
    if bias is not None:
        bias = validation.float_array("bias", bias)
        if bias.shape != (x.shape[2],):
            raise ValueError(f"short_conv: bias must be ({x.shape[2]},), got shape {bias.shape}")
        bias = bias.astype(x.dtype, copy=False)
    if conv_state is not None:
        conv_state = validation.float_array("conv_state", conv_state)
        expected = (x.shape[0], x.shape[2], weight.shape[1] - 1)
        if conv_state.shape != expected:
            raise ValueError(
                f"short_conv: conv_state must be (B, C, W-1) = {expected}, got shape "
                f"{conv_state.shape}"
            )
        conv_state = conv_state.astype(x.dtype, copy=False)
    return x, weight.astype(x.dtype, copy=False), bias, conv_state


class ShortConv(Module):
    """The causal depthwise convolution as a layer: parameter ``weight`` (C, 1, W), the layout of
    transformers' ``conv1d.weight`` (``nn.Conv1d(C, C, W, groups=C)``), so it loads as stored;
    with ``bias`` a parameter ``bias`` (C,), zeros at initialisation.

    Args:
        channels: C.
        kernel_size: W, the taps (the current token and the W - 1 before it).
        bias: a learned bias per channel.
        activation: ``"silu"`` (the layers') or None.
        rng: the generator (or seed) of the initial weight.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        *,
        bias: bool = False,
        activation: str | None = "silu",
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        self.channels = validation.positive_int("channels", channels)
        self.kernel_size = validation.positive_int("kernel_size", kernel_size)
        self.has_bias = validation.flag("bias", bias)
        if activation not in CONV_ACTIVATIONS:
            raise ValueError(f"ShortConv: activation must be 'silu' or None, got {activation!r}")
        self.activation = activation
        bound = 1 / np.sqrt(self.kernel_size)  # nn.Conv1d's fan-in bound for a depthwise conv
        rng = np.random.default_rng(rng)
        start = rng.uniform(-bound, bound, (self.channels, 1, self.kernel_size))
        self.register_parameter("weight", start.astype(np.float32))
        if self.has_bias:
            self.register_parameter("bias", np.zeros(self.channels, dtype=np.float32))

    def forward(
        self, x: np.ndarray, conv_state: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """x (B, T, C), conv_state (B, C, W-1) or None -> y (B, T, C), the state after x."""
        x = validation.layer_input("x", x, self.channels, (3,), self.weight.dtype, "ShortConv")
        bias = self.bias if self.has_bias else None
        weight = self.weight[:, 0]
        y, new_state, ctx = short_conv_forward(
            x, weight, bias, activation=self.activation, conv_state=conv_state
        )
        self._save_ctx(ctx, y)
        return y, new_state

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dy (B, T, C) -> dx (B, T, C); adds dweight (and dbias) into the grads (the incoming
        state is a constant here: decoding does not differentiate through past calls)."""
        dout, ctx = self._pop_ctx(dout)
        dx, dweight, dbias, _ = short_conv_backward(dout, ctx)
        self._accumulate("weight", dweight[:, None, :])
        if dbias is not None:
            self._accumulate("bias", dbias)
        return dx
