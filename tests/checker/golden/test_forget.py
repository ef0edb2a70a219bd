"""parity_tests.checker.golden.forget: every family's cached inputs, goldens and baselines are
emptied, and the count of what went is returned."""

from __future__ import annotations

import torch

from parity_tests.checker import golden
from parity_tests.checker.battery.catalog import select
from parity_tests.checker.golden import attention


def test_forget_empties_every_family_s_caches():
    case = select("sdpa", "quick", None)[0]  # plain-128x129-d64
    attention.reference(case, "float32", torch.device("cpu"), 0)
    held = attention.case_inputs.cache_info().currsize + (
        attention._reference_cached.cache_info().currsize
    )
    assert held >= 2

    gone = golden.forget()

    assert gone >= held
    assert attention.case_inputs.cache_info().currsize == 0
    assert attention._reference_cached.cache_info().currsize == 0
    assert golden.forget() == 0


def test_every_caching_module_is_a_golden_module_with_a_cache():
    import importlib

    for name in golden.CACHING:
        module = importlib.import_module(f"parity_tests.checker.golden.{name}")
        assert any(hasattr(value, "cache_clear") for value in vars(module).values()), name
