"""torch_attention.nsa: the torch twin of numpy_attention.nsa, autograd against the hand-derived
backward in float64 (out, the blocks chosen, every input's and every gate's gradient), with the
same refusals word for word."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.nsa import nsa_backward, nsa_forward
from torch_attention.nsa import nsa

from ..conftest import assert_close, to_numpy, to_torch
from ..numpy_attention.test_nsa import BAD, BLOCK, PACKED, WINDOW, S, inputs


@pytest.mark.parametrize("window", [0, WINDOW])
@pytest.mark.parametrize("cu_seqlens", [None, PACKED])
@pytest.mark.parametrize("counts", ["int", "per token"])
def test_autograd_equals_the_derived_backward(rng, window, cu_seqlens, counts):
    q, k, v, gates = inputs(rng)
    g_swa = gates[2] if window else None
    block_counts = 2 if counts == "int" else rng.integers(0, 4, (S, k.shape[1]))
    options = dict(block_size=BLOCK, window_size=window)
    ref = nsa_forward(
        q, k, v, gates[0], gates[1], g_swa, block_counts=block_counts, cu_seqlens=cu_seqlens,
        **options,
    )  # fmt: skip
    dout = rng.standard_normal(ref.out.shape)
    grads = nsa_backward(dout, ref.ctx)

    names = ["q", "k", "v", "g_cmp", "g_slc"] + (["g_swa"] if window else [])
    tensors = {
        n: to_torch(a, requires_grad=True) for n, a in zip(names, [q, k, v, *gates], strict=False)
    }
    out, chosen = nsa(
        *tensors.values(), **options, return_block_indices=True,
        block_counts=block_counts if counts == "int" else torch.from_numpy(block_counts),
        cu_seqlens=None if cu_seqlens is None else torch.from_numpy(cu_seqlens),
    )  # fmt: skip
    assert np.array_equal(to_numpy(chosen), ref.block_indices)
    assert_close(out, ref.out, name="out")
    (out * to_torch(dout)).sum().backward()
    for name, tensor in tensors.items():
        assert_close(tensor.grad, getattr(grads, "d" + name), name="d" + name)


def test_given_blocks(rng):
    q, k, v, gates = inputs(rng)
    given = rng.integers(-1, 4, (S, k.shape[1], 2))
    ref = nsa_forward(q, k, v, gates[0], gates[1], block_size=BLOCK, block_indices=given)
    out = nsa(
        *(to_torch(a) for a in (q, k, v, gates[0], gates[1])), block_size=BLOCK,
        block_indices=torch.from_numpy(given),
    )  # fmt: skip
    assert_close(out, ref.out, name="out")


@pytest.mark.parametrize("case", list(BAD))
def test_the_refusals_are_the_numpy_twins(rng, case):
    q, k, v, gates = inputs(rng)
    args = dict(q=q, k=k, v=v, g_cmp=gates[0], g_slc=gates[1], g_swa=None, block_size=BLOCK)
    args |= BAD[case][0]
    with pytest.raises((TypeError, ValueError)) as numpy_error:
        nsa_forward(**args)
    tensors = {n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for n, a in args.items()}
    with pytest.raises(type(numpy_error.value)) as torch_error:
        nsa(**tensors)
    numpy_words = str(numpy_error.value).replace("array", "tensor")
    assert str(torch_error.value).replace("torch.", "") == numpy_words
