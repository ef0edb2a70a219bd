"""``--list-cases``: the cases of a spec's battery (for the features claimed, within the limits)
as a table, each case's shape, the features it needs and why the kernel would not run it; then
the battery's coverage computed from its cases (every pair of its factors' values, how many
cases hold each value, the size requirements met), for every spec alike.

Tests: tests/checker/report/test_listing.py (and tests/parity/test_cli.py)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..battery import pairs
from ..battery.catalog import size_coverage
from ..battery.limits import KernelLimits, allowed_pairs
from ..spec import Spec

Emit = Callable[[str], None]


def list_cases(
    spec: Spec,
    cases: tuple[Any, ...],
    title: str,
    emit: Emit,
    *,
    features: frozenset[str] | None = None,
    limits: KernelLimits | None = None,
    excluded: dict[str, tuple[str, str]] | None = None,
    coverage: bool = True,
) -> None:
    """Print ``cases`` under ``title`` (one line each), and with ``coverage`` their pair and
    size coverage for a kernel claiming ``features`` (None: all) within ``limits``."""
    excluded = excluded or {}
    keys = _keys(cases)
    width = max(20, *(len(case.name) for case in cases))
    emit(f"{title}: {len(cases)} cases")
    emit(f"{'case':{width}} " + " ".join(f"{key:>5}" for key in keys) + "  needs")
    for case in cases:
        emit(case_line(spec, case, width, keys, features, excluded))
    if not coverage:
        return
    claimed = spec.features if features is None else features
    held = [case for case in cases if case.needs <= claimed and case.name not in excluded]
    for line in coverage_lines(spec, held, features, limits):
        emit(line)


def _keys(cases: Iterable[Any]) -> tuple[str, ...]:
    """The shape keys of the cases, in order (a decode case has more than B, H, N, M, D, Dv)."""
    keys: dict[str, None] = {}
    for case in cases:
        keys.update(dict.fromkeys(case.shape))
    return tuple(keys)


def case_line(
    spec: Spec,
    case: Any,
    width: int,
    keys: tuple[str, ...],
    features: frozenset[str] | None,
    excluded: dict[str, tuple[str, str]],
) -> str:
    """One line: name, shape, needs, and why the spec does not run it (or the kernel's
    features or limits)."""
    shape = " ".join(f"{case.shape.get(key, ''):>5}" for key in keys)
    needs = ", ".join(sorted(case.needs)) or "-"
    reason = spec.cannot_express(case)
    note = f"  (not in this spec: {reason})" if reason else ""
    if not reason and features is not None and case.needs - features:
        note = "  (not run: needs features not declared)"
    elif not reason and case.name in excluded:
        why, instead = excluded[case.name]
        note = f"  (not run, outside the kernel's limits: {why}; judged instead: {instead})"
    return f"{case.name:{width}} {shape}  {needs}{note}"


def coverage_lines(
    spec: Spec, held: list[Any], features: frozenset[str] | None, limits: KernelLimits | None
) -> list[str]:
    """The pair coverage of the cases a kernel runs (``held``) and the size requirements they
    meet, as lines."""
    found = pairs.coverage(spec, held, features)
    owed = allowed_pairs(spec, limits, features)
    missing = found.missing & owed
    share = f"{1 - len(missing) / max(len(owed), 1):.0%}"
    share += "" if limits is None else f"; the limits allow {len(owed)} of {found.required}"
    lines = [
        f"pair coverage: {len(owed) - len(missing)} of {len(owed)} pairs of values of "
        f"{len(found.counts)} factors meet in a case ({share}); cases holding each value:"
    ]
    for factor, counts in found.counts.items():
        lines.append(f"  {factor}: " + ", ".join(f"{v} {n}" for v, n in counts.items()))
    for first, second in sorted(missing):
        lines.append(f"  missing: {first[0]}={first[1]} with {second[0]}={second[1]}")
    met = size_coverage(spec, held, features)
    if met:
        lines.append(f"size requirements: {sum(met.values())} of {len(met)} met")
        lines += [f"  {line}" for line in spec.size_summary(held, features)]
    return lines
