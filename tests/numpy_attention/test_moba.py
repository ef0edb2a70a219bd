"""numpy_attention.moba: mixture of block attention against an independent dense construction (the
chunks chosen here by loops over tokens, heads and chunks, then the core's dense attention under
that mask), every gradient by central differences in float64, and the refusals. Against torch
autograd: tests/torch_attention/test_moba.py. fla's parallel_moba needs flash-attn (CUDA): its
conventions are read from fla/ops/moba/parallel.py (docs/derivations/moba.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.functional import attention_forward
from numpy_attention.grad_mode import no_grad
from numpy_attention.gradcheck import gradcheck
from numpy_attention.moba import moba_backward, moba_forward

from ..conftest import assert_close, assert_gradcheck

S, H, H_KV, D, DV, CHUNK = 14, 4, 2, 3, 2, 3  # S not a multiple of the chunk
PACKED = np.array([0, 8, 14])


def inputs(rng, s=S):
    q = rng.standard_normal((s, H, D))
    k = rng.standard_normal((s, H_KV, D))
    v = rng.standard_normal((s, H_KV, DV))
    return q, k, v


def dense_moba(q, k, v, chunk, topk, cu_seqlens, scale=None):
    """MoBA by its words: per query token and head, every complete chunk before its own scored by
    q . mean(k of the chunk), the best topk - 1 kept (lower chunk first on ties), with its own
    chunk up to itself; topk = 1 is full causal attention. Then dense attention under that mask."""
    s, heads, _ = q.shape
    group = heads // k.shape[1]
    shown = np.zeros((heads, s, s), bool)
    offsets = [0, s] if cu_seqlens is None else list(cu_seqlens)
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        for t in range(start, end):
            own = start + (t - start) // chunk * chunk
            for h in range(heads):
                if topk == 1:
                    shown[h, t, start : t + 1] = True
                    continue
                shown[h, t, own : t + 1] = True
                past = range(start, own, chunk)  # complete chunks before its own
                gate = {b: q[t, h] @ k[b : b + chunk, h // group].mean(0) for b in past}
                for b in sorted(gate, key=lambda b: (-gate[b], b))[: topk - 1]:
                    shown[h, t, b : b + chunk] = True
    res = attention_forward(
        q.swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1), attn_mask=shown, enable_gqa=True,
        scale=scale,
    )  # fmt: skip
    return res.out.swapaxes(0, 1)


@pytest.mark.parametrize("topk", [1, 2, 3, 9])
@pytest.mark.parametrize("cu_seqlens", [None, PACKED])
def test_forward_is_dense_attention_under_the_chunk_mask(rng, topk, cu_seqlens):
    q, k, v = inputs(rng)
    res = moba_forward(q, k, v, chunk_size=CHUNK, topk=topk, cu_seqlens=cu_seqlens)
    assert_close(res.out, dense_moba(q, k, v, CHUNK, topk, cu_seqlens), name="out")
    assert res.chunk_indices.shape == (S, H, topk - 1)


def test_the_gate_is_unscaled_and_the_scale_reaches_the_softmax(rng):
    """softmax_scale changes the attention, not the choice (fla's gate is q . mean(k))."""
    q, k, v = inputs(rng)
    res = moba_forward(q, k, v, chunk_size=CHUNK, topk=2, softmax_scale=-0.7)
    same = moba_forward(q, k, v, chunk_size=CHUNK, topk=2)
    assert np.array_equal(res.chunk_indices, same.chunk_indices)
    assert_close(res.out, dense_moba(q, k, v, CHUNK, 2, None, scale=-0.7), name="out")


def test_ties_go_to_the_lower_chunk(rng):
    q, k, v = inputs(rng)
    k[:] = 1.0  # every chunk's mean key is the same: all gates tie
    res = moba_forward(q, k, v, chunk_size=CHUNK, topk=3)
    assert np.array_equal(res.chunk_indices[-1], np.tile([0, 1], (H, 1)))


@pytest.mark.parametrize("topk", [1, 3])
@pytest.mark.parametrize("cu_seqlens", [None, PACKED])
def test_gradcheck(rng, topk, cu_seqlens):
    """dq, dk, dv by central differences: GQA (the repeat's adjoint), a short last chunk."""
    q, k, v = inputs(rng)

    def forward(q, k, v):
        res = moba_forward(q, k, v, chunk_size=CHUNK, topk=topk, cu_seqlens=cu_seqlens)
        return res.out, res.ctx

    assert_gradcheck(gradcheck(forward, q, k, v, backward=lambda d, ctx: moba_backward(d, ctx)))


def test_no_grad_keeps_no_ctx(rng):
    q, k, v = inputs(rng)
    with no_grad():
        res = moba_forward(q, k, v, chunk_size=CHUNK, topk=2)
    assert res.ctx is None
    with pytest.raises(TypeError, match="moba_backward needs the ctx"):
        moba_backward(np.zeros((S, H, DV)), res.ctx)


BAD = {
    "kv of another token count": (
        dict(k=np.zeros((S + 1, H_KV, D)), v=np.zeros((S + 1, H_KV, DV))),
        ValueError,
        "self-att",
    ),
    "heads not a multiple": (
        dict(k=np.zeros((S, 3, D)), v=np.zeros((S, 3, DV))),
        ValueError,
        "multiple of the kv",
    ),
    "an integer q": (dict(q=np.zeros((S, H, D), int)), TypeError, "q must be a floating"),
    "chunk_size 0": (dict(chunk_size=0), ValueError, "chunk_size must be a positive int"),
    "topk 0": (dict(topk=0), ValueError, "topk must be a positive int"),
    "a float topk": (dict(topk=2.0), TypeError, "topk must be an int"),
    "cu_seqlens decreasing": (dict(cu_seqlens=np.array([0, 9, 5, 14])), ValueError, "decrease"),
    "float32 v": (dict(v=np.zeros((S, H_KV, DV), np.float32)), TypeError, "one dtype"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_refusals(rng, case):
    q, k, v = inputs(rng)
    change, error, words = BAD[case]
    with pytest.raises(error, match=words):
        moba_forward(**(dict(q=q, k=k, v=v, chunk_size=CHUNK, topk=2) | change))
