"""The Module base: parameters, gradient accumulation, state dicts, modes, dtypes, no_grad."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import Linear, Module, ModuleList, no_grad
from numpy_attention.module import is_grad_enabled

from ..conftest import to_torch


class TwoLinears(Module):
    """A composite: x feeds both children and the outputs are summed (dx = dx_a + dx_b)."""

    def __init__(self, rng):
        super().__init__()
        self.a = Linear(3, 2, rng=rng)
        self.pair = ModuleList([Linear(3, 2, bias=False, rng=rng), Linear(3, 2, rng=rng)])

    def forward(self, x):
        return self.a(x) + self.pair[0](x) + self.pair[1](x)

    def backward(self, dout):
        return self.a.backward(dout) + self.pair[0].backward(dout) + self.pair[1].backward(dout)


def test_names_follow_torch_state_dict_keys(rng):
    module = TwoLinears(rng)

    assert list(module.state_dict()) == [
        "a.weight",
        "a.bias",
        "pair.0.weight",
        "pair.1.weight",
        "pair.1.bias",
    ]
    assert list(module.named_grads()) == list(module.named_parameters())


def test_backward_adds_into_grads_and_zero_grad_clears(rng):
    module = TwoLinears(rng).astype(np.float64)
    x = rng.standard_normal((4, 3))
    dout = rng.standard_normal((4, 2))

    module(x)
    module.backward(dout)
    once = {name: grad.copy() for name, grad in module.named_grads().items()}
    module(x)
    module.backward(dout)

    for name, grad in module.named_grads().items():
        np.testing.assert_array_equal(grad, 2 * once[name])  # g + g == 2g exactly
        assert np.any(grad != 0)
    module.zero_grad()
    assert all(np.all(grad == 0) for grad in module.named_grads().values())


def test_backward_needs_a_fresh_forward(rng):
    layer = Linear(3, 2, rng=rng)
    x = rng.standard_normal((4, 3)).astype(np.float32)

    with pytest.raises(RuntimeError, match="forward first"):
        layer.backward(np.ones((4, 2), dtype=np.float32))
    layer(x)
    layer.backward(np.ones((4, 2), dtype=np.float32))
    with pytest.raises(RuntimeError, match="forward first"):
        layer.backward(np.ones((4, 2), dtype=np.float32))


def test_no_grad_caches_nothing(rng):
    layer = Linear(3, 2, rng=rng)
    x = rng.standard_normal((4, 3)).astype(np.float32)

    with no_grad():
        assert not is_grad_enabled()
        layer(x)
    assert is_grad_enabled()

    assert layer._ctx is None
    with pytest.raises(RuntimeError):
        layer.backward(np.ones((4, 2), dtype=np.float32))


def test_load_state_dict_from_torch_and_errors(rng):
    module = TwoLinears(rng)
    torch_state = {
        name: to_torch(value * 2).double() for name, value in module.state_dict().items()
    }

    module.load_state_dict(torch_state)

    np.testing.assert_array_equal(
        module.a.weight, torch_state["a.weight"].numpy().astype(np.float32)
    )
    assert module.a.weight.dtype == np.float32  # cast to the module's dtype, as torch does
    missing = dict(torch_state)
    del missing["a.bias"]
    with pytest.raises(KeyError, match="a.bias"):
        module.load_state_dict(missing)
    with pytest.raises(KeyError, match="extra"):
        module.load_state_dict({**torch_state, "extra": np.zeros(1)})
    before = module.a.weight.copy()
    with pytest.raises(ValueError, match=r"pair.0.weight.*\(3, 2\)"):
        module.load_state_dict(
            {**torch_state, "a.weight": np.zeros((2, 3)), "pair.0.weight": np.zeros((3, 2))}
        )
    np.testing.assert_array_equal(module.a.weight, before)  # nothing changed on error
    module.load_state_dict({"a.bias": np.ones(2)}, strict=False)
    np.testing.assert_array_equal(module.a.bias, np.ones(2, dtype=np.float32))


def test_load_state_dict_takes_bfloat16_tensors(rng):
    layer = Linear(3, 2, rng=rng)

    layer.load_state_dict(
        {k: torch.ones(v.shape, dtype=torch.bfloat16) for k, v in layer.state_dict().items()}
    )

    np.testing.assert_array_equal(layer.weight, np.ones((2, 3), dtype=np.float32))


def test_astype_train_eval(rng):
    module = TwoLinears(rng)

    assert module.astype(np.float64) is module
    assert all(p.dtype == np.float64 for p in module.named_parameters().values())
    assert all(g.dtype == np.float64 for g in module.named_grads().values())
    assert not module.eval().training and not module.pair[1].training
    assert module.train().pair[1].training
    with pytest.raises(TypeError, match="floating"):
        module.astype(np.int32)


def test_input_dtype_must_match_parameters(rng):
    layer = Linear(3, 2, rng=rng)

    with pytest.raises(TypeError, match="float64.*float32"):
        layer(rng.standard_normal((4, 3)))
    with pytest.raises(TypeError, match="floating"):
        layer(np.ones((4, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\(4, 5\)"):
        layer(np.ones((4, 5), dtype=np.float32))
