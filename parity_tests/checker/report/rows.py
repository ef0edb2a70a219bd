"""What the kernel checker returns: one row per judged tensor, each distinct exception once, and a
verdict that says how much of the battery it covers.

Verdicts of a row (lowercase, the same strings in the API, the tables and the JSON), each failing
one of three outcomes that are never mixed (``OUTCOMES``):

- "pass": ``error <= bound``;
- *flagged*, the numbers are wrong: "fail" (``error > bound``); "nonfinite" (NaN or inf where the
  golden is finite); "bias" (the largest error is within its bound, but the root-mean-square
  error is not: a small systematic error made everywhere, a temperature a percent off, say, that
  the rounding of half precision hides from a max-error bound); "inplace" (the kernel changed one
  of its inputs in place: the row's tensor names which); "nondeterministic" (a second call on
  identical inputs gave the row's tensor other bits: ``error`` is max|second - first|);
- *refused*: "refused", the kernel raised ``ValueError``, ``NotImplementedError``,
  ``AssertionError`` or ``TypeError`` (its own checks of what it takes, or a keyword it has no
  argument for): a refusal of a case whose features it claims, which fails the verdict, reported
  apart from wrong numbers;
- *error*: "error" (any other exception, ``SystemExit`` included, a crash or a hang of its
  isolated process, or a result that is not a tensor of the right shape); "dtype" (a tensor of
  another dtype than its inputs: no correct kernel returns one);
- "skip": the kernel raised ``KernelUnsupported``, the checker's own opt-out (the case is outside
  its scope, said explicitly): not a failure, but it counts against coverage;
- "not-run": the case needs a feature the kernel does not claim (``features=``), or lies outside
  the kernel's limits (``limits=``, ``battery.limits``: the battery then holds its nearest case
  inside them); never a pass.

When the backward raises, the forward's rows are judged all the same, and one more row says what
the backward raised ("refused" or "error", tensor "-").

A (case, dtype) group's status is "fail" when any of its rows is flagged, else "error" when any is
an error, else "refused" when any is a refusal, else "skip", "not-run" or "pass" as its rows
say. A report has passed when no group failed in any of the three ways, at least one group
passed, and skipped groups do not outnumber passed ones: a kernel that refuses most of the
battery has not shown that it is correct, whatever it did on the rest. Groups not run count
neither way: the summary states the fraction of the battery the verdict covers, and how many
groups the kernel's limits left out. Against a list of documented failures (the CLI's built-in
targets) a failing group it explains is "xfail" and a passing one "xpass" (a failure); expected
failures are counted apart in every summary, never as judged (``coverage_counts``).

Tests: tests/checker/report/test_rows.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .diagnosis import report_diagnosis

VERDICTS = (
    "pass", "fail", "bias", "nonfinite", "dtype", "inplace", "nondeterministic", "error",
    "refused", "skip", "not-run",
)  # fmt: skip
# The three ways a row fails, never mixed, each with its verdicts.
OUTCOMES: dict[str, tuple[str, ...]] = {
    "flagged": ("fail", "bias", "nonfinite", "inplace", "nondeterministic"),
    "refused": ("refused",),
    "error": ("error", "dtype"),
}
FAILING = tuple(verdict for verdicts in OUTCOMES.values() for verdict in verdicts)


class KernelUnsupported(Exception):
    """Raised by a kernel for a case outside its scope (a forced SDPA backend that refuses a
    configuration, say): the case gets the verdict "skip" with the message, not a failure (a
    kernel's own ``ValueError`` and the like are refusals: "refused", a failure)."""


@dataclass(frozen=True)
class KernelRow:
    """One judged tensor of one case and dtype.

    ``error = max|K - G|``, ``baseline = max|Bl - G|`` (for dq and dk, ``max|R - G|`` where
    larger: R the exact answer of a kernel reading back its stored output), ``golden_max =
    max|G|`` and
    ``bound = c * baseline + floor * golden_max``; NaN where not measured (an "error",
    "refused", "skip" or "not-run" row, whose ``tensor`` is "-"). ``rms_error = rms(K - G)``
    and ``rms_bound = BIAS_FACTOR * max(rms_baseline, rms(rd(G) - G)) + BIAS_FLOOR * rms(G)``
    (rd(G): the golden stored in the kernel's dtype) are the bias statistic
    (NaN where not measured), ``rms_baseline = rms(Bl - G)`` (or ``rms(R - G)``, larger).
    ``tensor`` is "out", "dq", "dk", "dv", "lse", "keep" (the kept fraction of dropout) or, for
    an "inplace" row, the input changed ("q", "k", "v", "attn_mask", ...).
    ``detail`` says why a row is not a plain pass; ``exception`` is the 1-based number of the
    exception in ``KernelReport.errors`` for a row where the kernel raised (or refused), else 0.
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

    ``passed`` (a bool): no group failed (flagged, refused or an error), at least one group
    passed, skipped groups do not outnumber passed ones, and every feature the kernel claims
    was exercised by a judged group (``not_covered`` empty; for a battery, not for cases named
    one by one). ``failures`` lists the failed rows, ``errors`` each distinct exception once
    (refusals' too), ``cases`` the cases run by name (their shapes: ``cases[name].shape``).
    ``limits`` holds the kernel's declared limits by name (``KernelLimits.declared``; empty:
    none), ``excluded`` each case outside them: (why, the name of the case judged instead).
    ``claimed`` are the features the kernel claims and ``exercised`` those each case exercises
    (``Spec.exercised``); ``named`` says the cases were named one by one, not a battery.
    ``factors`` holds each case's factor values by name (``Spec.values_of``), from which
    ``diagnosis`` names what the failing groups have in common (``report.diagnosis``).
    """

    kernel: str
    device: str
    rows: list[KernelRow] = field(default_factory=list)
    errors: list[KernelError] = field(default_factory=list)
    cases: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    excluded: dict[str, tuple[str, str]] = field(default_factory=dict)
    claimed: frozenset[str] = frozenset()
    exercised: dict[str, frozenset[str]] = field(default_factory=dict)
    named: bool = False
    factors: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def failures(self) -> list[KernelRow]:
        return [row for row in self.rows if row.failed]

    @property
    def groups(self) -> dict[tuple[str, str], str]:
        """The status of each (case, dtype), in the order run (``group_status``)."""
        rows: dict[tuple[str, str], list[KernelRow]] = {}
        for row in self.rows:
            rows.setdefault((row.case, row.dtype), []).append(row)
        return {key: group_status(members) for key, members in rows.items()}

    @property
    def outside_limits(self) -> int:
        """How many (case, dtype) groups were not run for the kernel's limits."""
        return sum(case in self.excluded for case, _ in self.groups)

    @property
    def coverage(self) -> float:
        """The fraction of (case, dtype) groups judged (neither skipped nor not run); 0 for an
        empty report."""
        statuses = list(self.groups.values())
        unjudged = statuses.count("skip") + statuses.count("not-run")
        return (len(statuses) - unjudged) / len(statuses) if statuses else 0.0

    @property
    def not_covered(self) -> list[str]:
        """The claimed features that no judged group exercised, sorted."""
        return uncovered_features(self.claimed, self.exercised, self.groups)

    @property
    def failing_coverage(self) -> list[str]:
        """``not_covered`` where it fails the verdict: a battery's (cases named one by one are
        the user's choice of what to judge)."""
        return [] if self.named else self.not_covered

    @property
    def passed(self) -> bool:
        return statuses_pass(list(self.groups.values())) and not self.failing_coverage

    @property
    def summary(self) -> str:
        """One line: the verdict and what fraction of the battery it covers."""
        statuses = list(self.groups.values())
        return coverage_summary(statuses, self.outside_limits, self.failing_coverage)

    @property
    def diagnosis(self) -> list[str]:
        """The few factor values that every failing group holds and no passing group holds
        all of ("M % 16 != 0", "causal = off"), most specific first; [] when none set the
        failing groups apart (``report.diagnosis``)."""
        return report_diagnosis(self, self.groups)


# The group statuses whose case was run and judged (a documented failure, "xfail", too): the
# features of its case were exercised.
EXERCISED = ("pass", "fail", "error", "refused", "xfail", "xpass")


def uncovered_features(
    claimed: frozenset[str],
    exercised: dict[str, frozenset[str]],
    statuses: dict[tuple[str, str], str],
) -> list[str]:
    """The features of ``claimed`` that no group whose status is in ``EXERCISED`` exercised
    (``exercised``: the features of each case by name), sorted."""
    seen: set[str] = set()
    for (case, _), status in statuses.items():
        if status in EXERCISED:
            seen |= exercised.get(case, frozenset())
    return sorted(claimed - seen)


def group_status(rows: list[KernelRow]) -> str:
    """ "fail" if any row is flagged, else "error" if any is an error, else "refused" if any is
    a refusal, else "skip" if any row was skipped, else "not-run" if the case was not run, else
    "pass"."""
    for status, verdicts in (("fail", OUTCOMES["flagged"]), ("error", OUTCOMES["error"]),
                             ("refused", OUTCOMES["refused"]), ("skip", ("skip",)),
                             ("not-run", ("not-run",))):  # fmt: skip
        if any(row.verdict in verdicts for row in rows):
            return status
    return "pass"


# Group statuses as the CLI extends them: an expected failure that fails is "xfail" (documented,
# counted apart: neither judged nor a refusal), one that passes is "xpass" (a failure: the list of
# expected failures is stale).
PASSING_GROUPS = ("pass", "xfail")
FAILED_GROUPS = ("fail", "error", "refused")  # the three outcomes of a failing group
FAILING_GROUPS = (*FAILED_GROUPS, "xpass")


def statuses_pass(statuses: list[str]) -> bool:
    """The verdict of a run whose (case, dtype) groups got ``statuses``: no failing group, at
    least one passing group (a pass or an expected failure), and no more skipped groups than
    passing ones."""
    passes = sum(status in PASSING_GROUPS for status in statuses)
    failing = sum(status in FAILING_GROUPS for status in statuses)
    return failing == 0 and passes > 0 and statuses.count("skip") <= passes


def coverage_counts(statuses: list[str], outside_limits: int = 0) -> dict[str, int | float]:
    """How many groups of ``statuses`` were judged (compared and given a pass or a failure:
    "pass", "fail", "error", "refused", "xpass"), failed (any of those but "pass"), and of them
    were flagged ("fail"), refused, errors; were expected failures ("xfail"), skipped, not run
    (of which ``outside_limits`` for the kernel's limits), in all; and the fraction judged (0 for
    none). The keys are the JSON report's ``coverage``."""
    total, skipped, not_run = len(statuses), statuses.count("skip"), statuses.count("not-run")
    expected = statuses.count("xfail")
    judged = total - skipped - not_run - expected
    return {
        "judged": judged,
        "failing": sum(status in FAILING_GROUPS for status in statuses),
        "flagged": statuses.count("fail"),
        "refused": statuses.count("refused"),
        "error": statuses.count("error"),
        "expected_failures": expected,
        "skipped": skipped,
        "not_run": not_run,
        "outside_limits": outside_limits,
        "total": total,
        "fraction": judged / total if total else 0.0,
    }


def coverage_summary(
    statuses: list[str], outside_limits: int = 0, not_covered: list[str] | None = None
) -> str:
    """One line: "pass" or "fail", why (the failing groups, flagged, refused and errors apart;
    the claimed features no judged case exercised, ``not_covered``), how many groups were
    judged, and apart from them the expected failures, the skipped groups and those not run
    (for features not declared, or outside the kernel's limits)."""
    counts = coverage_counts(statuses, outside_limits)
    total, judged, failing = counts["total"], counts["judged"], counts["failing"]
    share = f"{judged} of {total} case-dtype groups judged ({judged / max(total, 1):.0%})"
    apart = ""
    if counts["expected_failures"]:
        xfails = counts["expected_failures"]
        apart += f", {xfails} expected failure{'s' if xfails != 1 else ''}"
    apart += f", {counts['skipped']} skipped" if counts["skipped"] else ""
    apart += _not_run(int(counts["not_run"]), outside_limits)
    gap = (
        f"not covered: {', '.join(not_covered)} (claimed, no judged case); " if not_covered else ""
    )
    if statuses_pass(statuses):
        return f"fail: {gap}{share}{apart}" if gap else f"pass: {share}{apart}"
    if failing:
        xpass = statuses.count("xpass")
        kinds = [
            (counts["flagged"], "flagged"),
            (counts["refused"], "refused"),
            (counts["error"], "error" if counts["error"] == 1 else "errors"),
            (xpass, "unexpected pass" if xpass == 1 else "unexpected passes"),
        ]
        ways = ", ".join(f"{count} {name}" for count, name in kinds if count)
        return f"fail: {failing} failing groups ({ways}); {gap}{share}{apart}"
    if total == 0:
        return "fail: nothing was checked"
    return f"fail: {gap}only {share}{apart}; skips outnumber passes, so this is not a pass"


def _not_run(not_run: int, outside_limits: int) -> str:
    if not not_run:
        return ""
    features = not_run - outside_limits
    if not outside_limits:
        return f", {not_run} not run (features not declared)"
    if not features:
        return f", {not_run} not run (outside the kernel's limits)"
    return (
        f", {not_run} not run ({features} for features not declared, {outside_limits} outside "
        "the kernel's limits)"
    )
