"""The checker's baseline: plain torch attention equals the NumPy golden in float64, forward and
backward, lse included, with every option of today's family (GQA, alignment, windows, softcap,
ALiBi, packed sequences), masks and fully masked rows included, with the default scale read from
D."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from numpy_attention.functional import attention_backward, attention_forward
from numpy_attention.varlen import varlen_attention_backward, varlen_attention_forward
from parity_tests.checker.battery.attention.case import make_inputs
from parity_tests.checker.battery.attention.handwritten import NAMED
from parity_tests.checker.golden.attention_baseline import (
    attention_scores,
    masked_softmax,
    plain_attention,
    plain_attention_lse,
    plain_varlen,
)

from ...conftest import assert_close, to_numpy, to_torch

BY_NAME = {case.name: case for case in NAMED}


def _options(case) -> dict:
    return {
        "align": case.align,
        "window": case.window,
        "softcap": case.softcap,
        "enable_gqa": case.kv_heads != case.heads,
    }


@pytest.mark.parametrize(
    "name",
    [
        "dv>d",
        "causal-n<m",
        "float-mask",
        "dead-rows-bool",
        "gqa-2of4",
        "causal-br-n>m",
        "window-br",
        "window-tl",
        "softcap",
        "alibi-bh-causal",
    ],
)
def test_plain_attention_in_float64_is_the_golden(name):
    case = BY_NAME[name]
    q, k, v, attn_mask, dout, slopes = make_inputs(case, seed=0)
    leaves = [to_torch(a, requires_grad=True) for a in (q, k, v)]
    mask = None if attn_mask is None else to_torch(attn_mask)
    rates = None if slopes is None else to_torch(slopes)

    out, lse = plain_attention_lse(*leaves, mask, is_causal=case.causal, scale=case.scale,
                                   alibi_slopes=rates, **_options(case))  # fmt: skip
    out.backward(to_torch(dout))

    golden = attention_forward(q, k, v, causal=case.causal, attn_mask=attn_mask, scale=case.scale,
                               alibi_slopes=slopes, return_lse=True, **_options(case))  # fmt: skip
    grads = attention_backward(dout, golden.ctx)
    assert_close(out, golden.out, name="out")
    finite = np.isfinite(golden.lse)
    assert np.array_equal(np.isfinite(to_numpy(lse)), finite)
    assert_close(to_numpy(lse)[finite], golden.lse[finite], name="lse")
    for name_, leaf, expected in zip(("dq", "dk", "dv"), leaves, grads[:3], strict=True):
        assert_close(leaf.grad, expected, name=name_)


@pytest.mark.parametrize("name", ["varlen", "varlen-causal-gqa"])
def test_plain_varlen_in_float64_is_the_golden(name):
    case = BY_NAME[name]
    q, k, v, _, dout, _ = make_inputs(case, seed=0)
    cu_q, cu_k = case.cu_seqlens
    leaves = [to_torch(a, requires_grad=True) for a in (q, k, v)]

    out, lse = plain_varlen(*leaves, to_torch(cu_q), to_torch(cu_k), is_causal=case.causal,
                            **_options(case))  # fmt: skip
    out.backward(to_torch(dout))

    golden = varlen_attention_forward(q, k, v, cu_q, cu_k, causal=case.causal, return_lse=True,
                                      **_options(case))  # fmt: skip
    grads = varlen_attention_backward(dout, golden.ctx)
    assert_close(out, golden.out, name="out")
    finite = np.isfinite(golden.lse)
    assert_close(to_numpy(lse)[finite], golden.lse[finite], name="lse")
    for name_, leaf, expected in zip(("dq", "dk", "dv"), leaves, grads[:3], strict=True):
        assert_close(leaf.grad, expected, name=name_)


def test_the_sdpa_signature_of_the_baseline_is_kept():
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)

    assert torch.equal(plain_attention(q, q, q, None, 0.0, True), plain_attention_lse(q, q, q,
                       is_causal=True)[0])  # fmt: skip


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
