"""Today's options have pitfalls with teeth too: each kernel of ``checker.pitfalls_today`` (GQA,
alignment, windows, softcap, ALiBi, lse, varlen, the ring's block offset) is flagged on the case
and tensor ``PITFALLS`` names for it (here in bfloat16, the loosest dtype; in every dtype over 60
seeds by ``python -m parity_tests --calibrate 60``)."""

from __future__ import annotations

import pytest

from parity_tests import check_kernel
from parity_tests.checker import pitfalls_today
from parity_tests.checker.pitfalls import PITFALLS

TODAY = sorted(
    name
    for name, pitfall in PITFALLS.items()
    if pitfall.kernel.__module__ == pitfalls_today.__name__
)


@pytest.mark.parametrize("name", TODAY)
def test_pitfall_is_flagged_on_its_case_and_tensor(name):
    # bfloat16, the loosest dtype; every dtype over 60 seeds: python -m parity_tests --calibrate
    pitfall = PITFALLS[name]

    report = check_kernel(pitfall.kernel, spec=pitfall.spec, dtypes=["bfloat16"],
                          cases=[pitfall.case])  # fmt: skip

    assert not report.passed
    assert (pitfall.case, "bfloat16", pitfall.tensor) in {
        (row.case, row.dtype, row.tensor) for row in report.failures
    }
