"""torch_attention.transfer: weights across the packages, exactly, in the module's dtype.

Every layer's NumPy state round-trips bit for bit; missing, unexpected and misshapen entries are
named. (A transferred layer computing what its twin computes is tested per family, in
test_attention.py and test_fused.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_attention import from_numpy, to_numpy

from .twins import LAYERS, numpy_layer, torch_layer


@pytest.mark.parametrize("name", LAYERS)
def test_numpy_weights_round_trip_exactly(name):
    args = LAYERS[name][1]
    source = numpy_layer(name, *args, seed=1)
    layer = torch_layer(name, *args)

    from_numpy(layer, source.state_dict())
    state = to_numpy(layer)

    expected = source.state_dict()
    assert list(state) == list(expected)
    for key, value in expected.items():
        assert state[key].dtype == value.dtype, key
        assert np.array_equal(state[key], value), key


def test_from_numpy_takes_a_numpy_module():
    source = numpy_layer("SelfAttentionV2", 5, 4, True, seed=3)

    layer = from_numpy(torch_layer("SelfAttentionV2", 5, 4, True), source)

    assert np.array_equal(layer.W_key.bias.detach().numpy(), source.W_key.bias)


def test_from_numpy_keeps_the_modules_dtype():
    source = numpy_layer("MultiHeadAttention", *LAYERS["MultiHeadAttention"][1], seed=3)
    layer = torch_layer("MultiHeadAttention", *LAYERS["MultiHeadAttention"][1]).double()

    from_numpy(layer, source.state_dict())

    assert all(t.dtype == torch.float64 for t in layer.state_dict().values())
    assert np.array_equal(layer.out_proj.weight.detach().numpy(), source.out_proj.weight)


def test_to_numpy_gives_bfloat16_as_float32():
    layer = torch_layer("SelfAttentionV1", 5, 4).to(torch.bfloat16)

    state = to_numpy(layer)

    assert state["W_query"].dtype == np.float32
    assert np.array_equal(state["W_query"], layer.W_query.detach().float().numpy())


def test_from_numpy_names_missing_and_unexpected_keys():
    layer = torch_layer("SelfAttentionV2", 5, 4, True)
    state = numpy_layer("SelfAttentionV2", 5, 4, False, seed=0).state_dict()

    with pytest.raises(KeyError, match="W_query.bias"):
        from_numpy(layer, state)
    with pytest.raises(KeyError, match="extra"):
        from_numpy(layer, {**numpy_layer("SelfAttentionV2", 5, 4, True).state_dict(), "extra": 0})


def test_from_numpy_rejects_a_wrong_shape():
    layer = torch_layer("SelfAttentionV1", 5, 4)
    state = numpy_layer("SelfAttentionV1", 4, 5, seed=0).state_dict()

    with pytest.raises(ValueError, match="W_query"):
        from_numpy(layer, state)


def test_from_numpy_refuses_a_complex_entry_as_load_state_dict_does():
    layer = torch_layer("SelfAttentionV1", 5, 4)
    before = {key: value.clone() for key, value in layer.state_dict().items()}
    state = numpy_layer("SelfAttentionV1", 5, 4, seed=0).state_dict()
    state["W_key"] = state["W_key"] * (1 + 1j)  # the imaginary part would be dropped silently

    with pytest.raises(TypeError, match="'W_key' has dtype torch.complex"):
        from_numpy(layer, state)

    assert all(torch.equal(layer.state_dict()[key], value) for key, value in before.items())
