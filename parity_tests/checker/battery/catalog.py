"""The batteries of every spec, and their cases by name: how ``check_kernel`` turns its ``cases``
argument into the cases it runs (``select``).

Each spec builds its own batteries (``Spec.battery``: "default", "quick", and the spec's others,
such as the attention specs' "stress"), for the features a kernel claims: a covering array of the
spec's factors (``battery.pairs``: every pair of values that one case can hold meets in some
case) sized to meet its requirements, then the spec's cases that need features not claimed,
listed as not run. Every generated case is named by what it holds, so the same case built for
two specs or feature sets is one case, and a report's name says what failed.

Tests: tests/checker/battery/test_catalog.py (pair coverage: tests/checker/battery/test_pairs.py)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from ..specs import get, registry
from .names import unique_by_name


def select(
    spec: Any,
    cases: str | Sequence[Any] | None,
    features: Iterable[str] | None = None,
    pool: Sequence[Any] = (),
) -> tuple[Any, ...]:
    """The cases ``spec`` runs for a kernel claiming ``features`` (None: all the spec's): a
    battery by name (None: the default), built for them, keeping the cases the spec can
    express; or explicitly named cases (a case object, or a name looked up in ``pool`` first,
    then among the spec's cases), all of which must be expressible."""
    spec = get(spec)
    claimed = None if features is None else frozenset(features)
    if claimed is not None and claimed >= spec.features - spec.judged_everywhere:
        claimed = None
    if cases is None or isinstance(cases, str):
        name = cases or "default"
        if name not in spec.batteries:
            raise ValueError(
                f"cases must be one of {sorted(spec.batteries)} or a sequence, got {cases!r}"
            )
        kept = spec.battery(name, claimed)
        if not kept:
            raise ValueError(f"the {name} battery has no case the {spec.name} spec runs")
        return kept
    known = {case.name: case for case in pool}
    named = [known.get(case, case) if isinstance(case, str) else case for case in cases]
    battery = resolve(named, spec, claimed)
    for case in battery:
        reason = spec.cannot_express(case)
        if reason is not None:
            raise ValueError(f"the {spec.name} spec cannot run case {case.name!r}: {reason}")
    return battery


def resolve(
    cases: Sequence[Any], spec: Any = None, features: Iterable[str] | None = None
) -> tuple[Any, ...]:
    """The cases named by ``cases``, a sequence of case objects and names (names are looked up
    among ``spec``'s cases for ``features`` first, then every spec's)."""
    if isinstance(cases, str):
        raise ValueError(f"cases must be a sequence of cases or names, got {cases!r}")
    claimed = None if features is None else frozenset(features)
    resolved = [
        case if not isinstance(case, str) else lookup(case, spec, claimed) for case in cases
    ]
    if not resolved:
        raise ValueError("cases is empty")
    names = [getattr(case, "name", case) for case in resolved]
    if len(set(names)) != len(names):
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"cases has repeated names: {repeated}")
    return tuple(resolved)


def lookup(name: object, spec: Any = None, features: Iterable[str] | None = None) -> Any:
    """The case called ``name``: of ``spec``'s cases for ``features`` first, else of any
    spec's."""
    if not isinstance(name, str):
        raise ValueError(f"unknown case {name!r}; cases are Case objects or names")
    claimed = None if features is None else frozenset(features)
    first = [] if spec is None else [get(spec)]
    for each in first + [s for s in registry().values() if s not in first]:
        try:
            return each.lookup(name, claimed if each in first else None)
        except ValueError:
            continue
    raise ValueError(f"unknown case {name!r}; --list-cases names them")


def size_coverage(
    spec: Any, cases: Iterable[Any], features: Iterable[str] | None = None
) -> dict[str, bool]:
    """For each size requirement of ``spec`` (for ``features``), whether a case meets it."""
    cases = list(cases)
    claimed = None if features is None else frozenset(features)
    return {r.label: any(r.met(case) for case in cases) for r in get(spec).requirements(claimed)}


@functools.cache
def everything() -> tuple[Any, ...]:
    """Every attention case addressable by name outside the stress and ring batteries: each
    attention spec's default battery (every feature claimed) and the named cases."""
    from ..battery.attention.handwritten import NAMED
    from ..specs._attention import AttentionSpec

    generated = [case for spec in registry().values()
                 if isinstance(spec, AttentionSpec) and spec.name != "ring"
                 for case in spec.default_battery()]  # fmt: skip
    return unique_by_name([*generated, *NAMED])
