"""numpy_attention.hf.rows: the row modules and how families.py joins them. What each row reads is
test_families.py's; against transformers, tests/parity/test_hf_models.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from numpy_attention.hf import families
from numpy_attention.hf.family import Family
from numpy_attention.hf.rows import classic, fused, gated, hybrids, twists

MODULES = (classic, fused, hybrids, gated, twists)


def test_every_row_is_in_exactly_one_module() -> None:
    names = [name for module in MODULES for name in module.ROWS]
    assert len(names) == len(set(names))
    assert set(names) == set(families.FAMILIES)
    for module in MODULES:
        for name, row in module.ROWS.items():
            assert families.FAMILIES[name] is row


def test_a_row_in_two_modules_is_refused_not_overridden() -> None:
    one = SimpleNamespace(ROWS={"llama": Family()})
    two = SimpleNamespace(ROWS={"llama": Family(bias=None)})
    with pytest.raises(ValueError, match="'llama' has a row in two modules"):
        families.join_rows(one, two)
    assert families.join_rows(one, SimpleNamespace(ROWS={})) == {"llama": Family()}


def test_no_model_type_is_both_a_row_and_refused() -> None:
    assert not set(families.FAMILIES) & set(families.REFUSED)
