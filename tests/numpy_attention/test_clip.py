"""The clip of q, k and v's pure pair (numpy_attention.clip): finite differences away from the
kinks, torch autograd (ties at +-c included: torch.clamp passes their gradient), float32 kept, and
bad options. The clip inside the layer (gradcheck, torch, decoding, bad options) is
tests/numpy_attention/test_grouped.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import gradcheck
from numpy_attention.clip import check_clip, clip_backward, clip_forward

from ..conftest import assert_close, assert_gradcheck, to_torch

B, N, W = 2, 3, 8
CLIP = 0.7


def away_from_the_kinks(x, clip, gap=1e-3):
    """x with every |x| within ``gap`` of the clip pushed out of that band (finite differences
    across a kink would average its two slopes)."""
    near = np.abs(np.abs(x) - clip) < gap
    return np.where(near, x + np.sign(x) * 2 * gap, x)


def test_gradcheck(rng):
    x = away_from_the_kinks(rng.standard_normal((B, N, W)), CLIP)
    clipped = np.abs(x) > CLIP

    report = gradcheck(clip_forward, x, backward=clip_backward, clip=CLIP)

    assert_gradcheck(report)
    assert 0.2 < clipped.mean() < 0.8  # both sides of the kink are exercised


def test_matches_torch_clamp_ties_included(rng):
    x = rng.standard_normal((B, N, W))
    x[0, 0, :4] = [-CLIP, CLIP, -2 * CLIP, 2 * CLIP]  # the ties, and one clamped on each side
    dout = rng.standard_normal(x.shape)
    x_t = to_torch(x, requires_grad=True)
    expected = x_t.clamp(min=-CLIP, max=CLIP)
    expected.backward(to_torch(dout))

    out, ctx = clip_forward(x, CLIP)
    dx = clip_backward(dout, ctx)

    assert_close(out, expected, name="out")
    assert_close(dx, x_t.grad, name="dx")
    np.testing.assert_array_equal(dx[0, 0, :4], [dout[0, 0, 0], dout[0, 0, 1], 0.0, 0.0])


def test_float32_stays_float32(rng):
    x = (3 * rng.standard_normal((B, N, W))).astype(np.float32)

    out, ctx = clip_forward(x, 0.1)  # 0.1 is no float32: the bound is c rounded to float32
    dx = clip_backward(np.ones_like(x), ctx)

    assert out.dtype == dx.dtype == np.float32
    assert np.abs(out).max() == np.float32(0.1)
    assert torch.equal(torch.from_numpy(out), torch.from_numpy(x).clamp(-0.1, 0.1))


@pytest.mark.parametrize(
    ("clip", "after_norm", "qk_norm", "error", "match"),
    [
        (0.0, False, False, ValueError, "clip_qkv must be > 0"),
        (-8.0, False, False, ValueError, "clip_qkv must be > 0"),
        (float("inf"), False, False, ValueError, "clip_qkv"),
        ("8", False, False, TypeError, "clip_qkv"),
        (None, True, True, ValueError, "clip_after_norm=True .* clip_qkv is None"),
        (8.0, True, False, ValueError, "clip_after_norm=True .* qk_norm is False"),
        (8.0, 1, True, TypeError, "clip_after_norm must be a bool"),
    ],
)
def test_bad_options_are_refused(clip, after_norm, qk_norm, error, match):
    with pytest.raises(error, match=match):
        check_clip(clip, after_norm, qk_norm)


def test_an_integer_clip_is_a_float():
    assert check_clip(8, False, False) == 8.0 and check_clip(None, False, True) is None
