"""numpy_attention.sparse: attention by indices, forward against the core attention over each
query's gathered rows, backward by finite differences in float64, and the contract's edge rules
(every kind of sentinel, repeats within and across queries, topk_length, dead rows, sinks, MLA's
shared latent, blocks of queries). Against torch autograd: tests/torch_attention/test_sparse.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import sparse
from numpy_attention.functional import attention_forward
from numpy_attention.grad_mode import no_grad
from numpy_attention.gradcheck import gradcheck
from numpy_attention.sparse import sparse_attention_backward, sparse_attention_forward

from ..conftest import assert_close, assert_gradcheck

S_Q, S_KV, H, H_KV, D, DV, TOPK = 7, 11, 4, 2, 6, 5, 9
SENTINELS = (-1, -7, S_KV, S_KV + 3, 2**31 - 1)


def overlapping_indices(rng, s_q=S_Q, s_kv=S_KV, kv_heads=H_KV, topk=TOPK, sentinels=True):
    """Indices as DSA's indexer makes them: neighbouring queries share most keys (a sliding set
    with a few swaps), a repeat within some rows, and every kind of sentinel sprinkled in."""
    base = np.arange(topk)
    idx = np.empty((s_q, kv_heads, topk), np.int64)
    for t in range(s_q):
        for h in range(kv_heads):
            row = (base + t // 2 + h) % s_kv
            row[rng.integers(topk)] = rng.integers(s_kv)  # a swap, sometimes a repeat
            idx[t, h] = row
    if sentinels:
        for value in SENTINELS:
            idx[rng.integers(s_q), rng.integers(kv_heads), rng.integers(topk)] = value
    idx[1, 0, :3] = idx[1, 0, 3]  # a repeat within a row, for certain
    return idx


def inputs(rng, v_none=False, dtype=np.float64):
    q = rng.standard_normal((S_Q, H, D)).astype(dtype)
    k = rng.standard_normal((S_KV, H_KV, D)).astype(dtype)
    v = None if v_none else rng.standard_normal((S_KV, H_KV, DV)).astype(dtype)
    return q, k, v


def reference(q, k, v, idx, *, sinks=None, topk_length=None, d_v=None, scale=None):
    """Per query token and head: the core's attention over exactly the rows its list reads."""
    s_q, heads, _ = q.shape
    s_kv, kv_heads, _ = k.shape
    group = heads // kv_heads
    values = k[..., :d_v] if v is None else v
    out = np.zeros((s_q, heads, values.shape[-1]))
    lse = np.zeros((s_q, heads))
    for t in range(s_q):
        for h in range(heads):
            row = idx[t, h // group]
            if topk_length is not None:
                row = row[: topk_length[t]]
            row = row[(row >= 0) & (row < s_kv)]
            res = attention_forward(
                q[t, h][None, None], k[row, h // group][None], values[row, h // group][None],
                scale=scale, sinks=None if sinks is None else sinks[h : h + 1], return_lse=True,
            )  # fmt: skip
            out[t, h], lse[t, h] = res.out[0, 0], res.lse[0, 0]
    return out, lse


@pytest.mark.parametrize("v_none", [False, True])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("with_length", [False, True])
def test_forward_is_the_core_attention_over_each_querys_rows(rng, v_none, with_sinks, with_length):
    q, k, v = inputs(rng, v_none)
    idx = overlapping_indices(rng)
    sinks = rng.standard_normal(H) if with_sinks else None
    length = rng.integers(0, TOPK + 1, S_Q) if with_length else None
    d_v = 4 if v_none else None
    res = sparse_attention_forward(
        q, k, v, idx, sinks=sinks, topk_length=length, d_v=d_v, return_lse=True
    )
    out, lse = reference(q, k, v, idx, sinks=sinks, topk_length=length, d_v=d_v)
    assert_close(res.out, out, name="out")
    assert np.array_equal(np.isneginf(res.lse), np.isneginf(lse))
    finite = np.isfinite(lse)
    assert_close(res.lse[finite], lse[finite], name="lse")


def test_unique_valid_indices_equal_dense_attention_under_their_mask(rng):
    """With every key named once per row, sparse attention is dense attention whose mask shows
    exactly the named keys (GQA's kv head per query head)."""
    q, k, v = inputs(rng)
    idx = np.stack([[rng.permutation(S_KV)[:TOPK] for _ in range(H_KV)] for _ in range(S_Q)])
    res = sparse_attention_forward(q, k, v, idx, softmax_scale=0.3, return_lse=True)
    group = H // H_KV
    shown = np.zeros((H, S_Q, S_KV), bool)
    for t in range(S_Q):
        for h in range(H):
            shown[h, t, idx[t, h // group]] = True
    dense = attention_forward(
        q.swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1), attn_mask=shown, scale=0.3,
        enable_gqa=True, return_lse=True,
    )  # fmt: skip
    assert_close(res.out, dense.out.swapaxes(0, 1), name="out")
    assert_close(res.lse, dense.lse.swapaxes(0, 1), name="lse")


def _function(v_none, sinks_on, length, d_v=None):
    def forward(q, k, *rest):
        rest = list(rest)
        v = None if v_none else rest.pop(0)
        sinks = rest.pop(0) if sinks_on else None
        res = sparse_attention_forward(
            q, k, v, forward.idx, sinks=sinks, topk_length=length, d_v=d_v
        )
        return res.out, res.ctx

    def backward(dout, ctx):
        grads = sparse_attention_backward(dout, ctx)
        return grads.dq, grads.dk, grads.dv, grads.dsinks

    return forward, backward


@pytest.fixture(params=["by pattern", "dense"])
def scatter_path(request, monkeypatch):
    """The backward's scatter-add both ways: chunks of ``_SCATTER_TOKENS`` tokens grouped by
    which tokens name a row, or one product over a whole block (the way small problems go)."""
    monkeypatch.setattr(sparse, "_SCATTER_WORK", 1 if request.param == "by pattern" else 1 << 40)
    return request.param


@pytest.mark.parametrize("v_none", [False, True])
@pytest.mark.parametrize("sinks_on", [False, True])
def test_gradcheck(rng, v_none, sinks_on, scatter_path):
    """Every gradient by central differences: repeats across queries (overlapping lists) and
    within a row, sentinels, topk_length, GQA, sinks, the shared latent."""
    q, k, v = inputs(rng, v_none)
    length = rng.integers(1, TOPK + 1, S_Q)
    length[2] = 0  # a row that reads nothing
    forward, backward = _function(v_none, sinks_on, length, d_v=4 if v_none else None)
    forward.idx = overlapping_indices(rng)
    args = [q, k] + ([] if v_none else [v]) + ([rng.standard_normal(H)] if sinks_on else [])
    assert_gradcheck(gradcheck(forward, *args, backward=backward))


def test_gradcheck_of_lse(rng):
    """dlse's path (with sinks): L = sum(lse * G) over the rows that see something."""
    q, k, v = inputs(rng)
    idx = overlapping_indices(rng)

    def forward(q, k, v, sinks):
        res = sparse_attention_forward(q, k, v, idx, sinks=sinks, return_lse=True)
        return res.lse, res.ctx

    def backward(dlse, ctx):
        grads = sparse_attention_backward(np.zeros((S_Q, H, DV)), ctx, dlse)
        return grads.dq, grads.dk, grads.dv, grads.dsinks

    assert_gradcheck(gradcheck(forward, q, k, v, rng.standard_normal(H), backward=backward))


@pytest.mark.parametrize("sentinel", SENTINELS)
def test_a_sentinel_reads_and_writes_nothing(rng, sentinel):
    """No key row is reached through an invalid entry: -1 is not Python's last row, S_kv is not
    clamped to it; the rows no valid entry names get exactly zero gradient, and changing them
    changes nothing."""
    q, k, v = inputs(rng)
    idx = np.full((S_Q, H_KV, TOPK), sentinel)
    idx[:, :, :4] = rng.integers(0, S_KV - 2, (S_Q, H_KV, 4))  # the last two rows never named
    res = sparse_attention_forward(q, k, v, idx)
    grads = sparse_attention_backward(rng.standard_normal((S_Q, H, DV)), res.ctx)
    assert np.all(grads.dk[-2:] == 0) and np.all(grads.dv[-2:] == 0)
    k2, v2 = k.copy(), v.copy()
    k2[-2:], v2[-2:] = 1e3, -1e3
    assert np.array_equal(sparse_attention_forward(q, k2, v2, idx).out, res.out)


def test_repeats_add_their_gradients(rng):
    """One query naming one key twice gives it twice the weight (a gather), and two queries
    naming the same key add their gradients: against an explicit sum over entries."""
    q, k, v = inputs(rng)
    idx = np.zeros((S_Q, H_KV, 2), np.int64)  # every query names row 0 twice: one key, w = 1
    res = sparse_attention_forward(q, k, v, idx)
    assert_close(res.out, np.repeat(v[0][None], S_Q, 0).repeat(H // H_KV, 1), name="out")
    dout = rng.standard_normal((S_Q, H, DV))
    grads = sparse_attention_backward(dout, res.ctx)
    group = H // H_KV
    expected = np.stack([dout[:, g * group : (g + 1) * group].sum((0, 1)) for g in range(H_KV)])
    assert_close(grads.dv[0], expected, name="dv")  # both entries of every query, added
    assert np.all(grads.dv[1:] == 0)


def naive_scatter(s_kv, rows, valid, weights, vectors, factor):
    """(S_kv, W) float64, one entry at a time: row rows[t, j] += factor * sum_g weights[t, g, j]
    vectors[t, g] for every valid entry (t, j)."""
    t_idx, j_idx = np.nonzero(valid)
    per_entry = np.einsum("eg,egw->ew", weights[t_idx, :, j_idx], vectors[t_idx])
    target = np.zeros((s_kv, vectors.shape[-1]))
    np.add.at(target, rows[t_idx, j_idx], factor * per_entry)
    return target


def test_the_scatter_adds_every_entry_whatever_the_tokens_naming_its_row(rng, scatter_path):
    """Five tokens, chunks of three and two by pattern: in the first chunk every non-empty set of
    its tokens names some row (rows named by one token, by two, by all three), with repeats
    within a token, every kind of sentinel and a topk_length that cuts a list; the sums go into a
    view (as dk's first d_v columns) and equal a per-entry np.add.at, the rest of the array
    untouched."""
    s_kv, group, width = 14, 2, 5
    indices = np.array(
        [
            [0, 1, 2, 2, 9, -1, 4, 12],  # 0 alone; 0 with 1; all three, 2 named twice here
            [1, 2, 3, 3, 3, s_kv, 4, 10],  # 3 by token 1 alone, three times; 10 with token 2
            [2, 5, 6, 2**31 - 1, 4, 7, 10, 12],  # 5, 6, 7 by token 2 alone; 12 with token 0
            [4, 8, 13, 0, -1, 8, 1, 11],
            [4, 8, 5, 2**31 - 1, 6, 6, 3, 9],
        ]
    )[:, None]  # (S_q, 1, topk)
    length = np.array([8, 8, 8, 6, 8])  # token 3 does not read 1 and 11
    valid = sparse.valid_entries(indices, s_kv, length)[:, 0]
    rows = np.where(valid, indices[:, 0], 0)
    first_chunk = [set(rows[t][valid[t]].tolist()) for t in range(3)]
    patterns = {frozenset(t for t in range(3) if r in first_chunk[t]) for r in range(s_kv)}
    assert len(patterns - {frozenset()}) == 7  # the coverage this test claims
    weights = rng.standard_normal((5, group, 8))
    vectors = rng.standard_normal((5, group, width))
    latent = rng.standard_normal((s_kv, 2, width + 3))
    before = latent.copy()

    sparse._scatter_products(latent[:, 1, :width], rows, valid, weights, vectors, 0.7)

    expected = naive_scatter(s_kv, rows, valid, weights, vectors, 0.7)
    np.testing.assert_allclose(
        latent[:, 1, :width] - before[:, 1, :width], expected, rtol=1e-12, atol=1e-12
    )
    assert np.array_equal(latent[:, 0], before[:, 0])
    assert np.array_equal(latent[:, 1, width:], before[:, 1, width:])
    unnamed = [r for r in range(s_kv) if not valid[rows == r].any()]
    assert unnamed == [11] and np.array_equal(latent[11], before[11])  # named past the length


def test_the_scatters_two_ways_agree_in_a_backward(rng, monkeypatch):
    """The whole MLA backward (dk carries the values' gradient in its first columns) with the
    scatter by pattern and with one product per block: equal up to summation order."""
    q, k, _ = inputs(rng, v_none=True)
    idx = overlapping_indices(rng)
    length = rng.integers(0, TOPK + 1, S_Q)
    dout = rng.standard_normal((S_Q, H, 4))
    grads = {}
    for path, work in (("by pattern", 1), ("dense", 1 << 40)):
        monkeypatch.setattr(sparse, "_SCATTER_WORK", work)
        res = sparse_attention_forward(q, k, None, idx, topk_length=length, d_v=4)
        grads[path] = sparse_attention_backward(dout, res.ctx)
    for name, a, b in zip("dq dk".split(), grads["by pattern"], grads["dense"], strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.max(np.abs(b)), err_msg=name)


def test_dead_rows_and_the_sink(rng):
    q, k, v = inputs(rng)
    idx = overlapping_indices(rng, sentinels=False)
    idx[3] = -1  # token 3 names no key
    length = np.full(S_Q, TOPK)
    length[5] = 0  # token 5 reads none of its entries
    res = sparse_attention_forward(q, k, v, idx, topk_length=length, return_lse=True)
    for t in (3, 5):
        assert np.all(res.out[t] == 0) and np.all(np.isneginf(res.lse[t]))
    sinks = rng.standard_normal(H)
    res = sparse_attention_forward(q, k, v, idx, sinks=sinks, topk_length=length, return_lse=True)
    for t in (3, 5):
        assert np.all(res.out[t] == 0)
        assert_close(res.lse[t], sinks, name="lse of a dead row")
    dlse = np.zeros((S_Q, H))
    dlse[3] = 1.0
    grads = sparse_attention_backward(np.zeros((S_Q, H, DV)), res.ctx, dlse)
    assert_close(grads.dsinks, np.ones(H), name="dsinks = the dead row's dlse")
    assert np.all(grads.dq[3] == 0)


def test_the_shared_latent_is_key_and_value(rng):
    """v None, d_v: the same as v = k[..., :d_v] given, with dk carrying both gradients."""
    q, k, _ = inputs(rng, v_none=True)
    idx = overlapping_indices(rng)
    latent = sparse_attention_forward(q, k, None, idx, d_v=4)
    split = sparse_attention_forward(q, k, k[..., :4].copy(), idx)
    assert_close(latent.out, split.out, name="out")
    dout = rng.standard_normal((S_Q, H, 4))
    a = sparse_attention_backward(dout, latent.ctx)
    b = sparse_attention_backward(dout, split.ctx)
    assert a.dv is None
    expected = b.dk.copy()
    expected[..., :4] += b.dv
    assert_close(a.dk, expected, name="dk")


def test_blocks_of_queries_change_nothing(rng, monkeypatch):
    q, k, v = inputs(rng)
    idx = overlapping_indices(rng)
    sinks = rng.standard_normal(H)
    whole = sparse_attention_forward(q, k, v, idx, sinks=sinks, return_lse=True)
    dout = rng.standard_normal((S_Q, H, DV))
    grads = sparse_attention_backward(dout, whole.ctx)
    monkeypatch.setattr(sparse, "_BLOCK_ENTRIES", 1)  # one query token per block
    assert len(sparse._blocks(whole.ctx)) == S_Q
    blocked = sparse_attention_forward(q, k, v, idx, sinks=sinks, return_lse=True)
    assert_close(blocked.out, whole.out, name="out")
    for name, a, b in zip(
        "dq dk dv dsinks".split(), sparse_attention_backward(dout, blocked.ctx), grads, strict=True
    ):
        assert_close(a, b, name=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_keeps_the_dtype_and_computes_wider(rng, dtype):
    q, k, v = inputs(rng, dtype=dtype)
    idx = overlapping_indices(rng)
    res = sparse_attention_forward(q, k, v, idx, return_lse=True)
    assert res.out.dtype == dtype
    assert res.lse.dtype == (np.float32 if dtype == np.float16 else dtype)
    out, _ = reference(*(t.astype(np.float64) for t in (q, k, v)), idx)
    assert np.max(np.abs(res.out - out)) < 10 * np.finfo(dtype).eps * np.max(np.abs(out))
    grads = sparse_attention_backward(np.ones((S_Q, H, DV), dtype), res.ctx)
    assert all(g.dtype == dtype for g in grads[:3])


def test_no_grad_keeps_no_ctx(rng):
    q, k, v = inputs(rng)
    with no_grad():
        res = sparse_attention_forward(q, k, v, overlapping_indices(rng))
    assert res.ctx is None
    with pytest.raises(TypeError, match="outside no_grad"):
        sparse_attention_backward(np.zeros((S_Q, H, DV)), res.ctx)


def test_bad_input(rng):
    q, k, v = inputs(rng)
    idx = overlapping_indices(rng, sentinels=False)
    cases = [
        (TypeError, "indices must be an integer array", dict(indices=idx.astype(float))),
        (TypeError, "indices must be an integer array", dict(indices=idx > 0)),
        (ValueError, r"indices must be \(S_q, H_kv, topk\)", dict(indices=idx[:, 0])),
        (
            ValueError,
            r"topk_length must lie in \[0, topk",
            dict(topk_length=np.full(S_Q, TOPK + 1)),
        ),
        (ValueError, r"topk_length must lie in \[0, topk", dict(topk_length=np.full(S_Q, -1))),
        (ValueError, r"topk_length must be \(S_q,\)", dict(topk_length=np.zeros(S_Q + 1, int))),
        (ValueError, "d_v must be at most the key width", dict(v=None, d_v=D + 1)),
        (ValueError, "give d_v", dict(v=None)),
        (ValueError, "v was given", dict(d_v=3)),
        (ValueError, "must be a multiple of the kv heads", dict(q=q[:, :3])),
        (ValueError, "token-major", dict(q=q[None])),
        (ValueError, "share the head width", dict(k=k[..., :4], v=v)),
        (ValueError, r"sinks must be \(H,\)", dict(sinks=np.zeros(H + 1))),
    ]
    for error, match, change in cases:
        args = dict(q=q, k=k, v=v, indices=idx) | change
        positional = [args.pop(name) for name in ("q", "k", "v", "indices")]
        with pytest.raises(error, match=match):
            sparse_attention_forward(*positional, **args)
