"""torch_attention.decode.cache, the twin of numpy_attention.decode.cache: PagedKVCache holds
what a contiguous KVCache holds and refuses what does not fit with nothing written. The layer
over either: tests/torch_attention/test_grouped.py."""

from __future__ import annotations

import pytest
import torch

from torch_attention.decode.cache import KVCache, PagedKVCache

from ...conftest import to_torch

D = 8


def test_the_pool_holds_what_a_contiguous_cache_holds(rng):
    paged = PagedKVCache(8, 2, 1, D, dtype=torch.float64)
    contiguous = KVCache(2, 1, 5, D, torch.float64)
    for n in (3, 2):
        k, v = (to_torch(t) for t in rng.standard_normal((2, 2, 1, n, D)))
        paged.append(k, v)
        contiguous.append(k, v)

    keys, values = paged.gather()

    assert paged.block_table.tolist() == [[0, 1, 2], [4, 5, 6]]  # a region each
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
