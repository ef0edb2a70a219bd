"""The refusals of torch_attention.decode.paged.kvcache_attention (torch_attention.decode.checks,
through the pure-Python checker the twins share), the NumPy twin's cases
(tests/numpy_attention/decode/test_checks.py): the same errors, nothing written to either
cache."""

from __future__ import annotations

import pytest
import torch

from torch_attention.decode.paged import kvcache_attention

from ...numpy_attention.decode.test_checks import BAD, _bad, paged_call
from .test_paged import _torch


@pytest.mark.parametrize("name", ["past the block table", "page out of range", "float table",
                                  "short rotary", "shared slot"])  # fmt: skip
def test_bad_input_is_refused_as_numpy_refuses_it_and_nothing_is_written(rng, name):
    call = paged_call(rng)
    changes, error, match = BAD[name]
    call.update({arg: _bad(call, arg, value) if isinstance(value, str) else value
                 for arg, value in changes.items()})  # fmt: skip
    given = _torch(call)
    before = given["k_cache"].clone(), given["v_cache"].clone()

    with pytest.raises(error, match=match):
        kvcache_attention(**given)

    assert torch.equal(given["k_cache"], before[0]) and torch.equal(given["v_cache"], before[1])
