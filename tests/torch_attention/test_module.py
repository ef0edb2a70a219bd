"""torch_attention.module: what every layer's ``load_state_dict`` casts and refuses, before
anything is loaded, by the NumPy twin's rules (tests/numpy_attention/test_module.py).

The layers are the NumPy test's ``LAYERS``, every public layer built small with non-default
arguments; here each is built in torch with the same arguments.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import numpy_attention
import torch_attention
from torch_attention.module import Module

from ..numpy_attention.test_module import LAYERS, build


def torch_layer(name):
    args, kwargs, _ = LAYERS[name]
    return getattr(torch_attention, name)(*args, **kwargs)


def snapshot(layer):
    return {key: value.clone() for key, value in layer.state_dict().items()}


def assert_state_equal(layer, expected):
    actual = layer.state_dict()
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert actual[key].dtype == value.dtype, key
        assert torch.equal(actual[key], value), key


def real_state(layer, dtype, seed=0):
    """A state dict for ``layer`` in ``dtype``, other values than its own; causal buffers kept."""
    generator = torch.Generator().manual_seed(seed)
    return {
        key: value.to(dtype)
        if key.endswith("mask")
        else (3 * torch.randn(value.shape, dtype=torch.float64, generator=generator)).to(dtype)
        for key, value in layer.state_dict().items()
    }


WITH_STATE = [name for name in LAYERS if torch_layer(name).state_dict()]

# What numpy_attention's load_state_dict casts (the NumPy kinds b, i, u, f; bfloat16 it reads as
# float32) and a sample of what it refuses.
CAST = [
    torch.bool,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
REFUSED = [torch.complex64, torch.complex128, torch.float8_e5m2, torch.uint4]


def test_every_public_layer_is_a_module_and_in_layers():
    public = {
        name
        for name, value in vars(torch_attention).items()
        if inspect.isclass(value) and issubclass(value, nn.Module)
    }

    assert public == set(LAYERS)
    assert all(issubclass(getattr(torch_attention, name), Module) for name in public)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("name", WITH_STATE)
def test_a_complex_entry_is_a_type_error_naming_it_and_nothing_loads(rng, name, strict):
    layer = torch_layer(name)
    before = snapshot(layer)
    state = real_state(layer, torch.float32)
    key = list(state)[-1]  # the last entry: a partial load would have changed every other one
    state[key] = state[key].to(torch.complex64) * (1 + 1j)
    twin, _ = build(name, rng)

    with pytest.raises(TypeError, match=f"'{key}' has dtype (torch.)?complex64"):
        layer.load_state_dict(state, strict=strict)
    with pytest.raises(TypeError, match=f"'{key}' has dtype (torch.)?complex64"):
        twin.load_state_dict(state, strict=strict)

    assert_state_equal(layer, before)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("name", WITH_STATE)
def test_real_tensors_load_cast_to_the_module_dtype(name, dtype):
    layer = torch_layer(name)
    state = real_state(layer, dtype)

    layer.load_state_dict(state)

    assert_state_equal(layer, {key: value.float() for key, value in state.items()})


@pytest.mark.parametrize("dtype", CAST + REFUSED, ids=str)
def test_the_twins_cast_and_refuse_the_same_dtypes(dtype):
    layer, twin = torch_attention.Linear(3, 2), numpy_attention.Linear(3, 2)
    state = {"weight": torch.zeros(2, 3), "bias": torch.zeros(2, dtype=dtype)}

    outcomes = []
    for module in (layer, twin):
        try:
            module.load_state_dict(state)
            outcomes.append("cast")
        except TypeError:
            outcomes.append("TypeError")

    assert outcomes[0] == outcomes[1] == ("cast" if dtype in CAST else "TypeError")


def test_a_layer_inside_a_plain_torch_module_still_refuses():
    model = nn.Sequential(nn.Linear(3, 3), torch_attention.Linear(3, 2))
    state = model.state_dict()

    with pytest.raises(TypeError, match="'1.bias' has dtype torch.complex128"):
        model.load_state_dict({**state, "1.bias": torch.ones(2, dtype=torch.complex128)})


def test_a_buffer_check_runs_before_anything_loads():
    def refuse_negatives(key, value):
        if (value < 0).any():
            raise ValueError(f"{key} is negative")

    class Checked(Module):
        def __init__(self):
            super().__init__()
            self.inner = torch_attention.Linear(2, 2)
            self.register_buffer("scale", torch.ones(2), check=refuse_negatives)
            self.register_buffer("free", torch.ones(2))

    module = Checked()
    before = snapshot(module)
    state = {**real_state(module, torch.float32), "scale": -torch.ones(2)}

    with pytest.raises(ValueError, match="scale is negative"):
        module.load_state_dict(state)

    assert_state_equal(module, before)
    module.load_state_dict({**state, "scale": torch.ones(2), "free": -torch.ones(2)})


def test_missing_unexpected_and_misshapen_entries_stay_torchs_runtime_error():
    layer = torch_attention.Linear(3, 2)
    state = layer.state_dict()

    with pytest.raises(RuntimeError, match="Missing key.*bias"):
        layer.load_state_dict({"weight": state["weight"]})
    with pytest.raises(RuntimeError, match="Unexpected key.*extra"):
        layer.load_state_dict({**state, "extra": torch.ones(2, dtype=torch.complex64)})
    with pytest.raises(RuntimeError, match="size mismatch for bias"):
        layer.load_state_dict({**state, "bias": torch.zeros(3)})
