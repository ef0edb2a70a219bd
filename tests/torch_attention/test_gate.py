"""torch_attention.gate, the output gate's torch twin, against the NumPy pair it mirrors
(numpy_attention.gate): the forward and its autograd gradients per kind and activation, softplus
past torch's threshold, the dtype kept, and the option rules word for word. The gate inside the
layer is tests/torch_attention/test_grouped.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import gate as np_gate
from torch_attention import gate as torch_gate

from ..conftest import assert_close, to_numpy, to_torch

B, N, H, D = 2, 3, 4, 5
WIDTHS = {"element": H * D, "head": H}  # the gate's pre-activation width per kind


@pytest.mark.parametrize("kind", list(WIDTHS))
@pytest.mark.parametrize("activation", ["sigmoid", "softplus", "silu"])
def test_forward_and_gradients_match_the_numpy_pair(rng, kind, activation):
    attn = rng.standard_normal((B, N, H * D))
    pre = 4 * rng.standard_normal((B, N, WIDTHS[kind]))  # past +-10: both tails of each act
    dout = rng.standard_normal((B, N, H * D))
    attn_t, pre_t = to_torch(attn, requires_grad=True), to_torch(pre, requires_grad=True)

    out_t = torch_gate.output_gate(attn_t, pre_t, activation)
    out_t.backward(to_torch(dout))
    out, ctx = np_gate.output_gate_forward(attn, pre, activation)
    dattn, dpre = np_gate.output_gate_backward(dout, ctx)

    assert_close(to_numpy(out_t), out, name="out")
    assert_close(to_numpy(attn_t.grad), dattn, name="dattn")
    assert_close(to_numpy(pre_t.grad), dpre, name="dpre")


def test_softplus_past_torchs_threshold_differs_from_the_exact_value_below_2e_9():
    # F.softplus returns z itself for z > 20; log(1 + exp(z)) - z = log1p(exp(-z)) < 2.1e-9 there
    pre = np.array([[19.0, 20.0, 20.5, 25.0, 40.0]])
    attn = np.ones_like(pre)

    out_t = to_numpy(torch_gate.output_gate(to_torch(attn), to_torch(pre), "softplus"))
    out, _ = np_gate.output_gate_forward(attn, pre, "softplus")

    assert np.all(np.abs(out_t - out) <= np.log1p(np.exp(-20.0)) * (1 + 1e-12))
    assert out_t[0, 0] == pytest.approx(out[0, 0], rel=1e-15)  # below it, the same function
    assert np.all(out_t[0, 2:] == pre[0, 2:])  # past it, z itself


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keeps_the_dtype(rng, dtype):
    attn = torch.from_numpy(rng.standard_normal((B, N, H * D))).to(dtype)
    pre = torch.from_numpy(rng.standard_normal((B, N, H))).to(dtype)

    assert torch_gate.output_gate(attn, pre, "sigmoid").dtype == dtype


@pytest.mark.parametrize(
    ("kind", "activation", "bias"),
    [("channel", "sigmoid", False), ("head", "silu", False), (None, "softplus", False)]
    + [(None, "sigmoid", True)],
)
def test_refuses_the_same_options_with_the_same_words_as_the_numpy_pair(kind, activation, bias):
    with pytest.raises(ValueError) as numpy_error:
        np_gate.check_gate(kind, activation, bias)
    with pytest.raises(ValueError) as torch_error:
        torch_gate.check_gate(kind, activation, bias)

    assert str(torch_error.value) == str(numpy_error.value)


@pytest.mark.parametrize("kind", [None, "element", "head"])
def test_accepts_and_sizes_the_same_gates_as_the_numpy_pair(kind):
    expected = np_gate.check_gate(kind, "sigmoid", False)
    assert torch_gate.check_gate(kind, "sigmoid", False) == expected
    if kind is not None:
        assert torch_gate.gate_width(kind, H, D) == np_gate.gate_width(kind, H, D) == WIDTHS[kind]
