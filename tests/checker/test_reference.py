"""The checker's baseline: plain torch attention equals the NumPy golden in float64, forward and
backward, masks and fully masked rows included, with the default scale read from D."""

from __future__ import annotations

import math

import pytest
import torch

from numpy_attention.functional import attention_backward, attention_forward
from parity_tests.checker.battery import DEFAULT, make_inputs
from parity_tests.checker.reference import attention_scores, masked_softmax, plain_attention

from ..conftest import assert_close, to_numpy, to_torch

BY_NAME = {case.name: case for case in DEFAULT}


@pytest.mark.parametrize("name", ["dv>d", "causal-n<m", "float-mask", "dead-rows-bool"])
def test_plain_attention_in_float64_is_the_golden(name):
    case = BY_NAME[name]
    q, k, v, attn_mask, dout = make_inputs(case, seed=0)
    leaves = [to_torch(a, requires_grad=True) for a in (q, k, v)]
    mask = None if attn_mask is None else to_torch(attn_mask)

    out = plain_attention(*leaves, mask, is_causal=case.causal, scale=case.scale)
    out.backward(to_torch(dout))

    golden = attention_forward(q, k, v, causal=case.causal, attn_mask=attn_mask, scale=case.scale)
    grads = attention_backward(dout, golden.ctx)
    assert_close(out, golden.out, name="out")
    for name_, leaf, expected in zip(("dq", "dk", "dv"), leaves, grads[:3], strict=True):
        assert_close(leaf.grad, expected, name=name_)


def test_default_scale_is_one_over_sqrt_d_not_dv():
    q, k = torch.ones(1, 1, 2, 4), torch.ones(1, 1, 3, 4)

    scores = attention_scores(q, k)

    assert torch.equal(scores, torch.full((1, 1, 2, 3), 4.0 / math.sqrt(4)))


def test_fully_masked_rows_get_zero_weights_and_zero_gradients():
    scores = torch.tensor([[0.5, -math.inf], [-math.inf, -math.inf]], requires_grad=True)

    probs = masked_softmax(scores)
    probs.backward(torch.ones_like(probs) * torch.tensor([[2.0, 3.0], [5.0, 7.0]]))

    assert to_numpy(probs).tolist() == [[1.0, 0.0], [0.0, 0.0]]
    assert not torch.isnan(scores.grad).any() and torch.equal(scores.grad[1], torch.zeros(2))
