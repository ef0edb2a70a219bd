"""The checker's report: row verdicts, the error / bound ratio, group statuses, and a verdict that
never passes a kernel on skips."""

from __future__ import annotations

import math

import pytest

from parity_tests.checker.report import (
    FAILING,
    VERDICTS,
    KernelReport,
    KernelRow,
    coverage_counts,
    coverage_summary,
    group_status,
    statuses_pass,
)


def _row(case: str, verdict: str, error: float = 1e-7, bound: float = 1e-6) -> KernelRow:
    return KernelRow(case, "float32", "out", error, 1e-7, 1.0, bound, verdict)


def _report(statuses: list[str]) -> KernelReport:
    return KernelReport(
        "kernel", "cpu", rows=[_row(f"case-{i}", status) for i, status in enumerate(statuses)]
    )


@pytest.mark.parametrize(
    ("error", "bound", "ratio"),
    [(1e-7, 1e-6, 0.1), (0.0, 0.0, 0.0), (1e-9, 0.0, math.inf), (math.inf, 1e-6, math.inf)],
)
def test_ratio_is_error_over_bound(error, bound, ratio):
    assert _row("c", "pass", error, bound).ratio == pytest.approx(ratio)


def test_ratio_of_an_unmeasured_row_is_nan():
    row = KernelRow("c", "float32", "-", math.nan, math.nan, math.nan, math.nan, "error")

    assert math.isnan(row.ratio)


def test_every_verdict_but_pass_skip_and_not_run_fails():
    assert set(FAILING) == set(VERDICTS) - {"pass", "skip", "not-run"}
    assert all(_row("c", verdict).failed for verdict in FAILING)
    assert "bias" in FAILING


@pytest.mark.parametrize(
    ("verdicts", "status"),
    [
        (["pass", "pass"], "pass"),
        (["pass", "skip"], "skip"),
        (["skip", "inplace"], "fail"),
        (["pass", "dtype"], "fail"),
        (["pass", "bias"], "fail"),
        (["not-run"], "not-run"),
    ],
)
def test_group_status(verdicts, status):
    assert group_status([_row("c", verdict) for verdict in verdicts]) == status


@pytest.mark.parametrize(
    ("statuses", "passed"),
    [
        (["pass", "pass", "skip"], True),
        (["pass", "skip"], True),
        (["pass", "skip", "skip"], False),  # skips outnumber passes
        (["skip"], False),
        ([], False),
        (["pass", "fail"], False),
        (["pass", "not-run", "not-run"], True),  # not run is neither a pass nor a refusal
        (["not-run"], False),
    ],
)
def test_a_report_whose_skips_outnumber_its_passes_has_not_passed(statuses, passed):
    assert _report(statuses).passed is passed


def test_coverage_is_the_fraction_of_groups_not_skipped():
    report = _report(["pass", "skip", "pass", "skip"])

    assert report.coverage == 0.5
    assert report.groups == {
        ("case-0", "float32"): "pass",
        ("case-1", "float32"): "skip",
        ("case-2", "float32"): "pass",
        ("case-3", "float32"): "skip",
    }


def test_the_summary_says_how_much_of_the_battery_the_verdict_covers():
    assert _report(["pass", "pass", "pass", "skip"]).summary == (
        "pass: 3 of 4 case-dtype groups judged (75%), 1 skipped"
    )
    assert _report(["pass", "skip", "skip"]).summary == (
        "fail: only 1 of 3 case-dtype groups judged (33%), 2 skipped; skips outnumber passes, "
        "so this is not a pass"
    )


def test_expected_failures_pass_the_verdict_and_unexpected_passes_fail_it():
    assert statuses_pass(["pass", "xfail", "skip"])
    assert not statuses_pass(["pass", "xpass"])
    assert coverage_summary(["xpass", "pass"]).startswith("fail: 1 failing groups")


def test_expected_failures_are_counted_apart_never_as_judged():
    """A documented failure (a case that raised and was never compared, say) is neither a judged
    group nor a skip: every count and summary says how many there were."""
    statuses = ["pass", "pass", "pass", "xfail"]

    assert coverage_counts(statuses) == {
        "judged": 3,
        "failing": 0,
        "expected_failures": 1,
        "skipped": 0,
        "not_run": 0,
        "total": 4,
        "fraction": 0.75,
    }
    assert coverage_summary(statuses) == (
        "pass: 3 of 4 case-dtype groups judged (75%), 1 expected failure"
    )
    assert coverage_summary(["pass", "xfail", "xfail", "skip", "not-run", "xpass"]) == (
        "fail: 1 failing groups; 2 of 6 case-dtype groups judged (33%), 2 expected failures, "
        "1 skipped, 1 not run (features not declared)"
    )


def test_an_empty_report_has_not_passed():
    report = KernelReport("nothing", "cpu")

    assert not report.passed and report.coverage == 0.0
    assert report.summary == "fail: nothing was checked"


def test_groups_not_run_are_not_judged_and_said_so():
    report = _report(["pass", "not-run", "skip", "pass"])

    assert report.coverage == 0.5
    assert report.summary == (
        "pass: 2 of 4 case-dtype groups judged (50%), 1 skipped, 1 not run (features not declared)"
    )


@pytest.mark.parametrize(
    ("rms_error", "rms_bound", "ratio"), [(2e-6, 1e-6, 2.0), (0.0, 0.0, 0.0), (1e-9, 0.0, math.inf)]
)
def test_bias_ratio_is_rms_error_over_rms_bound(rms_error, rms_bound, ratio):
    row = KernelRow("c", "float32", "out", 0.0, 0.0, 1.0, 1.0, "pass", "", 0, rms_error, rms_bound)

    assert row.bias_ratio == pytest.approx(ratio)
    assert math.isnan(_row("c", "pass").bias_ratio)
