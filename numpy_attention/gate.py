"""The output gate: the attention's merged heads scaled by a gate computed from the layer's input,
before the output projection (Qwen3-Next and Qwen3.5 per element with a sigmoid, LFM3 per head
with a sigmoid, Laguna per head or per element with a softplus); and the gate of a gated RMSNorm
(Qwen3-Next's linear-attention layers: a SiLU per element after the norm, Kimi Linear's: a sigmoid).

    element:  y = a * act(z)                  a, z (..., H*D): one gate per coordinate
    head:     y_h = a_h * act(z_h)            a (..., H*D) seen as (..., H, D), z (..., H)

with z = x W_g (+ b_g) the gate's pre-activation (``GroupedQueryAttention``'s ``g_proj``) and
act a sigmoid, a softplus or a SiLU, each computed without overflow:

    softplus(z) = log(1 + exp(z)) = logaddexp(0, z)
    sigmoid(z)  = exp(-softplus(-z))
    silu(z)     = z sigmoid(z)

Shape legend: "..." leading axes (B, N), H heads, D head width.

Derivation: docs/derivations/output-gate.md.
Tests: tests/numpy_attention/test_gate.py; in the layer, tests/numpy_attention/test_grouped.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "GATE_ACTIVATIONS",
    "GATE_KINDS",
    "GateCtx",
    "check_gate",
    "gate_width",
    "output_gate_backward",
    "output_gate_forward",
]

GATE_KINDS = ("element", "head")
# A layer's output gate takes a sigmoid or a softplus (the models that have one); the pair below
# also takes "silu", the gate of the gated RMSNorm in the linear-attention layers.
GATE_ACTIVATIONS = ("sigmoid", "softplus")


def check_gate(kind: object, activation: object, bias: bool) -> str | None:
    """The gate's options checked; its kind (None: no gate) returned. Options given without a
    gate are refused (they would do nothing)."""
    if kind is not None and kind not in GATE_KINDS:
        raise ValueError(f"output_gate must be None or one of {list(GATE_KINDS)}, got {kind!r}")
    if activation not in GATE_ACTIVATIONS:
        raise ValueError(
            f"gate_activation must be one of {list(GATE_ACTIVATIONS)}, got {activation!r}"
        )
    if kind is None and (activation != "sigmoid" or bias):
        raise ValueError(
            f"gate_activation={activation!r} and gate_bias={bias} describe an output gate, but "
            "output_gate is None"
        )
    return None if kind is None else str(kind)


def gate_width(kind: str, heads: int, head_dim: int) -> int:
    """The gate projection's output width: H*D per element, H per head."""
    return heads * head_dim if kind == "element" else heads


class GateCtx(NamedTuple):
    attn: np.ndarray  # the ungated heads, (..., H*D)
    pre: np.ndarray  # the gate's pre-activation z, (..., H*D) or (..., H)
    gate: np.ndarray  # act(z), z's shape
    activation: str


def _softplus(z: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, z)  # log(1 + exp(z)), never overflowing


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-_softplus(-z))  # 1 / (1 + exp(-z)), never overflowing


def output_gate_forward(
    attn: np.ndarray, pre: np.ndarray, activation: str
) -> tuple[np.ndarray, GateCtx]:
    """y = attn * act(pre), per element (pre (..., H*D)) or per head (pre (..., H), each head's
    D coordinates of attn scaled by its one gate).

    Args:
        attn: (..., H*D), the merged heads.
        pre: (..., H*D) or (..., H), the gate's pre-activation x W_g (+ b_g).
        activation: ``"sigmoid"``, ``"softplus"`` or ``"silu"``.

    Returns:
        y (..., H*D) and the backward's ctx.
    """
    gate = _activation(pre, activation)
    width, heads = attn.shape[-1], pre.shape[-1]
    per_head = attn.reshape(*attn.shape[:-1], heads, width // heads)  # (..., H, D) or (..., H*D, 1)
    out = (per_head * gate[..., None]).reshape(attn.shape)  # -> (..., H*D)
    return out, GateCtx(attn, pre, gate, activation)


def output_gate_backward(dout: np.ndarray, ctx: GateCtx) -> tuple[np.ndarray, np.ndarray]:
    """dattn = dy * g (g repeated over each head's D coordinates when per head);
    dg = dy * attn (summed over each head's D coordinates when per head);
    dz = dg * act'(z), sigmoid' = s (1 - s), softplus' = sigmoid(z), silu' = s (1 + z (1 - s)).

    Derivation: docs/derivations/output-gate.md.

    Args:
        dout: (..., H*D), the gradient of y.
        ctx: ``output_gate_forward``'s.

    Returns:
        dattn (..., H*D), dpre (pre's shape).
    """
    attn, pre, gate, activation = ctx
    width, heads = attn.shape[-1], pre.shape[-1]
    split = (*attn.shape[:-1], heads, width // heads)  # (..., H, D) or (..., H*D, 1)
    dout_heads = dout.reshape(split)
    dattn = (dout_heads * gate[..., None]).reshape(attn.shape)  # forward: y = attn * g
    dgate = (dout_heads * attn.reshape(split)).sum(axis=-1)  # (..., H, D) -> (..., H)
    if activation == "sigmoid":
        dpre = dgate * gate * (1 - gate)  # sigmoid' = s (1 - s)
    elif activation == "silu":
        s = _sigmoid(pre)
        dpre = dgate * s * (1 + pre * (1 - s))  # (z s)' = s + z s (1 - s)
    else:
        dpre = dgate * _sigmoid(pre)  # softplus' = sigmoid
    return dattn, dpre


def _activation(pre: np.ndarray, activation: str) -> np.ndarray:
    if activation == "sigmoid":
        return _sigmoid(pre)
    if activation == "silu":
        return pre * _sigmoid(pre)
    return _softplus(pre)
