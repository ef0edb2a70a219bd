"""torch_attention.latent_cache, the twin of numpy_attention.latent_cache: PagedLatentCache
allocates and holds what the NumPy twin does, attends as the contiguous LatentCache does (the
rows as values, the first L columns kept), and refuses what does not fit, naming the field, with
nothing written. The layer over either cache: tests/torch_attention/test_latent.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention.latent_cache as np_latent_cache
from torch_attention.latent_cache import LatentCache, PagedLatentCache

from ..conftest import assert_close, to_torch

B, H, L, R = 2, 3, 4, 4
OPTIONS = {"causal": True, "align": "bottom-right", "scale": 0.3, "enable_gqa": True}


def test_the_paged_cache_holds_and_attends_as_its_twins(rng):
    """The pool, page for page the NumPy twin's; attend equal to the contiguous cache's (with a
    left-padded sequence) and to the NumPy paged cache's."""
    paged, contiguous = (
        PagedLatentCache(8, 2, L, R, torch.float64),
        LatentCache(B, 5, L, R, torch.float64),
    )
    twin = np_latent_cache.PagedLatentCache(8, 2, L, R, np.float64)
    first = rng.standard_normal((B, 3, L)), rng.standard_normal((B, 3, R))
    step = rng.standard_normal((B, 2, L)), rng.standard_normal((B, 2, R))
    q = rng.standard_normal((B, H, 2, L + R))
    padding = np.zeros((B, 5), bool)
    padding[1, :2] = True
    for cache in (paged, contiguous):
        cache.append(*map(to_torch, first))
    twin.append(*first)

    out = paged.attend(
        to_torch(q), *map(to_torch, step), key_padding_mask=to_torch(padding), **OPTIONS
    )
    expected = contiguous.attend(
        to_torch(q), *map(to_torch, step), key_padding_mask=to_torch(padding), **OPTIONS
    )
    numpy_out = twin.attend(q, *step, key_padding_mask=padding, **OPTIONS).out

    assert out.shape == (B, H, 2, L) and paged.block_table.tolist() == twin.block_table.tolist()
    np.testing.assert_array_equal(paged.latent.numpy(), twin.latent)
    assert_close(out, expected, name="paged")
    assert_close(out, numpy_out, name="numpy twin")


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"n": 4}, ValueError, "cache is full: 2 sequences of 2 tokens need 4 more pages"),
        ({"b": 3}, ValueError, "batch 3 does not fit its 2"),
        ({"rank": L + 2}, ValueError, "kv_lora_rank 6 does not fit its 4"),
        (
            {"dtype": torch.float32},
            TypeError,
            "cache holds torch.float64, got latents of torch.float32",
        ),
        ({"device": "meta"}, ValueError, "the cache lives on cpu, got latents on meta"),
    ],
)
def test_the_paged_cache_refuses_what_does_not_fit_and_writes_nothing(change, error, match):
    cache = PagedLatentCache(4, 2, L, R, torch.float64)
    cache.append(torch.ones(B, 2, L, dtype=torch.float64), torch.ones(B, 2, R, dtype=torch.float64))
    before = cache.latent.clone(), cache.block_table.tolist()
    given = {"b": B, "n": 1, "rank": L, "dtype": torch.float64, "device": "cpu"} | change
    shape = (given["b"], given["n"])
    c_kv = torch.zeros(*shape, given["rank"], dtype=given["dtype"], device=given["device"])
    k_rope = torch.zeros(*shape, R, dtype=given["dtype"], device=given["device"])

    with pytest.raises(error, match=match):
        cache.append(c_kv, k_rope)

    assert cache.length == 2 and cache.block_table.tolist() == before[1]
    assert torch.equal(cache.latent, before[0])


def test_the_paged_cache_refuses_bad_construction():
    with pytest.raises(TypeError, match="PagedLatentCache needs a floating torch dtype"):
        PagedLatentCache(4, 2, L, R, torch.int64)
    assert "device=cpu, sequences=0" in repr(PagedLatentCache(4, 2, L, R))
