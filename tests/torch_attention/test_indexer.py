"""torch_attention.indexer: the twin of numpy_attention.indexer; its scores and autograd against
the NumPy forward and hand-derived backward, the same top-k, the KL loss and its autograd against
the NumPy loss and dscores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import indexer as np_indexer
from torch_attention.indexer import indexer_kl_loss, indexer_scores, topk_indices

from ..conftest import assert_close, to_numpy, to_torch
from ..numpy_attention.test_indexer import S_KV, S_Q, inputs


@pytest.mark.parametrize("causal", [True, False])
def test_scores_and_autograd_equal_the_derived_backward(rng, causal):
    q, k, w = inputs(rng)
    ref = np_indexer.indexer_forward(q, k, w, causal=causal)
    d = rng.standard_normal((S_Q, S_KV))
    grads = np_indexer.indexer_backward(d, ref.ctx)
    tq, tk, tw = (to_torch(t, requires_grad=True) for t in (q, k, w))
    scores = indexer_scores(tq, tk, tw, causal=causal)
    # the masked (-inf) positions exactly; the rest within float64 rounding: numpy's and torch's
    # BLAS may sum the same products in another order (1 ulp apart on an AVX2 machine)
    found = to_numpy(scores)
    assert np.array_equal(np.isneginf(found), np.isneginf(ref.scores))
    kept = np.isfinite(ref.scores)
    assert_close(found[kept], ref.scores[kept], name="scores")
    finite = torch.isfinite(scores)
    (torch.where(finite, scores, 0.0) * to_torch(d)).sum().backward()
    for name, tensor, grad in zip(("dq", "dk", "dw"), (tq, tk, tw), grads, strict=True):
        assert_close(to_numpy(tensor.grad), grad, name=name)


def test_topk_is_the_numpy_twins(rng):
    q, k, w = inputs(rng)
    scores = np_indexer.indexer_forward(q, k, w).scores
    scores[2, 1] = scores[2, 0]  # a tie
    for topk in (1, 3, S_KV + 2):
        expected = np_indexer.topk_indices(scores, topk)
        assert topk_indices(torch.from_numpy(scores), topk).tolist() == expected.tolist()


@pytest.mark.parametrize("restricted", [False, True])
def test_kl_loss_and_its_gradient_are_the_numpy_twins(rng, restricted):
    q, k, w = inputs(rng)
    scores = np_indexer.indexer_forward(q, k, w).scores
    attention = rng.random((S_Q, 2, S_KV)) * ~np.isneginf(scores)[:, None, :]
    attention[0] = 0.0
    indices = np_indexer.topk_indices(scores, 3) if restricted else None
    ref = np_indexer.indexer_kl_loss(scores, attention, indices)
    ts = to_torch(scores, requires_grad=True)
    loss = indexer_kl_loss(
        ts, torch.from_numpy(attention), None if indices is None else torch.from_numpy(indices)
    )
    assert float(loss.detach()) == pytest.approx(ref.loss, rel=1e-12)
    loss.backward()
    assert_close(to_numpy(ts.grad), ref.dscores, name="dscores")
