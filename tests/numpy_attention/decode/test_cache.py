"""A layer's caches (numpy_attention.decode.cache): PagedKVCache's pool holds what a contiguous
KVCache holds, refuses what does not fit with nothing written, and its construction is checked.
The layer over either, equal results: tests/numpy_attention/test_grouped.py."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.decode.cache import KVCache, PagedKVCache

D = 8


def test_the_pool_holds_what_a_contiguous_cache_holds(rng):
    paged, contiguous = PagedKVCache(9, 2, 2, D, dtype=np.float64), KVCache(2, 2, 7, D, np.float64)
    for n in (3, 1, 2):
        k, v = rng.standard_normal((2, 2, 2, n, D))
        paged.append(k, v)
        contiguous.append(k, v)

    keys, values = paged.gather()

    np.testing.assert_array_equal(keys, contiguous.k[:, :, :6])
    np.testing.assert_array_equal(values, contiguous.v[:, :, :6])


@pytest.mark.parametrize(
    ("shape", "dtype", "error", "match"),
    [
        (
            (2, 2, 5, D),
            np.float64,
            ValueError,
            "cache is full: 2 sequences of 2 tokens need 6 more pages of 2 for 5 new tokens, "
            "2 are free",
        ),
        ((3, 2, 1, D), np.float64, ValueError, r"\(2, 2, N, 8\), got \(3, 2, 1, 8\)"),
        ((2, 1, 1, D), np.float64, ValueError, r"\(2, 2, N, 8\), got \(2, 1, 1, 8\)"),
        ((2, 2, 1, D), np.float32, TypeError, "cache holds float64, got .* float32"),
    ],
)
def test_the_pool_refuses_what_does_not_fit_and_writes_nothing(rng, shape, dtype, error, match):
    cache = PagedKVCache(4, 2, 2, D, dtype=np.float64)
    cache.append(*rng.standard_normal((2, 2, 2, 2, D)))
    before = cache.k.copy(), cache.block_table

    with pytest.raises(error, match=match):
        cache.append(*rng.standard_normal((2, *shape)).astype(dtype))

    assert cache.length == 2
    np.testing.assert_array_equal(cache.k, before[0])
    np.testing.assert_array_equal(cache.block_table, before[1])


def test_bad_construction_is_refused():
    with pytest.raises(TypeError, match="PagedKVCache needs a floating dtype, got int64"):
        PagedKVCache(2, 2, 1, D, dtype=np.int64)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive int"):
        PagedKVCache(2, 2, 0, D)
