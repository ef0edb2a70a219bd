"""What the kernel checker returns: one row per judged tensor, each distinct exception once, and a
verdict that says how much of the battery it covers.

Verdicts of a row (lowercase, the same strings in the API, the tables and the JSON):

- "pass": ``error <= bound``;
- "fail": ``error > bound``;
- "nonfinite": NaN or inf where the golden is finite;
- "dtype": the kernel returned a tensor of another dtype than its inputs (no correct kernel does);
- "inplace": the kernel changed one of its inputs in place (the row's tensor names which);
- "error": the kernel raised, or returned something that is not a tensor of the right shape;
- "bias": the largest error is within its bound, but the root-mean-square error is not: a small
  systematic error made everywhere (a temperature a percent off, say) that the rounding of half
  precision hides from a max-error bound;
- "skip": the kernel raised ``KernelUnsupported`` (the case is outside its scope);
- "not-run": the case needs a feature the kernel does not claim (``features=``); never a pass.

A (case, dtype) group is "fail" when any of its rows failed, else "skip" when any was skipped,
else "not-run" when it was not run, else "pass". A report has passed when no row failed, at least
one group passed, and skipped groups do not outnumber passed ones: a kernel that refuses most of
the battery has not shown that it is correct, whatever it did on the rest. Groups not run for an
undeclared feature are neither: the summary states the fraction of the battery the verdict
covers. Against a list of documented failures (the CLI's built-in targets) a failing group it
explains is "xfail" and a passing one "xpass" (a failure); expected failures are counted apart in
every summary, never as judged (``coverage_counts``).

Tests: tests/checker/test_report.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .battery import Case

VERDICTS = ("pass", "fail", "bias", "nonfinite", "dtype", "inplace", "error", "skip", "not-run")
FAILING = ("fail", "bias", "nonfinite", "dtype", "inplace", "error")


class KernelUnsupported(Exception):
    """Raised by a kernel for a case outside its scope (a forced SDPA backend that refuses a
    configuration, say): the case gets the verdict "skip" with the message, not a failure."""


@dataclass(frozen=True)
class KernelRow:
    """One judged tensor of one case and dtype.

    ``error = max|K - G|``, ``baseline = max|Bl - G|``, ``golden_max = max|G|`` and
    ``bound = c * baseline + floor * golden_max``; NaN where not measured (an "error", "skip" or
    "not-run" row, whose ``tensor`` is "-"). ``rms_error = rms(K - G)`` and ``rms_bound =
    BIAS_FACTOR * rms(Bl - G) + BIAS_FLOOR * rms(G)`` are the bias statistic (NaN where not
    measured), ``rms_baseline = rms(Bl - G)``. ``tensor`` is "out", "dq", "dk", "dv", "lse",
    "keep" (the kept fraction of dropout) or, for an "inplace" row, the input changed ("q", "k",
    "v", "attn_mask", ...).
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
    rms_error: float = math.nan
    rms_bound: float = math.nan
    rms_baseline: float = math.nan

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    @property
    def bias_ratio(self) -> float:
        """``rms_error / rms_bound``: above 1 is a "bias" verdict; NaN when not measured."""
        if math.isnan(self.rms_error) or math.isnan(self.rms_bound):
            return math.nan
        if self.rms_bound == 0.0:
            return 0.0 if self.rms_error == 0.0 else math.inf
        return self.rms_error / self.rms_bound

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
        """The fraction of (case, dtype) groups judged (neither skipped nor not run); 0 for an
        empty report."""
        statuses = list(self.groups.values())
        unjudged = statuses.count("skip") + statuses.count("not-run")
        return (len(statuses) - unjudged) / len(statuses) if statuses else 0.0

    @property
    def passed(self) -> bool:
        return statuses_pass(list(self.groups.values()))

    @property
    def summary(self) -> str:
        """One line: the verdict and what fraction of the battery it covers."""
        return coverage_summary(list(self.groups.values()))


def group_status(rows: list[KernelRow]) -> str:
    """ "fail" if any row failed, else "skip" if any row was skipped, else "not-run" if the case
    was not run, else "pass"."""
    if any(row.failed for row in rows):
        return "fail"
    if any(row.verdict == "skip" for row in rows):
        return "skip"
    if any(row.verdict == "not-run" for row in rows):
        return "not-run"
    return "pass"


# Group statuses as the CLI extends them: an expected failure that fails is "xfail" (documented,
# counted apart: neither judged nor a refusal), one that passes is "xpass" (a failure: the list of
# expected failures is stale).
PASSING_GROUPS = ("pass", "xfail")
FAILING_GROUPS = ("fail", "xpass")


def statuses_pass(statuses: list[str]) -> bool:
    """The verdict of a run whose (case, dtype) groups got ``statuses``: no failing group, at
    least one passing group (a pass or an expected failure), and no more skipped groups than
    passing ones."""
    passes = sum(status in PASSING_GROUPS for status in statuses)
    failing = sum(status in FAILING_GROUPS for status in statuses)
    return failing == 0 and passes > 0 and statuses.count("skip") <= passes


def coverage_counts(statuses: list[str]) -> dict[str, int | float]:
    """How many groups of ``statuses`` were judged (compared and given a pass or a failure:
    "pass", "fail", "xpass"), failed ("fail", "xpass"), were expected failures ("xfail"),
    skipped, not run, in all; and the fraction judged (0 for none). The keys are the JSON
    report's ``coverage``."""
    total, skipped, not_run = len(statuses), statuses.count("skip"), statuses.count("not-run")
    expected = statuses.count("xfail")
    judged = total - skipped - not_run - expected
    return {
        "judged": judged,
        "failing": sum(status in FAILING_GROUPS for status in statuses),
        "expected_failures": expected,
        "skipped": skipped,
        "not_run": not_run,
        "total": total,
        "fraction": judged / total if total else 0.0,
    }


def coverage_summary(statuses: list[str]) -> str:
    """One line: "pass" or "fail", why, how many groups were judged, and apart from them the
    expected failures, the skipped groups and those not run."""
    counts = coverage_counts(statuses)
    total, judged, failing = counts["total"], counts["judged"], counts["failing"]
    share = f"{judged} of {total} case-dtype groups judged ({judged / max(total, 1):.0%})"
    apart = ""
    if counts["expected_failures"]:
        xfails = counts["expected_failures"]
        apart += f", {xfails} expected failure{'s' if xfails != 1 else ''}"
    apart += f", {counts['skipped']} skipped" if counts["skipped"] else ""
    apart += f", {counts['not_run']} not run (features not declared)" if counts["not_run"] else ""
    if statuses_pass(statuses):
        return f"pass: {share}{apart}"
    if failing:
        return f"fail: {failing} failing groups; {share}{apart}"
    if total == 0:
        return "fail: nothing was checked"
    return f"fail: only {share}{apart}; skips outnumber passes, so this is not a pass"
