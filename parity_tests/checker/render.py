"""The kernel checker's results for people and for programs: the text tables the CLI prints, the
summary of failing rows, and the JSON form of ``--json`` (schema: docs/kernel-verification.md,
"The JSON report").

A *check* is one target checked on one device and battery, as a plain dict: the report's rows
grouped by (case, dtype), each group with its shape and its status ("pass", "fail", "skip", or,
against ``targets.EXPECTED_FAILURES``, "xfail" / "xpass"), the distinct exceptions once each, and
the verdict with the fraction of the battery it covers. Verdicts and statuses are the same
lowercase strings in the tables and in the JSON.

Tests: tests/checker/test_render.py
"""

from __future__ import annotations

import dataclasses
import functools
import math
import platform
from collections.abc import Callable, Iterable
from typing import Any

from .report import (
    FAILING,
    FAILING_GROUPS,
    KernelReport,
    coverage_summary,
    group_status,
    statuses_pass,
)
from .targets import expected_failure

SCHEMA_VERSION = 1
TENSOR_COLUMNS = ("out", "dq", "dk", "dv", "lse", "keep")
SHAPE_KEYS = ("B", "H", "N", "M", "D", "Dv")
_WIDTHS = {"B": 2, "H": 2, "N": 5, "M": 5, "D": 4, "Dv": 4}

Emit = Callable[[str], None]


def check_entry(
    report: KernelReport, *, target: str, battery: str, judged: bool, spec: str = "sdpa"
) -> dict:
    """One check as a plain dict (the JSON schema's ``kernels[i]``), statuses included.

    ``judged`` False (the stress battery) ignores the expected failures and gives no verdict.
    """
    grouped: dict[tuple[str, str], list] = {}
    for row in report.rows:
        grouped.setdefault((row.case, row.dtype), []).append(row)
    groups = []
    for (case, dtype), rows in grouped.items():
        status, note = _status(target, case, dtype, report.device, rows, judged)
        groups.append(
            {
                "case": case,
                "dtype": dtype,
                "shape": report.cases[case].shape,
                "status": status,
                "note": note,
                "rows": [row_dict(row) for row in rows],
            }
        )
    statuses = [group["status"] for group in groups]
    skipped, not_run = statuses.count("skip"), statuses.count("not-run")
    judged_groups = len(statuses) - skipped - not_run
    return {
        "target": target,
        "spec": spec,
        "device": report.device,
        "device_name": device_name(report.device),
        "battery": battery,
        "judged": judged,
        "verdict": ("pass" if statuses_pass(statuses) else "fail") if judged else None,
        "summary": coverage_summary(statuses),
        "coverage": {
            "judged": judged_groups,
            "skipped": skipped,
            "not_run": not_run,
            "total": len(statuses),
            "fraction": judged_groups / len(statuses) if statuses else 0.0,
        },
        "groups": groups,
        "errors": [
            {
                "number": error.number,
                "type": error.kind,
                "message": error.message,
                "traceback": error.traceback,
                "where": [{"case": case, "dtype": dtype} for case, dtype in error.where],
            }
            for error in report.errors
        ],
    }


def row_dict(row: Any) -> dict:
    """A result row (a dataclass: ``KernelRow``, the registry's ``ParityRow``) as a dict, with
    ``ratio`` where the row has one and a lowercase ``verdict`` where it has only ``passed``."""
    entry = dataclasses.asdict(row)
    if hasattr(row, "ratio"):
        entry["ratio"] = row.ratio
    if hasattr(row, "bias_ratio"):
        entry["bias_ratio"] = row.bias_ratio
    if "verdict" not in entry and "passed" in entry:
        entry["verdict"] = "pass" if entry.pop("passed") else "fail"
    return entry


def _status(target, case, dtype, device, rows, judged: bool) -> tuple[str, str]:
    """The group's status, against the expected-failure list when judged, and its note."""
    status = group_status(rows)
    expected = expected_failure(target, case, dtype, device) if judged else None
    if status in ("skip", "not-run"):
        return status, next(row.detail for row in rows if row.verdict == status)
    failed = [row.detail or "" for row in rows if row.failed]
    if expected is not None and status == "fail" and expected.explains(failed):
        return "xfail", expected.reason
    if expected is not None and status != "fail" and expected.strict:
        return "xpass", "expected to fail: " + expected.reason
    return status, ", ".join(_why(row) for row in rows if row.failed)


def _why(row: Any) -> str:
    """What a failed row says in a table note: the exception's number, not its message."""
    if row.verdict == "error":
        return f"exception #{row.exception}" if row.exception else row.detail
    if row.verdict in ("inplace", "dtype"):
        return row.detail
    if row.verdict == "nonfinite":
        return f"{row.tensor} NaN/inf"
    if row.verdict == "bias":
        return f"{row.tensor} bias (rms error / bound {_number(row.bias_ratio, '.2g')})"
    return f"{row.tensor} fail"


def print_checks(checks: list[dict], title: str, emit: Emit) -> None:
    """One table per check: per (case, dtype) its shape, error / bound of each tensor (a failed
    row marked "!"), the worst row's error and bound, and the status; then the distinct
    exceptions with their tracebacks, once each, and the reasons of skips and expected failures."""
    emit(f"== {title}: error / bound per tensor (above 1 fails) ==")
    for check in checks:
        spec = "" if check.get("spec", "sdpa") == "sdpa" else f", {check['spec']} spec"
        emit(f"-- {check['target']} on {check['device']} ({check['battery']} battery{spec}) --")
        emit(
            f"{'case':20} {'dtype':9}"
            + "".join(f" {key:>{_WIDTHS[key]}}" for key in SHAPE_KEYS)
            + " |"
            + "".join(f" {t:>8}" for t in TENSOR_COLUMNS)
            + f" | {'worst: error / bound':27}  status"
        )
        reasons: dict[tuple[str, str], dict[str, None]] = {}  # (status, why) -> its cases
        for group in check["groups"]:
            cells = {row["tensor"]: _cell(row) for row in group["rows"]}
            line = (
                f"{group['case']:20} {group['dtype']:9}"
                + "".join(f" {group['shape'][key]:>{_WIDTHS[key]}}" for key in SHAPE_KEYS)
                + " |"
                + "".join(f" {cells.get(t, '-'):>8}" for t in TENSOR_COLUMNS)
                + f" | {_worst(group['rows']):27}  {group['status']}"
            )
            note = group["note"]
            if group["status"] in ("xfail", "xpass", "skip", "not-run"):
                reasons.setdefault((group["status"], note), {})[group["case"]] = None
                note = ""
            emit(line + (f" ({note})" if note else ""))
        for error in check["errors"]:
            where = ", ".join(f"{w['case']} {w['dtype']}" for w in error["where"])
            count = len(error["where"])
            emit(f"   exception #{error['number']}, raised in {count} groups ({where}):")
            for text in error["traceback"].rstrip().splitlines():
                emit(f"      {text}")
        for (status, why), cases in reasons.items():
            emit(f"   {status} {', '.join(cases)}: {why}")
        emit(f"   {check['summary']}")
    emit("")


def _cell(row: dict) -> str:
    """error / bound; for a "bias" row "rms" and rms error / rms bound."""
    text = "NaN/inf" if row["verdict"] == "nonfinite" else _number(row["ratio"], ".2g")
    if row["verdict"] == "bias":
        text = "rms" + _number(row["bias_ratio"], ".2g")
    return text + ("!" if row["verdict"] in FAILING else "")


def _worst(rows: list[dict]) -> str:
    measured = [row for row in rows if not math.isnan(row["ratio"])]
    if not measured:
        return "-"
    row = max(measured, key=lambda r: r["ratio"])
    return f"{row['tensor']} {_number(row['error'], '.1e')} / {_number(row['bound'], '.1e')}"


def _number(value: float, spec: str) -> str:
    return format(value, spec) if math.isfinite(value) else str(value)


def failing_lines(checks: Iterable[dict]) -> list[str]:
    """One line per failing row of the judged checks (expected failures left out), one per
    unexpected pass, and one per check that covers too little of its battery to pass."""
    lines = []
    for check in checks:
        if not check["judged"]:
            continue
        where = f"{check['target']} on {check['device']}"
        for group in check["groups"]:
            shape = " ".join(f"{key}={group['shape'][key]}" for key in SHAPE_KEYS)
            head = f"{where}: {group['case']} {group['dtype']} ({shape})"
            if group["status"] == "xpass":
                lines.append(f"{head}: xpass, {group['note']}")
            if group["status"] != "fail":
                continue
            for row in group["rows"]:
                if row["verdict"] in FAILING:
                    lines.append(f"{head}: {_row_summary(row)}")
        if check["verdict"] == "fail" and not any(
            group["status"] in FAILING_GROUPS for group in check["groups"]
        ):
            lines.append(f"{where}: {check['summary']}")
    return lines


def _row_summary(row: dict) -> str:
    if row["verdict"] == "error":
        return "error, " + (f"exception #{row['exception']}" if row["exception"] else row["detail"])
    numbers = f"error {_number(row['error'], '.2e')}, bound {_number(row['bound'], '.2e')}"
    detail = f"; {row['detail']}" if row["detail"] else ""
    return f"{row['tensor']} {row['verdict']}: {numbers}{detail}"


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON: numbers stay numbers; a non-finite float in a dict becomes null,
    and the dict gains ``"nonfinite": {field: "inf" | "-inf" | "nan"}`` naming it."""
    if isinstance(value, dict):
        entry, flags = {}, {}
        for key, item in value.items():
            if isinstance(item, float) and not math.isfinite(item):
                entry[key], flags[key] = None, str(item)
            else:
                entry[key] = jsonable(item)
        if flags:
            entry["nonfinite"] = flags
        return entry
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def environment(devices: Iterable[str]) -> dict:
    """The versions and devices a result depends on: Python, NumPy, torch, and each device's
    name."""
    import numpy as np
    import torch

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "platform": platform.platform(),
        "devices": {device: device_name(device) for device in devices},
    }


@functools.lru_cache(maxsize=8)
def device_name(device: str) -> str:
    """The CUDA device's name, or the CPU's model as the OS reports it."""
    import torch

    parsed = torch.device(device)
    if parsed.type == "cuda":
        return torch.cuda.get_device_name(parsed)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
