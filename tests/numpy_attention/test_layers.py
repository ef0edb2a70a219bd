"""Linear and Dropout (numpy_attention.layers): gradcheck, torch autograd in float64, torch's
initialisation, explicit and drawn keep-masks, and the upstream gradient's checks; the per-head
linear pair of latent attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import Dropout, Linear
from numpy_attention.gradcheck import gradcheck
from numpy_attention.layers import (
    dropout_backward,
    dropout_forward,
    head_linear_backward,
    head_linear_forward,
)

from ..conftest import assert_close, assert_gradcheck, to_torch


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4)])
def test_linear_gradcheck(rng, bias, shape):
    layer = Linear(4, 3, bias=bias, rng=rng)

    assert_gradcheck(gradcheck(layer, rng.standard_normal(shape)))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_torch(rng, bias):
    layer = Linear(5, 3, bias=bias, rng=rng).astype(np.float64)
    reference = torch.nn.Linear(5, 3, bias=bias).double()
    reference.load_state_dict({name: to_torch(value) for name, value in layer.state_dict().items()})
    x = rng.standard_normal((2, 4, 5))
    dout = rng.standard_normal((2, 4, 3))
    tx = to_torch(x, requires_grad=True)

    out = layer(x)
    dx = layer.backward(dout)
    expected = reference(tx)
    expected.backward(to_torch(dout))

    assert_close(out, expected, name="out")
    assert_close(dx, tx.grad, name="dx")
    for name, param in reference.named_parameters():
        assert_close(layer.named_grads()[name], param.grad, name=name)


def test_linear_init_follows_torch_default_bounds():
    layer = Linear(64, 256, rng=0)
    bound = 1 / np.sqrt(64)

    assert layer.weight.shape == (256, 64) and layer.bias.shape == (256,)
    assert layer.weight.dtype == np.float32
    assert np.abs(layer.weight).max() <= bound and np.abs(layer.weight).max() > 0.95 * bound
    assert np.abs(layer.bias).max() <= bound
    assert abs(float(layer.weight.mean())) < 0.01  # uniform, centred


def test_dropout_forward_backward_with_explicit_mask(rng):
    x = rng.standard_normal((2, 3, 4))
    keep = rng.random(x.shape) > 0.4

    out, ctx = dropout_forward(x, 0.4, keep)
    dout = rng.standard_normal(x.shape)

    assert_close(out, np.where(keep, x / 0.6, 0.0), name="out")
    assert_close(dropout_backward(dout, ctx), np.where(keep, dout / 0.6, 0.0), name="dx")
    assert_gradcheck(
        gradcheck(lambda t: dropout_forward(t, 0.4, keep), x, backward=dropout_backward)
    )


def test_dropout_layer_draws_from_its_own_generator_and_is_identity_in_eval(rng):
    x = rng.standard_normal((200, 50)).astype(np.float32)
    layer = Dropout(0.3, rng=1)

    out = layer(x)
    kept = out != 0

    assert out.dtype == np.float32
    assert 0.65 < kept.mean() < 0.75  # P(keep) = 0.7 over 10^4 draws
    assert_close(out[kept], x[kept] / np.float32(0.7), name="kept")
    assert layer.eval()(x) is x
    with pytest.raises(ValueError, match="eval mode"):
        layer(x, mask=np.ones(x.shape, dtype=bool))


@pytest.mark.parametrize(
    ("dout", "error", "match"),
    [
        (
            np.ones((4, 2), dtype=np.float32),
            ValueError,
            r"dout must have the output's shape \(4, 3\)",
        ),
        (np.ones((4, 3), dtype=np.int64), TypeError, "dout must be a floating"),
    ],
)
def test_linear_backward_checks_dout_before_touching_anything(rng, dout, error, match):
    layer = Linear(5, 3, rng=rng)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    layer(x)

    with pytest.raises(error, match=match):
        layer.backward(dout)

    assert all(np.all(grad == 0) for grad in layer.named_grads().values())
    dx = layer.backward(np.ones((4, 3), dtype=np.float32))  # the context is still there
    assert_close(dx, np.ones((4, 3)) @ layer.weight.astype(np.float64), dtype=np.float32)


def test_linear_backward_returns_the_layers_dtype_for_another_float_dout(rng):
    """A float64 dout of a float32 layer is cast to float32, as torch casts a gradient to its
    tensor's dtype: float32 in, float32 out, also backwards."""
    layer = Linear(5, 3, rng=rng)
    layer(rng.standard_normal((4, 5)).astype(np.float32))

    dx = layer.backward(rng.standard_normal((4, 3)))

    assert dx.dtype == np.float32


def test_dropout_layer_rejected_keep_mask_names_the_shape(rng):
    layer = Dropout(0.5, rng=1)
    x = rng.standard_normal((2, 3)).astype(np.float32)

    with pytest.raises(ValueError, match=r"mask must have shape \(2, 3\), got \(3,\)"):
        layer(x, mask=np.ones(3, dtype=bool))


def test_head_linear_is_one_linear_per_head(rng):
    x = rng.standard_normal((2, 3, 4, 5))  # (B, H, N, I)
    weight = rng.standard_normal((3, 6, 5))  # (H, O, I)

    out, _ = head_linear_forward(x, weight)

    assert_close(out, np.einsum("bhni,hoi->bhno", x, weight), name="y")
    assert_gradcheck(gradcheck(head_linear_forward, x, weight, backward=head_linear_backward))
