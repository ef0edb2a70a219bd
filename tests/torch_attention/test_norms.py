"""torch_attention.norms, the twin of numpy_attention.norms: RMSNorm and LayerNorm (a weight of
(D,) or per head, scale (offset + w)) against the NumPy twin's forward and hand-derived backward,
torch's gradcheck, and bad input."""

from __future__ import annotations

import pytest
import torch

from numpy_attention import norms as np_norms
from torch_attention.norms import LayerNorm, RMSNorm, WeightlessRMSNorm

from ..conftest import assert_close, to_torch

D = 6  # the head width (even, for RoPE)


NORMS = {"rms": (RMSNorm, np_norms.rmsnorm_forward, np_norms.rmsnorm_backward)}
NORMS["layer"] = (LayerNorm, np_norms.layernorm_forward, np_norms.layernorm_backward)


def test_weightless_rms_norm_matches_numpy_and_has_no_parameter(rng):
    x = rng.standard_normal((2, 5, 3, D)) + 0.5
    dout = rng.standard_normal(x.shape)
    numpy_norm = np_norms.WeightlessRMSNorm(D, eps=0.1)
    expected = numpy_norm(x)
    dx = numpy_norm.backward(dout)
    x_t = to_torch(x, requires_grad=True)

    out = WeightlessRMSNorm(D, eps=0.1)(x_t)
    out.backward(to_torch(dout))

    assert list(WeightlessRMSNorm(D).parameters()) == []
    assert_close(out, expected, name="out")
    assert_close(x_t.grad, dx, name="dx")


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dim", [D, (3, D)], ids=["shared", "per_head"])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_norms_match_numpy_forward_and_backward(rng, norm, dim, offset):
    layer, forward, backward = NORMS[norm]
    x = rng.standard_normal((2, 5, 3, D)) + 0.5
    weight = rng.standard_normal(dim)
    dout = rng.standard_normal(x.shape)
    norm = layer(dim, eps=1e-5, weight_offset=offset).double()
    with torch.no_grad():
        norm.weight.copy_(to_torch(weight))

    expected, ctx = forward(x, weight, 1e-5, weight_offset=offset)
    x_t = to_torch(x, requires_grad=True)
    out = norm(x_t)
    out.backward(to_torch(dout))
    dx, dweight = backward(dout, ctx)

    assert_close(out, expected, name="out")
    assert_close(x_t.grad, dx, name="dx")
    assert_close(norm.weight.grad, dweight, name="dweight")


@pytest.mark.parametrize("dim", [D, (3, D)], ids=["shared", "per_head"])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_layernorm_with_a_bias_matches_numpy_forward_and_backward(rng, dim, offset):
    """Persimmon's QK-norm: out, dx, dweight and dbias against the NumPy pair's hand-derived
    backward (dbias the sum of dy over the rows)."""
    x = rng.standard_normal((2, 5, 3, D)) + 0.5
    weight, bias = rng.standard_normal(dim), rng.standard_normal(dim)
    dout = rng.standard_normal(x.shape)
    norm = LayerNorm(dim, eps=1e-5, weight_offset=offset, bias=True).double()
    with torch.no_grad():
        norm.weight.copy_(to_torch(weight))
        norm.bias.copy_(to_torch(bias))

    expected, ctx = np_norms.layernorm_forward(x, weight, 1e-5, weight_offset=offset, bias=bias)
    x_t = to_torch(x, requires_grad=True)
    out = norm(x_t)
    out.backward(to_torch(dout))
    dx, dweight = np_norms.layernorm_backward(dout, ctx)

    assert [name for name, _ in norm.named_parameters()] == ["weight", "bias"]
    assert_close(out, expected, name="out")
    assert_close(x_t.grad, dx, name="dx")
    assert_close(norm.weight.grad, dweight, name="dweight")
    assert_close(norm.bias.grad, np_norms.layernorm_bias_backward(dout, norm.shape), name="dbias")


def test_rmsnorm_passes_gradcheck(rng):
    norm = RMSNorm(D, eps=1e-6).double()
    x = to_torch(rng.standard_normal((3, 2, D)), requires_grad=True)
    weight = to_torch(rng.standard_normal(D), requires_grad=True)

    def fn(x_, w_):
        return torch.func.functional_call(norm, {"weight": w_}, (x_,))

    assert torch.autograd.gradcheck(fn, (x, weight))


def test_rmsnorm_refuses_another_width_or_dtype(rng):
    norm = RMSNorm(D)
    with pytest.raises(ValueError, match=r"x has last axis 5 \(shape \(2, 5\)\), expected 6"):
        norm(torch.ones(2, 5))
    with pytest.raises(TypeError, match="float64 but RMSNorm's parameters are torch.float32"):
        norm(torch.ones(2, D, dtype=torch.float64))
    with pytest.raises(ValueError, match="eps must be > 0"):
        RMSNorm(D, eps=0.0)
    with pytest.raises(ValueError, match=r"weight \(3, 6\) needs x \(\.\.\., \*\(3, 6\)\)"):
        LayerNorm((3, D))(torch.ones(2, 2, D))


# -- the layer ----------------------------------------------------------------------------------
