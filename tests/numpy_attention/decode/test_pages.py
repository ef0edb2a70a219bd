"""The pages of a pool (numpy_attention.decode.pages): read_tokens reads a sequence's tokens in
table order (a view of the pool when its pages are consecutive, gathered otherwise, into a reused
buffer when asked), write_tokens writes across page boundaries, and PagePool's bookkeeping
(seen through PagedKVCache, a pool of keys and values): each sequence in its own region, its
pages one run whatever the batch's steps, the lowest free page when the next one is held,
reserve then a kernel then advance, reset."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.decode.cache import KVCache, PagedKVCache
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


def test_each_sequence_starts_in_its_own_region_of_the_pool(rng):
    cache = PagedKVCache(9, 2, 1, D, dtype=np.float64)  # regions of 9 // 2 = 4 pages, one spare
    cache.append(*rng.standard_normal((2, 2, 1, 3, D)))  # 2 sequences of 3 tokens: 2 pages each

    assert cache.regions == [range(0, 4), range(4, 8)]
    np.testing.assert_array_equal(cache.block_table, [[0, 1], [4, 5]])
    cache.append(*rng.standard_normal((2, 2, 1, 2, D)))  # each grows into its own region
    np.testing.assert_array_equal(cache.block_table, [[0, 1, 2], [4, 5, 6]])
    np.testing.assert_array_equal(cache.cache_seqlens, [5, 5])
    assert cache.block_table.dtype == cache.cache_seqlens.dtype == np.int32
    cache.reset()
    assert cache.regions == [] and cache.batch == 0


@pytest.mark.parametrize("num_blocks", [48, 51], ids=["pool exactly full", "3 spare pages"])
def test_a_batch_decoding_token_by_token_keeps_each_sequence_in_one_run_read_in_place(
    rng, num_blocks
):
    """B = 4 sequences, a prefill of 5 tokens then 40 one-token steps in pages of 4: every step
    that crosses a page gives each sequence a page, in turn; each sequence's 12 pages stay one
    run of the pool, so its keys are read as a view, equal to a contiguous cache's."""
    batch, steps = 4, [5] + [1] * 40
    paged = PagedKVCache(num_blocks, 4, 2, D, dtype=np.float64)
    contiguous = KVCache(batch, 2, 45, D, np.float64)
    for n in steps:
        k, v = rng.standard_normal((2, batch, 2, n, D))
        paged.append(k, v)
        contiguous.append(k, v)

    region = num_blocks // batch
    for b, table in enumerate(paged.block_table):
        np.testing.assert_array_equal(table, np.arange(b * region, b * region + 12))
        keys = read_tokens(paged.k, table, 0, paged.length)  # (45, H_kv, D)
        values = read_tokens(paged.v, table, 0, paged.length)
        assert np.shares_memory(keys, paged.k) and np.shares_memory(values, paged.v)
        np.testing.assert_array_equal(keys.swapaxes(0, 1), contiguous.k[b])
        np.testing.assert_array_equal(values.swapaxes(0, 1), contiguous.v[b])


@pytest.mark.parametrize(
    ("held", "tables"),
    [
        # sequence 1: 6, then 7 is held: its region's lowest free page, 8 (not the pool's, 3)
        ([4, 7], [[0, 1, 2, 3, 5], [6, 8, 9, 10, 11]]),
        # sequence 0: 0, 1, 2, then 3 is held: its region's lowest free, 5; then its region is
        # used up: the pool's lowest free, 10, in sequence 1's region, which takes 11 in turn
        ([3, 4], [[0, 1, 2, 5, 10], [6, 7, 8, 9, 11]]),
    ],
    ids=["in its region", "region used up"],
)
def test_a_sequence_whose_next_page_is_held_takes_the_lowest_free_page(rng, held, tables):
    """Sequences of equal length never outgrow their regions; a page held outside them (here by
    hand: nothing in the pool's own API does it) sends the sequence to the lowest free page of
    its region, else of the pool, and the pool still reads exactly what was written."""
    paged = PagedKVCache(12, 2, 1, D, dtype=np.float64)  # regions [0, 6) and [6, 12)
    contiguous = KVCache(2, 1, 10, D, np.float64)
    paged._owned[held] = True  # two pages held elsewhere
    for n in (5, 1, 1, 1, 1, 1):  # up to 10 tokens: 5 pages each, 10 of the 10 free
        k, v = rng.standard_normal((2, 2, 1, n, D))
        paged.append(k, v)
        contiguous.append(k, v)

    np.testing.assert_array_equal(paged.block_table, tables)
    keys, values = paged.gather()
    np.testing.assert_array_equal(keys, contiguous.k)
    np.testing.assert_array_equal(values, contiguous.v)
    assert not np.shares_memory(read_tokens(paged.k, paged.block_table[1], 0, 10), paged.k)
    with pytest.raises(ValueError, match="cache is full: 2 sequences of 10 tokens need 2"):
        paged.append(*rng.standard_normal((2, 2, 1, 1, D)))


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
