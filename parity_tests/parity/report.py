"""The layer part of ``python -m parity_tests``: the registry run on each device, as rows of the
JSON report, and its tables: one line per (device, case, dtype, backend) with its worst tensor
(``--verbose``), one line per layer with its groups judged and failing, the failing rows and the
line of the totals.

A layer's groups are counted as a kernel check's are (``checker.report.render``'s summary), so
that the layers' table and the kernel targets' read alike: every group is judged, a failing one
is flagged; the registry has no expected failures, skips or refusals.

Tests: tests/parity/test_report.py, tests/parity/test_cli.py.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from ..checker.report.render import SUMMARY_HEADER, row_dict, summary_line
from . import run

LAYER_DTYPES = ("float64", "float32")


class Progress(Protocol):
    """What the CLI's progress display offers: a line per part, an update per run."""

    def start(self, message: str) -> None: ...

    def update(self, message: str) -> None: ...


def run_layers(devices: list[str], quick: bool, progress: Progress) -> list[dict[str, Any]]:
    """Every row of the registry (or of its quick subset) on each of ``devices``, in float64 and
    float32, as the JSON report's dicts."""
    rows = []
    for device in devices:
        progress.start(f"layer registry on {device}")
        for row in run.run_registry(
            device=device, dtypes=LAYER_DTYPES, quick=quick, progress=progress.update
        ):
            rows.append(row_dict(row))
    return rows


def layer_groups(rows: list[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """The rows of each (device, layer case, dtype, backend), in the order run."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["device"], row["case"], row["dtype"], row["backend"])
        groups.setdefault(key, []).append(row)
    return groups


def ratio(row: dict[str, Any]) -> float:
    """A row's error / bound (inf where the bound is 0)."""
    return math.inf if not row["bound"] else row["error"] / row["bound"]


def print_layers(rows: list[dict[str, Any]]) -> None:
    """One line per (device, layer case, dtype, backend): its worst tensor (``--verbose``)."""
    print("== layers: NumPy vs torch (norm-wise relative error, bound) ==")
    print(
        f"{'device':7} {'case':44} {'dtype':8} {'backend':8} {'worst':18} "
        f"{'error':>9} {'bound':>9}  verdict"
    )
    groups = layer_groups(rows)
    for (device, case, dtype, backend), members in groups.items():
        worst = max(members, key=ratio)
        verdict = "pass" if all(r["verdict"] == "pass" for r in members) else "fail"
        print(
            f"{device:7} {case:44} {dtype:8} {backend:8} {worst['tensor']:18} "
            f"{worst['error']:9.2e} {worst['bound']:9.2e}  {verdict}"
        )
    print()


def print_layer_summary(rows: list[dict[str, Any]]) -> str:
    """One line per (device, layer): its verdict, its (case, dtype, backend) groups judged and
    failing, its largest error / bound. Returns the line of the total."""
    layers: dict[tuple[str, str], list[bool]] = {}  # (device, layer) -> each group failed
    worst: dict[tuple[str, str], float] = {}
    for (device, *_), members in layer_groups(rows).items():
        key = (device, members[0]["layer"])
        layers.setdefault(key, []).append(any(row["verdict"] != "pass" for row in members))
        worst[key] = max([worst.get(key, 0.0)] + [ratio(row) for row in members])
    print("== layers: NumPy layer vs torch twin, output and every gradient, per layer ==")
    print(SUMMARY_HEADER.replace("target", "layer ", 1))
    for (device, layer), failed in layers.items():
        verdict = "fail" if any(failed) else "pass"
        counts = layer_counts(len(failed), sum(failed))
        print(summary_line(device, layer, verdict, counts, worst[(device, layer)]))
    print()
    passed = sum(not any(failed) for failed in layers.values())
    groups = sum(len(failed) for failed in layers.values())
    failing = sum(sum(failed) for failed in layers.values())
    devices = ", ".join(dict.fromkeys(device for device, _ in layers)) or "no device"
    verdict = "fail" if failing else "pass"
    return (
        f"{verdict}, {passed} of {len(layers)} layers on {devices} pass; {groups} groups "
        f"(case, dtype, backend) judged, {failing} failing"
    )


def layer_counts(groups: int, failing: int) -> dict[str, int]:
    """A layer's groups counted as a kernel check's are: every group is judged, a failing one
    flagged (the registry has no expected failures, skips, features or refusals)."""
    return {
        "judged": groups,
        "failing": failing,
        "flagged": failing,
        "refused": 0,
        "error": 0,
        "expected_failures": 0,
        "skipped": 0,
        "not_run": 0,
        "total": groups,
    }


def layer_failures(rows: list[dict[str, Any]]) -> list[str]:
    """One line per failing layer row, for the summary at the end."""
    return [
        f"layers on {row['device']}: {row['case']} {row['dtype']} {row['backend']}: "
        f"{row['tensor']} {tuple(row['shape'])} {row['verdict']}: error {row['error']:.2e}, "
        f"bound {row['bound']:.2e}"
        for row in rows
        if row["verdict"] != "pass"
    ]
