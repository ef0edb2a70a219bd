"""The builder of the batteries whose cases differ by one width (the sparse specs' head width D,
the linear specs' key width K): the covering array of the spec's factors (``battery.pairs``,
as every spec's) for the claimed features, each row given the first width still wanted by a
size requirement (``Spec.requirements``: ``kind`` "width" and ``value``; other kinds, such as
FlashMLA's query rows, met by what the row holds); a requirement no row met gets a row of its
own (``Spec.row_for``). ``spec.case_of(row, width)`` makes each case, named by what it holds.

Tests: tests/checker/specs/test_sparse.py, tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import functools
from typing import Any

from . import pairs
from .names import unique_by_name


@functools.cache
def default_battery(spec: Any, key: frozenset[str] | None) -> tuple[Any, ...]:
    """The default battery of ``spec`` for a kernel claiming ``key`` (the claimed features that
    have a factor; None: every feature)."""
    seeds = () if key is None else tuple(c for c in default_battery(spec, None) if c.needs <= key)
    unmet = [r for r in spec.requirements(key) if not any(r.met(c) for c in seeds)]
    known = [spec.values_of(c) for c in seeds]
    rows = pairs.covering_rows(spec, key, known)
    cases = [_build(spec, row, unmet) for row in rows]
    while unmet:
        wanted = unmet[0]
        cases.append(_build(spec, spec.row_for(wanted, key), unmet))
        if wanted in unmet:
            raise ValueError(f"the {spec.name} battery cannot meet {wanted.label!r}")
    return unique_by_name([*seeds, *cases])


def _build(spec: Any, row: pairs.Row, unmet: list[Any]) -> Any:
    """The case of ``row`` at the first width still wanted (else the spec's first)."""
    wanted = [r.value for r in unmet if r.kind == "width"]
    case = spec.case_of(row, wanted[0] if wanted else spec.widths[0])
    unmet[:] = [r for r in unmet if not r.met(case)]
    return case
