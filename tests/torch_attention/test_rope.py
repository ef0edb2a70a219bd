"""torch_attention.rope, the twin of numpy_attention.rope: forward and backward against the NumPy
twin (both layouts, positions per batch element), torch's gradcheck, float64 angles for float32
inputs, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.rope import rope_backward, rope_forward
from numpy_attention.rope import rope_inv_freq as numpy_rope_inv_freq
from torch_attention.rope import rope, rope_inv_freq

from ..conftest import assert_close, to_torch

D = 6  # the head width (even, for RoPE)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("batched_positions", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 4, 0], ids=["whole", "partial", "nope"])
def test_rope_matches_numpy_forward_and_backward(rng, interleaved, batched_positions, rotary_dim):
    x = rng.standard_normal((2, 3, 7, D))
    positions = (
        np.stack([np.arange(7) + 4, np.arange(7) - 2]) if batched_positions else np.arange(7)
    )
    inv_freq = rng.random((D if rotary_dim is None else rotary_dim) // 2)
    dout = rng.standard_normal(x.shape)
    options = {
        "inv_freq": inv_freq,
        "interleaved": interleaved,
        "attention_factor": 1.3,
        "rotary_dim": rotary_dim,
    }

    expected, ctx = rope_forward(x, positions, **options)
    x_t = to_torch(x, requires_grad=True)
    out = rope(x_t, to_torch(positions), **options)
    out.backward(to_torch(dout))

    assert_close(out, expected, name="out")
    assert_close(x_t.grad, rope_backward(dout, ctx), name="dx")


def test_rope_passes_gradcheck(rng):
    x = to_torch(rng.standard_normal((2, 2, 5, D)), requires_grad=True)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])

    assert torch.autograd.gradcheck(
        lambda t: rope(t, positions, inv_freq=rope_inv_freq(D), attention_factor=0.9), (x,)
    )


def test_rope_keeps_float32_and_computes_angles_in_float64(rng):
    """Positions around 1e5: float32 angles would be off by up to 4e-3 rad; the NumPy twin's
    float64 angles agree to float32 rounding."""
    x = rng.standard_normal((1, 5, D)).astype(np.float32)
    positions = 100_000 + np.arange(5)
    inv_freq = rope_inv_freq(D, 500_000.0)

    out = rope(to_torch(x), to_torch(positions), inv_freq=inv_freq)

    assert out.dtype == torch.float32
    assert_close(out, rope_forward(x, positions, inv_freq=inv_freq.numpy())[0], name="out")


def test_rope_default_frequencies_are_numpys():
    assert_close(rope_inv_freq(D, 500_000.0), numpy_rope_inv_freq(D, 500_000.0))


@pytest.mark.parametrize(
    ("positions", "message"),
    [(np.arange(6), r"positions must be \(N,\) = \(7,\) or \(B, N\)"), (np.ones(7, bool), "dtype")],
)
def test_rope_refuses_positions_of_the_wrong_shape_or_dtype(rng, positions, message):
    x = to_torch(rng.standard_normal((2, 3, 7, D)))

    with pytest.raises((ValueError, TypeError), match=message):
        rope(x, positions, inv_freq=rope_inv_freq(D))


def test_rope_refuses_an_odd_width_and_frequencies_of_the_wrong_length(rng):
    with pytest.raises(ValueError, match="even head width"):
        rope(to_torch(rng.standard_normal((3, 5))), np.arange(3), inv_freq=np.ones(2))
    with pytest.raises(ValueError, match=r"inv_freq must be \(R/2,\) = \(3,\)"):
        rope(to_torch(rng.standard_normal((3, 6))), np.arange(3), inv_freq=np.ones(2))
    with pytest.raises(ValueError, match="rotary_dim must be even .* got 3"):
        rope(to_torch(rng.standard_normal((3, 6))), np.arange(3), inv_freq=np.ones(1), rotary_dim=3)
