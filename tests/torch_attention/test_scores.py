"""torch_attention.scores: the score pipeline, the rules on positions and the softmax with its
log-sum-exp, on their own (the backends that run them are tested in test_functional.py; the
checks of ``rules.prepare``, test_rules.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_attention import scores
from torch_attention.rules import prepare

from ..conftest import assert_close, to_torch
from .test_rules import qkv, rules_for

NAN, INF = float("nan"), float("inf")


def test_scores_forward_is_the_pipeline(rng):
    q, k, _ = qkv(rng)
    bias = to_torch(rng.standard_normal((5, 7)))
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[0, 6] = True
    rules = prepare(q, k, k, causal=True, attn_mask=bias, key_padding_mask=padding).rules

    s, _ = scores.scores_forward(q, k, rules)

    expected = q @ k.transpose(-2, -1) * 0.5 + bias
    expected = expected.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(), -INF)
    expected[0, :, 6] = -INF
    assert torch.equal(s == -INF, expected == -INF)
    assert_close(s[s > -INF], expected[expected > -INF], name="scores")


def test_scores_forward_replaces_a_hidden_nan_score(rng):
    q, k, _ = qkv(rng)
    k[:, 6, 0] = NAN
    rules = prepare(q, k, k, attn_mask=torch.arange(7) != 6).rules

    s, _ = scores.scores_forward(q, k, rules)

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


# -- today's options: the rules on positions, GQA, sinks ------------------------------------------


def reference_band(n, m, offset, left, right):
    """The band written out entry by entry: p_i - left <= j <= p_i + right, p_i = i + offset."""
    visible = np.ones((n, m), dtype=bool)
    for i in range(n):
        for j in range(m):
            p = i + offset
            if right is not None and j > p + right:
                visible[i, j] = False
            if left is not None and j < p - left:
                visible[i, j] = False
    return visible


@pytest.mark.parametrize(("n", "m"), [(5, 7), (7, 5)])
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
@pytest.mark.parametrize("window", [(None, 0), (2, 0), (1, 3), (0, None), (0, 0)])
def test_band_is_the_window_entry_by_entry(rng, n, m, align, window):
    rules = rules_for(rng, n, m, window=window, align=align)

    visible = scores.band(rules, torch.arange(n)[:, None], torch.arange(m)[None, :])

    expected = reference_band(n, m, rules.offset, *window)
    assert np.array_equal(visible.numpy(), expected)


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_distance_is_alibis_position_gap(rng, align):
    rules = rules_for(rng, 5, 7, align=align)

    gap = scores.distance(rules, torch.arange(5)[:, None], torch.arange(7)[None, :])

    offset = 2 if align == "bottom-right" else 0
    expected = [[abs(i + offset - j) for j in range(7)] for i in range(5)]
    assert torch.equal(gap, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_query_head_h_reads_kv_head_h_over_the_group(rng, kv_heads):
    """GQA's mapping (SDPA's and flash-attn's): query head h reads kv head h // (H // H_kv),
    the same as repeating each kv head H // H_kv times in a row, forward and backward."""
    q, dout = (to_torch(rng.standard_normal((2, 4, 5, 3))) for _ in range(2))
    ds = to_torch(rng.standard_normal((2, 4, 5, 7)))
    k, v = (to_torch(rng.standard_normal((2, kv_heads, 7, 3))) for _ in range(2))
    probs = to_torch(rng.random((2, 4, 5, 7)))
    group = 4 // kv_heads
    k_rep, v_rep = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    assert_close(scores.qk(q, k, group), q @ k_rep.transpose(-2, -1), name="Q K^T")
    assert_close(scores.pv(probs, v, group), probs @ v_rep, name="P V")
    dprobs, dv = scores.pv_backward(dout, probs, v, group)
    assert_close(dprobs, dout @ v_rep.transpose(-2, -1), name="dP")
    assert_close(
        dv, (probs.transpose(-2, -1) @ dout).unflatten(1, (kv_heads, group)).sum(2), name="dV"
    )
    dq, dk = scores.qk_backward(ds, q, k, group)
    assert_close(dq, ds @ k_rep, name="dQ")
    assert_close(dk, (ds.transpose(-2, -1) @ q).unflatten(1, (kv_heads, group)).sum(2), name="dK")


def test_cap_is_softcap_tanh_and_the_identity_at_zero(rng):
    s = to_torch(rng.standard_normal((3, 7)) * 10)

    assert torch.equal(scores.cap(s, 0.0), s)
    assert_close(scores.cap(s, 2.0), 2.0 * torch.tanh(s / 2.0), name="capped")
    assert scores.cap(s, 2.0).abs().max() < 2.0


def test_softmax_forward_with_a_sink_puts_a_dead_rows_weight_on_it(rng):
    s = to_torch(rng.standard_normal((3, 7)))
    s[1] = -INF
    sink = torch.tensor([[0.5]], dtype=torch.float64)

    probs, lse = scores.softmax_forward(s, sink)

    with_sink = torch.cat((s, sink.expand(3, 1)), dim=-1)
    assert_close(probs[[0, 2]], torch.softmax(with_sink, -1)[[0, 2], :7], name="probs")
    assert_close(lse, torch.logsumexp(with_sink, -1), name="lse")
    assert torch.equal(probs[1], torch.zeros(7, dtype=torch.float64)) and lse[1] == 0.5
