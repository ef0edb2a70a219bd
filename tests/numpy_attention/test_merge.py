"""Merging partial attentions (numpy_attention.merge): attention over concatenated keys is the
merge of the attentions over the parts, forward and backward; sinks are a merge; finite
differences; torch autograd on the merge formula; bad input.

The oracle is the dense attention over all keys (``attention_forward(..., impl="dense")``), itself
checked against torch autograd and finite differences in test_functional.py. The backward of a
merge is checked by chaining it into each part's ``attention_backward(dout, ctx, dlse)``: q feeds
every part, so its gradients add; each part owns its keys, so dk and dv concatenate.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import no_grad, tiled
from numpy_attention.functional import attention_backward, attention_forward
from numpy_attention.gradcheck import gradcheck
from numpy_attention.merge import MergeCtx, merge_attention_backward, merge_attention_forward

from ..conftest import assert_close, assert_gradcheck, to_torch

LEAD, N, M, D, DV = (2, 3), 5, 7, 4, 6
# Where the keys are cut into part A = keys [0, split) and part B = keys [split, M): an empty
# part on either side, a single key, and an odd cut.
SPLITS = {"0+7": 0, "1+6": 1, "3+4": 3, "7+0": 7}
# "dead-rows": row 0 sees nothing at all, row 1 nothing in part A, row 2 nothing in part B.
MASKS = ["none", "causal", "dead-rows"]


def make_qkv(rng, dtype=np.float64):
    q = rng.standard_normal((*LEAD, N, D)).astype(dtype)
    k = rng.standard_normal((*LEAD, M, D)).astype(dtype)
    v = rng.standard_normal((*LEAD, M, DV)).astype(dtype)
    return q, k, v


def make_allowed(rng, kind, split):
    """A bool (N, M) "may attend" mask, or None; its columns are cut with the keys."""
    if kind == "none":
        return None
    if kind == "causal":
        return np.tri(N, M, dtype=bool)
    allowed = rng.random((N, M)) > 0.3
    allowed[0] = False
    allowed[1, :split] = False
    allowed[1, split:] = True
    allowed[2, split:] = False
    allowed[2, :split] = True
    return allowed


def attend(q, k, v, allowed, cols, impl, **options):
    """Attention of every query over the keys ``cols``, with lse: the dense path, or the tiled
    path in small blocks so that the parts are cut into several tiles."""
    attn_mask = None if allowed is None else allowed[:, cols]
    k, v = k[..., cols, :], v[..., cols, :]
    if impl == "tiled":
        return tiled.tiled_attention_forward(
            q, k, v, block_q=2, block_k=3, attn_mask=attn_mask, return_lse=True, **options
        )
    return attention_forward(q, k, v, attn_mask=attn_mask, impl="dense", return_lse=True, **options)


def assert_lse_close(actual, expected, *, dtype=None, name="lse"):
    """Dead rows (-inf) in the same places, the finite entries within the dtype's tolerance."""
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected), err_msg=name)
    finite = np.isfinite(expected)
    assert_close(actual[finite], expected[finite], dtype=dtype, name=name)


def chain_backward(dout, dlse, merged, parts):
    """Gradients of q, k, v through a merge of two attentions: merge backward, then each part's
    attention backward with the lse gradient the merge hands it."""
    dout_a, dlse_a, dout_b, dlse_b = merge_attention_backward(dout, dlse, merged.ctx)
    grads_a = attention_backward(dout_a, parts[0].ctx, dlse_a)
    grads_b = attention_backward(dout_b, parts[1].ctx, dlse_b)
    return {
        "dq": grads_a.dq + grads_b.dq,  # q feeds both parts: its gradients add
        "dk": np.concatenate([grads_a.dk, grads_b.dk], axis=-2),
        "dv": np.concatenate([grads_a.dv, grads_b.dv], axis=-2),
    }


# -- attention over concatenated keys is the merge of the parts --------------------------------


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("softcap", [0.0, 1.5])
@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_merge_of_parts_equals_attention_over_all_keys(rng, split, mask, softcap, impl):
    q, k, v = make_qkv(rng)
    cut = SPLITS[split]
    allowed = make_allowed(rng, mask, cut)

    whole = attend(q, k, v, allowed, slice(None), "dense", softcap=softcap)
    part_a = attend(q, k, v, allowed, slice(0, cut), impl, softcap=softcap)
    part_b = attend(q, k, v, allowed, slice(cut, None), impl, softcap=softcap)
    merged = merge_attention_forward(part_a.out, part_a.lse, part_b.out, part_b.lse)

    assert_close(merged.out, whole.out, name="out")
    assert_lse_close(merged.lse, whole.lse)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("softcap", [0.0, 1.5])
@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_merge_backward_equals_attention_backward_over_all_keys(rng, split, mask, softcap, impl):
    q, k, v = make_qkv(rng)
    cut = SPLITS[split]
    allowed = make_allowed(rng, mask, cut)
    whole = attend(q, k, v, allowed, slice(None), "dense", softcap=softcap)
    parts = (
        attend(q, k, v, allowed, slice(0, cut), impl, softcap=softcap),
        attend(q, k, v, allowed, slice(cut, None), impl, softcap=softcap),
    )
    merged = merge_attention_forward(parts[0].out, parts[0].lse, parts[1].out, parts[1].lse)
    dout = rng.standard_normal(whole.out.shape)
    dlse = rng.standard_normal(whole.lse.shape)

    grads = chain_backward(dout, dlse, merged, parts)
    expected = attention_backward(dout, whole.ctx, dlse)

    for name, grad in grads.items():
        assert_close(grad, getattr(expected, name), name=name)


NESTINGS = ["(ab)c", "a(bc)"]
CUTS = (0, 2, 4, M)  # three parts: keys [0, 2), [2, 4), [4, 7)


def three_parts(rng, q, k, v):
    """The dense attention over all keys and over each of three parts, under a mask where row 0
    sees nothing, row 1 only part c and row 2 only part a (dead rows inside the merges)."""
    allowed = rng.random((N, M)) > 0.3
    allowed[0] = False
    allowed[1] = np.arange(M) >= CUTS[2]
    allowed[2] = np.arange(M) < CUTS[1]
    whole = attend(q, k, v, allowed, slice(None), "dense")
    parts = [
        attend(q, k, v, allowed, slice(lo, hi), "dense")
        for lo, hi in zip(CUTS[:-1], CUTS[1:], strict=True)
    ]
    return whole, parts


def nested_merge(nesting, parts):
    """Merge three parts in the given order; returns the outer merge and the inner one."""
    a, b, c = parts
    if nesting == "(ab)c":
        inner = merge_attention_forward(a.out, a.lse, b.out, b.lse)
        return merge_attention_forward(inner.out, inner.lse, c.out, c.lse), inner
    inner = merge_attention_forward(b.out, b.lse, c.out, c.lse)
    return merge_attention_forward(a.out, a.lse, inner.out, inner.lse), inner


@pytest.mark.parametrize("nesting", NESTINGS)
def test_nested_merges_equal_attention_over_all_keys(rng, nesting):
    q, k, v = make_qkv(rng)
    whole, parts = three_parts(rng, q, k, v)

    merged, _ = nested_merge(nesting, parts)

    assert_close(merged.out, whole.out, name="out")
    assert_lse_close(merged.lse, whole.lse)


@pytest.mark.parametrize("nesting", NESTINGS)
def test_nested_merge_backward_equals_attention_backward(rng, nesting):
    q, k, v = make_qkv(rng)
    whole, parts = three_parts(rng, q, k, v)
    merged, inner = nested_merge(nesting, parts)
    dout = rng.standard_normal(whole.out.shape)
    dlse = rng.standard_normal(whole.lse.shape)

    # The outer merge hands the inner one a gradient of its lse: nesting needs dlse.
    douter_a, dlse_outer_a, douter_b, dlse_outer_b = merge_attention_backward(
        dout, dlse, merged.ctx
    )
    if nesting == "(ab)c":
        dinner = merge_attention_backward(douter_a, dlse_outer_a, inner.ctx)
        upstream = [(dinner[0], dinner[1]), (dinner[2], dinner[3]), (douter_b, dlse_outer_b)]
    else:
        dinner = merge_attention_backward(douter_b, dlse_outer_b, inner.ctx)
        upstream = [(douter_a, dlse_outer_a), (dinner[0], dinner[1]), (dinner[2], dinner[3])]
    grads = [
        attention_backward(dpart, part.ctx, dlse_part)
        for part, (dpart, dlse_part) in zip(parts, upstream, strict=True)
    ]
    expected = attention_backward(dout, whole.ctx, dlse)

    assert_close(sum(g.dq for g in grads), expected.dq, name="dq")
    assert_close(np.concatenate([g.dk for g in grads], axis=-2), expected.dk, name="dk")
    assert_close(np.concatenate([g.dv for g in grads], axis=-2), expected.dv, name="dv")


def test_two_dead_parts_merge_into_a_dead_row(rng):
    out_a, out_b = np.zeros((2, 3, DV)), np.zeros((2, 3, DV))
    lse_a = np.array([[-np.inf, 0.5, -np.inf], [1.0, -np.inf, -np.inf]])
    lse_b = np.array([[-np.inf, -np.inf, 2.0], [-np.inf, 0.0, -np.inf]])
    out_a[0, 1], out_a[1, 0] = 1.0, 2.0
    out_b[0, 2], out_b[1, 1] = 3.0, 4.0

    out, lse, ctx = merge_attention_forward(out_a, lse_a, out_b, lse_b)
    grads = merge_attention_backward(np.ones_like(out), np.ones_like(lse), ctx)

    dead = np.array([[True, False, False], [False, False, True]])
    np.testing.assert_array_equal(np.isneginf(lse), dead)
    assert np.all(out[dead] == 0) and np.all(np.isfinite(out))
    for name, grad in zip(grads._fields, grads, strict=True):
        assert np.all(np.isfinite(grad)), name
        assert np.all(grad[dead] == 0), name
    # A row where one part is dead is the other part, exactly.
    np.testing.assert_array_equal(out[0, 1], out_a[0, 1])
    np.testing.assert_array_equal(out[1, 1], out_b[1, 1])


# -- sinks are a merge with an empty-value state ------------------------------------------------


@pytest.mark.parametrize("mask", ["none", "dead-rows"])
@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_sinks_are_a_merge_with_a_state_of_no_value(rng, mask, impl):
    q, k, v = make_qkv(rng)
    sinks = rng.standard_normal(LEAD[-1])
    allowed = make_allowed(rng, mask, 3)
    with_sinks = attend(q, k, v, allowed, slice(None), "dense", sinks=sinks)
    plain = attend(q, k, v, allowed, slice(None), impl)
    sink_lse = np.broadcast_to(sinks[:, None], plain.lse.shape)  # (B, H, N): the sink logit
    sink_state = merge_attention_forward(plain.out, plain.lse, np.zeros_like(plain.out), sink_lse)
    dout = rng.standard_normal(plain.out.shape)
    dlse = rng.standard_normal(plain.lse.shape)

    dout_a, dlse_a, _, dlse_sink = merge_attention_backward(dout, dlse, sink_state.ctx)
    grads = attention_backward(dout_a, plain.ctx, dlse_a)
    expected = attention_backward(dout, with_sinks.ctx, dlse)

    assert_close(sink_state.out, with_sinks.out, name="out")
    assert_lse_close(sink_state.lse, with_sinks.lse)
    for name in ("dq", "dk", "dv"):
        assert_close(getattr(grads, name), getattr(expected, name), name=name)
    # The sink is one logit per head, broadcast over batch and rows: its gradients sum there.
    assert_close(dlse_sink.sum(axis=(0, 2)), expected.dsinks, name="dsinks")


# -- the merge alone: finite differences, torch autograd, dtypes --------------------------------


def merge_inputs(rng, dtype=np.float64):
    """Two parts with one dead row each (lse -inf, out 0) and one row where the parts' lse are
    60 apart (one weight ~1e-26)."""
    out_a, out_b = rng.standard_normal((2, *LEAD, N, DV)).astype(dtype)
    lse_a, lse_b = rng.standard_normal((2, *LEAD, N))
    lse_a[0, 0, 1], lse_b[1, 2, 3] = -np.inf, -np.inf
    out_a[0, 0, 1], out_b[1, 2, 3] = 0.0, 0.0
    lse_a[1, 1, 4], lse_b[1, 1, 4] = 30.0, -30.0
    lse_dtype = np.result_type(np.float32, dtype)  # attention's lse: float32 for float16 inputs
    return out_a, lse_a.astype(lse_dtype), out_b, lse_b.astype(lse_dtype)


def merged_rows(out_a, lse_a, out_b, lse_b):
    """The merge with lse appended to each row of out, so one upstream gradient covers both."""
    out, lse, ctx = merge_attention_forward(out_a, lse_a, out_b, lse_b)
    return np.concatenate([out, lse[..., None]], axis=-1), ctx


def merged_rows_backward(dresult, ctx):
    return merge_attention_backward(dresult[..., :-1], dresult[..., -1], ctx)


def test_merge_gradcheck(rng):
    report = gradcheck(merged_rows, *merge_inputs(rng), backward=merged_rows_backward)

    assert_gradcheck(report)


def torch_merge(out_a, lse_a, out_b, lse_b):
    """The oracle: the merge formula in torch ops, differentiated by autograd."""
    lse = torch.logaddexp(lse_a, lse_b)
    weight_a = torch.exp(lse_a - lse)[..., None]
    weight_b = torch.exp(lse_b - lse)[..., None]
    return weight_a * out_a + weight_b * out_b, lse


@pytest.mark.parametrize("with_dlse", [False, True])
def test_merge_matches_torch_autograd_float64(rng, with_dlse):
    inputs = merge_inputs(rng)
    out, lse, ctx = merge_attention_forward(*inputs)
    dout = rng.standard_normal(out.shape)
    dlse = rng.standard_normal(lse.shape) if with_dlse else None

    grads = merge_attention_backward(dout, dlse, ctx)
    tensors = [to_torch(t, requires_grad=True) for t in inputs]
    out_t, lse_t = torch_merge(*tensors)
    loss = (out_t * to_torch(dout)).sum()
    if with_dlse:
        loss = loss + (lse_t * to_torch(dlse)).sum()
    loss.backward()

    assert_close(out, out_t, name="out")
    assert_close(lse, lse_t, name="lse")
    for name, grad, tensor in zip(grads._fields, grads, tensors, strict=True):
        assert_close(grad, tensor.grad, name=name)


def test_merge_in_float32_stays_float32_and_matches_float64(rng):
    q, k, v = make_qkv(rng, np.float32)
    whole = attend(*(t.astype(np.float64) for t in (q, k, v)), None, slice(None), "dense")
    parts = [attend(q, k, v, None, cols, "dense") for cols in (slice(0, 3), slice(3, None))]
    merged = merge_attention_forward(parts[0].out, parts[0].lse, parts[1].out, parts[1].lse)
    dout = rng.standard_normal(whole.out.shape).astype(np.float32)
    dlse = rng.standard_normal(whole.lse.shape).astype(np.float32)

    grads = chain_backward(dout, dlse, merged, parts)
    expected = attention_backward(dout.astype(np.float64), whole.ctx, dlse.astype(np.float64))

    assert merged.out.dtype == np.float32 and merged.lse.dtype == np.float32
    assert all(grad.dtype == np.float32 for grad in grads.values())
    assert_close(merged.out, whole.out, dtype=np.float32, name="out")
    assert_lse_close(merged.lse, whole.lse, dtype=np.float32)
    for name, grad in grads.items():
        assert_close(grad, getattr(expected, name), dtype=np.float32, name=name)


def test_merge_in_float16_is_computed_in_float32_and_rounded_once(rng):
    inputs = merge_inputs(rng, np.float16)  # float16 outputs, float32 lse: as attention gives
    golden = merge_attention_forward(*(t.astype(np.float64) for t in inputs))
    dout = rng.standard_normal(golden.out.shape).astype(np.float16)
    dlse = rng.standard_normal(golden.lse.shape).astype(np.float32)
    expected = merge_attention_backward(
        dout.astype(np.float64), dlse.astype(np.float64), golden.ctx
    )

    out, lse, ctx = merge_attention_forward(*inputs)
    grads = merge_attention_backward(dout, dlse, ctx)

    assert out.dtype == np.float16 and lse.dtype == np.float32
    assert [g.dtype for g in grads] == [np.float16, np.float32, np.float16, np.float32]
    assert_close(out, golden.out, dtype=np.float16, name="out")
    assert_lse_close(lse, golden.lse, dtype=np.float32)
    for name, grad, want in zip(grads._fields, grads, expected, strict=True):
        assert_close(grad, want, dtype=grad.dtype, name=name)


def test_no_grad_keeps_no_ctx(rng):
    inputs = merge_inputs(rng)

    with no_grad():
        result = merge_attention_forward(*inputs)

    assert result.ctx is None
    np.testing.assert_array_equal(result.out, merge_attention_forward(*inputs).out)


# -- bad input -----------------------------------------------------------------------------------


_OUT, _LSE = np.zeros((2, 3, 4)), np.zeros((2, 3))
BAD_FORWARD = {
    "out-shapes-differ": ((_OUT, _LSE, np.zeros((2, 4, 4)), _LSE), ValueError, "out_a and out_b"),
    "lse_a-shape": ((_OUT, np.zeros((3, 2)), _OUT, _LSE), ValueError, "lse_a"),
    "lse_b-shape": ((_OUT, _LSE, _OUT, np.zeros((2, 3, 1))), ValueError, "lse_b"),
    "scalar-outputs": ((np.zeros(()),) * 4, ValueError, "out_a and out_b"),
    "integer-out": ((_OUT.astype(int), _LSE, _OUT.astype(int), _LSE), TypeError, "out_a must"),
    "integer-lse": ((_OUT, _LSE.astype(int), _OUT, _LSE.astype(int)), TypeError, "lse_a must"),
    "out-dtypes-differ": ((_OUT, _LSE, _OUT.astype(np.float32), _LSE), TypeError, "out_b float32"),
    "lse-dtypes-differ": ((_OUT, _LSE.astype(np.float32), _OUT, _LSE), TypeError, "lse_a float32"),
}


@pytest.mark.parametrize("case", BAD_FORWARD)
def test_forward_rejects_bad_input_naming_the_argument(case):
    inputs, error, match = BAD_FORWARD[case]

    with pytest.raises(error, match=match):
        merge_attention_forward(*inputs)


@pytest.mark.parametrize(
    ("dout_shape", "dlse_shape", "error", "match"),
    [
        ((2, 3, 5), (2, 3), ValueError, "dout"),
        ((2, 3, 4), (3, 2), ValueError, "dlse"),
        ((2, 3, 4), (2, 3, 4), ValueError, "dlse"),
    ],
)
def test_backward_rejects_bad_gradients_naming_them(dout_shape, dlse_shape, error, match):
    zeros = np.zeros((2, 3))
    ctx = merge_attention_forward(np.ones((2, 3, 4)), zeros, np.ones((2, 3, 4)), zeros).ctx

    with pytest.raises(error, match=match):
        merge_attention_backward(np.zeros(dout_shape), np.zeros(dlse_shape), ctx)


def test_backward_rejects_an_integer_gradient():
    zeros = np.zeros((2, 3))
    ctx = merge_attention_forward(np.ones((2, 3, 4)), zeros, np.ones((2, 3, 4)), zeros).ctx

    with pytest.raises(TypeError, match="dout"):
        merge_attention_backward(np.zeros((2, 3, 4), dtype=int), None, ctx)


@pytest.mark.parametrize("kind", ["none", "attention", "tuple"])
def test_backward_rejects_a_ctx_of_the_wrong_type(rng, kind):
    q, k, v = make_qkv(rng)
    attention_ctx = attention_forward(q, k, v).ctx
    merge_ctx = merge_attention_forward(*merge_inputs(rng)).ctx
    ctx = {"none": None, "attention": attention_ctx, "tuple": tuple(merge_ctx)}[kind]
    assert isinstance(merge_ctx, MergeCtx)

    with pytest.raises(TypeError, match="merge_attention_backward needs the ctx"):
        merge_attention_backward(np.zeros((*LEAD, N, DV)), None, ctx)
