"""RMSNorm and LayerNorm (numpy_attention.norms): gradcheck of the pure pairs and the layers,
torch's own ``F.rms_norm`` / ``F.layer_norm`` under autograd in float64 (with a weight per head,
the (offset + w) scale and LayerNorm's bias too), float32, the layers' parameter and gradient
accumulation, bad input."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from numpy_attention.gradcheck import gradcheck
from numpy_attention.norms import (
    LayerNorm,
    RMSNorm,
    WeightlessRMSNorm,
    layernorm_backward,
    layernorm_bias_backward,
    layernorm_forward,
    rmsnorm_backward,
    rmsnorm_forward,
)

from ..conftest import assert_close, assert_gradcheck, to_torch

B, H, N, D = 2, 3, 5, 8
SHAPES = [(D,), (N, D), (B, H, N, D)]
NORMS = {
    "rms": (rmsnorm_forward, rmsnorm_backward, RMSNorm),
    "layer": (layernorm_forward, layernorm_backward, LayerNorm),
}
# the weight's shapes: one (D,) for every row, or one row per head on x (..., H, D) (Cohere)
WEIGHTS = {"shared": (D,), "per_head": (H, D)}


def torch_norm(norm, x, weight, eps, offset):
    """torch's own norm of the last axis, scaled by (offset + w) of any trailing shape."""
    if norm == "rms":
        normalized = torch.nn.functional.rms_norm(x, (D,), None, eps)
    else:
        normalized = torch.nn.functional.layer_norm(x, (D,), None, None, eps)
    return normalized * (offset + weight)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradcheck_of_the_pure_pair(rng, shape):
    x = rng.standard_normal(shape)
    weight = rng.standard_normal(D)

    # eps through partial: gradcheck's own ``eps`` keyword is its finite-difference step
    report = gradcheck(partial(rmsnorm_forward, eps=0.3), x, weight, backward=rmsnorm_backward)

    assert_gradcheck(report)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_gradcheck_of_every_form(rng, norm, weight, offset):
    forward, backward, _ = NORMS[norm]
    x = rng.standard_normal((B, N, H, D))

    report = gradcheck(
        partial(forward, eps=0.3, weight_offset=offset),
        x,
        rng.standard_normal(WEIGHTS[weight]),
        backward=backward,
    )

    assert_gradcheck(report)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_every_form_matches_torch_under_autograd(rng, norm, weight, offset):
    """The layer, a weight of (D,) or (H, D), scale (offset + w): out, dx and dweight against
    torch's own F.rms_norm / F.layer_norm times (offset + w)."""
    layer = NORMS[norm][2](WEIGHTS[weight], eps=0.2, weight_offset=offset).astype(np.float64)
    layer.load_state_dict({"weight": rng.standard_normal(WEIGHTS[weight])})
    x = 3.0 * rng.standard_normal((B, N, H, D)) + 1.0  # a mean for LayerNorm to take away
    dout = rng.standard_normal(x.shape)
    tx = to_torch(x, requires_grad=True)
    tweight = to_torch(layer.weight, requires_grad=True)

    out = layer(x)
    dx = layer.backward(dout)
    expected = torch_norm(norm, tx, tweight, 0.2, offset)
    expected.backward(to_torch(dout))

    assert_close(out, expected, name="out")
    assert_close(dx, tx.grad, name="dx")
    assert_close(layer.named_grads()["weight"], tweight.grad, name="weight")


def _layernorm_with_bias(x, weight, bias, eps, weight_offset):
    """layernorm_forward with its bias as a third differentiated input."""
    out, ctx = layernorm_forward(x, weight, eps, weight_offset=weight_offset, bias=bias)
    return out, (ctx, bias.shape)


def _layernorm_with_bias_backward(dout, saved):
    ctx, shape = saved
    return (*layernorm_backward(dout, ctx), layernorm_bias_backward(dout, shape))


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_gradcheck_of_layernorm_with_a_bias(rng, weight, offset):
    """dx, dweight and dbias (the sum of dy over the rows) against central differences."""
    shape = WEIGHTS[weight]

    report = gradcheck(
        partial(_layernorm_with_bias, eps=0.3, weight_offset=offset),
        rng.standard_normal((B, N, H, D)),
        rng.standard_normal(shape),
        rng.standard_normal(shape),
        backward=_layernorm_with_bias_backward,
    )

    assert_gradcheck(report)


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_layernorm_with_a_bias_matches_torch_under_autograd(rng, weight, offset):
    """The layer with ``bias=True`` (Persimmon's QK-norm, nn.LayerNorm's): out, dx, dweight and
    dbias against torch's F.layer_norm times (offset + w) plus b; gradcheck of the layer."""
    shape = WEIGHTS[weight]
    layer = LayerNorm(shape, eps=0.2, weight_offset=offset, bias=True).astype(np.float64)
    layer.load_state_dict(
        {"weight": rng.standard_normal(shape), "bias": rng.standard_normal(shape)}
    )
    x = 3.0 * rng.standard_normal((B, N, H, D)) + 1.0
    dout = rng.standard_normal(x.shape)
    tx = to_torch(x, requires_grad=True)
    tweight = to_torch(layer.weight, requires_grad=True)
    tbias = to_torch(layer.bias, requires_grad=True)

    out = layer(x)
    dx = layer.backward(dout)
    expected = torch_norm("layer", tx, tweight, 0.2, offset) + tbias
    expected.backward(to_torch(dout))

    assert list(layer.state_dict()) == ["weight", "bias"]
    assert_close(out, expected, name="out")
    assert_close(dx, tx.grad, name="dx")
    assert_close(layer.named_grads()["weight"], tweight.grad, name="weight")
    assert_close(layer.named_grads()["bias"], tbias.grad, name="bias")
    assert_gradcheck(gradcheck(layer, x))


def test_layernorm_bias_starts_at_zero_and_is_refused_in_another_shape(rng):
    layer = LayerNorm((H, D), bias=True)
    x = rng.standard_normal((N, H, D))

    assert layer.bias.shape == (H, D) and layer.bias.dtype == np.float32
    assert np.all(layer.bias == 0.0)
    np.testing.assert_array_equal(
        layer(x.astype(np.float32)), LayerNorm((H, D))(x.astype(np.float32))
    )
    with pytest.raises(
        ValueError, match=r"the bias must have the weight's shape \(3, 8\), got \(8,\)"
    ):
        layernorm_forward(x, np.ones((H, D)), bias=np.zeros(D))
    with pytest.raises(TypeError, match="x float64, bias float32"):
        layernorm_forward(x, np.ones((H, D)), bias=np.zeros((H, D), np.float32))


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_weightless_rms_norm_has_no_parameter_and_matches_torch(rng, eps):
    """nanochat's QK-norm and Llama 4's L2Norm: x / sqrt(mean(x^2) + eps), nothing learned."""
    layer = WeightlessRMSNorm(D, eps=eps)
    x = 3.0 * rng.standard_normal((B, H, N, D))
    dout = rng.standard_normal(x.shape)
    tx = to_torch(x, requires_grad=True)

    out = layer(x)
    dx = layer.backward(dout)
    expected = tx * torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + eps)  # Llama 4's formula
    expected.backward(to_torch(dout))

    assert layer.state_dict() == {} and layer.named_grads() == {}
    assert_close(out, expected, name="out")
    assert_close(dx, tx.grad, name="dx")
    assert_gradcheck(gradcheck(layer, x))


@pytest.mark.parametrize("norm", NORMS)
def test_the_scale_starts_at_one_whatever_the_offset(rng, norm):
    """Gemma's (1 + w) starts at w = 0, a plain weight at ones: both scale by one at first."""
    x = rng.standard_normal((N, H, D)).astype(np.float32)

    plain = NORMS[norm][2]((H, D))
    gemma = NORMS[norm][2]((H, D), weight_offset=1.0)

    assert np.all(plain.weight == 1.0) and np.all(gemma.weight == 0.0)
    assert gemma.weight.shape == (H, D) and gemma.weight.dtype == np.float32
    np.testing.assert_array_equal(plain(x), gemma(x))


def test_gradcheck_of_the_layer(rng):
    layer = RMSNorm(D, eps=0.1)
    layer.load_state_dict({"weight": rng.standard_normal(D)})

    assert_gradcheck(gradcheck(layer, rng.standard_normal((B, H, N, D))))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_matches_torch_rms_norm_under_autograd(rng, shape, eps):
    layer = RMSNorm(D, eps=eps).astype(np.float64)
    layer.load_state_dict({"weight": rng.standard_normal(D)})
    x = 3.0 * rng.standard_normal(shape)
    dout = rng.standard_normal(shape)
    tx = to_torch(x, requires_grad=True)
    tweight = to_torch(layer.weight, requires_grad=True)

    out = layer(x)
    dx = layer.backward(dout)
    expected = torch.nn.functional.rms_norm(tx, (D,), tweight, eps)
    expected.backward(to_torch(dout))

    assert_close(out, expected, name="out")
    assert_close(dx, tx.grad, name="dx")
    assert_close(layer.named_grads()["weight"], tweight.grad, name="weight")


def test_float32_is_computed_in_float32(rng):
    x = rng.standard_normal((B, N, D))
    weight = rng.standard_normal(D)
    dout = rng.standard_normal(x.shape)

    out32, ctx32 = rmsnorm_forward(x.astype(np.float32), weight.astype(np.float32))
    dx32, dweight32 = rmsnorm_backward(dout.astype(np.float32), ctx32)
    out64, ctx64 = rmsnorm_forward(x, weight)
    dx64, dweight64 = rmsnorm_backward(dout, ctx64)

    assert out32.dtype == dx32.dtype == dweight32.dtype == ctx32.inv_std.dtype == np.float32
    assert_close(out32, out64, dtype=np.float32, name="out")
    assert_close(dx32, dx64, dtype=np.float32, name="dx")
    assert_close(dweight32, dweight64, dtype=np.float32, name="dweight")


def test_layer_starts_at_ones_and_accumulates_its_gradient(rng):
    assert RMSNorm(D).weight.dtype == np.float32  # like every layer's parameters
    layer = RMSNorm(D).astype(np.float64)
    x = rng.standard_normal((N, D))
    dout = rng.standard_normal((N, D))

    out = layer(x)
    layer.backward(dout)
    layer(x)
    layer.backward(dout)

    assert list(layer.state_dict()) == ["weight"]
    assert np.array_equal(layer.weight, np.ones(D))
    mean_square = np.mean(x**2, axis=-1, keepdims=True)
    # weight ones: rms(out) = rms(x) / sqrt(mean(x^2) + eps), 1 but for eps
    assert_close(
        np.sqrt(np.mean(out**2, axis=-1, keepdims=True)),
        np.sqrt(mean_square / (mean_square + 1e-6)),
        name="rms of the output",
    )
    expected = 2 * (dout * x / np.sqrt(mean_square + 1e-6)).sum(0)
    assert_close(layer.named_grads()["weight"], expected, name="2 x dweight")
    assert layer.constructor_args() == {"dim": D, "eps": 1e-6, "weight_offset": 0.0}


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (
            np.zeros((N, D + 1), np.float32),
            ValueError,
            r"x has last axis 9 \(shape \(5, 9\)\), expected 8",
        ),
        (np.zeros((N, D)), TypeError, "x has dtype float64 but RMSNorm's parameters are float32"),
        (np.zeros((N, D), int), TypeError, "x must be a floating-point array"),
    ],
)
def test_layer_refuses_bad_input(x, error, match):
    with pytest.raises(error, match=match):
        RMSNorm(D)(x)


def test_a_weight_per_head_needs_x_with_those_heads():
    with pytest.raises(
        ValueError, match=r"weight \(3, 8\) needs x \(\.\.\., \*\(3, 8\)\), got \(5, 2, 8\)"
    ):
        LayerNorm((H, D))(np.zeros((N, 2, D), np.float32))


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0,), ValueError, "dim must be a positive int"),
        ((D, 0.0), ValueError, "eps must be > 0"),
        ((D, np.nan), ValueError, "eps must be finite"),
        ((D, "1e-6"), TypeError, "eps must be a real number"),
        (((),), ValueError, "non-empty tuple"),
        (((H, 0),), ValueError, r"dim\[1\] must be a positive int"),
    ],
)
def test_layer_refuses_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        RMSNorm(*args)


def test_pure_pair_refuses_bad_input(rng):
    x = rng.standard_normal((N, D))

    with pytest.raises(ValueError, match=r"x \(5, 8\) and weight \(7,\)"):
        rmsnorm_forward(x, np.ones(D - 1))
    with pytest.raises(ValueError, match=r"x \(5, 8\) and weight \(2, 5, 8\)"):
        layernorm_forward(x, np.ones((2, N, D)))
    with pytest.raises(ValueError, match="weight_offset must be finite"):
        layernorm_forward(x, np.ones(D), weight_offset=np.nan)
    with pytest.raises(TypeError, match="x float64, weight float32"):
        rmsnorm_forward(x, np.ones(D, np.float32))
    _, ctx = rmsnorm_forward(x, np.ones(D))
    with pytest.raises(ValueError, match=r"dout must have the output's shape \(5, 8\)"):
        rmsnorm_backward(np.zeros((N, D - 1)), ctx)
