"""Softmax and head split/merge: gradcheck and torch autograd in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.functional import (
    merge_heads_backward,
    merge_heads_forward,
    softmax_backward,
    softmax_forward,
    split_heads_backward,
    split_heads_forward,
)
from numpy_attention.gradcheck import gradcheck

from ..conftest import assert_close, assert_gradcheck, to_torch


def masked_scores(rng, masked):
    scores = rng.standard_normal((2, 3, 5))
    if masked:
        scores[0, 1, [0, 3]] = -np.inf  # partly masked row
        scores[1, 2, :] = -np.inf  # fully masked row
    return scores


@pytest.mark.parametrize("masked", [False, True])
def test_softmax_gradcheck(rng, masked):
    scores = masked_scores(rng, masked)
    finite = np.isfinite(scores)

    def forward(s):
        # Perturbations only move finite entries; masked ones stay -inf.
        return softmax_forward(np.where(finite, s, -np.inf))

    assert_gradcheck(gradcheck(forward, np.where(finite, scores, 0.0), backward=softmax_backward))


@pytest.mark.parametrize("masked", [False, True])
def test_softmax_matches_torch_autograd(rng, masked):
    scores = masked_scores(rng, masked)
    dprobs = rng.standard_normal(scores.shape)
    tscores = to_torch(np.where(np.isfinite(scores), scores, 0.0), requires_grad=True)
    dead = torch.from_numpy(~np.isfinite(scores).any(axis=-1, keepdims=True))

    probs, ctx = softmax_forward(scores)
    dscores = softmax_backward(dprobs, ctx)
    masked_scores_t = tscores.masked_fill(torch.from_numpy(~np.isfinite(scores)), float("-inf"))
    expected = torch.softmax(masked_scores_t.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    expected.backward(to_torch(dprobs))

    assert_close(probs, expected, name="probs")
    assert_close(dscores, tscores.grad, name="dscores")


def test_softmax_fully_masked_row_is_zero_not_nan():
    scores = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0]])

    probs, ctx = softmax_forward(scores)
    dscores = softmax_backward(np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]), ctx)

    np.testing.assert_array_equal(probs[0], 0.0)
    np.testing.assert_array_equal(dscores[0], 0.0)
    assert probs[1, 1] == 0.0 and dscores[1, 1] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_is_stable_for_large_logits(dtype):
    # exp(1000) overflows both dtypes: only the max-shift keeps this finite.
    probs, _ = softmax_forward(np.array([[1000.0, 999.0, -1000.0]], dtype=dtype))

    expected = np.array([1.0, np.exp(-1.0), 0.0]) / (1.0 + np.exp(-1.0))
    assert_close(probs[0], expected.astype(dtype), name="probs")


@pytest.mark.parametrize("shape", [(2, 5, 12), (5, 12), (2, 3, 5, 12)])
@pytest.mark.parametrize("num_heads", [1, 3, 4])
def test_split_and_merge_heads(rng, shape, num_heads):
    x = rng.standard_normal(shape)
    d = shape[-1] // num_heads

    heads, ctx = split_heads_forward(x, num_heads)
    merged, merge_ctx = merge_heads_forward(heads)

    assert heads.shape == (*shape[:-2], num_heads, shape[-2], d)
    np.testing.assert_array_equal(
        heads[..., 1 % num_heads, :, :], x[..., (1 % num_heads) * d :][..., :d]
    )
    np.testing.assert_array_equal(merged, x)
    assert_gradcheck(
        gradcheck(lambda t: split_heads_forward(t, num_heads), x, backward=split_heads_backward)
    )
    assert_gradcheck(gradcheck(merge_heads_forward, heads, backward=merge_heads_backward))


def test_split_heads_rejects_indivisible_width(rng):
    with pytest.raises(ValueError, match="3 heads"):
        split_heads_forward(rng.standard_normal((2, 4, 10)), 3)
