"""The classic mistakes through SDPA's signature: a one-percent temperature error is flagged in
bfloat16 by the bias statistic where the max bound alone would pass it, while correct kernels
pass the same battery (no false positives)."""

from __future__ import annotations

import pytest
import torch.nn.functional as F

from parity_tests import check_kernel
from parity_tests.checker.pitfalls.sdpa import PITFALLS
from parity_tests.checker.targets.torch_kernels import torch_attention_kernel


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
