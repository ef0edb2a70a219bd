"""The output gate in torch, the twin of ``numpy_attention.gate``: the attention's merged heads
scaled by a gate computed from the layer's input, before the output projection.

    element:  y = a * act(z)                  a, z (..., H*D): one gate per coordinate
    head:     y_h = a_h * act(z_h)            a (..., H*D) seen as (..., H, D), z (..., H)

act is ``torch.sigmoid``, ``F.silu`` or ``F.softplus`` (which returns z itself past z = 20, where
log(1 + exp(z)) differs from z by less than 2e-9: the NumPy twin's logaddexp keeps that term).

Shape legend: "..." leading axes (B, N), H heads, D head width.

Derivation: docs/derivations/output-gate.md (the NumPy twin's backward; autograd here).
Tests: tests/torch_attention/test_gate.py (against the NumPy pair); in the layer,
tests/torch_attention/test_grouped.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The options and their rules are pure Python: the NumPy twin's, shared.
from numpy_attention.gate import GATE_ACTIVATIONS, GATE_KINDS, check_gate, gate_width

__all__ = ["GATE_ACTIVATIONS", "GATE_KINDS", "check_gate", "gate_width", "output_gate"]


def output_gate(attn: torch.Tensor, pre: torch.Tensor, activation: str) -> torch.Tensor:
    """y = attn * act(pre), per element (pre (..., H*D)) or per head (pre (..., H)).

    Args:
        attn: (..., H*D), the merged heads.
        pre: (..., H*D) or (..., H), the gate's pre-activation x W_g (+ b_g).
        activation: ``"sigmoid"``, ``"softplus"`` or ``"silu"``.

    Returns:
        (..., H*D).
    """
    if activation == "sigmoid":
        gate = torch.sigmoid(pre)
    else:
        gate = F.silu(pre) if activation == "silu" else F.softplus(pre)
    width, heads = attn.shape[-1], pre.shape[-1]
    per_head = attn.reshape(*attn.shape[:-1], heads, width // heads)  # (..., H, D) or (..., H*D, 1)
    return (per_head * gate[..., None]).reshape(attn.shape)  # -> (..., H*D)
