"""Every spec has teeth: every pitfall of every spec (``pitfalls.all_pitfalls``) is flagged on
the case and tensor its table names, here in bfloat16, the loosest dtype (in every dtype over 60
seeds of the default battery by ``python -m parity_tests --calibrate 60``, docs/pitfalls.md),
and that case is in its spec's quick battery; the pitfalls' names are disjoint and each kernel
is importable from the package by its name."""

from __future__ import annotations

import pytest

from parity_tests import check_kernel
from parity_tests.checker import pitfalls
from parity_tests.checker.battery.catalog import select
from parity_tests.checker.pitfalls import all_pitfalls

PITFALLS = all_pitfalls()


def assert_flagged_on_its_case_and_tensor(name: str) -> None:
    """Pitfall ``name`` fails on the case and tensor its table names, in bfloat16 (the loosest
    dtype; every dtype over 60 seeds: python -m parity_tests --calibrate)."""
    pitfall = PITFALLS[name]

    report = check_kernel(pitfall.kernel, spec=pitfall.spec, dtypes=["bfloat16"],
                          cases=[pitfall.case])  # fmt: skip

    assert not report.passed
    assert (pitfall.case, "bfloat16", pitfall.tensor) in {
        (row.case, row.dtype, row.tensor) for row in report.failures
    }


@pytest.mark.parametrize("name", sorted(PITFALLS))
def test_pitfall_is_flagged_on_its_case_and_tensor(name):
    assert_flagged_on_its_case_and_tensor(name)


@pytest.mark.parametrize("name", sorted(PITFALLS))
def test_the_quick_battery_of_each_pitfalls_spec_holds_its_case(name):
    pitfall = PITFALLS[name]

    assert pitfall.case in {case.name for case in select(pitfall.spec, "quick")}


def test_each_pitfall_is_importable_by_its_name_for_the_cli():
    assert pitfalls.alibi_sign is PITFALLS["alibi_sign"].kernel
    assert pitfalls.PITFALLS.keys() == PITFALLS.keys()
    with pytest.raises(AttributeError):
        pitfalls.no_such_pitfall  # noqa: B018
