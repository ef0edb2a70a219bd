"""torch_attention.decode.pages, the twin of numpy_attention.decode.pages: read_tokens and
write_tokens as the NumPy twin's (in table order, across page boundaries; a run of pages read in
place), and PagePool's allocation (through PagedKVCache) page for page the NumPy twin's, its tables
int32 tensors: regions, one run per sequence through a batch's decode steps, the fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention.decode.pages as np_pages
from numpy_attention.decode.cache import PagedKVCache as NumpyPagedKVCache
from torch_attention.decode.cache import KVCache, PagedKVCache
from torch_attention.decode.pages import read_tokens, write_tokens

from ...conftest import to_torch

D = 8


def test_read_and_write_tokens_are_the_numpy_twins(rng):
    pool, tokens = rng.standard_normal((6, 2, 1, 3)), rng.standard_normal((3, 1, 3))
    pages, torch_pool = [4, 0, 3], to_torch(pool)

    write_tokens(torch_pool, pages, [1, 2, 3], to_torch(tokens))
    np_pages.write_tokens(pool, np.array(pages), np.arange(1, 4), tokens)

    np.testing.assert_array_equal(torch_pool.numpy(), pool)
    for table in (pages, [2, 3, 4]):
        for lo, hi in ((0, 6), (1, 5), (3, 3)):
            expected = np_pages.read_tokens(pool, np.array(table), lo, hi)
            tokens = read_tokens(torch_pool, table, lo, hi)
            np.testing.assert_array_equal(tokens.numpy(), expected)
    assert np.shares_memory(read_tokens(torch_pool, [2, 3, 4], 1, 5).numpy(), torch_pool.numpy())
    assert not np.shares_memory(read_tokens(torch_pool, pages, 1, 5).numpy(), torch_pool.numpy())


def test_the_pool_allocates_as_the_numpy_twin(rng):
    caches = PagedKVCache(8, 2, 1, D, dtype=torch.float64), NumpyPagedKVCache(8, 2, 1, D)
    for cache in caches:
        cache.reserve(2, 3)
        cache.advance(3)
        cache.reserve(2, 2)  # each sequence grows in its own region
        cache.advance(2)

    tables = [cache.block_table.tolist() for cache in caches]
    assert tables[0] == tables[1] == [[0, 1, 2], [4, 5, 6]]
    assert caches[0].regions == caches[1].regions == [range(0, 4), range(4, 8)]
    assert caches[0].cache_seqlens.tolist() == [5, 5]
    assert caches[0].block_table.dtype == caches[0].cache_seqlens.dtype == torch.int32
    with pytest.raises(ValueError, match="reserve them first"):
        caches[0].advance(2)
    caches[0].reset()
    assert caches[0].batch == caches[0].length == 0
    caches[0].reserve(1, 16)  # every page free again


def test_a_batch_decoding_token_by_token_keeps_each_sequence_in_one_run_read_in_place(rng):
    """The NumPy twin's test: B = 4, a prefill of 5 tokens then 40 one-token steps in pages of 4,
    3 spare pages; each sequence's 12 pages one run, read as a view, equal to a KVCache's."""
    batch = 4
    paged = PagedKVCache(51, 4, 2, D, dtype=torch.float64)
    twin = NumpyPagedKVCache(51, 4, 2, D, dtype=np.float64)
    contiguous = KVCache(batch, 2, 45, D, torch.float64)
    for n in [5] + [1] * 40:
        k, v = rng.standard_normal((2, batch, 2, n, D))
        paged.append(to_torch(k), to_torch(v))
        twin.append(k, v)
        contiguous.append(to_torch(k), to_torch(v))

    assert paged.block_table.tolist() == twin.block_table.tolist()
    for b, table in enumerate(paged.block_table.tolist()):
        assert table == list(range(12 * b, 12 * b + 12))
        keys = paged._read(paged.k, b)  # (45, H_kv, D)
        assert np.shares_memory(keys.numpy(), paged.k.numpy())
        assert torch.equal(keys.transpose(0, 1), contiguous.k[b])


@pytest.mark.parametrize(
    ("held", "tables"),
    [
        ([4, 7], [[0, 1, 2, 3, 5], [6, 8, 9, 10, 11]]),
        ([3, 4], [[0, 1, 2, 5, 10], [6, 7, 8, 9, 11]]),
    ],
    ids=["in its region", "region used up"],
)
def test_a_sequence_whose_next_page_is_held_takes_the_lowest_free_page_as_the_numpy_twin(
    rng, held, tables
):
    """Two pages held by hand (the pool's own API never does it): the NumPy twin's tables, and
    the keys read back exactly."""
    caches = (
        PagedKVCache(12, 2, 1, D, dtype=torch.float64),
        NumpyPagedKVCache(12, 2, 1, D, dtype=np.float64),
    )
    contiguous = KVCache(2, 1, 10, D, torch.float64)
    for page in held:
        caches[0]._owned[page] = caches[1]._owned[page] = True
    for n in (5, 1, 1, 1, 1, 1):
        k, v = rng.standard_normal((2, 2, 1, n, D))
        caches[0].append(to_torch(k), to_torch(v))
        caches[1].append(k, v)
        contiguous.append(to_torch(k), to_torch(v))

    assert caches[0].block_table.tolist() == caches[1].block_table.tolist() == tables
    keys, values = caches[0].gather()
    assert torch.equal(keys, contiguous.k) and torch.equal(values, contiguous.v)
