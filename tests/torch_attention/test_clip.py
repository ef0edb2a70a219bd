"""torch_attention.clip: the torch twin of numpy_attention.clip, against its NumPy forward and
hand-derived backward (ties at +-c included), and the shared rules. Through the layer:
tests/torch_attention/test_grouped.py."""

from __future__ import annotations

import numpy as np

from numpy_attention import clip as np_clip
from torch_attention import clip as torch_clip

from ..conftest import to_numpy, to_torch


def test_forward_and_autograd_are_the_numpy_twins(rng):
    x = rng.standard_normal((2, 5, 6)) * 2.0
    x[0, 0, :3] = (-1.5, 1.5, 1.4999999)  # exactly at the clip, and just inside
    out, ctx = np_clip.clip_forward(x, 1.5)
    dout = rng.standard_normal(x.shape)
    tx = to_torch(x, requires_grad=True)
    y = torch_clip.clip(tx, 1.5)
    assert np.array_equal(to_numpy(y), out)
    (y * to_torch(dout)).sum().backward()
    assert np.array_equal(to_numpy(tx.grad), np_clip.clip_backward(dout, ctx))


def test_the_rules_are_the_numpy_twins():
    assert torch_clip.check_clip is np_clip.check_clip
