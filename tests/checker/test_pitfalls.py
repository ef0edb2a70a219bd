"""The checker has teeth: every classic mistake is flagged on its case (here in bfloat16, the
loosest dtype; in every dtype over 60 seeds by ``python -m parity_tests --calibrate 60``), while
correct kernels pass in every dtype (docs/pitfalls.md); each pitfall's case is in its spec's quick
battery. Today's options' pitfalls: test_pitfalls_today.py."""

from __future__ import annotations

import pytest
import torch.nn.functional as F

from parity_tests import check_kernel
from parity_tests.checker import pitfalls_today
from parity_tests.checker.pipeline import battery_for
from parity_tests.checker.pitfalls import PITFALLS
from parity_tests.checker.targets.builtin import torch_attention_kernel

CLASSIC = sorted(
    name
    for name, pitfall in PITFALLS.items()
    if pitfall.kernel.__module__ != pitfalls_today.__name__
)


def assert_flagged_on_its_case_and_tensor(name: str) -> None:
    """Pitfall ``name`` fails on the case and tensor ``PITFALLS`` names, in bfloat16 (the loosest
    dtype; every dtype over 60 seeds: python -m parity_tests --calibrate)."""
    pitfall = PITFALLS[name]

    report = check_kernel(pitfall.kernel, spec=pitfall.spec, dtypes=["bfloat16"],
                          cases=[pitfall.case])  # fmt: skip

    assert not report.passed
    assert (pitfall.case, "bfloat16", pitfall.tensor) in {
        (row.case, row.dtype, row.tensor) for row in report.failures
    }


@pytest.mark.parametrize("name", CLASSIC)
def test_pitfall_is_flagged_on_its_case_and_tensor(name):
    assert_flagged_on_its_case_and_tensor(name)


def test_a_one_percent_temperature_error_is_flagged_in_bfloat16_by_the_bias_statistic():
    report = check_kernel(PITFALLS["temperature_1pct"].kernel, dtypes=["bfloat16"],
                          cases="quick")  # fmt: skip

    by_max = {row.case for row in report.rows if row.verdict == "fail"}
    by_rms = {row.case for row in report.rows if row.verdict == "bias"}
    assert not report.passed
    assert by_rms - by_max  # cases that the max bound alone would pass


@pytest.mark.parametrize(
    ("kernel", "dtype"),
    [(F.scaled_dot_product_attention, "bfloat16"), (torch_attention_kernel("math"), "float16")],
    ids=["sdpa-bfloat16", "torch_attention-math-float16"],
)
def test_correct_kernels_pass_so_no_false_positives(kernel, dtype):
    # The quick battery holds every value of every factor; the default battery over 60 seeds in
    # every dtype is python -m parity_tests --calibrate 60.
    report = check_kernel(kernel, dtypes=[dtype], cases="quick", seed=1)

    assert report.passed, report.failures


@pytest.mark.parametrize("name", sorted(PITFALLS))
def test_the_quick_battery_of_each_pitfalls_spec_holds_its_case(name):
    pitfall = PITFALLS[name]

    assert pitfall.case in {case.name for case in battery_for(pitfall.spec, "quick")}
