"""torch_attention.temperature: the torch twin of numpy_attention.temperature, t(p) and q' = t(p)
q against the NumPy forward and its backward, per kind and for (N,) and (B, N) positions; the
shared rules. Through the layer: tests/torch_attention/test_grouped.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import temperature as np_temperature
from torch_attention import temperature as torch_temperature

from ..conftest import assert_close, to_numpy, to_torch

SPECS = [
    {"kind": "log_floor", "beta": 0.1, "length": 4.0, "offset": 0.0},
    {"kind": "power", "exponent": 0.1, "length": 8.0, "offset": 1.0},
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["kind"])
@pytest.mark.parametrize("batched", [False, True])
def test_forward_and_autograd_are_the_numpy_twins(rng, spec, batched):
    spec = np_temperature.check_temperature(spec)
    q = rng.standard_normal((2, 3, 11, 4))
    positions = np.arange(11) if not batched else np.stack([np.arange(11), np.arange(11) + 5])
    out, ctx = np_temperature.query_temperature_forward(q, positions, spec)
    dout = rng.standard_normal(q.shape)
    tq = to_torch(q, requires_grad=True)
    y = torch_temperature.query_temperature(tq, torch.from_numpy(positions), spec)
    assert_close(to_numpy(y), out, name="q'")
    (y * to_torch(dout)).sum().backward()
    assert_close(to_numpy(tq.grad), np_temperature.query_temperature_backward(dout, ctx))
    scales = torch_temperature.temperature_scale(torch.from_numpy(positions), spec)
    assert_close(to_numpy(scales), np_temperature.temperature_scale(positions, spec))


def test_the_rules_are_the_numpy_twins():
    assert torch_temperature.check_temperature is np_temperature.check_temperature
    assert torch_temperature.TEMPERATURE_KINDS is np_temperature.TEMPERATURE_KINDS
