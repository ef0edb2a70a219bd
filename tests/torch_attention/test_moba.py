"""torch_attention.moba: the torch twin of numpy_attention.moba, autograd against the hand-derived
backward in float64 (out, dq, dk, dv), with the same refusals word for word."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.moba import moba_backward, moba_forward
from torch_attention.moba import moba

from ..conftest import assert_close, to_torch
from ..numpy_attention.test_moba import BAD, CHUNK, PACKED, inputs


@pytest.mark.parametrize("topk", [1, 2, 3])
@pytest.mark.parametrize("cu_seqlens", [None, PACKED])
def test_autograd_equals_the_derived_backward(rng, topk, cu_seqlens):
    q, k, v = inputs(rng)
    ref = moba_forward(q, k, v, chunk_size=CHUNK, topk=topk, cu_seqlens=cu_seqlens)
    dout = rng.standard_normal(ref.out.shape)
    grads = moba_backward(dout, ref.ctx)

    tensors = [to_torch(a, requires_grad=True) for a in (q, k, v)]
    out = moba(
        *tensors, chunk_size=CHUNK, topk=topk,
        cu_seqlens=None if cu_seqlens is None else torch.from_numpy(cu_seqlens),
    )  # fmt: skip
    assert_close(out, ref.out, name="out")
    (out * to_torch(dout)).sum().backward()
    for name, tensor, grad in zip(("dq", "dk", "dv"), tensors, grads, strict=True):
        assert_close(tensor.grad, grad, name=name)


@pytest.mark.parametrize("case", list(BAD))
def test_the_refusals_are_the_numpy_twins(rng, case):
    q, k, v = inputs(rng)
    args = dict(q=q, k=k, v=v, chunk_size=CHUNK, topk=2) | BAD[case][0]
    with pytest.raises((TypeError, ValueError)) as numpy_error:
        moba_forward(**args)
    tensors = {n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for n, a in args.items()}
    with pytest.raises(type(numpy_error.value)) as torch_error:
        moba(**tensors)
    numpy_words = str(numpy_error.value).replace("array", "tensor")
    assert str(torch_error.value).replace("torch.", "") == numpy_words
