"""The checker's report: row verdicts in three outcomes never mixed (flagged, refused, error), the
error / bound ratio, group statuses, groups outside the kernel's limits counted apart, and a
verdict that never passes a kernel on skips."""

from __future__ import annotations

import math

import pytest

from parity_tests.checker.report.rows import (
    FAILING,
    OUTCOMES,
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


def test_every_verdict_but_pass_skip_and_not_run_fails_in_exactly_one_outcome():
    assert set(FAILING) == set(VERDICTS) - {"pass", "skip", "not-run"}
    assert sorted(FAILING) == sorted({v for verdicts in OUTCOMES.values() for v in verdicts})
    assert all(_row("c", verdict).failed for verdict in FAILING)
    assert "bias" in OUTCOMES["flagged"] and OUTCOMES["refused"] == ("refused",)
    assert "dtype" in OUTCOMES["error"]


@pytest.mark.parametrize(
    ("verdicts", "status"),
    [
        (["pass", "pass"], "pass"),
        (["pass", "skip"], "skip"),
        (["skip", "inplace"], "fail"),
        (["pass", "dtype"], "error"),
        (["pass", "bias"], "fail"),
        (["not-run"], "not-run"),
        (["pass", "refused"], "refused"),
        (["refused", "error"], "error"),  # the forward a wrong dtype, the backward refused
        (["fail", "refused"], "fail"),  # wrong numbers first: they are the silent failure
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
        (["pass", "refused"], False),  # a refusal of a declared feature fails the verdict
        (["pass", "error"], False),
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
        "flagged": 0,
        "refused": 0,
        "error": 0,
        "expected_failures": 1,
        "skipped": 0,
        "not_run": 0,
        "outside_limits": 0,
        "total": 4,
        "fraction": 0.75,
    }
    assert coverage_summary(statuses) == (
        "pass: 3 of 4 case-dtype groups judged (75%), 1 expected failure"
    )
    assert coverage_summary(["pass", "xfail", "xfail", "skip", "not-run", "xpass"]) == (
        "fail: 1 failing groups (1 unexpected pass); 2 of 6 case-dtype groups judged (33%), "
        "2 expected failures, 1 skipped, 1 not run (features not declared)"
    )


def test_the_summary_counts_flagged_refused_and_errors_apart():
    statuses = ["pass", "fail", "refused", "refused", "error"]

    counts = coverage_counts(statuses)

    assert (counts["failing"], counts["flagged"], counts["refused"], counts["error"]) == (
        4,
        1,
        2,
        1,
    )
    assert coverage_summary(statuses) == (
        "fail: 4 failing groups (1 flagged, 2 refused, 1 error); 5 of 5 case-dtype groups "
        "judged (100%)"
    )


def test_groups_outside_the_kernels_limits_are_counted_apart_from_undeclared_features():
    report = _report(["pass", "not-run", "not-run", "not-run"])
    report.excluded = {"case-2": ("N = 37 not a multiple of 64", "plain-64x128-d64"),
                       "case-3": ("N != M", "plain-64x64-d64")}  # fmt: skip

    assert report.outside_limits == 2
    assert report.summary == (
        "pass: 1 of 4 case-dtype groups judged (25%), 3 not run (1 for features not declared, "
        "2 outside the kernel's limits)"
    )
    assert coverage_summary(["pass", "not-run"], outside_limits=1).endswith(
        "1 not run (outside the kernel's limits)"
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
