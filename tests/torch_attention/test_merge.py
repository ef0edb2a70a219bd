"""torch_attention.merge: the torch twin of the NumPy merge, differentiable by autograd.

The oracles are NumPy's: the dense attention over all keys (``attention_forward`` /
``attention_backward`` in float64) and ``numpy_attention.merge``'s hand-derived backward.
Attention over concatenated keys must be the merge of the attentions over the parts, forward
and, through autograd, backward (nested merges need the lse gradient at every level); dead rows
give out 0, lse -inf and gradient 0, never NaN; half precision is computed in float32 and
rounded once.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.functional import attention_backward, attention_forward
from numpy_attention.merge import merge_attention_backward, merge_attention_forward
from torch_attention.merge import merge_attention

from ..conftest import assert_close, to_numpy, to_torch

LEAD, N, M, D, DV = (2, 3), 5, 7, 4, 6
# Part A = keys [0, split), part B = keys [split, M): an empty part on either side, one key.
SPLITS = {"0+7": 0, "1+6": 1, "3+4": 3, "7+0": 7}
# "dead-rows": row 0 sees nothing at all, row 1 nothing in part A, row 2 nothing in part B.
MASKS = ["none", "causal", "dead-rows"]


def make_qkv(rng):
    q = rng.standard_normal((*LEAD, N, D))
    k = rng.standard_normal((*LEAD, M, D))
    v = rng.standard_normal((*LEAD, M, DV))
    return q, k, v


def make_allowed(rng, kind, split):
    """A bool (N, M) "may attend" mask, or None; its columns are cut with the keys."""
    if kind == "none":
        return None
    if kind == "causal":
        return np.tri(N, M, dtype=bool)
    allowed = rng.random((N, M)) > 0.3
    allowed[0] = False
    allowed[1] = np.arange(M) >= split
    allowed[2] = np.arange(M) < split
    return allowed


def numpy_part(q, k, v, allowed, cols, **options):
    """The float64 golden attention of every query over the keys ``cols``, with lse."""
    attn_mask = None if allowed is None else allowed[:, cols]
    return attention_forward(
        q, k[..., cols, :], v[..., cols, :], attn_mask=attn_mask, return_lse=True, **options
    )


def assert_lse_close(actual, expected, *, dtype=None):
    """Dead rows (-inf) in the same places, the finite entries within the dtype's tolerance."""
    actual, expected = to_numpy(actual), np.asarray(expected)
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected), err_msg="lse")
    finite = np.isfinite(expected)
    assert_close(actual[finite], expected[finite], dtype=dtype, name="lse")


def torch_part(q, k, v, cols):
    """The formula of attention with lse in plain torch ops over the keys ``cols``,
    differentiable by autograd (unmasked: torch's softmax of an all -inf row is NaN)."""
    scores = q @ k[..., cols, :].transpose(-2, -1) / D**0.5
    return torch.softmax(scores, dim=-1) @ v[..., cols, :], torch.logsumexp(scores, dim=-1)


# -- attention over concatenated keys is the merge of the parts --------------------------------


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("softcap", [0.0, 1.5])
def test_merge_of_parts_equals_attention_over_all_keys(rng, split, mask, softcap):
    q, k, v = make_qkv(rng)
    cut = SPLITS[split]
    allowed = make_allowed(rng, mask, cut)
    whole = numpy_part(q, k, v, allowed, slice(None), softcap=softcap)
    part_a = numpy_part(q, k, v, allowed, slice(0, cut), softcap=softcap)
    part_b = numpy_part(q, k, v, allowed, slice(cut, None), softcap=softcap)

    out, lse = merge_attention(
        *(to_torch(t) for t in (part_a.out, part_a.lse)),
        *(to_torch(t) for t in (part_b.out, part_b.lse)),
    )

    assert_close(out, whole.out, name="out")
    assert_lse_close(lse, whole.lse)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("mask", MASKS)
def test_autograd_of_the_merge_equals_the_numpy_merge_backward(rng, split, mask):
    q, k, v = make_qkv(rng)
    cut = SPLITS[split]
    allowed = make_allowed(rng, mask, cut)
    part_a = numpy_part(q, k, v, allowed, slice(0, cut))
    part_b = numpy_part(q, k, v, allowed, slice(cut, None))
    merged = merge_attention_forward(part_a.out, part_a.lse, part_b.out, part_b.lse)
    dout, dlse = rng.standard_normal((*LEAD, N, DV)), rng.standard_normal((*LEAD, N))
    expected = merge_attention_backward(dout, dlse, merged.ctx)
    inputs = [to_torch(t, requires_grad=True) for t in (part_a.out, part_a.lse)] + [
        to_torch(t, requires_grad=True) for t in (part_b.out, part_b.lse)
    ]

    out, lse = merge_attention(*inputs)
    torch.autograd.backward((out, lse), (to_torch(dout), to_torch(dlse)))

    for name, tensor, grad in zip(
        ["dout_a", "dlse_a", "dout_b", "dlse_b"], inputs, expected, strict=True
    ):
        assert_close(tensor.grad, grad, name=name)


@pytest.mark.parametrize("nesting", ["(ab)c", "a(bc)"])
def test_nested_merges_differentiate_to_attention_over_all_keys(rng, nesting):
    q, k, v = make_qkv(rng)
    whole = attention_forward(q, k, v)
    dout = rng.standard_normal(whole.out.shape)
    expected = attention_backward(dout, whole.ctx)
    tq, tk, tv = (to_torch(t, requires_grad=True) for t in (q, k, v))
    a, b, c = (torch_part(tq, tk, tv, cols) for cols in (slice(0, 2), slice(2, 4), [4, 5, 6]))

    if nesting == "(ab)c":
        out, _ = merge_attention(*merge_attention(*a, *b), *c)
    else:
        out, _ = merge_attention(*a, *merge_attention(*b, *c))
    out.backward(to_torch(dout))

    assert_close(out, whole.out, name="out")
    for name, tensor, grad in zip(["dq", "dk", "dv"], (tq, tk, tv), expected[:3], strict=True):
        assert_close(tensor.grad, grad, name=name)


def test_two_dead_parts_merge_into_a_dead_row_with_zero_gradients(rng):
    out_a, out_b = (torch.zeros(2, 3, DV, dtype=torch.float64, requires_grad=True) for _ in "ab")
    lse_a, lse_b = (
        torch.full((2, 3), float("-inf"), dtype=torch.float64, requires_grad=True) for _ in "ab"
    )

    out, lse = merge_attention(out_a, lse_a, out_b, lse_b)
    torch.autograd.backward(
        (out, lse),
        (to_torch(rng.standard_normal((2, 3, DV))), to_torch(rng.standard_normal((2, 3)))),
    )

    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()
    for tensor in (out_a, lse_a, out_b, lse_b):
        assert tensor.grad is not None and torch.equal(tensor.grad, torch.zeros_like(tensor))


def test_far_apart_lse_weigh_the_smaller_part_zero(rng):
    out_a, out_b = (to_torch(rng.standard_normal((3, DV))) for _ in "ab")
    lse_a, lse_b = (
        torch.zeros(3, dtype=torch.float64),
        torch.full((3,), -800.0, dtype=torch.float64),
    )

    out, lse = merge_attention(out_a, lse_a, out_b, lse_b)

    assert torch.equal(out, out_a)  # exp(-800) underflows to 0: nothing overflows
    assert torch.equal(lse, lse_a)


# -- dtypes -------------------------------------------------------------------------------------


def test_float32_stays_float32_and_matches_float64(rng):
    q, k, v = make_qkv(rng)
    parts = [numpy_part(q, k, v, None, cols) for cols in (slice(0, 3), slice(3, None))]
    whole = numpy_part(q, k, v, None, slice(None))
    inputs = [to_torch(t.astype(np.float32)) for p in parts for t in (p.out, p.lse)]

    out, lse = merge_attention(*inputs)

    assert out.dtype == lse.dtype == torch.float32
    assert_close(out, whole.out, dtype=np.float32, name="out")
    assert_close(lse, whole.lse, dtype=np.float32, name="lse")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lse_dtype", ["float32", "half"])
def test_half_inputs_are_merged_in_float32_and_rounded_once(rng, dtype, lse_dtype):
    lse_type = torch.float32 if lse_dtype == "float32" else dtype
    outs = [to_torch(rng.standard_normal((*LEAD, N, DV))).to(dtype) for _ in "ab"]
    lses = [to_torch(rng.standard_normal((*LEAD, N))).to(lse_type) for _ in "ab"]

    out, lse = merge_attention(outs[0], lses[0], outs[1], lses[1])
    wide_out, wide_lse = merge_attention(*(t.float() for t in (outs[0], lses[0], outs[1], lses[1])))

    assert out.dtype == dtype and lse.dtype == lse_type
    assert torch.equal(out, wide_out.to(dtype))
    assert torch.equal(lse, wide_lse.to(lse_type))


# -- bad input ----------------------------------------------------------------------------------


def good_inputs():
    return [torch.zeros(2, N, DV), torch.zeros(2, N), torch.zeros(2, N, DV), torch.zeros(2, N)]


BAD = {
    "out_a not a tensor": (0, np.zeros((2, N, DV)), TypeError, "out_a must be a torch.Tensor"),
    "integer lse_b": (3, torch.zeros(2, N, dtype=torch.int64), TypeError, "lse_b"),
    "out_b float64": (2, torch.zeros(2, N, DV, dtype=torch.float64), TypeError, "out_b"),
    "lse_a float64": (1, torch.zeros(2, N, dtype=torch.float64), TypeError, "lse_a"),
    "out_b of another shape": (2, torch.zeros(2, N + 1, DV), ValueError, r"\(2, 6, 6\)"),
    "lse_b of another shape": (3, torch.zeros(2, N + 1), ValueError, "lse_b must be"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_refused_naming_the_argument(case):
    position, value, error, match = BAD[case]
    inputs = good_inputs()
    inputs[position] = value

    with pytest.raises(error, match=match):
        merge_attention(*inputs)
