"""Today's options have pitfalls with teeth too: each kernel of ``checker.pitfalls_today`` (GQA,
alignment, windows, softcap, ALiBi, lse, varlen, the ring's block offset) is flagged on the case
and tensor ``PITFALLS`` names for it (here in bfloat16, the loosest dtype; in every dtype over 60
seeds by ``python -m parity_tests --calibrate 60``)."""

from __future__ import annotations

import pytest

from parity_tests.checker import pitfalls_today
from parity_tests.checker.pitfalls import PITFALLS

from .test_pitfalls import assert_flagged_on_its_case_and_tensor

TODAY = sorted(
    name
    for name, pitfall in PITFALLS.items()
    if pitfall.kernel.__module__ == pitfalls_today.__name__
)


@pytest.mark.parametrize("name", TODAY)
def test_pitfall_is_flagged_on_its_case_and_tensor(name):
    assert_flagged_on_its_case_and_tensor(name)
