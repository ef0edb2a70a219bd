"""torch_attention.paged, the torch twin of numpy_attention.paged: kvcache_attention against the
NumPy reference in float64 on every case of its tests (out, lse and both caches after the call),
float32 by the suite's tolerance, the same refusals (nothing written), and the page pool's
bookkeeping. Half precision is the kernel checker's to judge (tests/checker/test_decode.py runs
this twin as the built-in target of the "flash_kvcache" spec)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.paged import kvcache_attention_forward
from torch_attention.grouped import KVCache
from torch_attention.paged import PagedKVCache, kvcache_attention

from ..conftest import assert_close, to_torch
from ..numpy_attention.test_paged import BAD, CASES, D, _bad, make_call, paged_call


def _torch(call: dict, dtype: torch.dtype = torch.float64) -> dict:
    """The call's arrays as tensors, floats in ``dtype``."""
    return {
        name: (to_torch(t).to(dtype) if t.dtype == np.float64 else to_torch(t))
        if isinstance(t, np.ndarray)
        else t
        for name, t in call.items()
    }


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_numpy_reference(rng, name):
    call = make_call(rng, CASES[name])
    given = _torch(call)
    expected = kvcache_attention_forward(**call, return_lse=True)  # writes call's caches

    result = kvcache_attention(**given, return_lse=True)

    assert_close(result.out, expected.out, name="out")
    finite = np.isfinite(expected.lse)
    np.testing.assert_array_equal(np.isneginf(result.lse.numpy()), np.isneginf(expected.lse))
    assert_close(result.lse.numpy()[finite], expected.lse[finite], name="lse")
    np.testing.assert_array_equal(given["k_cache"].numpy(), call["k_cache"])
    np.testing.assert_array_equal(given["v_cache"].numpy(), call["v_cache"])


def test_float32_follows_float64(rng):
    call = make_call(rng, CASES["rotary-interleaved-causal"])
    expected = kvcache_attention_forward(**call, return_lse=True)

    result = kvcache_attention(**_torch(call, torch.float32), return_lse=True)

    assert result.out.dtype == torch.float32
    assert_close(result.out, expected.out, dtype=np.float32, name="out")


@pytest.mark.parametrize("name", ["past the block table", "page out of range", "float table",
                                  "short rotary", "shared slot"])  # fmt: skip
def test_bad_input_is_refused_as_numpy_refuses_it_and_nothing_is_written(rng, name):
    call = paged_call(rng)
    changes, error, match = BAD[name]
    call.update({arg: _bad(call, arg, value) if isinstance(value, str) else value
                 for arg, value in changes.items()})  # fmt: skip
    given = _torch(call)
    before = given["k_cache"].clone(), given["v_cache"].clone()

    with pytest.raises(error, match=match):
        kvcache_attention(**given)

    assert torch.equal(given["k_cache"], before[0]) and torch.equal(given["v_cache"], before[1])


def test_the_pool_allocates_as_the_numpy_twin_and_holds_what_a_contiguous_cache_holds(rng):
    paged = PagedKVCache(8, 2, 1, D, dtype=torch.float64)
    contiguous = KVCache(2, 1, 5, D, torch.float64)
    for n in (3, 2):
        k, v = (to_torch(t) for t in rng.standard_normal((2, 2, 1, n, D)))
        paged.append(k, v)
        contiguous.append(k, v)

    keys, values = paged.gather()

    assert paged.block_table.tolist() == [[0, 1, 4], [2, 3, 5]]
    assert paged.cache_seqlens.tolist() == [5, 5] and paged.block_table.dtype == torch.int32
    assert torch.equal(keys, contiguous.k) and torch.equal(values, contiguous.v)


def test_the_pool_refuses_what_does_not_fit_and_writes_nothing(rng):
    cache = PagedKVCache(4, 2, 1, D, dtype=torch.float64)
    cache.append(*(to_torch(t) for t in rng.standard_normal((2, 2, 1, 2, D))))
    before = cache.k.clone()

    with pytest.raises(ValueError, match="cache is full: 2 sequences of 2 tokens need 6"):
        cache.append(*(to_torch(t) for t in rng.standard_normal((2, 2, 1, 5, D))))
    with pytest.raises(TypeError, match="cache holds torch.float64, got .* torch.float32"):
        cache.append(*torch.zeros(2, 2, 1, 1, D))

    assert cache.length == 2 and torch.equal(cache.k, before)
