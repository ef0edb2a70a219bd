"""The tolerance policy on one tensor: both sides of the inequality, the bias statistic beside
it, lse as the libraries return it, non-finite values, the kept fraction of dropout, and a second
call's result against the first's, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from parity_tests.checker.judge.policy import (
    difference,
    judge_keep,
    judge_lse,
    judge_repeat,
    judge_tensor,
    stored,
    unmeasured,
    wrong_dtype,
)
from parity_tests.tolerances import (
    BIAS_FACTOR,
    BIAS_FLOOR,
    DROPOUT_SIGMAS,
    FLOOR,
    GRAD_FACTOR,
    OUTPUT_FACTOR,
)

GOLD = np.array([[0.5, -2.0], [1.0, 0.25]])  # max|G| = 2
BASE = GOLD + np.array([[1e-3, 0.0], [0.0, -2e-3]])  # max|Bl - G| = 2e-3


@pytest.mark.parametrize(("tensor", "factor"), [("out", OUTPUT_FACTOR), ("dq", GRAD_FACTOR)])
def test_bound_is_factor_times_baseline_plus_floor(tensor, factor):
    row = judge_tensor("c", "float16", tensor, GOLD, GOLD, BASE)

    assert row.baseline == pytest.approx(2e-3) and row.golden_max == 2.0
    assert row.bound == pytest.approx(factor * 2e-3 + FLOOR["float16"] * 2.0)


def test_an_error_above_the_bound_fails_and_one_below_it_does_not():
    bound = OUTPUT_FACTOR * 2e-3 + FLOOR["float16"] * 2.0
    below = GOLD + np.array([[0.99 * bound, 0.0], [0.0, 0.0]])
    above = GOLD + np.array([[0.0, 0.0], [0.0, -1.01 * bound]])

    # One entry of four near the max bound is also far above the RMS bound ("bias"): the max
    # bound's side alone is what this test is about.
    assert judge_tensor("c", "float16", "out", below, GOLD, BASE).verdict != "fail"
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


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x**2)))


def test_a_small_error_everywhere_is_bias_where_one_error_as_large_is_not():
    rng = np.random.default_rng(0)
    gold = rng.standard_normal(10_000)
    base = gold + 1e-2 * rng.choice([-1.0, 1.0], 10_000) * (rng.random(10_000) < 0.05)
    spike = gold.copy()
    spike[7] += 1.9e-2  # one entry off by about twice the baseline's worst: rounding
    everywhere = gold * (1 + 8e-3)  # every entry off by 0.8% of itself: a systematic error

    spiky = judge_tensor("c", "bfloat16", "out", spike, gold, base)
    biased = judge_tensor("c", "bfloat16", "out", everywhere, gold, base)

    assert spiky.verdict == "pass"
    assert biased.error <= biased.bound and biased.verdict == "bias" and biased.failed
    assert biased.rms_error == pytest.approx(_rms(everywhere - gold))
    assert biased.rms_bound == pytest.approx(
        BIAS_FACTOR * _rms(base - gold) + BIAS_FLOOR["bfloat16"] * _rms(gold)
    )
    assert biased.bias_ratio > 1.0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_stored_rounds_as_torch_stores_a_float32_value(dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    values = (rng.standard_normal(20_000) * np.exp(rng.uniform(-8, 8, 20_000))).astype(np.float32)
    # halfway between two bfloat16 neighbours: ties go to the even one, both ways
    ties = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8)], dtype=np.float32)
    values = np.concatenate([values, ties]).astype(np.float64)

    expected = torch.from_numpy(values).float().to(getattr(torch, dtype)).double().numpy()

    np.testing.assert_array_equal(stored(values, dtype), expected)


def test_stored_clips_at_the_largest_finite_value_and_leaves_float64_alone():
    values = np.array([1e6, -1e40, 0.1])

    assert stored(values, "float16")[:2].tolist() == [65504.0, -65504.0]
    assert np.isfinite(stored(values, "bfloat16")).all()
    np.testing.assert_array_equal(stored(values, "float64"), values)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_rms_bound_is_never_below_storing_the_golden(dtype):
    # A kernel that computes exactly and stores its result in the dtype is correct, whatever the
    # baseline did: overflowed (NaN), or happened to round more luckily than storage itself.
    gold = np.random.default_rng(2).standard_normal(10_000) * 7.0
    exact = stored(gold, dtype)
    hot = stored(gold * (1 + 8e-3), dtype)  # 0.8% everywhere: a systematic error
    for base in (np.full_like(gold, np.nan), gold.copy()):
        row = judge_tensor("c", dtype, "out", exact, gold, base)
        biased = judge_tensor("c", dtype, "out", hot, gold, base)

        assert row.verdict == "pass", (row, base[0])
        assert biased.verdict in ("bias", "fail"), (biased, base[0])
        assert row.rms_bound == pytest.approx(
            BIAS_FACTOR * _rms(exact - gold) + BIAS_FLOOR[dtype] * _rms(gold)
        )


@pytest.mark.parametrize("finite_baseline", [True, False])
def test_a_kernel_reading_back_its_stored_output_is_bounded_by_that_answers_error(finite_baseline):
    rng = np.random.default_rng(3)
    gold = rng.standard_normal(4_000)  # max|G| about 3.5: a floor of about 3.5e-3
    base = gold + 1e-3 * rng.choice([-1.0, 1.0], 4_000)  # max|Bl - G| = 1e-3
    if not finite_baseline:
        base[0] = np.nan
    read_back = gold + 1e-2 * np.sign(gold) * (rng.random(4_000) < 0.02)  # max 1e-2
    result = read_back + 2e-3 * rng.choice([-1.0, 1.0], 4_000)  # 1.2e-2 at most: 12x Bl's
    floor = FLOOR["float16"] * np.max(np.abs(gold))

    alone = judge_tensor("c", "float16", "dk", result, gold, base)
    row = judge_tensor("c", "float16", "dk", result, gold, base, read_back)

    assert alone.verdict == "fail"
    assert row.verdict == "pass"
    assert row.bound == pytest.approx(GRAD_FACTOR * 1e-2 + floor)
    assert row.baseline == pytest.approx(1e-2) if finite_baseline else math.isnan(row.baseline)


LSE_GOLD = np.array([[1.5, -np.inf, 0.25]])
LSE_BASE = LSE_GOLD + np.array([[1e-3, 0.0, -1e-3]])


@pytest.mark.parametrize("dead", [-np.inf, np.inf])
def test_lse_of_a_dead_row_may_be_minus_or_plus_inf(dead):
    row = judge_lse("c", "float16", np.array([[1.5, dead, 0.25]]), LSE_GOLD, LSE_BASE)

    assert row.verdict == "pass" and row.tensor == "lse"


@pytest.mark.parametrize("dead", [0.0, np.nan])
def test_lse_of_a_dead_row_must_not_be_finite_or_nan(dead):
    row = judge_lse("c", "float16", np.array([[1.5, dead, 0.25]]), LSE_GOLD, LSE_BASE)

    assert row.verdict == "fail" and "must have lse -inf" in row.detail


def test_the_other_lse_convention_is_accepted_exactly_and_named():
    shift = np.array([[0.5, 0.0, 0.75]])  # slope_h * p_i per row
    shifted = LSE_GOLD + shift

    flash = judge_lse("c", "float32", shifted, LSE_GOLD, LSE_BASE, shifted)
    half_way = judge_lse("c", "float32", LSE_GOLD + shift / 2, LSE_GOLD, LSE_BASE, shifted)

    assert flash.verdict == "pass" and "flash-attn's causal ALiBi convention" in flash.detail
    assert half_way.verdict == "fail"


@pytest.mark.parametrize(
    ("second", "gap"),
    [
        ([0.5, -0.0, np.nan, np.inf], 0.0),  # -0.0 == 0.0, NaN where NaN was: the same
        ([np.nextafter(0.5, 1.0), 0.0, np.nan, np.inf], np.nextafter(0.5, 1.0) - 0.5),
        ([0.5, 0.0, 1.0, np.inf], math.inf),  # a number where NaN was
        ([0.5, 0.0, np.nan, -np.inf], math.inf),
    ],
)
def test_a_second_result_differs_where_its_bits_do_and_by_how_much(second, gap):
    first = np.array([0.5, 0.0, np.nan, np.inf])

    assert difference(first, np.array(second)) == gap
    assert difference(np.array(second), first) == gap


def test_a_result_that_differs_from_call_to_call_is_flagged_with_a_bound_of_zero():
    row = judge_repeat("c", "float16", "dq", 4.9e-4)

    assert (row.tensor, row.verdict, row.error, row.bound) == ("dq", "nondeterministic", 4.9e-4, 0)
    assert row.failed and "max|difference| 0.00049" in row.detail
