"""numpy_attention.linear_cache: the fixed-size decode states of the linear-attention layers.
Reads are copies, writes land in the right rows (the paged pool's other rows untouched), the
state's dtype is never half precision, and each mismatch raises one clear error. The layers'
decoding through these caches is in their own tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.linear_cache import LinearStateCache, PagedLinearStateCache, state_dtype

B, H, K, V, C, W = 2, 3, 4, 5, 6, 4


def _pair(rng, batch=B):
    return rng.standard_normal((batch, C, W - 1)), rng.standard_normal((batch, H, K, V))


def test_contiguous_cache_starts_at_zero_and_returns_copies(rng):
    cache = LinearStateCache(B, H, K, V, conv_dim=C, conv_width=W)
    conv, state = cache.read()
    assert not conv.any() and not state.any() and cache.length == 0
    conv[...] = 1.0  # a copy: the cache is unchanged
    assert not cache.read()[0].any()

    new_conv, new_state = _pair(rng)
    cache.write(new_conv, new_state, 3)

    conv, state = cache.read()
    np.testing.assert_array_equal(conv, new_conv)
    np.testing.assert_array_equal(state, new_state)
    assert cache.length == 3


def test_paged_cache_writes_only_its_sequences_rows(rng):
    cache = PagedLinearStateCache([4, 1], 6, H, K, V, conv_dim=C, conv_width=W)
    new_conv, new_state = _pair(rng)

    cache.write(new_conv, new_state, 1)

    convs, states = cache.pool
    np.testing.assert_array_equal(states[[4, 1]], new_state)
    np.testing.assert_array_equal(convs[[4, 1]], new_conv)
    assert not states[[0, 2, 3, 5]].any() and not convs[[0, 2, 3, 5]].any()
    conv, state = cache.read()
    np.testing.assert_array_equal(state, new_state)
    np.testing.assert_array_equal(conv, new_conv)


def test_a_layer_without_convolution_keeps_none(rng):
    cache = LinearStateCache(B, H, K, V)
    assert cache.read()[0] is None
    cache.write(None, rng.standard_normal((B, H, K, V)), 2)
    with pytest.raises(ValueError, match="holds no convolution state"):
        cache.write(rng.standard_normal((B, C, W - 1)), rng.standard_normal((B, H, K, V)), 1)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_state_is_never_kept_in_half_precision(rng, dtype):
    cache = LinearStateCache(B, H, K, V, dtype=dtype)
    state = rng.standard_normal((B, H, K, V)) * 1e-3 + 1.0
    cache.write(None, state.astype(np.float32) if dtype != np.float64 else state, 1)
    assert cache.read()[1].dtype == state_dtype(dtype) != np.float16
    assert cache.read()[1].dtype == (np.float64 if dtype == np.float64 else np.float32)


def test_check_names_every_mismatch():
    cache = LinearStateCache(B, H, K, V, conv_dim=C, conv_width=W)
    cache.check(B, H, K, V, C, W)  # the layer it was built for: no error
    with pytest.raises(ValueError, match=r"batch 2 \(the layer's call has 3\), key_dim 4"):
        cache.check(3, H, K + 1, V, C, W)
    with pytest.raises(ValueError, match=r"conv_width 4 \(the layer's call has None\)"):
        cache.check(B, H, K, V, C, None)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LinearStateCache(B, H, K, V, conv_dim=C), "conv_dim and conv_width go together"),
        (lambda: PagedLinearStateCache([0, 0], 4, H, K, V), "slot_ids must be distinct"),
        (lambda: PagedLinearStateCache([0, 4], 4, H, K, V), r"slot_ids must lie in \[0, 4\)"),
        (lambda: PagedLinearStateCache([], 4, H, K, V), "non-empty 1-D integer"),
        (lambda: LinearStateCache(0, H, K, V), "batch"),
    ],
)
def test_bad_construction_raises_one_clear_error(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_write_of_the_wrong_shape_raises(rng):
    cache = LinearStateCache(B, H, K, V, conv_dim=C, conv_width=W)
    conv, state = _pair(rng)
    with pytest.raises(ValueError, match=r"state must be \(2, 3, 4, 5\)"):
        cache.write(conv, state[:1], 1)
    with pytest.raises(ValueError, match=r"conv_state must be \(2, 6, 3\)"):
        cache.write(conv[..., :2], state, 1)
    assert cache.length == 0
