"""The output gate's pure pair (numpy_attention.gate): finite differences per kind and
activation, torch autograd, the activations at extreme pre-activations, and float32 kept. The
gate inside the layer (gradcheck, torch, decoding, bad options) is tests/numpy_attention/
test_grouped.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numpy_attention import gradcheck
from numpy_attention.gate import output_gate_backward, output_gate_forward

from ..conftest import assert_close, assert_gradcheck, to_torch

B, N, H, D = 2, 3, 4, 5
WIDTHS = {"element": H * D, "head": H}  # the gate's pre-activation width per kind


@pytest.mark.parametrize("kind", list(WIDTHS))
@pytest.mark.parametrize("activation", ["sigmoid", "softplus", "silu"])
def test_gradcheck(rng, kind, activation):
    attn = rng.standard_normal((B, N, H * D))
    pre = 2 * rng.standard_normal((B, N, WIDTHS[kind]))

    report = gradcheck(
        output_gate_forward, attn, pre, backward=output_gate_backward, activation=activation
    )

    assert_gradcheck(report)


@pytest.mark.parametrize("kind", list(WIDTHS))
@pytest.mark.parametrize("activation", ["sigmoid", "softplus", "silu"])
def test_matches_torch_autograd(rng, kind, activation):
    attn = rng.standard_normal((B, N, H * D))
    pre = 2 * rng.standard_normal((B, N, WIDTHS[kind]))
    dout = rng.standard_normal((B, N, H * D))
    attn_t, pre_t = to_torch(attn, requires_grad=True), to_torch(pre, requires_grad=True)
    gate = {"sigmoid": torch.sigmoid, "softplus": F.softplus, "silu": F.silu}[activation](pre_t)
    per_head = attn_t.reshape(B, N, WIDTHS[kind], -1)  # (B, N, H, D) or (B, N, H*D, 1)
    expected = (per_head * gate[..., None]).reshape(B, N, H * D)
    expected.backward(to_torch(dout))

    out, ctx = output_gate_forward(attn, pre, activation)
    dattn, dpre = output_gate_backward(dout, ctx)

    assert_close(out, expected, name="out")
    assert_close(dattn, attn_t.grad, name="dattn")
    assert_close(dpre, pre_t.grad, name="dpre")


@pytest.mark.parametrize("activation", ["sigmoid", "softplus", "silu"])
def test_extreme_pre_activations_neither_overflow_nor_lose_the_gradient(activation):
    """At z = +-800, exp(|z|) overflows float64: the gate is 0, 1 or z, the gradient finite."""
    attn = np.ones((1, 1, 4))
    pre = np.array([[[-800.0, -30.0, 30.0, 800.0]]])

    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out, ctx = output_gate_forward(attn, pre, activation)
        dattn, dpre = output_gate_backward(np.ones_like(attn), ctx)

    expected = {
        "sigmoid": [0.0, np.exp(-30.0), 1.0, 1.0],
        "softplus": [0.0, np.exp(-30.0), 30.0, 800.0],
        "silu": [0.0, -30 * np.exp(-30.0) / (1 + np.exp(-30.0)), 30 / (1 + np.exp(-30.0)), 800.0],
    }
    np.testing.assert_allclose(out[0, 0], expected[activation], rtol=1e-12, atol=0)
    assert np.all(np.isfinite(dpre)) and np.all(np.isfinite(dattn))


@pytest.mark.parametrize("kind", list(WIDTHS))
def test_float32_stays_float32(rng, kind):
    attn = rng.standard_normal((B, N, H * D)).astype(np.float32)
    pre = rng.standard_normal((B, N, WIDTHS[kind])).astype(np.float32)

    out, ctx = output_gate_forward(attn, pre, "softplus")
    dattn, dpre = output_gate_backward(out, ctx)

    assert out.dtype == dattn.dtype == dpre.dtype == np.float32
