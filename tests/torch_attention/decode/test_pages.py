"""torch_attention.decode.pages, the twin of numpy_attention.decode.pages: read_tokens and
write_tokens as the NumPy twin's (in table order, across page boundaries), and PagePool's allocation
(through PagedKVCache) page for page the NumPy twin's, its tables int32 tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention.decode.pages as np_pages
from numpy_attention.decode.cache import PagedKVCache as NumpyPagedKVCache
from torch_attention.decode.cache import PagedKVCache
from torch_attention.decode.pages import read_tokens, write_tokens

from ...conftest import to_torch

D = 8


def test_read_and_write_tokens_are_the_numpy_twins(rng):
    pool, tokens = rng.standard_normal((6, 2, 1, 3)), rng.standard_normal((3, 1, 3))
    pages, torch_pool = [4, 0, 3], to_torch(pool)

    write_tokens(torch_pool, pages, [1, 2, 3], to_torch(tokens))
    np_pages.write_tokens(pool, np.array(pages), np.arange(1, 4), tokens)

    np.testing.assert_array_equal(torch_pool.numpy(), pool)
    for lo, hi in ((0, 6), (1, 5), (3, 3)):
        expected = np_pages.read_tokens(pool, np.array(pages), lo, hi)
        np.testing.assert_array_equal(read_tokens(torch_pool, pages, lo, hi).numpy(), expected)


def test_the_pool_allocates_as_the_numpy_twin(rng):
    caches = PagedKVCache(8, 2, 1, D, dtype=torch.float64), NumpyPagedKVCache(8, 2, 1, D)
    for cache in caches:
        cache.reserve(2, 3)
        cache.advance(3)
        cache.reserve(2, 2)  # page 2 is taken: the lowest free
        cache.advance(2)

    tables = [cache.block_table.tolist() for cache in caches]
    assert tables[0] == tables[1] == [[0, 1, 4], [2, 3, 5]]
    assert caches[0].cache_seqlens.tolist() == [5, 5]
    assert caches[0].block_table.dtype == caches[0].cache_seqlens.dtype == torch.int32
    with pytest.raises(ValueError, match="reserve them first"):
        caches[0].advance(2)
    caches[0].reset()
    assert caches[0].batch == caches[0].length == 0
    caches[0].reserve(1, 16)  # every page free again
