"""The decode specs have teeth: every decode pitfall is flagged on its case and tensor (here in
bfloat16, the loosest dtype; in every dtype over 60 seeds by python -m
parity_tests.checker.calibration.decode 60), and its case is in its spec's battery."""

from __future__ import annotations

import pytest

from parity_tests import check_kernel
from parity_tests.checker.battery.decode_case import DECODE_BATTERIES
from parity_tests.checker.pitfalls_decode import DECODE_PITFALLS


@pytest.mark.parametrize("name", sorted(DECODE_PITFALLS))
def test_pitfall_is_flagged_on_its_case_and_tensor(name):
    pitfall = DECODE_PITFALLS[name]

    report = check_kernel(pitfall.kernel, spec=pitfall.spec, dtypes=["bfloat16"],
                          cases=[pitfall.case])  # fmt: skip

    assert not report.passed
    assert (pitfall.tensor, "bfloat16") in {(row.tensor, row.dtype) for row in report.failures}


def test_each_pitfalls_case_is_in_its_specs_battery():
    for pitfall in DECODE_PITFALLS.values():
        assert pitfall.case in {case.name for case in DECODE_BATTERIES[pitfall.spec]}
