"""The pages of a pool (numpy_attention.decode.pages): read_tokens reads a sequence's tokens in
table order (a view of the pool when its pages are consecutive, gathered otherwise, into a reused
buffer when asked), write_tokens writes across page boundaries, and PagePool's bookkeeping
(seen through PagedKVCache, a pool of keys and values): pages consecutive while they can be,
reserve then a kernel then advance, reset."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.decode.cache import PagedKVCache
from numpy_attention.decode.paged import kvcache_attention_forward
from numpy_attention.decode.pages import read_tokens, write_tokens

H, D = 4, 8


def test_read_tokens_reads_in_table_order_in_place_when_it_can(rng):
    pool = rng.standard_normal((6, 2, 1, 3))  # 6 pages of 2 tokens
    run, shuffled = np.array([2, 3, 4]), np.array([4, 0, 3])

    in_place = read_tokens(pool, run, 1, 5)
    gathered = read_tokens(pool, shuffled, 1, 5)
    first = read_tokens(pool, shuffled, 0, 6, scratch=0)
    second = read_tokens(pool, shuffled[::-1], 0, 6, scratch=0)

    np.testing.assert_array_equal(in_place, pool[2:5].reshape(6, 1, 3)[1:5])
    np.testing.assert_array_equal(gathered, pool[shuffled].reshape(6, 1, 3)[1:5])
    assert np.shares_memory(in_place, pool) and not np.shares_memory(gathered, pool)
    assert np.shares_memory(first, second)  # the slot's buffer, reused
    np.testing.assert_array_equal(second, pool[shuffled[::-1]].reshape(6, 1, 3))
    assert read_tokens(pool, shuffled, 3, 3).shape == (0, 1, 3)


def test_write_tokens_continues_in_the_next_page_of_the_table(rng):
    pool = np.zeros((4, 2, 1, 1))
    tokens = rng.standard_normal((3, 1, 1))

    write_tokens(pool, np.array([3, 1]), np.arange(1, 4), tokens)  # slots 1 | 0, 1

    np.testing.assert_array_equal(pool[3, 1], tokens[0])
    np.testing.assert_array_equal(pool[1], tokens[1:])
    assert np.count_nonzero(pool) == 3


def test_the_pool_keeps_each_sequences_pages_consecutive_while_it_can(rng):
    cache = PagedKVCache(8, 2, 1, D, dtype=np.float64)
    cache.append(*rng.standard_normal((2, 2, 1, 3, D)))  # 2 sequences of 3 tokens: 2 pages each

    np.testing.assert_array_equal(cache.block_table, [[0, 1], [2, 3]])
    cache.append(*rng.standard_normal((2, 2, 1, 2, D)))  # page 2 is taken: the lowest free
    np.testing.assert_array_equal(cache.block_table, [[0, 1, 4], [2, 3, 5]])
    np.testing.assert_array_equal(cache.cache_seqlens, [5, 5])
    assert cache.block_table.dtype == cache.cache_seqlens.dtype == np.int32


def test_reserve_then_a_kernel_then_advance(rng):
    """The engine's order: pages first, the kernel writes in place, then the lengths move."""
    cache = PagedKVCache(6, 2, 2, D, dtype=np.float64)
    cache.append(*rng.standard_normal((2, 1, 2, 3, D)))
    q, (k, v) = rng.standard_normal((1, 1, H, D)), rng.standard_normal((2, 1, 1, 2, D))
    cache.reserve(1, 1)

    kvcache_attention_forward(q, cache.k, cache.v, k=k, v=v, cache_seqlens=cache.cache_seqlens,
                              block_table=cache.block_table)  # fmt: skip
    cache.advance(1)

    keys, values = cache.gather()
    assert cache.length == 4
    np.testing.assert_array_equal(keys[0, :, 3], k[0, 0])
    np.testing.assert_array_equal(values[0, :, 3], v[0, 0])


def test_reset_frees_every_page_and_advance_needs_reserved_pages(rng):
    cache = PagedKVCache(2, 2, 1, D, dtype=np.float64)
    cache.append(*rng.standard_normal((2, 1, 1, 4, D)))
    cache.reset()
    cache.append(*rng.standard_normal((2, 2, 1, 2, D)))  # 2 new sequences fit again

    assert cache.batch == 2 and cache.length == 2
    with pytest.raises(ValueError, match="reserve them first"):
        cache.advance(3)
    with pytest.raises(ValueError, match="page_size must be a positive int"):
        PagedKVCache(2, 0, 1, D)
