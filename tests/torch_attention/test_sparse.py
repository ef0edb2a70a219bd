"""torch_attention.sparse: the torch twin of numpy_attention.sparse, against the NumPy forward and
its hand-derived backward (torch autograd on the one side, the derivation on the other), in
float64 and in half precision, with the same refusals word for word."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.sparse import sparse_attention_backward, sparse_attention_forward
from torch_attention.sparse import sparse_attention

from ..conftest import assert_close, to_numpy, to_torch
from ..numpy_attention.test_sparse import DV, H_KV, S_KV, S_Q, TOPK, H, inputs, overlapping_indices


@pytest.mark.parametrize("v_none", [False, True])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_autograd_equals_the_derived_backward(rng, v_none, with_sinks):
    q, k, v = inputs(rng, v_none)
    idx = overlapping_indices(rng)
    sinks = rng.standard_normal(H) if with_sinks else None
    length = rng.integers(0, TOPK + 1, S_Q)
    d_v = 4 if v_none else None
    ref = sparse_attention_forward(
        q, k, v, idx, sinks=sinks, topk_length=length, d_v=d_v, return_lse=True
    )
    dout = rng.standard_normal(ref.out.shape)
    dlse = rng.standard_normal(ref.lse.shape)
    dlse[~np.isfinite(ref.lse)] = 0.0
    grads = sparse_attention_backward(dout, ref.ctx, dlse)

    tensors = [to_torch(t, requires_grad=True) for t in (q, k)]
    tv = None if v_none else to_torch(v, requires_grad=True)
    ts = None if sinks is None else to_torch(sinks, requires_grad=True)
    res = sparse_attention(
        *tensors, tv, torch.from_numpy(idx), sinks=ts, topk_length=torch.from_numpy(length),
        d_v=d_v, return_lse=True,
    )  # fmt: skip
    assert_close(to_numpy(res.out), ref.out, name="out")
    finite = np.isfinite(ref.lse)
    assert np.array_equal(np.isfinite(to_numpy(res.lse)), finite)
    assert_close(to_numpy(res.lse)[finite], ref.lse[finite], name="lse")
    lse = torch.where(torch.isfinite(res.lse), res.lse, torch.zeros_like(res.lse))
    ((res.out * to_torch(dout)).sum() + (lse * to_torch(dlse)).sum()).backward()
    assert_close(to_numpy(tensors[0].grad), grads.dq, name="dq")
    assert_close(to_numpy(tensors[1].grad), grads.dk, name="dk")
    if tv is not None:
        assert_close(to_numpy(tv.grad), grads.dv, name="dv")
    if ts is not None:
        assert_close(to_numpy(ts.grad), grads.dsinks, name="dsinks")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_half_precision_keeps_the_dtype(rng, dtype):
    q, k, v = inputs(rng)
    idx = overlapping_indices(rng)
    ref = sparse_attention_forward(q, k, v, idx, return_lse=True)
    res = sparse_attention(
        *(torch.from_numpy(t).to(dtype) for t in (q, k, v)), torch.from_numpy(idx),
        return_lse=True,
    )  # fmt: skip
    assert res.out.dtype == dtype
    assert res.lse.dtype == (torch.float32 if dtype != torch.float64 else dtype)
    eps = torch.finfo(dtype).eps
    assert np.max(np.abs(res.out.double().numpy() - ref.out)) < 16 * eps * np.abs(ref.out).max()


def test_the_refusals_are_the_numpy_twins(rng):
    q, k, v = inputs(rng)
    idx = overlapping_indices(rng, sentinels=False)
    cases = [
        dict(indices=idx.astype(float)),
        dict(indices=idx[:, 0]),
        dict(topk_length=np.full(S_Q, TOPK + 1)),
        dict(v=None, d_v=k.shape[-1] + 1),
        dict(v=None),
        dict(q=q[:, :3]),
        dict(sinks=np.zeros(H + 1)),
    ]
    for change in cases:
        args = dict(q=q, k=k, v=v, indices=idx) | change
        with pytest.raises((TypeError, ValueError)) as numpy_error:
            positional = [args.pop(n) for n in ("q", "k", "v", "indices")]
            sparse_attention_forward(*positional, **args)
        args = dict(q=q, k=k, v=v, indices=idx) | change
        tensors = {
            n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for n, a in args.items()
        }
        with pytest.raises(type(numpy_error.value)) as torch_error:
            positional = [tensors.pop(n) for n in ("q", "k", "v", "indices")]
            sparse_attention(*positional, **tensors)
        numpy_words = str(numpy_error.value).replace("array", "tensor")
        assert str(torch_error.value).replace("torch.", "") == numpy_words


def test_a_sentinel_writes_no_gradient(rng):
    q, k, v = inputs(rng)
    idx = np.full((S_Q, H_KV, TOPK), -1)
    idx[:, :, :3] = rng.integers(0, S_KV - 1, (S_Q, H_KV, 3))  # the last row never named
    tk, tv = to_torch(k, requires_grad=True), to_torch(v, requires_grad=True)
    out = sparse_attention(to_torch(q), tk, tv, torch.from_numpy(idx))
    (out * to_torch(rng.standard_normal((S_Q, H, DV)))).sum().backward()
    assert torch.all(tk.grad[-1] == 0) and torch.all(tv.grad[-1] == 0)
