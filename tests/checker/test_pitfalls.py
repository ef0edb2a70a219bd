"""The checker has teeth: every classic mistake is flagged in every dtype, while correct kernels
pass in every dtype (docs/pitfalls.md)."""

from __future__ import annotations

import pytest
import torch.nn.functional as F

from parity_tests import check_kernel
from parity_tests.checker.battery import QUICK
from parity_tests.checker.pitfalls import PITFALLS
from parity_tests.checker.targets import torch_attention_kernel

DTYPES = ("float32", "float16", "bfloat16")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(PITFALLS))
def test_pitfall_is_flagged_on_its_case_and_tensor(name, dtype):
    pitfall = PITFALLS[name]

    report = check_kernel(pitfall.kernel, dtypes=[dtype], cases=[pitfall.case])

    assert not report.passed
    assert (pitfall.case, dtype, pitfall.tensor) in {
        (row.case, row.dtype, row.tensor) for row in report.failures
    }


@pytest.mark.parametrize("name", sorted(PITFALLS))
def test_pitfall_fails_the_default_battery(name):
    report = check_kernel(PITFALLS[name].kernel, dtypes=["bfloat16"], seed=1)

    assert not report.passed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "kernel",
    [F.scaled_dot_product_attention, torch_attention_kernel("math")],
    ids=["sdpa", "torch_attention-math"],
)
def test_correct_kernels_pass_so_no_false_positives(kernel, dtype):
    report = check_kernel(kernel, dtypes=[dtype], seed=1)

    assert report.passed, report.failures


def test_the_quick_battery_holds_the_case_that_flags_each_pitfall():
    assert {pitfall.case for pitfall in PITFALLS.values()} <= {case.name for case in QUICK}
