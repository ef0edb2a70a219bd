"""Linear and Dropout: torch's own, with the checks and the explicit keep-masks of the NumPy twin.

The twin of ``numpy_attention.layers``. Backward is autograd's here; what this file adds is the
contract: a ``TypeError`` for an input of another dtype than the parameters, and dropout that takes
an explicit bool keep-mask so that NumPy and torch can share one.

Shape legend: "..." leading axes, C_in / C_out the feature widths.

Derivation: docs/derivations/linear.md (backward by autograd here; the page derives the NumPy
twin's). Tests: tests/torch_attention/test_layers.py.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import validation
from .module import Module


class Linear(Module, nn.Linear):
    """``nn.Linear`` (same parameters, same initialisation, same RNG draws) with checked input.

    weight (C_out, C_in), bias (C_out,); x (..., C_in) -> (..., C_out).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = validation.layer_input("x", x, self.in_features, None, self.weight.dtype, "Linear")
        return super().forward(x)


def dropout(x: torch.Tensor, p: float, keep: torch.Tensor | None, training: bool) -> torch.Tensor:
    """Inverted dropout: y = x * keep / (1 - p) with an explicit keep-mask; without one,
    ``F.dropout`` draws it from torch's generator in training and is the identity otherwise."""
    if keep is None:
        return F.dropout(x, p, training)
    return x * keep * (1.0 / (1.0 - p))


def dropout_keep_mask(
    name: str,
    p: float,
    shape: tuple[int, ...],
    training: bool,
    mask: Any,
    device: torch.device,
) -> torch.Tensor | None:
    """The explicit keep-mask ``mask`` checked for a dropout in ``training`` mode, or None.

    Same checks as the NumPy twin: a mask in eval mode or with p = 0 is a ``ValueError``, it must
    be bool with exactly ``shape``. Unlike the twin, None is returned when no mask is given: torch
    then draws inside the op (SDPA or ``F.dropout``).
    """
    if mask is None:
        return None
    if not training:
        raise ValueError(f"{name} was given in eval mode, where dropout is the identity")
    return validation.keep_mask(name, mask, p, shape, device, exact=True)


class Dropout(Module):
    """Inverted dropout that also takes an explicit keep-mask; the identity in eval mode.

    ``forward(x, mask=None)``: ``mask`` is bool shaped like x (True = kept), so tests and parity
    runs can share one mask with NumPy. Unlike ``nn.Dropout``, p = 1.0 is a ``ValueError``.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = validation.dropout_p(p, "p")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = validation.float_tensor("x", x)
        keep = dropout_keep_mask("mask", self.p, tuple(x.shape), self.training, mask, x.device)
        return dropout(x, self.p, keep, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
