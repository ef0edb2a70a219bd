"""The query temperature's pure pair (numpy_attention.temperature): each kind's t(p) against its
model's own formula in torch, finite differences and torch autograd of q' = t(p) q, positions
per batch element, float32 kept, and bad specs refused. The temperature inside the layer
(gradcheck, torch, decoding) is tests/numpy_attention/test_grouped.py's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from numpy_attention import gradcheck
from numpy_attention.temperature import (
    check_temperature,
    query_temperature_backward,
    query_temperature_forward,
    temperature_scale,
)

from ..conftest import assert_close, assert_gradcheck, to_torch

B, H, N, D = 2, 3, 7, 4
SPECS = {  # the released models' parameters, with lengths small enough for 7 positions to cross
    "ministral3": {"kind": "log_floor", "beta": 0.1, "length": 2.0, "offset": 0.0},
    "llama4": {"kind": "log_floor", "beta": 0.1, "length": 3.0, "offset": 1.0},
    "beam": {"kind": "power", "exponent": 0.1, "length": 2.0, "offset": 1.0},
}


def models_formula(name, positions):
    """t(p) as each model's code writes it, in torch float64 (positions an integer tensor)."""
    spec = SPECS[name]
    p = positions.to(torch.float64)
    if name == "ministral3":  # 1 + beta * log(1 + floor(p / original_max_position_embeddings))
        return 1 + spec["beta"] * torch.log(1 + torch.floor(p / spec["length"]))
    if name == "llama4":  # log1p(floor((p + 1) / floor_scale)) * attn_scale + 1
        return torch.log1p(torch.floor((p + 1.0) / spec["length"])) * spec["beta"] + 1.0
    return torch.exp(0.1 * torch.log1p((p + 1) / spec["length"]))  # Beam: (1 + (p+1)/L)^0.1


@pytest.mark.parametrize("name", list(SPECS))
def test_scale_is_the_models_formula(name):
    positions = np.arange(N)

    scale = temperature_scale(positions, SPECS[name])

    assert_close(scale, models_formula(name, torch.arange(N)), name="t(p)")
    assert scale[0] == pytest.approx(1.0, abs=0.1) and len(set(scale.round(12))) > 2


def test_ministral3_temperature_at_known_positions():
    """1 + 0.1 log(1 + floor(p / 16384)): 1 below 16384, 1 + 0.1 log 2 from there."""
    spec = {"kind": "log_floor", "beta": 0.1, "length": 16384, "offset": 0}

    scale = temperature_scale(np.array([0, 16383, 16384, 3 * 16384]), check_temperature(spec))

    np.testing.assert_allclose(scale, [1, 1, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(4)])


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("per_batch", [False, True], ids=["positions-N", "positions-BN"])
def test_gradcheck_and_torch_autograd(rng, name, per_batch):
    q = rng.standard_normal((B, H, N, D))
    dout = rng.standard_normal(q.shape)
    positions = np.stack([np.arange(N), np.arange(N) + 5]) if per_batch else np.arange(N)
    q_t = to_torch(q, requires_grad=True)
    t = models_formula(name, torch.from_numpy(positions))
    expected = q_t * (t[:, None, :, None] if per_batch else t[:, None])
    expected.backward(to_torch(dout))

    out, ctx = query_temperature_forward(q, positions, SPECS[name])
    dq = query_temperature_backward(dout, ctx)

    assert_close(out, expected, name="out")
    assert_close(dq, q_t.grad, name="dq")
    report = gradcheck(
        query_temperature_forward,
        q,
        backward=query_temperature_backward,
        positions=positions,
        spec=SPECS[name],
    )
    assert_gradcheck(report)


def test_float32_stays_float32(rng):
    q = rng.standard_normal((B, H, N, D)).astype(np.float32)

    out, ctx = query_temperature_forward(q, np.arange(N), SPECS["beam"])
    dq = query_temperature_backward(out, ctx)

    assert out.dtype == dq.dtype == np.float32


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ([("kind", "power")], TypeError, "must be None or a mapping"),
        ({"beta": 0.1}, ValueError, r"\['kind'\] must be one of \['log_floor', 'power'\]"),
        ({"kind": "log_floor", "beta": 0.1, "length": 4}, ValueError, r"got \['beta', 'length'\]"),
        (SPECS["beam"] | {"beta": 1.0}, ValueError, "takes"),
        (SPECS["beam"] | {"length": -2.0}, ValueError, r"\['length'\] must be > 0"),
        (SPECS["ministral3"] | {"beta": math.inf}, ValueError, "beta"),
    ],
)
def test_bad_specs_are_refused(spec, error, match):
    with pytest.raises(error, match=match):
        check_temperature(spec)
