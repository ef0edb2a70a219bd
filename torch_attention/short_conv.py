"""The causal short convolution in torch, the twin of ``numpy_attention.short_conv``: a depthwise
1-D convolution over time reading the current token and the W - 1 before it (the state, zeros
before the first token), then a SiLU; the state after x is returned for decoding. The backward is
autograd's.

    xx = [conv_state ; x]  along time          pre = depthwise_conv(xx, w) (+ bias)
    y = silu(pre)                              new_state = the last W - 1 inputs of xx

Shape legend: B batch, T tokens, C channels, W taps.

Derivation: docs/derivations/short-conv.md (the NumPy twin's backward).
Tests: tests/torch_attention/test_short_conv.py (against the NumPy pair).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from numpy_attention.short_conv import CONV_ACTIVATIONS

from . import validation
from .module import Module

__all__ = ["ShortConv", "short_conv"]


def short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
    conv_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal depthwise convolution, then the activation.

    Args:
        x: (B, T, C) token-major inputs.
        weight: (C, W) the taps; tap W - 1 multiplies the current token.
        bias: (C,) or None.
        activation: ``"silu"`` or None.
        conv_state: (B, C, W-1) the W - 1 inputs before x (oldest first); None is zeros.

    Returns:
        y (B, T, C) and the state after x (B, C, W-1).
    """
    if x.dim() != 3:
        raise ValueError(f"short_conv: x must be (B, T, C), got shape {tuple(x.shape)}")
    batch, tokens, channels = x.shape
    if weight.dim() != 2 or weight.shape[0] != channels or weight.shape[1] < 1:
        raise ValueError(
            f"short_conv: weight must be (C, W) with C = {channels} (x's channels), got shape "
            f"{tuple(weight.shape)}"
        )
    if activation not in CONV_ACTIVATIONS:
        raise ValueError(f"short_conv: activation must be 'silu' or None, got {activation!r}")
    if bias is not None and tuple(bias.shape) != (channels,):
        raise ValueError(f"short_conv: bias must be ({channels},), got shape {tuple(bias.shape)}")
    width = weight.shape[1]
    expected = (batch, channels, width - 1)
    if conv_state is None:
        conv_state = x.new_zeros(expected)
    elif tuple(conv_state.shape) != expected:
        raise ValueError(
            f"short_conv: conv_state must be (B, C, W-1) = {expected}, got shape "
            f"{tuple(conv_state.shape)}"
        )
    xx = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=2)  # (B, C, W-1+T)
    pre = F.conv1d(xx, weight.to(x.dtype)[:, None, :], bias, groups=channels)  # (B, C, T)
    y = F.silu(pre) if activation == "silu" else pre
    return y.transpose(1, 2), xx[:, :, tokens:].detach().clone()


class ShortConv(Module):
    """The causal depthwise convolution as a layer: parameter ``weight`` (C, 1, W), transformers'
    ``conv1d.weight``; with ``bias`` a parameter ``bias`` (C,), zeros at initialisation.

    Args:
        channels: C.
        kernel_size: W.
        bias: a learned bias per channel.
        activation: ``"silu"`` or None.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        *,
        bias: bool = False,
        activation: str | None = "silu",
    ) -> None:
        super().__init__()
        self.channels = validation.positive_int("channels", channels)
        self.kernel_size = validation.positive_int("kernel_size", kernel_size)
        if activation not in CONV_ACTIVATIONS:
            raise ValueError(f"ShortConv: activation must be 'silu' or None, got {activation!r}")
        self.activation = activation
        bound = 1 / math.sqrt(self.kernel_size)
        self.weight = nn.Parameter(
            torch.empty(self.channels, 1, self.kernel_size).uniform_(-bound, bound)
        )
        self.bias = nn.Parameter(torch.zeros(self.channels)) if bias else None

    def forward(
        self, x: torch.Tensor, conv_state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C), conv_state (B, C, W-1) or None -> y (B, T, C), the state after x."""
        return short_conv(
            x, self.weight[:, 0], self.bias, activation=self.activation, conv_state=conv_state
        )
