"""numpy_attention.short_conv: the causal depthwise convolution of the linear-attention layers.
Its value against a direct sum over taps, its hand-derived backward against finite differences
(x, weight, bias and the incoming state) and torch autograd, decoding in pieces equal to one call,
the layer's state-dict layout, and one clear error per bad input.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch.nn.functional as F

from numpy_attention.grad_mode import no_grad
from numpy_attention.gradcheck import gradcheck
from numpy_attention.short_conv import ShortConv, short_conv_backward, short_conv_forward

from ..conftest import assert_close, assert_gradcheck, to_torch

B, T, C, W = 2, 7, 5, 4


def _conv(x, weight, bias, conv_state, activation="silu"):
    return short_conv_forward(x, weight, bias, activation=activation, conv_state=conv_state)


@pytest.mark.parametrize("activation", ["silu", None])
def test_gradcheck_of_every_input(rng, activation):
    x, weight = rng.standard_normal((B, T, C)), rng.standard_normal((C, W))
    bias, state = rng.standard_normal(C), rng.standard_normal((B, C, W - 1))

    report = gradcheck(
        _conv, x, weight, bias, state, backward=short_conv_backward, activation=activation
    )

    assert_gradcheck(report)


def test_value_is_the_sum_over_taps_of_the_current_and_earlier_tokens(rng):
    x, weight, bias = (
        rng.standard_normal((B, T, C)),
        rng.standard_normal((C, W)),
        rng.standard_normal(C),
    )
    state = rng.standard_normal((B, C, W - 1))

    y, new_state, _ = short_conv_forward(x, weight, bias, activation=None, conv_state=state)

    history = np.concatenate([state.transpose(0, 2, 1), x], axis=1)  # (B, W-1+T, C)
    for t in range(T):
        window = history[:, t : t + W]  # tokens t - W + 1 .. t, the last one the current token
        expected = bias + np.einsum("bjc,cj->bc", window, weight)
        np.testing.assert_allclose(y[:, t], expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(new_state, history[:, -(W - 1) :].transpose(0, 2, 1))


def test_matches_torch_autograd_over_nn_conv1d_padding(rng):
    """Without a state the convolution is nn.Conv1d's with W - 1 zeros of left padding, the
    full forward of transformers' layers."""
    x, weight = rng.standard_normal((B, T, C)), rng.standard_normal((C, W))
    dy = rng.standard_normal((B, T, C))
    x_t, w_t = to_torch(x, requires_grad=True), to_torch(weight, requires_grad=True)
    expected = F.silu(F.conv1d(x_t.transpose(1, 2), w_t[:, None], padding=W - 1, groups=C)[..., :T])
    expected.transpose(1, 2).backward(to_torch(dy))

    y, _, ctx = short_conv_forward(x, weight)
    dx, dweight, dbias, dstate = short_conv_backward(dy, ctx)

    assert_close(y, expected.transpose(1, 2), name="y")
    assert_close(dx, x_t.grad, name="dx")
    assert_close(dweight, w_t.grad, name="dweight")
    assert dbias is None and dstate is None


@pytest.mark.parametrize("pieces", [(7,), (3, 1, 1, 2), (1,) * 7])
def test_calls_in_pieces_carry_the_state_to_one_call(rng, pieces):
    x, weight = rng.standard_normal((B, T, C)), rng.standard_normal((C, W))
    whole, whole_state, _ = short_conv_forward(x, weight)

    state, outs, start = None, [], 0
    for n in pieces:
        y, state, _ = short_conv_forward(x[:, start : start + n], weight, conv_state=state)
        outs.append(y)
        start += n

    np.testing.assert_allclose(np.concatenate(outs, axis=1), whole, rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(state, whole_state)


def test_layer_holds_transformers_weight_layout_and_accumulates_its_gradients(rng):
    layer = ShortConv(C, W, bias=True, rng=0).astype(np.float64)
    assert layer.weight.shape == (C, 1, W) and layer.bias.shape == (C,)
    layer.bias[:] = rng.standard_normal(C)
    x, dy = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))

    y, _ = layer(x)
    dx = layer.backward(dy)

    expected, _, ctx = short_conv_forward(x, layer.weight[:, 0], layer.bias)
    edx, edw, edb, _ = short_conv_backward(dy, ctx)
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(dx, edx)
    np.testing.assert_array_equal(layer.named_grads()["weight"], edw[:, None])
    np.testing.assert_array_equal(layer.named_grads()["bias"], edb)


def test_no_grad_keeps_no_ctx(rng):
    with no_grad():
        _, _, ctx = short_conv_forward(rng.standard_normal((B, T, C)), rng.standard_normal((C, W)))
    assert ctx is None


def test_single_tap_has_an_empty_state(rng):
    x, weight = rng.standard_normal((B, T, C)), rng.standard_normal((C, 1))
    y, state, _ = short_conv_forward(x, weight, activation=None)
    np.testing.assert_allclose(y, x * weight[:, 0], rtol=1e-15)
    assert state.shape == (B, C, 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x": np.zeros((T, C))}, r"x must be \(B, T, C\)"),
        ({"weight": np.zeros((C + 1, W))}, r"weight must be \(C, W\) with C = 5"),
        ({"bias": np.zeros(C + 1)}, r"bias must be \(5,\)"),
        ({"conv_state": np.zeros((B, C, W))}, r"conv_state must be \(B, C, W-1\) = \(2, 5, 3\)"),
        ({"activation": "relu"}, "activation must be 'silu' or None"),
    ],
)
def test_bad_input_raises_one_clear_error(change, message):
    args = {"x": np.zeros((B, T, C)), "weight": np.zeros((C, W)), "bias": None, "conv_state": None}
    args["activation"] = "silu"
    args.update(change)
    with pytest.raises(ValueError, match=message):
        short_conv_forward(
            args["x"], args["weight"], args["bias"], activation=args["activation"],
            conv_state=args["conv_state"],
        )  # fmt: skip
