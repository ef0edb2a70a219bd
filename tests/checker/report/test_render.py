"""The checker's tables and JSON: statuses against the expected failures, each exception printed
once with its traceback, the failing rows summed up, the main job's summary (one line per
target and per expected failure, expected failures counted apart), the versions the report
records, and strict JSON with non-finite numbers flagged."""

from __future__ import annotations

import importlib.metadata
import json
import math
import platform
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import parity_tests
from parity_tests import check_kernel
from parity_tests.checker.battery.catalog import everything
from parity_tests.checker.report.render import (
    check_entry,
    environment,
    failing_lines,
    jsonable,
    packages,
    print_checks,
    print_summary,
    project,
    row_dict,
    total_line,
)
from parity_tests.checker.report.rows import KernelReport, KernelRow
from parity_tests.checker.specs import get
from parity_tests.checker.targets import expected as targets

CASES = {case.name: case for case in everything()}


def _report(*rows: KernelRow) -> KernelReport:
    return KernelReport("k", "cpu", list(rows), cases=CASES)


def _row(case: str, verdict: str, tensor: str = "out", detail: str = "") -> KernelRow:
    return KernelRow(case, "float32", tensor, 2e-6, 1e-7, 1.0, 1e-6, verdict, detail)


def _raises(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    raise RuntimeError("kernel exploded")


def test_groups_carry_their_shape_status_and_rows():
    report = _report(_row("dv>d", "pass"), _row("dv>d", "fail", "dq"))

    (group,) = check_entry(report, target="k", battery="quick", judged=True)["groups"]

    assert group["shape"] == {"B": 2, "H": 2, "N": 37, "M": 113, "D": 32, "Dv": 64}
    assert group["status"] == "fail" and group["note"] == "dq fail"
    assert [row["verdict"] for row in group["rows"]] == ["pass", "fail"]
    assert group["rows"][1]["ratio"] == pytest.approx(2.0)


@pytest.mark.parametrize(("verdict", "status"), [("nonfinite", "xfail"), ("pass", "xpass")])
def test_expected_failures_turn_into_xfail_or_xpass(monkeypatch, verdict, status):
    entry = targets.ExpectedFailure("k", "plain", "a documented deviation")
    monkeypatch.setattr(targets, "EXPECTED_FAILURES", (entry,))

    check = check_entry(_report(_row("plain", verdict)), target="k", battery="b", judged=True)

    assert check["groups"][0]["status"] == status
    assert check["verdict"] == ("pass" if status == "xfail" else "fail")


@pytest.mark.parametrize(
    ("verdict", "detail", "status"),
    [
        ("pass", "-", "pass"),  # not strict: passing is fine
        ("error", "CppCompileError: boom", "xfail"),  # the failure it documents
        ("error", "RuntimeError: something else", "error"),  # any other failure still fails
    ],
)
def test_an_order_dependent_expected_failure_explains_only_its_own_failure(
    monkeypatch, verdict, detail, status
):
    entry = targets.ExpectedFailure("k", "*", "why", detail="CppCompileError", strict=False)
    monkeypatch.setattr(targets, "EXPECTED_FAILURES", (entry,))

    report = _report(_row("plain", verdict, "out", detail))
    check = check_entry(report, target="k", battery="b", judged=True)

    assert check["groups"][0]["status"] == status
    assert check["verdict"] == ("fail" if status == "error" else "pass")


def test_stress_findings_have_no_verdict():
    check = check_entry(_report(_row("plain", "fail")), target="k", battery="stress", judged=False)

    assert check["verdict"] is None and check["groups"][0]["status"] == "fail"
    assert failing_lines([check]) == []


def test_coverage_is_reported_per_check():
    report = _report(_row("plain", "pass"), _row("dv>d", "skip", "-", "no Dv != D here"))

    check = check_entry(report, target="k", battery="b", judged=True)

    assert check["coverage"] == {
        "judged": 1,
        "failing": 0,
        "flagged": 0,
        "refused": 0,
        "error": 0,
        "expected_failures": 0,
        "skipped": 1,
        "not_run": 0,
        "outside_limits": 0,
        "total": 2,
        "fraction": 0.5,
    }
    assert check["limits"] is None
    assert check["summary"] == "pass: 1 of 2 case-dtype groups judged (50%), 1 skipped"


def test_an_expected_failure_is_not_counted_as_judged(monkeypatch):
    entry = targets.ExpectedFailure("k", "plain", "a documented deviation")
    monkeypatch.setattr(targets, "EXPECTED_FAILURES", (entry,))
    report = _report(
        _row("plain", "error", "-", "RuntimeError: never compared"), _row("dv>d", "pass")
    )

    check = check_entry(report, target="k", battery="b", judged=True)

    assert check["coverage"]["judged"] == 1 and check["coverage"]["expected_failures"] == 1
    assert check["summary"] == "pass: 1 of 2 case-dtype groups judged (50%), 1 expected failure"


def test_each_exception_is_printed_once_with_its_traceback():
    report = check_kernel(_raises, dtypes=["float32", "float16"], cases=["plain", "causal-n<m"])
    check = check_entry(report, target="k", battery="b", judged=True)
    lines: list[str] = []

    print_checks([check], "kernels", lines.append)

    text = "\n".join(lines)
    assert text.count("RuntimeError: kernel exploded") == 1
    assert "exception #1, raised in 4 groups" in text and "Traceback" in text
    assert text.count("error (exception #1)") == 4


def test_the_failing_rows_are_summed_up_with_their_shapes():
    report = _report(_row("plain", "pass"), _row("dv>d", "fail", "dq"), _row("plain", "pass", "dq"))
    check = check_entry(report, target="k", battery="b", judged=True)

    (line,) = failing_lines([check])

    assert line.startswith("k on cpu: dv>d float32 (B=2 H=2 N=37 M=113 D=32 Dv=64): dq fail")
    assert "error 2.00e-06, bound 1.00e-06" in line


def test_a_check_that_covers_too_little_is_named_in_the_summary():
    skips = [_row(name, "skip", "-", "no") for name in ("plain", "dv>d")]
    check = check_entry(_report(_row("dv<d", "pass"), *skips), target="k", battery="b", judged=True)

    (line,) = failing_lines([check])

    assert check["verdict"] == "fail" and "skips outnumber passes" in line


@dataclass
class _LayerRow:
    case: str
    error: float
    bound: float
    passed: bool


def test_layer_rows_get_the_same_lowercase_verdicts():
    assert row_dict(_LayerRow("c", 1e-3, 2e-5, False)) == {
        "case": "c",
        "error": 1e-3,
        "bound": 2e-5,
        "verdict": "fail",
    }


def test_json_has_numbers_as_numbers_and_non_finite_as_null_with_a_flag():
    value = {"rows": [{"error": math.inf, "ratio": math.nan, "bound": 1e-6, "tensor": "out"}]}

    text = json.dumps(jsonable(value), allow_nan=False)

    assert json.loads(text) == {
        "rows": [
            {
                "error": None,
                "ratio": None,
                "bound": 1e-6,
                "tensor": "out",
                "nonfinite": {"error": "inf", "ratio": "nan"},
            }
        ]
    }


def test_environment_names_python_the_platform_and_the_devices():
    env = environment(["cpu"])

    assert env["python"] == platform.python_version() and env["platform"]
    assert env["devices"]["cpu"]


def test_packages_are_the_installed_distributions_of_the_modules_imported():
    found = packages()

    assert found["numpy"] == np.__version__ and found["torch"] == torch.__version__
    assert found == {name: importlib.metadata.version(name) for name in found}
    assert parity_tests.DISTRIBUTION not in found  # the project is named apart: project()
    assert project() == {"name": "attention-parity", "version": parity_tests.__version__}


def test_a_package_not_imported_is_not_listed(monkeypatch):
    imported = dict(sys.modules)
    monkeypatch.setattr(sys, "modules", {k: v for k, v in imported.items() if k != "numpy"})

    assert "numpy" not in packages()


def _summary(checks: list[dict]) -> list[str]:
    lines: list[str] = []
    print_summary(checks, "kernels", lines.append)
    return lines


def test_the_summary_has_one_line_per_check_and_per_expected_failure(monkeypatch):
    log = "\n".join(f"warning: line {i} of a compiler log" for i in range(3000))
    entry = targets.ExpectedFailure("k", "plain", "a documented crash")
    monkeypatch.setattr(targets, "EXPECTED_FAILURES", (entry,))

    def raises(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        if not is_causal:
            raise RuntimeError(f"compilation failed\n{log}")
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)

    report = check_kernel(raises, dtypes=["float32"], cases=["plain", "causal-n<m"])
    check = check_entry(report, target="k", battery="cases", judged=True)

    lines = _summary([check])

    assert lines[2].split()[:11] == ["cpu", "k", "pass", "1", "0", "0", "0", "1", "0", "0", "2"]
    assert lines[3:] == ["        xfail plain: a documented crash", ""]
    assert "compiler log" in check["errors"][0]["traceback"]  # the JSON keeps it all
    assert total_line([check]) == (
        "pass, 1 of 1 targets on cpu pass; 1 of 2 case-dtype groups judged, 0 flagged, "
        "0 refused, 0 errors, 1 expected failures, 0 skipped, 0 not run"
    )


def test_findings_have_no_verdict_in_the_summary():
    check = check_entry(_report(_row("plain", "fail")), target="k", battery="stress", judged=False)

    (line,) = [line for line in _summary([check]) if line.startswith("cpu")]

    assert line.split()[:4] == ["cpu", "k", "-", "1"]
    assert total_line([check]).startswith("findings (no verdict), 1 targets on cpu;")


def test_a_bias_row_shows_its_rms_ratio_and_why():
    row = KernelRow("plain", "bfloat16", "dq", 1e-3, 1e-3, 1.0, 4e-3, "bias", "rms", 0, 3e-4, 1e-4)
    check = check_entry(_report(row), target="k", battery="b", judged=True)
    lines: list[str] = []

    print_checks([check], "kernels", lines.append)

    assert check["groups"][0]["note"] == "dq bias (rms error / bound 3)"
    assert check["groups"][0]["rows"][0]["bias_ratio"] == pytest.approx(3.0)
    assert any("rms3!" in line for line in lines)


def test_a_group_not_run_says_which_features_it_needs():
    row = KernelRow("plain", "float32", "-", *[math.nan] * 4, "not-run", "needs gqa, not declared")
    check = check_entry(_report(row), target="k", battery="b", judged=True, spec="flash")
    lines: list[str] = []

    print_checks([check], "kernels", lines.append)

    assert check["spec"] == "flash" and check["coverage"]["not_run"] == 1
    assert "   not-run plain: needs gqa, not declared" in lines
    assert any(line.endswith("(b battery, flash spec) --") for line in lines)


def test_a_reason_shared_by_many_groups_is_printed_once_with_its_cases():
    rows = [
        KernelRow(case, dtype, "-", *[math.nan] * 4, "skip", "no masks here")
        for case in ("plain", "dv>d")
        for dtype in ("float32", "float16")
    ]
    check = check_entry(_report(*rows), target="k", battery="b", judged=True)
    lines: list[str] = []

    print_checks([check], "kernels", lines.append)

    assert [line for line in lines if "no masks here" in line] == [
        "   skip plain, dv>d: no masks here"
    ]


def test_a_decode_table_shows_the_cache_columns_and_the_caches():
    case = next(c for c in get("flash_kvcache").default_battery() if c.page_size == 16)
    rows = [KernelRow(case.name, "float32", tensor, 2e-6, 1e-7, 1.0, 1e-6, verdict)
            for tensor, verdict in (("out", "pass"), ("k_cache", "fail"))]  # fmt: skip
    report = KernelReport("k", "cpu", rows, cases={case.name: case})
    check = check_entry(report, target="k", battery="b", judged=True, spec="flash_kvcache")
    lines: list[str] = []

    print_checks([check], "kernels", lines.append)
    (failing,) = failing_lines([check])

    header, row = lines[2].split(), lines[3].split()
    assert header[2:14] == ["B", "H", "N", "M", "D", "Dv", "s_new", "H_kv", "P", "|", "out", "lse"]
    assert header[14:16] == ["k_cache", "v_cache"]
    assert row[2:11] == [str(value) for value in case.shape.values()] and row[10] == "16"
    assert row[14] == "2!"  # k_cache's error / bound, failed
    assert f"s_new={case.s_new} H_kv={case.heads_kv} P=16): k_cache fail" in failing


def test_what_the_failing_cases_share_is_printed_and_in_the_json():
    failing = ("plain", "dv>d", "dv<d")
    rows = [_row(name, "fail" if name in failing else "pass")
            for name in (*failing, "causal-n<m", "causal-n>m")]  # fmt: skip
    report = _report(*rows)
    report.factors = {name: {"causal": "on" if case.causal else "off"}
                      for name, case in CASES.items()}  # fmt: skip
    check = check_entry(report, target="k", battery="b", judged=True)
    lines: list[str] = []

    print_checks([check], "kernels", lines.append)

    assert check["diagnosis"] == report.diagnosis == ["causal = off"]
    assert check["finished"] is True
    assert failing_lines([check])[-1] == "k on cpu: every failing case: causal = off"
    assert "   every failing case: causal = off" in lines
