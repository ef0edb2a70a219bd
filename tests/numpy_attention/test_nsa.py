"""numpy_attention.nsa: native sparse attention, each branch against dense attention under the
branch's mask (built here by loops over tokens and blocks), the block choice against a brute-force
ranking, every gradient (gates included) by central differences in float64, and the refusals.
Against torch autograd: tests/torch_attention/test_nsa.py; against fla's naive_nsa:
tests/parity/test_fla_nsa.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.functional import attention_forward
from numpy_attention.grad_mode import no_grad
from numpy_attention.gradcheck import gradcheck
from numpy_attention.nsa import nsa_backward, nsa_forward

from ..conftest import assert_close, assert_gradcheck

S, H, H_KV, D, DV, BLOCK, WINDOW = 13, 4, 2, 3, 2, 2, 3  # S not a multiple of the block
PACKED = np.array([0, 6, 13])  # two sequences, both with a short last block


def inputs(rng, s=S, heads=H, kv_heads=H_KV):
    q = rng.standard_normal((s, heads, D))
    k = rng.standard_normal((s, kv_heads, D))
    v = rng.standard_normal((s, kv_heads, DV))
    gates = [rng.uniform(0.1, 1.0, (s, heads)) for _ in range(3)]
    return q, k, v, gates


def sequences(cu_seqlens, s=S):
    """(start, end) of each packed sequence."""
    offsets = [0, s] if cu_seqlens is None else list(cu_seqlens)
    return list(zip(offsets[:-1], offsets[1:], strict=True))


def dense(q, k, v, shown):
    """Dense attention under a (H, S_q, S_kv) mask of shown keys, token-major in and out."""
    res = attention_forward(
        q.swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1), attn_mask=shown, enable_gqa=True
    )
    return res.out.swapaxes(0, 1)


def reference(q, k, v, gates, block_indices, cu_seqlens, window):
    """NSA by its definition: pooled keys by explicit means, each branch dense under its mask."""
    s, heads = q.shape[:2]
    group = heads // k.shape[1]
    k_cmp, v_cmp, owner = [], [], []  # the pooled rows and (sequence start, block) of each
    for start, end in sequences(cu_seqlens, s):
        for c, b in enumerate(range(start, end, BLOCK)):
            k_cmp.append(k[b : min(b + BLOCK, end)].mean(0))
            v_cmp.append(v[b : min(b + BLOCK, end)].mean(0))
            owner.append((start, c))
    cmp = np.zeros((heads, s, len(owner)), bool)
    slc = np.zeros((heads, s, s), bool)
    swa = np.zeros((heads, s, s), bool)
    for start, end in sequences(cu_seqlens, s):
        for t in range(start, end):
            cmp[:, t] = [o == start and (c + 1) * BLOCK - 1 <= t - start for o, c in owner]
            for h in range(heads):
                for b in block_indices[t, h // group]:
                    if b >= 0:
                        lo = start + b * BLOCK
                        slc[h, t, lo : min(lo + BLOCK, t + 1)] = True
            swa[:, t, max(start, t - window + 1) : t + 1] = True
    out = gates[0][..., None] * dense(q, np.stack(k_cmp), np.stack(v_cmp), cmp)
    out = out + gates[1][..., None] * dense(q, k, v, slc)
    if window:
        out = out + gates[2][..., None] * dense(q, k, v, swa)
    return out


def brute_force_blocks(q, k, cu_seqlens, counts, scale):
    """The selection by its words: for each token and kv head, every block of its sequence scored
    by the compressed softmax summed over the group (forced blocks: g), best first, lower block
    first on ties, only visible or forced blocks."""
    s, heads, _ = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    chosen = np.full((s, kv_heads, counts), -1)
    for start, end in sequences(cu_seqlens, s):
        means = np.stack([k[b : min(b + BLOCK, end)].mean(0) for b in range(start, end, BLOCK)])
        for t in range(start, end):
            pos, current = t - start, (t - start) // BLOCK
            visible = [c for c in range(len(means)) if (c + 1) * BLOCK - 1 <= pos]
            for c_kv in range(kv_heads):
                score = {}
                for h in range(c_kv * group, (c_kv + 1) * group):
                    logits = np.array([scale * q[t, h] @ means[c, c_kv] for c in visible])
                    probs = np.exp(logits - np.logaddexp.reduce(logits)) if visible else []
                    for c, p in zip(visible, probs, strict=True):
                        score[c] = score.get(c, 0.0) + p
                for c in {0, current, current - 1} - {-1}:
                    score[c] = float(group)
                ranked = sorted(score, key=lambda c: (-score[c], c))[:counts]
                chosen[t, c_kv, : len(ranked)] = ranked
    return chosen


@pytest.mark.parametrize("window", [0, WINDOW])
@pytest.mark.parametrize("cu_seqlens", [None, PACKED])
@pytest.mark.parametrize("counts", [1, 4])
def test_forward_is_the_three_branches_by_their_definition(rng, window, cu_seqlens, counts):
    q, k, v, gates = inputs(rng)
    g_swa = gates[2] if window else None
    res = nsa_forward(
        q, k, v, gates[0], gates[1], g_swa, block_size=BLOCK, block_counts=counts,
        window_size=window, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    expected = brute_force_blocks(q, k, cu_seqlens, counts, D**-0.5)
    assert np.array_equal(res.block_indices, expected)
    out = reference(q, k, v, gates, res.block_indices, cu_seqlens, window)
    assert_close(res.out, out, name="out")


def test_given_blocks_and_per_token_counts(rng):
    """block_indices replace the selection (-1 attends nothing); block_counts per token and kv
    head cut each list, and a count of 0 leaves the selected branch dead (out 0)."""
    q, k, v, gates = inputs(rng)
    given = rng.integers(-1, 4, (S, H_KV, 2))
    res = nsa_forward(q, k, v, gates[0], gates[1], block_size=BLOCK, block_indices=given)
    assert np.array_equal(res.block_indices, given)
    assert_close(res.out, reference(q, k, v, gates, given, None, 0), name="out")
    counts = rng.integers(0, 4, (S, H_KV))
    res = nsa_forward(q, k, v, gates[0], gates[1], block_size=BLOCK, block_counts=counts)
    full = brute_force_blocks(q, k, None, 3, D**-0.5)
    assert np.array_equal(res.block_indices, np.where(np.arange(3) < counts[..., None], full, -1))


def _function(window, cu_seqlens):
    def forward(q, k, v, g_cmp, g_slc, *g_swa):
        res = nsa_forward(
            q, k, v, g_cmp, g_slc, *g_swa, block_size=BLOCK, block_counts=2,
            window_size=window, cu_seqlens=cu_seqlens,
        )  # fmt: skip
        return res.out, res.ctx

    return forward, lambda dout, ctx: nsa_backward(dout, ctx)


@pytest.mark.parametrize(("window", "cu_seqlens"), [(0, None), (WINDOW, PACKED)])
def test_gradcheck(rng, window, cu_seqlens):
    """Every input and every gate by central differences: GQA, short last blocks, packed (the
    forward's test covers each option alone; two runs keep the finite differences short)."""
    q, k, v, gates = inputs(rng)
    forward, backward = _function(window, cu_seqlens)
    args = [q, k, v, gates[0], gates[1]] + ([gates[2]] if window else [])
    assert_gradcheck(gradcheck(forward, *args, backward=backward))


def test_no_grad_keeps_no_ctx(rng):
    q, k, v, gates = inputs(rng)
    with no_grad():
        res = nsa_forward(q, k, v, gates[0], gates[1], block_size=BLOCK)
    assert res.ctx is None
    with pytest.raises(TypeError, match="nsa_backward needs the ctx"):
        nsa_backward(np.zeros((S, H, DV)), res.ctx)


BAD = {
    "kv of another token count": (
        dict(k=np.zeros((S + 1, H_KV, D)), v=np.zeros((S + 1, H_KV, DV))),
        ValueError,
        "self-att",
    ),
    "heads not a multiple": (dict(k=np.zeros((S, 3, D))), ValueError, "multiple of the kv heads"),
    "a gate's shape": (dict(g_slc=np.zeros((S, H_KV))), ValueError, r"g_slc must be \(S, H\)"),
    "an integer gate": (dict(g_cmp=np.zeros((S, H), int)), TypeError, "g_cmp must be a floating"),
    "g_swa without a window": (dict(g_swa=np.zeros((S, H))), ValueError, "g_swa must be given"),
    "a window without g_swa": (dict(window_size=2), ValueError, "g_swa must be given"),
    "block_size 0": (dict(block_size=0), ValueError, "block_size must be a positive int"),
    "a float block_counts": (dict(block_counts=2.0), TypeError, "block_counts must be an int"),
    "block_counts' shape": (dict(block_counts=np.ones(S, int)), ValueError, "block_counts must"),
    "float block_indices": (dict(block_indices=np.zeros((S, H_KV, 1))), TypeError, "integer"),
    "block_indices' shape": (dict(block_indices=np.zeros((S, H, 1), int)), ValueError, "H_kv"),
    "cu_seqlens' end": (dict(cu_seqlens=np.array([0, 5])), ValueError, "end at the packed"),
    "float16 gates": (dict(g_slc=np.zeros((S, H), np.float16)), TypeError, "one dtype"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_refusals(rng, case):
    q, k, v, gates = inputs(rng)
    args = dict(q=q, k=k, v=v, g_cmp=gates[0], g_slc=gates[1], g_swa=None, block_size=BLOCK)
    change, error, words = BAD[case]
    with pytest.raises(error, match=words):
        nsa_forward(**(args | change))
