"""The kernel checker's results for people and for programs: the text tables the CLI prints, the
summary of failing rows, and the JSON form of ``--json`` (schema: docs/kernel-verification.md,
"The JSON report").

A *check* is one target checked on one device and battery, as a plain dict: the report's rows
grouped by (case, dtype), each group with its shape and its status ("pass"; "fail", "error" or
"refused", the three ways to fail; "skip", "not-run", or, against
``targets.expected.EXPECTED_FAILURES``, "xfail" / "xpass"), the distinct exceptions once each, the
kernel's limits with the cases they excluded, and the verdict with the fraction of the battery
it covers (expected failures counted apart). Verdicts and statuses are the same lowercase
strings in the tables and in the JSON.

Two views for people: ``print_summary`` (the main job's table: one line per target with its
verdict and counts, one line per expected failure with its reason) and ``print_checks`` (every
group with its shape and each tensor's error / bound, and each exception's traceback:
``--verbose``); beside them ``failing_lines``, every failing row and what the failing groups of
each check have in common (``diagnosis``).

Tests: tests/checker/report/test_render.py
"""

from __future__ import annotations

import dataclasses
import functools
import math
import platform
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from ... import DISTRIBUTION, __version__
from ..targets.expected import expected_failure
from .diagnosis import report_diagnosis, sentence
from .rows import (
    FAILED_GROUPS,
    FAILING,
    FAILING_GROUPS,
    KernelReport,
    coverage_counts,
    coverage_summary,
    group_status,
    statuses_pass,
    uncovered_features,
)

# 2: a check's coverage counts expected failures apart ("judged" no longer includes them);
# the project's version and the packages the run imported are recorded.
# 3: three outcomes never mixed: a group's status "fail" is wrong numbers only, "error" and
# "refused" are new statuses (and "refused" a new verdict), coverage counts them apart
# ("flagged", "refused", "error") and the groups outside the kernel's limits
# ("outside_limits"); a check names its limits, and settings the limits, timeout and fuzz.
# 4: a check names the claimed features no judged case exercised ("not_covered"); for a
# battery (not cases named one by one) they fail its verdict, and its summary says so.
# 5: a check names what its failing groups have in common ("diagnosis") and whether it ran to
# its end ("finished"); the report says whether the run did ("state": the file is written as
# the groups finish, and a run stopped keeps them).
SCHEMA_VERSION = 5
TENSOR_COLUMNS = ("out", "dq", "dk", "dv", "lse", "keep")
CACHE_COLUMNS = ("k_cache", "v_cache")  # a decode call's caches, judged where it appends
# The widths of the shape columns: the legend letters of every case, then a decode case's own.
_WIDTHS = {"B": 2, "H": 2, "N": 5, "M": 5, "D": 4, "Dv": 4, "s_new": 5, "H_kv": 4, "P": 4}

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
    outside = report.outside_limits
    by_group = {(group["case"], group["dtype"]): group["status"] for group in groups}
    missing = uncovered_features(report.claimed, report.exercised, by_group)
    failing = [] if report.named or not judged else missing
    return {
        "target": target,
        "spec": spec,
        "device": report.device,
        "device_name": device_name(report.device),
        "battery": battery,
        "judged": judged,
        "verdict": ("pass" if statuses_pass(statuses) and not failing else "fail")
        if judged
        else None,
        "summary": coverage_summary(statuses, outside, failing),
        "not_covered": missing,
        "diagnosis": report_diagnosis(report, by_group),
        "finished": True,
        "coverage": coverage_counts(statuses, outside),
        "limits": {
            "declared": report.limits,
            "excluded": [
                {"case": case, "why": why, "instead": instead}
                for case, (why, instead) in report.excluded.items()
            ],
        }
        if report.limits
        else None,
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
    if expected is not None and status in FAILED_GROUPS and expected.explains(failed):
        return "xfail", expected.reason
    if expected is not None and status != "fail" and expected.strict:
        return "xpass", "expected to fail: " + expected.reason
    return status, ", ".join(_why(row) for row in rows if row.failed)


def _why(row: Any) -> str:
    """What a failed row says in a table note: the exception's number, not its message."""
    if row.verdict in ("error", "refused"):
        number = f"exception #{row.exception}" if row.exception else row.detail
        return number if row.verdict == "error" else f"refused: {number}"
    if row.verdict in ("inplace", "dtype", "nondeterministic"):
        return row.detail
    if row.verdict == "nonfinite":
        return f"{row.tensor} NaN/inf"
    if row.verdict == "bias":
        return f"{row.tensor} bias (rms error / bound {_number(row.bias_ratio, '.2g')})"
    return f"{row.tensor} fail"


def print_checks(checks: list[dict], title: str, emit: Emit) -> None:
    """One table per check: per (case, dtype) its shape (a decode case's cache columns too),
    error / bound of each tensor (a failed row marked "!"), the worst row's error and bound,
    and the status; then the distinct exceptions with their tracebacks, once each, the reasons
    of skips and expected failures, the summary and what the failing groups have in common."""
    emit(f"== {title}: error / bound per tensor (above 1 fails) ==")
    for check in checks:
        spec = "" if check.get("spec", "sdpa") == "sdpa" else f", {check['spec']} spec"
        emit(f"-- {check['target']} on {check['device']} ({check['battery']} battery{spec}) --")
        keys, tensors = shape_keys(check["groups"]), tensor_columns(check["groups"])
        width = min(max([20, *(len(group["case"]) for group in check["groups"])]), 48)
        emit(
            f"{'case':{width}} {'dtype':9}"
            + "".join(f" {key:>{_width(key)}}" for key in keys)
            + " |"
            + "".join(f" {t:>8}" for t in tensors)
            + f" | {'worst: error / bound':27}  status"
        )
        reasons: dict[tuple[str, str], dict[str, None]] = {}  # (status, why) -> its cases
        for group in check["groups"]:
            cells = {row["tensor"]: _cell(row) for row in group["rows"]}
            line = (
                f"{group['case']:{width}} {group['dtype']:9}"
                + "".join(f" {group['shape'].get(key, '-'):>{_width(key)}}" for key in keys)
                + " |"
                + "".join(f" {cells.get(t, '-'):>8}" for t in tensors)
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
        if check.get("diagnosis"):
            emit(f"   {sentence(check['diagnosis'])}")
    emit("")


def shape_keys(groups: list[dict]) -> list[str]:
    """The shape columns of a table: every key of the groups' shapes, in the order they come
    (B, H, N, M, D, Dv; a decode case's s_new, H_kv and P after them)."""
    return list(dict.fromkeys(key for group in groups for key in group["shape"]))


def tensor_columns(groups: list[dict]) -> tuple[str, ...]:
    """The tensor columns of a table: out, the gradients, lse and keep; for a decode call
    (whose shape has a page size P) out, lse and the caches."""
    decode = any("P" in group["shape"] for group in groups)
    return ("out", "lse", *CACHE_COLUMNS) if decode else TENSOR_COLUMNS


def _width(key: str) -> int:
    return _WIDTHS.get(key, max(len(key), 4))


# The columns of the main job's summary tables, layers and kernels alike: the judged groups,
# and of them the three ways to fail apart (an unexpected pass fails the verdict too, on a line
# of its own).
SUMMARY_HEADER = (
    f"{'device':7} {'target':40} {'verdict':7} {'judged':>6} {'flagged':>7} {'refused':>7} "
    f"{'error':>5} {'xfail':>5} {'skipped':>7} {'not-run':>7} {'total':>5}  worst error / bound"
)


def summary_line(device: str, name: str, verdict: str | None, counts: dict, worst: float) -> str:
    """One line of a summary table: a target (or a layer) on a device, its verdict ("-" for
    findings that are not judged), its groups counted by ``report.coverage_counts``, and its
    largest error / bound among the judged rows."""
    return (
        f"{device:7} {name:40} {verdict or '-':7} {counts['judged']:>6} {counts['flagged']:>7} "
        f"{counts['refused']:>7} {counts['error']:>5} {counts['expected_failures']:>5} "
        f"{counts['skipped']:>7} {counts['not_run']:>7} {counts['total']:>5}  "
        f"{_number(worst, '.2g') if not math.isnan(worst) else '-'}"
    )


def print_summary(checks: list[dict], title: str, emit: Emit) -> None:
    """The main job's table of ``checks``: one line per check (``summary_line``), and each
    expected failure (and each unexpected pass) on one line with its cases and reason. The
    total over the checks is ``total_line``."""
    emit(f"== {title} ==")
    emit(SUMMARY_HEADER)
    for check in checks:
        judged = [g for g in check["groups"] if g["status"] not in ("skip", "not-run", "xfail")]
        rows = [row for group in judged for row in group["rows"]]
        emit(summary_line(check["device"], check["target"], check["verdict"],
                          check["coverage"], _worst_ratio(rows)))  # fmt: skip
        reasons: dict[tuple[str, str], dict[str, None]] = {}  # (status, why) -> its cases
        for group in check["groups"]:
            if group["status"] in ("xfail", "xpass") and check["judged"]:
                reasons.setdefault((group["status"], group["note"]), {})[group["case"]] = None
        for (status, why), cases in reasons.items():
            emit(f"{'':8}{status} {', '.join(cases)}: {why}")
    emit("")


def total_line(checks: list[dict]) -> str:
    """The total over ``checks``: how many targets passed, and their groups counted as each
    check counts them."""
    devices = ", ".join(dict.fromkeys(check["device"] for check in checks)) or "no device"
    counts = {key: sum(check["coverage"][key] for check in checks) for key in _COUNTED}
    groups = (
        f"{counts['judged']} of {counts['total']} case-dtype groups judged, "
        f"{counts['flagged']} flagged, {counts['refused']} refused, {counts['error']} errors, "
        f"{counts['expected_failures']} expected failures, {counts['skipped']} skipped, "
        f"{counts['not_run']} not run"
    )
    verdicts = [check["verdict"] for check in checks]
    if checks and verdicts[0] is None:  # the stress battery: findings, no verdict
        return f"findings (no verdict), {len(checks)} targets on {devices}; {groups}"
    passed = verdicts.count("pass")
    verdict = "pass" if checks and passed == len(checks) else "fail"
    return f"{verdict}, {passed} of {len(checks)} targets on {devices} pass; {groups}"


_COUNTED = (
    "judged", "flagged", "refused", "error", "expected_failures", "skipped", "not_run", "total"
)  # fmt: skip


def _worst_ratio(rows: list[dict]) -> float:
    """The largest error / bound (a bias row: its rms ratio, when larger) of ``rows``; NaN when
    none was measured."""
    ratios = [row["ratio"] for row in rows if not math.isnan(row["ratio"])]
    ratios += [row["bias_ratio"] for row in rows if row.get("verdict") == "bias"]
    return max(ratios, default=math.nan)


def _cell(row: dict) -> str:
    """error / bound; for a "bias" row "rms" and rms error / rms bound."""
    text = _WORDS.get(row["verdict"]) or _number(row["ratio"], ".2g")
    if row["verdict"] == "bias":
        text = "rms" + _number(row["bias_ratio"], ".2g")
    return text + ("!" if row["verdict"] in FAILING else "")


# The cells of the verdicts whose error / bound says nothing (a bound of 0, a NaN).
_WORDS = {"nonfinite": "NaN/inf", "nondeterministic": "nondet"}


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
    unexpected pass, one per check that covers too little of its battery to pass, and one
    naming what the failing groups of a check have in common (its ``diagnosis``)."""
    lines = []
    for check in checks:
        if not check["judged"]:
            continue
        where = f"{check['target']} on {check['device']}"
        for group in check["groups"]:
            shape = " ".join(f"{key}={value}" for key, value in group["shape"].items())
            head = f"{where}: {group['case']} {group['dtype']} ({shape})"
            if group["status"] == "xpass":
                lines.append(f"{head}: xpass, {group['note']}")
            if group["status"] not in FAILED_GROUPS:
                continue
            for row in group["rows"]:
                if row["verdict"] in FAILING:
                    lines.append(f"{head}: {_row_summary(row)}")
        if check["verdict"] == "fail" and not any(
            group["status"] in FAILING_GROUPS for group in check["groups"]
        ):
            lines.append(f"{where}: {check['summary']}")
        if check.get("diagnosis"):
            lines.append(f"{where}: {sentence(check['diagnosis'])}")
    return lines


def _row_summary(row: dict) -> str:
    if row["verdict"] in ("error", "refused"):
        number = f" (exception #{row['exception']})" if row["exception"] else ""
        return f"{row['verdict']}, {row['detail']}{number}"
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
    """What a result depends on, besides the packages (``packages``): Python, the platform, and
    each device's name."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "devices": {device: device_name(device) for device in devices},
    }


def packages() -> dict[str, str]:
    """The version of every installed distribution (this project's aside: ``__version__``) that
    provides a module imported in this process so far, by distribution name, sorted: the
    third-party code a run has executed (numpy and torch always; transformers only where its
    targets ran). Modules of no installed distribution (the standard library, a kernel module
    in the current directory) are left out, and so are modules that only child processes
    (isolated kernels, ring ranks) imported: this process cannot see them."""
    providers = metadata.packages_distributions()
    names = {
        dist
        for module in list(sys.modules)
        if "." not in module and module not in sys.stdlib_module_names
        for dist in providers.get(module, ())
        if dist != DISTRIBUTION
    }
    found = {}
    for name in sorted(names, key=str.lower):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # a stale entry of packages_distributions
            continue
    return found


def project() -> dict[str, str]:
    """This project's distribution and version (``parity_tests.__version__``)."""
    return {"name": DISTRIBUTION, "version": __version__}


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
