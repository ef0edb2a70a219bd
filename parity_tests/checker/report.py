"""What the kernel checker returns: one row per judged tensor, each distinct exception once, and a
verdict that says how much of the battery it covers.

Verdicts of a row (lowercase, the same strings in the API, the tables and the JSON):

- "pass": ``error <= bound``;
- "fail": ``error > bound``;
- "nonfinite": NaN or inf where the golden is finite;
- "dtype": the kernel returned a tensor of another dtype than its inputs (no correct kernel does);
- "inplace": the kernel changed one of its inputs in place (the row's tensor names which);
- "error": the kernel raised, or returned something that is not a tensor of the right shape;
- "skip": the kernel raised ``KernelUnsupported`` (the case is outside its scope).

A (case, dtype) group is "fail" when any of its rows failed, else "skip" when any was skipped,
else "pass". A report has passed when no row failed, at least one group passed, and skipped groups
do not outnumber passed ones: a kernel that refuses most of the battery has not shown that it is
correct, whatever it did on the rest.

Tests: tests/checker/test_report.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .battery import Case

VERDICTS = ("pass", "fail", "nonfinite", "dtype", "inplace", "error", "skip")
FAILING = ("fail", "nonfinite", "dtype", "inplace", "error")


class KernelUnsupported(Exception):
    """Raised by a kernel for a case outside its scope (a forced SDPA backend that refuses a
    configuration, say): the case gets the verdict "skip" with the message, not a failure."""


@dataclass(frozen=True)
class KernelRow:
    """One judged tensor of one case and dtype.

    ``error = max|K - G|``, ``baseline = max|Bl - G|``, ``golden_max = max|G|`` and
    ``bound = c * baseline + floor * golden_max``; NaN where not measured (an "error" or "skip"
    row, whose ``tensor`` is "-"). ``tensor`` is "out", "dq", "dk", "dv", "keep" (the kept
    fraction of dropout) or, for an "inplace" row, the input changed ("q", "k", "v", "attn_mask").
    ``detail`` says why a row is not a plain pass; ``exception`` is the 1-based number of the
    exception in ``KernelReport.errors`` for a row where the kernel raised, else 0.
    """

    case: str
    dtype: str
    tensor: str
    error: float
    baseline: float
    golden_max: float
    bound: float
    verdict: str
    detail: str = ""
    exception: int = 0

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    @property
    def ratio(self) -> float:
        """``error / bound``: above 1 fails. inf for an error above a zero bound, NaN when the
        error was not measured."""
        if math.isnan(self.error) or math.isnan(self.bound):
            return math.nan
        if self.bound == 0.0:
            return 0.0 if self.error == 0.0 else math.inf
        return self.error / self.bound


@dataclass
class KernelError:
    """One distinct exception raised by the kernel, and the (case, dtype) groups that raised it.

    ``traceback`` starts at the kernel's own frames (the checker's are left out).
    """

    number: int
    kind: str
    message: str
    traceback: str
    where: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class KernelReport:
    """The rows of one ``check_kernel`` run.

    ``passed`` (a bool): no row failed, at least one group passed, and skipped groups do not
    outnumber passed ones. ``failures`` lists the failed rows, ``errors`` each distinct exception
    once, ``cases`` the cases run by name (their shapes: ``cases[name].shape``).
    """

    kernel: str
    device: str
    rows: list[KernelRow] = field(default_factory=list)
    errors: list[KernelError] = field(default_factory=list)
    cases: dict[str, Case] = field(default_factory=dict)

    @property
    def failures(self) -> list[KernelRow]:
        return [row for row in self.rows if row.failed]

    @property
    def groups(self) -> dict[tuple[str, str], str]:
        """The status of each (case, dtype): "pass", "fail" or "skip", in the order run."""
        rows: dict[tuple[str, str], list[KernelRow]] = {}
        for row in self.rows:
            rows.setdefault((row.case, row.dtype), []).append(row)
        return {key: group_status(members) for key, members in rows.items()}

    @property
    def coverage(self) -> float:
        """The fraction of (case, dtype) groups judged, i.e. not skipped; 0 for an empty report."""
        statuses = list(self.groups.values())
        return (len(statuses) - statuses.count("skip")) / len(statuses) if statuses else 0.0

    @property
    def passed(self) -> bool:
        return statuses_pass(list(self.groups.values()))

    @property
    def summary(self) -> str:
        """One line: the verdict and what fraction of the battery it covers."""
        return coverage_summary(list(self.groups.values()))


def group_status(rows: list[KernelRow]) -> str:
    """ "fail" if any row failed, else "skip" if any row was skipped, else "pass"."""
    if any(row.failed for row in rows):
        return "fail"
    if any(row.verdict == "skip" for row in rows):
        return "skip"
    return "pass"


# Group statuses as the CLI extends them: an expected failure that fails is "xfail" (judged, as
# documented), one that passes is "xpass" (a failure: the list of expected failures is stale).
PASSING_GROUPS = ("pass", "xfail")
FAILING_GROUPS = ("fail", "xpass")


def statuses_pass(statuses: list[str]) -> bool:
    """The verdict of a run whose (case, dtype) groups got ``statuses``: no failing group, at
    least one passing group, and no more skipped groups than passing ones."""
    passes = sum(status in PASSING_GROUPS for status in statuses)
    failing = sum(status in FAILING_GROUPS for status in statuses)
    return failing == 0 and passes > 0 and statuses.count("skip") <= passes


def coverage_summary(statuses: list[str]) -> str:
    """One line: "pass" or "fail", why, and how many groups were judged (not skipped)."""
    total, skips = len(statuses), statuses.count("skip")
    failing = sum(status in FAILING_GROUPS for status in statuses)
    judged = total - skips
    share = f"{judged} of {total} case-dtype groups judged ({judged / max(total, 1):.0%})"
    skipped = f", {skips} skipped" if skips else ""
    if statuses_pass(statuses):
        return f"pass: {share}{skipped}"
    if failing:
        return f"fail: {failing} failing groups; {share}{skipped}"
    if total == 0:
        return "fail: nothing was checked"
    return f"fail: only {share}; skips outnumber passes, so this is not a pass"
