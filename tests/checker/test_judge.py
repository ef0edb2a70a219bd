"""The tolerance policy on one tensor: both sides of the inequality, non-finite values, and the
kept fraction of dropout."""

from __future__ import annotations

import math

import numpy as np
import pytest

from parity_tests.checker.judge import judge_keep, judge_tensor, unmeasured, wrong_dtype
from parity_tests.tolerances import DROPOUT_SIGMAS, FLOOR, GRAD_FACTOR, OUTPUT_FACTOR

GOLD = np.array([[0.5, -2.0], [1.0, 0.25]])  # max|G| = 2
BASE = GOLD + np.array([[1e-3, 0.0], [0.0, -2e-3]])  # max|Bl - G| = 2e-3


@pytest.mark.parametrize(("tensor", "factor"), [("out", OUTPUT_FACTOR), ("dq", GRAD_FACTOR)])
def test_bound_is_factor_times_baseline_plus_floor(tensor, factor):
    row = judge_tensor("c", "float16", tensor, GOLD, GOLD, BASE)

    assert row.baseline == pytest.approx(2e-3) and row.golden_max == 2.0
    assert row.bound == pytest.approx(factor * 2e-3 + FLOOR["float16"] * 2.0)


def test_an_error_above_the_bound_fails_and_one_below_it_passes():
    bound = OUTPUT_FACTOR * 2e-3 + FLOOR["float16"] * 2.0
    below = GOLD + np.array([[0.99 * bound, 0.0], [0.0, 0.0]])
    above = GOLD + np.array([[0.0, 0.0], [0.0, -1.01 * bound]])

    assert judge_tensor("c", "float16", "out", below, GOLD, BASE).verdict == "pass"
    row = judge_tensor("c", "float16", "out", above, GOLD, BASE)
    assert row.verdict == "fail" and row.ratio == pytest.approx(1.01)


def test_nan_where_the_golden_is_finite_is_nonfinite_and_elsewhere_ignored():
    gold = np.array([1.0, np.inf])
    poisoned = judge_tensor("c", "float32", "out", np.array([np.nan, 0.0]), gold, gold)
    outside = judge_tensor("c", "float32", "out", np.array([1.0, np.nan]), gold, gold)

    assert poisoned.verdict == "nonfinite" and poisoned.error == math.inf
    assert outside.verdict == "pass" and outside.error == 0.0


def test_a_baseline_that_overflowed_leaves_the_floor_alone():
    row = judge_tensor("c", "bfloat16", "dk", GOLD, GOLD, np.full_like(GOLD, np.inf))

    assert math.isnan(row.baseline) and row.bound == FLOOR["bfloat16"] * 2.0
    assert row.detail == "floor-only bound: baseline NaN/inf"


def test_the_kept_fraction_is_judged_within_binomial_sigmas():
    keep = np.arange(10_000) % 10 < 7  # kept fraction exactly 0.7
    bound = DROPOUT_SIGMAS * math.sqrt(0.3 * 0.7 / 10_000)

    right = judge_keep("c", "float32", 0.3, keep)
    nothing_dropped = judge_keep("c", "float32", 0.3, np.ones(10_000, dtype=bool))

    assert right.verdict == "pass" and right.error == pytest.approx(0.0, abs=1e-12)
    assert right.bound == pytest.approx(bound)
    assert nothing_dropped.verdict == "fail" and nothing_dropped.error == pytest.approx(0.3)


def test_a_wrong_dtype_keeps_its_numbers_and_fails():
    row = judge_tensor("c", "float32", "out", GOLD, GOLD, BASE)

    wrong = wrong_dtype(row, "float64")

    assert (wrong.error, wrong.bound) == (row.error, row.bound)
    assert wrong.verdict == "dtype" and wrong.failed
    assert wrong.detail == "out is float64, the inputs are float32"


def test_an_unmeasured_row_has_no_numbers():
    row = unmeasured("c", "float32", "error", "RuntimeError: boom", 2)

    assert row.tensor == "-" and math.isnan(row.error) and row.exception == 2
