"""The latent caches (numpy_attention.latent_cache): LatentCache appends and returns views of
everything so far; PagedLatentCache, its twin over pages, holds the same rows (each
sequence's pages one run in its region of the pool), attends as the contiguous cache does, and
its pool is FlashMLA's layout (kvcache_attention_forward reads it, values the first L columns
of the keys); both refuse what does not fit, naming the field, with nothing written. The layer
over either cache: tests/numpy_attention/test_latent.py."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.decode.paged import kvcache_attention_forward
from numpy_attention.latent_cache import LatentCache, PagedLatentCache

from ..conftest import assert_close

B, H, L, R = 2, 3, 4, 4
SCALE = 0.3
OPTIONS = {"causal": True, "align": "bottom-right", "scale": SCALE, "enable_gqa": True}


def latents(rng, n, b=B, dtype=np.float64):
    """c_kv (b, n, L) and k_rope (b, n, R)."""
    return rng.standard_normal((b, n, L)).astype(dtype), rng.standard_normal((b, n, R)).astype(
        dtype
    )


# -- the contiguous cache ---------------------------------------------------------------------


def test_cache_appends_and_returns_views_of_everything_so_far(rng):
    cache = LatentCache(B, 6, L, R, np.float32)
    c1, c2 = rng.standard_normal((B, 4, L)), rng.standard_normal((B, 1, L))
    k1, k2 = rng.standard_normal((B, 4, R)), rng.standard_normal((B, 1, R))

    cache.append(c1.astype(np.float32), k1.astype(np.float32))
    rows = cache.append(c2.astype(np.float32), k2.astype(np.float32))

    assert cache.length == 5 and rows.shape == (B, 5, L + R)
    np.testing.assert_array_equal(rows[..., :L], np.concatenate([c1, c2], 1).astype(np.float32))
    np.testing.assert_array_equal(rows[..., L:], np.concatenate([k1, k2], 1).astype(np.float32))
    assert np.shares_memory(rows, cache.latent)
    cache.reset()
    assert cache.length == 0 and "length=0" in repr(cache)


@pytest.mark.parametrize(
    ("c_shape", "k_shape", "dtype", "error", "match"),
    [
        ((B, 3, L), (B, 3, R), np.float64, ValueError, "too short: max_len = 4.*2 cached.*5"),
        ((B + 1, 1, L), (B + 1, 1, R), np.float64, ValueError, "batch 3 does not fit its 2"),
        ((B, 1, L + 2), (B, 1, R), np.float64, ValueError, "kv_lora_rank 6 does not fit its 4"),
        ((B, 1, L), (B, 1, R - 2), np.float64, ValueError, "qk_rope_head_dim 2 does not fit"),
        ((B, 1, L), (B, 2, R), np.float64, ValueError, r"c_kv must be \(B, N, L\)"),
        ((B, 1, L), (B, 1, R), np.float32, TypeError, "cache holds float64, got .* float32"),
    ],
)
def test_cache_refuses_what_does_not_fit_and_writes_nothing(
    rng, c_shape, k_shape, dtype, error, match
):
    cache = LatentCache(B, 4, L, R, np.float64)
    cache.append(rng.standard_normal((B, 2, L)), rng.standard_normal((B, 2, R)))
    before = cache.latent.copy()

    with pytest.raises(error, match=match):
        cache.append(*(rng.standard_normal(shape).astype(dtype) for shape in (c_shape, k_shape)))

    assert cache.length == 2
    np.testing.assert_array_equal(cache.latent, before)


def test_cache_refuses_bad_construction():
    with pytest.raises(TypeError, match="LatentCache needs a floating dtype, got int64"):
        LatentCache(B, 4, L, R, np.int64)
    with pytest.raises(ValueError, match="kv_lora_rank must be a positive int"):
        LatentCache(B, 4, 0, R, np.float64)


# -- the paged cache ----------------------------------------------------------------------------


def test_the_paged_cache_holds_the_contiguous_caches_rows(rng):
    paged, contiguous = (
        PagedLatentCache(8, 2, L, R, np.float64),
        LatentCache(B, 6, L, R, np.float64),
    )

    for n in (3, 1, 2):  # each sequence's pages one run in its own half of the pool
        step = latents(rng, n)
        rows = paged.append(*step)
        expected = contiguous.append(*step)

    np.testing.assert_array_equal(rows, expected)  # every row so far: (B, 6, L + R)
    np.testing.assert_array_equal(paged.block_table, [[0, 1, 2], [4, 5, 6]])
    assert paged.length == 6 and paged.latent.shape == (8, 2, 1, L + R)
    assert np.shares_memory(paged.c_kv, paged.latent) and paged.k_rope.shape == (8, 2, 1, R)


def test_attend_over_pages_equals_the_contiguous_cache_and_flash_mlas_reading(rng):
    """Left padding split by sequence; and the pool read by kvcache_attention_forward as FlashMLA
    reads it (no append, cache_seqlens counting the new tokens, values a view of the keys)."""
    paged, contiguous = (
        PagedLatentCache(8, 2, L, R, np.float64),
        LatentCache(B, 6, L, R, np.float64),
    )
    first = latents(rng, 3)
    paged.append(*first)
    contiguous.append(*first)
    q, step = rng.standard_normal((B, H, 2, L + R)), latents(rng, 2)
    padding = np.zeros((B, 5), bool)
    padding[1, :2] = True

    out = paged.attend(q, *step, key_padding_mask=padding, **OPTIONS).out
    expected = contiguous.attend(q, *step, key_padding_mask=padding, **OPTIONS).out
    flash = kvcache_attention_forward(
        q.swapaxes(1, 2), paged.latent, paged.c_kv, cache_seqlens=paged.cache_seqlens,
        block_table=paged.block_table, softmax_scale=SCALE, causal=True,
    ).out  # fmt: skip

    assert out.shape == (B, H, 2, L)
    np.testing.assert_array_equal(out, expected)
    assert_close(flash.swapaxes(1, 2)[:1], out[:1], name="FlashMLA's reading, no padding")


@pytest.mark.parametrize(
    ("c_shape", "k_shape", "dtype", "error", "match"),
    [
        ((B, 4, L), (B, 4, R), np.float64, ValueError,
         "cache is full: 2 sequences of 2 tokens need 4 more pages of 2 for 4 new tokens, 2"),
        ((B + 1, 1, L), (B + 1, 1, R), np.float64, ValueError,
         r"holds 2 sequences of \(page_size, kv_lora_rank \+ qk_rope_head_dim\) = \(2, 4 \+ 4\); "
         "batch 3 does not fit its 2"),
        ((B, 1, L + 2), (B, 1, R), np.float64, ValueError, "kv_lora_rank 6 does not fit its 4"),
        ((B, 1, L), (B, 1, R + 2), np.float64, ValueError, "qk_rope_head_dim 6 does not fit"),
        ((B, 1, L), (B, 2, R), np.float64, ValueError, r"c_kv must be \(B, N, L\)"),
        ((B, 1, L), (B, 1, R), np.float32, TypeError, "cache holds float64, got .* float32"),
    ],
)  # fmt: skip
def test_the_paged_cache_refuses_what_does_not_fit_and_writes_nothing(
    rng, c_shape, k_shape, dtype, error, match
):
    cache = PagedLatentCache(4, 2, L, R, np.float64)
    cache.append(*latents(rng, 2))
    before = cache.latent.copy(), cache.block_table

    with pytest.raises(error, match=match):
        c_kv, k_rope = (rng.standard_normal(shape).astype(dtype) for shape in (c_shape, k_shape))
        cache.attend(rng.standard_normal((B, H, 1, L + R)), c_kv, k_rope)

    assert cache.length == 2
    np.testing.assert_array_equal(cache.latent, before[0])
    np.testing.assert_array_equal(cache.block_table, before[1])


def test_the_paged_cache_refuses_bad_construction():
    with pytest.raises(TypeError, match="PagedLatentCache needs a floating dtype, got int64"):
        PagedLatentCache(4, 2, L, R, np.int64)
    with pytest.raises(ValueError, match="qk_rope_head_dim must be a positive int"):
        PagedLatentCache(4, 2, L, 0)
    assert "sequences=0, length=0" in repr(PagedLatentCache(4, 2, L, R))


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_indexer_keys_are_written_where_the_latents_go_next(rng, paged):
    """DSA's indexer keys: ``index_append`` writes at the positions the next ``append`` takes
    and returns every key so far; the latents' append then advances ``length``. Pages of 2
    under the latents' block table (two sequences, each in its region of the pool)."""
    width = 5
    cache = (
        PagedLatentCache(8, 2, L, R, np.float64, index_head_dim=width)
        if paged
        else LatentCache(B, 6, L, R, np.float64, index_head_dim=width)
    )
    keys = rng.standard_normal((B, 5, width))
    latents = rng.standard_normal((B, 5, L)), rng.standard_normal((B, 5, R))

    first = cache.index_append(keys[:, :3])
    assert cache.length == 0 and first.shape == (B, 3, width)
    cache.append(latents[0][:, :3], latents[1][:, :3])
    every = cache.index_append(keys[:, 3:])
    cache.append(latents[0][:, 3:], latents[1][:, 3:])

    assert cache.length == 5
    np.testing.assert_array_equal(every, keys)
    if paged:  # the keys sit in the latents' pages
        assert cache.block_table.tolist() == [[0, 1, 2], [4, 5, 6]]
        np.testing.assert_array_equal(cache.index_keys[[0, 1, 2], :, 0].reshape(6, width)[:5],
                                      keys[0])  # fmt: skip


@pytest.mark.parametrize(
    ("cache", "keys", "error", "match"),
    [
        (LatentCache(B, 6, L, R, np.float64), (B, 2, 5), ValueError, "holds no indexer keys"),
        (PagedLatentCache(8, 2, L, R, np.float64), (B, 2, 5), ValueError, "holds no indexer"),
        (LatentCache(B, 6, L, R, np.float64, index_head_dim=5), (B, 2, 4), ValueError,
         r"\(B, N, DI\) = \(B, N, 5\), got \(2, 2, 4\)"),
        (LatentCache(B, 6, L, R, np.float32, index_head_dim=5), (B, 2, 5), TypeError,
         "holds float32, got indexer keys of float64"),
        (LatentCache(B, 1, L, R, np.float64, index_head_dim=5), (B, 2, 5), ValueError,
         "max_len = 1"),
        (PagedLatentCache(1, 2, L, R, np.float64, index_head_dim=5), (B, 2, 5), ValueError,
         "cache is full"),
    ],
)  # fmt: skip
def test_bad_indexer_keys_are_refused_and_nothing_written(cache, keys, error, match):
    with pytest.raises(error, match=match):
        cache.index_append(np.ones(keys))
    assert cache.length == 0
    if cache.index_keys is not None:
        assert not cache.index_keys.any()


def test_a_bad_indexer_width_is_refused():
    with pytest.raises(ValueError, match="index_head_dim must be a positive int"):
        LatentCache(B, 6, L, R, np.float64, index_head_dim=0)
