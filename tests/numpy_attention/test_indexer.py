"""numpy_attention.indexer: the lightning indexer's scores against their definition, its backward
by finite differences, the top-k selection's order and sentinels, and the KL loss's value and
gradient (dense and restricted). Against torch autograd: tests/torch_attention/test_indexer.py;
against transformers' DeepseekV32Indexer: tests/parity/test_hf_indexer.py."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import indexer
from numpy_attention.gradcheck import gradcheck
from numpy_attention.indexer import (
    indexer_backward,
    indexer_forward,
    indexer_kl_loss,
    topk_indices,
)

from ..conftest import assert_close, assert_gradcheck

S_Q, S_KV, HI, DI = 5, 8, 3, 4


def inputs(rng):
    return (
        rng.standard_normal((S_Q, HI, DI)),
        rng.standard_normal((S_KV, DI)),
        rng.standard_normal((S_Q, HI)),
    )


@pytest.mark.parametrize("causal", [True, False])
def test_scores_are_the_definition(rng, causal):
    q, k, w = inputs(rng)
    scores = indexer_forward(q, k, w, scale=0.7, causal=causal).scores
    expected = np.zeros((S_Q, S_KV))
    for t in range(S_Q):
        for s in range(S_KV):
            if causal and s > t + S_KV - S_Q:
                expected[t, s] = -np.inf
                continue
            expected[t, s] = sum(w[t, j] * max(0.7 * q[t, j] @ k[s], 0.0) for j in range(HI))
    assert np.array_equal(np.isneginf(scores), np.isneginf(expected))
    assert_close(scores[np.isfinite(expected)], expected[np.isfinite(expected)], name="scores")


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck(rng, causal):
    q, k, w = inputs(rng)

    def forward(q, k, w):
        res = indexer_forward(q, k, w, causal=causal)
        return np.where(np.isneginf(res.scores), 0.0, res.scores), res.ctx

    report = gradcheck(forward, q, k, w, backward=lambda d, ctx: indexer_backward(d, ctx))
    assert_gradcheck(report)


def test_blocks_change_nothing(rng, monkeypatch):
    q, k, w = inputs(rng)
    whole = indexer_forward(q, k, w)
    d = rng.standard_normal((S_Q, S_KV))
    grads = indexer_backward(d, whole.ctx)
    monkeypatch.setattr(indexer, "_BLOCK_ENTRIES", 1)
    blocked = indexer_forward(q, k, w)
    assert np.array_equal(blocked.scores, whole.scores)
    for a, b in zip(indexer_backward(d, blocked.ctx), grads, strict=True):
        assert_close(a, b)


def test_topk_order_ties_and_sentinels():
    scores = np.array(
        [
            [1.0, 3.0, 3.0, -np.inf, 2.0],  # a tie: the lower index first
            [0.0, -np.inf, -np.inf, -np.inf, -np.inf],  # one visible key
            [-np.inf] * 5,  # none
        ]
    )
    assert topk_indices(scores, 3).tolist() == [[1, 2, 4], [0, -1, -1], [-1, -1, -1]]
    assert topk_indices(scores, 7).tolist()[0] == [1, 2, 4, 0, -1, -1, -1]  # past S_kv: -1
    with pytest.raises(ValueError, match="NaN"):
        topk_indices(np.array([[np.nan, 1.0]]), 1)
    with pytest.raises(ValueError, match="topk must be"):
        topk_indices(scores, 0)


def _kl_naive(scores, attention, indices=None):
    loss, grad = 0.0, np.zeros_like(scores)
    for t in range(scores.shape[0]):
        keys = np.flatnonzero(np.isfinite(scores[t]))
        if indices is not None:
            keys = np.intersect1d(keys, indices[t][(indices[t] >= 0) & (indices[t] < S_KV)])
        p = attention[t].sum(0)[keys]
        if p.sum() == 0:
            continue
        p = p / p.sum()
        q = np.exp(scores[t, keys] - scores[t, keys].max())
        q = q / q.sum()
        loss += float(np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p / q, 1.0)), 0.0)))
        grad[t, keys] = q - p
    return loss, grad


@pytest.mark.parametrize("restricted", [False, True])
def test_kl_loss_value_and_gradient(rng, restricted):
    q, k, w = inputs(rng)
    scores = indexer_forward(q, k, w).scores
    attention = rng.random((S_Q, 2, S_KV)) * ~np.isneginf(scores)[:, None, :]
    attention[0] = 0.0  # a row with no weight: left out
    indices = topk_indices(scores, 3) if restricted else None
    res = indexer_kl_loss(scores, attention, indices)
    loss, grad = _kl_naive(scores, attention, indices)
    assert res.loss == pytest.approx(loss, rel=1e-12)
    assert_close(res.dscores, grad, name="dscores")
    # the gradient by central differences on the visible scores
    eps, visible = 1e-6, np.argwhere(np.isfinite(scores))
    for t, s in visible:
        plus, minus = scores.copy(), scores.copy()
        plus[t, s] += eps
        minus[t, s] -= eps
        numeric = (
            indexer_kl_loss(plus, attention, indices).loss
            - indexer_kl_loss(minus, attention, indices).loss
        ) / (2 * eps)
        assert abs(numeric - res.dscores[t, s]) < 1e-7


def test_kl_loss_refuses_weight_on_hidden_keys(rng):
    q, k, w = inputs(rng)
    scores = indexer_forward(q, k, w).scores
    with pytest.raises(ValueError, match="hides"):
        indexer_kl_loss(scores, np.ones((S_Q, S_KV)))


def test_bad_input(rng):
    q, k, w = inputs(rng)
    with pytest.raises(ValueError, match=r"k_idx must be \(S_kv, DI\)"):
        indexer_forward(q, k[:, :3], w)
    with pytest.raises(ValueError, match=r"weights must be \(S_q, HI\)"):
        indexer_forward(q, k, w[:, :2])
    with pytest.raises(ValueError, match="causal needs S_kv >= S_q"):
        indexer_forward(q, k[:3], w)
    with pytest.raises(TypeError, match="indices must be an integer array"):
        indexer_kl_loss(np.zeros((S_Q, S_KV)), np.ones((S_Q, S_KV)), np.zeros((S_Q, 2)))
