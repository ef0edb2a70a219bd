"""torch_attention.short_conv, the causal short convolution's torch twin, against the NumPy pair:
the value, the state after the call, autograd's gradients against the hand-derived ones (x,
weight, bias, the incoming state), the layer's parameter names, and the same refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import short_conv as np_conv
from torch_attention import short_conv as torch_conv

from ..conftest import assert_close, to_torch

B, T, C, W = 2, 6, 5, 4


@pytest.mark.parametrize("activation", ["silu", None])
def test_matches_the_numpy_pair_with_a_state(rng, activation):
    x, weight = rng.standard_normal((B, T, C)), rng.standard_normal((C, W))
    bias, state = rng.standard_normal(C), rng.standard_normal((B, C, W - 1))
    dy = rng.standard_normal((B, T, C))
    leaves = [to_torch(a, requires_grad=True) for a in (x, weight, bias, state)]

    y_t, state_t = torch_conv.short_conv(
        leaves[0], leaves[1], leaves[2], activation=activation, conv_state=leaves[3]
    )
    y_t.backward(to_torch(dy))
    y, new_state, ctx = np_conv.short_conv_forward(
        x, weight, bias, activation=activation, conv_state=state
    )
    grads = np_conv.short_conv_backward(dy, ctx)

    assert_close(y_t, y, name="y")
    np.testing.assert_array_equal(state_t.numpy(), new_state)
    for name, leaf, grad in zip(("dx", "dweight", "dbias", "dstate"), leaves, grads, strict=True):
        assert_close(leaf.grad, grad, name=name)


def test_layer_has_transformers_parameter_names():
    layer = torch_conv.ShortConv(C, W, bias=True)
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == {
        "weight": (C, 1, W),
        "bias": (C,),
    }
    numpy_layer = np_conv.ShortConv(C, W, bias=True)
    assert set(numpy_layer.state_dict()) == set(layer.state_dict())


@pytest.mark.parametrize(
    ("kwargs", "shape"),
    [({"conv_state": torch.zeros(B, C, W)}, (B, T, C)), ({"activation": "relu"}, (B, T, C))],
)
def test_refuses_what_the_numpy_pair_refuses(kwargs, shape):
    x, weight = torch.zeros(shape, dtype=torch.float64), torch.zeros(C, W, dtype=torch.float64)
    with pytest.raises(ValueError) as torch_error:
        torch_conv.short_conv(x, weight, **kwargs)
    numpy_kwargs = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in kwargs.items()}
    with pytest.raises(ValueError) as numpy_error:
        np_conv.short_conv_forward(x.numpy(), weight.numpy(), **numpy_kwargs)
    assert str(torch_error.value) == str(numpy_error.value)
