"""torch_attention.linear_cache, the decode caches' torch twin: the same reads and writes as the
NumPy caches, the paged pool's other rows untouched, float32 states for half-precision layers, and
the NumPy twin's words for every refusal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import linear_cache as np_cache
from torch_attention import linear_cache as torch_cache

B, H, K, V, C, W = 2, 3, 4, 5, 6, 4


def test_paged_writes_and_reads_match_the_numpy_twin(rng):
    conv, state = rng.standard_normal((B, C, W - 1)), rng.standard_normal((B, H, K, V))
    t = torch_cache.PagedLinearStateCache([3, 0], 5, H, K, V, conv_dim=C, conv_width=W)
    n = np_cache.PagedLinearStateCache([3, 0], 5, H, K, V, conv_dim=C, conv_width=W)

    t.write(torch.from_numpy(conv), torch.from_numpy(state), 2)
    n.write(conv, state, 2)

    for mine, theirs in zip(t.pool, n.pool, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs)
    np.testing.assert_array_equal(t.read()[1].numpy(), state)
    assert t.length == n.length == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_half_precision_layers_keep_float32_states(dtype):
    cache = torch_cache.LinearStateCache(B, H, K, V, dtype=dtype)
    cache.write(None, torch.full((B, H, K, V), 1.0 + 2**-12, dtype=torch.float32), 1)
    assert cache.read()[1].dtype == torch.float32
    assert float(cache.read()[1][0, 0, 0, 0]) == 1.0 + 2**-12  # not rounded to bf16 / fp16


def test_check_uses_the_numpy_twins_words():
    t = torch_cache.LinearStateCache(B, H, K, V, conv_dim=C, conv_width=W)
    n = np_cache.LinearStateCache(B, H, K, V, conv_dim=C, conv_width=W)
    with pytest.raises(ValueError) as torch_error:
        t.check(B + 1, H, K, V, C, W)
    with pytest.raises(ValueError) as numpy_error:
        n.check(B + 1, H, K, V, C, W)
    assert str(torch_error.value) == str(numpy_error.value)


def test_refuses_shared_slots_and_wrong_shapes():
    with pytest.raises(ValueError, match="slot_ids must be distinct"):
        torch_cache.PagedLinearStateCache([1, 1], 3, H, K, V)
    cache = torch_cache.LinearStateCache(B, H, K, V, conv_dim=C, conv_width=W)
    with pytest.raises(ValueError, match=r"conv_state must be \(2, 6, 3\), got None"):
        cache.write(None, torch.zeros(B, H, K, V), 1)
