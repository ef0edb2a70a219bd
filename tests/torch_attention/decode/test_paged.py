"""torch_attention.decode.paged, the torch twin of numpy_attention.decode.paged: kvcache_attention
against the NumPy reference in float64 on every case of its tests (out, lse and both caches after
the call), and float32 by the suite's tolerance. Half precision is the kernel checker's to judge
(tests/checker/running/test_decode.py runs this twin as the built-in target of the "flash_kvcache"
spec); the refusals: test_checks.py; the page pool: test_pages.py, test_cache.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.decode.paged import kvcache_attention_forward
from torch_attention.decode.paged import kvcache_attention

from ...conftest import assert_close, to_torch
from ...numpy_attention.decode.test_paged import CASES, make_call


def _torch(call: dict, dtype: torch.dtype = torch.float64) -> dict:
    """The call's arrays as tensors, floats in ``dtype``."""
    return {
        name: (to_torch(t).to(dtype) if t.dtype == np.float64 else to_torch(t))
        if isinstance(t, np.ndarray)
        else t
        for name, t in call.items()
    }


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_numpy_reference(rng, name):
    call = make_call(rng, CASES[name])
    given = _torch(call)
    expected = kvcache_attention_forward(**call, return_lse=True)  # writes call's caches

    result = kvcache_attention(**given, return_lse=True)

    assert_close(result.out, expected.out, name="out")
    finite = np.isfinite(expected.lse)
    np.testing.assert_array_equal(np.isneginf(result.lse.numpy()), np.isneginf(expected.lse))
    assert_close(result.lse.numpy()[finite], expected.lse[finite], name="lse")
    np.testing.assert_array_equal(given["k_cache"].numpy(), call["k_cache"])
    np.testing.assert_array_equal(given["v_cache"].numpy(), call["v_cache"])


def test_float32_follows_float64(rng):
    call = make_call(rng, CASES["rotary-interleaved-causal"])
    expected = kvcache_attention_forward(**call, return_lse=True)

    result = kvcache_attention(**_torch(call, torch.float32), return_lse=True)

    assert result.out.dtype == torch.float32
    assert_close(result.out, expected.out, dtype=np.float32, name="out")
