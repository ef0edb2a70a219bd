"""torch_attention.scores: the checks of ``prepare``, the score pipeline and the softmax with its
log-sum-exp, on their own (the backends that run them are tested in test_functional.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_attention import scores

from ..conftest import assert_close, to_torch

NAN, INF = float("nan"), float("inf")


def qkv(rng, n=5, m=7, d=4):
    q, k, v = (to_torch(rng.standard_normal(shape)) for shape in ((2, n, d), (2, m, d), (2, m, 3)))
    return q, k, v


def test_prepare_turns_the_minus_inf_of_a_float_mask_into_hidden_positions(rng):
    bias = rng.standard_normal((5, 7))
    bias[1, 2] = -np.inf

    _, _, _, rules = scores.prepare(*qkv(rng), attn_mask=to_torch(bias))

    assert rules.bias[1, 2] == 0.0
    assert not rules.allowed[1, 2]
    assert int(rules.allowed.sum()) == 5 * 7 - 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_prepare_computes_half_types_in_float32(rng, dtype):
    q, k, v = (t.to(dtype) for t in qkv(rng))

    rules = scores.prepare(q, k, v, attn_mask=torch.zeros(5, 7, dtype=dtype)).rules

    expected = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    assert rules.compute == expected and rules.bias.dtype == expected


def test_prepare_defaults_the_scale_to_one_over_sqrt_d(rng):
    assert scores.prepare(*qkv(rng, d=9)).rules.scale == 1 / 3


def test_scores_forward_is_the_pipeline(rng):
    q, k, _ = qkv(rng)
    bias = to_torch(rng.standard_normal((5, 7)))
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[0, 6] = True
    rules = scores.prepare(q, k, k, causal=True, attn_mask=bias, key_padding_mask=padding).rules

    s = scores.scores_forward(q, k, rules)

    expected = q @ k.transpose(-2, -1) * 0.5 + bias
    expected = expected.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(), -INF)
    expected[0, :, 6] = -INF
    assert torch.equal(s == -INF, expected == -INF)
    assert_close(s[s > -INF], expected[expected > -INF], name="scores")


def test_scores_forward_replaces_a_hidden_nan_score(rng):
    q, k, _ = qkv(rng)
    k[:, 6, 0] = NAN
    rules = scores.prepare(q, k, k, attn_mask=torch.arange(7) != 6).rules

    s = scores.scores_forward(q, k, rules)

    assert torch.equal(s[..., 6], torch.full((2, 5), -INF, dtype=torch.float64))
    assert torch.isfinite(s[..., :6]).all()


def test_softmax_forward_gives_probabilities_and_their_log_sum_exp(rng):
    s = to_torch(rng.standard_normal((2, 5, 7)))

    probs, lse = scores.softmax_forward(s)

    assert_close(probs, torch.softmax(s, dim=-1), name="probs")
    assert_close(lse, torch.logsumexp(s, dim=-1), name="lse")


def test_softmax_forward_of_a_dead_row_is_zero_with_lse_minus_inf_and_gradient_zero(rng):
    s = to_torch(rng.standard_normal((3, 7)))
    s[1] = -INF
    s.requires_grad_(True)

    probs, lse = scores.softmax_forward(s)
    (probs * to_torch(rng.standard_normal((3, 7)))).sum().add(lse[[0, 2]].sum()).backward()

    assert torch.equal(probs[1], torch.zeros(7, dtype=torch.float64))
    assert lse[1] == -INF
    assert torch.equal(s.grad[1], torch.zeros(7, dtype=torch.float64))
    assert torch.isfinite(s.grad).all()


def test_softmax_forward_of_no_keys_is_empty_with_lse_minus_inf():
    probs, lse = scores.softmax_forward(torch.zeros(3, 0))

    assert probs.shape == (3, 0)
    assert torch.equal(lse, torch.full((3,), -INF))


@pytest.mark.parametrize("value", [NAN, INF])
def test_softmax_forward_makes_a_row_with_nan_or_plus_inf_nan_and_only_that_row(rng, value):
    s = to_torch(rng.standard_normal((3, 7)))
    s[1, 4] = value

    probs, lse = scores.softmax_forward(s)

    assert torch.isnan(probs[1]).all() and torch.isnan(lse[1])
    assert torch.isfinite(probs[[0, 2]]).all() and torch.isfinite(lse[[0, 2]]).all()


def test_softmax_forward_gives_a_minus_inf_score_weight_zero(rng):
    s = to_torch(rng.standard_normal((3, 7)))
    s[1, 4] = -INF

    probs, _ = scores.softmax_forward(s)

    assert probs[1, 4] == 0
    assert_close(probs[1], torch.softmax(s[1], dim=-1), name="probs")
