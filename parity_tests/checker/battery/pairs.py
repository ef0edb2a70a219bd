"""What a spec's battery must cover: the values of its factors (``Any.factors``), the pairs of
them that a case can hold, a covering array that holds every such pair, and the coverage of a
battery, for every spec alike (the attention and decode specs, and any added later).

A *pair* is two values of two factors. It is *required* when some case can hold both; the
spec's ``allowed`` says which cannot (and a value the spec names "not applicable", ``Any.na``,
is never part of a pair). A kernel that claims fewer features has each unclaimed feature's
factor held at its first value, "off" (``space``).

``covering_rows`` builds rows (a value for every factor) until every required pair is in one:
a covering array of strength 2, greedily (AETG: each row starts from the value in the most
uncovered pairs, then takes for each factor, in a random order, the value that covers the most
new pairs, ties going to the earlier value, "off" first, so that an option costly to judge such
as dropout appears only as often as its pairs need; the best of a few candidate rows is kept),
deterministic for a spec and its features. ``Any.values_of`` reads the values back from a
case's own fields, so ``uncovered`` and ``coverage`` compute the coverage of a battery from its
cases, never from the rows that made them.

Tests: tests/checker/battery/test_pairs.py
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

_CANDIDATES = 8  # candidate rows per row of the covering array; the one covering most is kept

Row = dict[str, str]
Pair = tuple[tuple[str, str], tuple[str, str]]


def space(spec: Any, features: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
    """The values of each factor of ``spec``; a factor whose feature is not in ``features``
    (None: every feature) has its "off" value only."""
    claimed = None if features is None else frozenset(features)
    values = dict(spec.factors)
    if claimed is not None:
        for feature, factor in spec.feature_factors.items():
            if feature not in claimed and factor in values:
                values[factor] = values[factor][:1]
    return values


def extendable(spec: Any, domains: Mapping[str, tuple[str, ...]], row: Mapping[str, str]) -> bool:
    """Whether ``row`` (some factors assigned) can be completed to a whole row that
    ``spec.allowed`` accepts, with values from ``domains``."""
    constrained = spec.constrained
    bound = tuple((f, row[f]) for f in constrained if f in row)
    free = tuple((f, domains[f]) for f in constrained if f in domains and f not in row)
    return _completes(spec, bound, free)


@functools.cache
def _completes(
    spec: Any, bound: tuple[tuple[str, str], ...], free: tuple[tuple[str, tuple[str, ...]], ...]
) -> bool:
    """Whether the constrained values ``bound`` extend, through the values of ``free``, to a
    row that ``spec.allowed`` accepts (the other factors take part in no rule)."""
    if not spec.allowed(dict(bound)):
        return False
    if not free:
        return True
    (factor, values), rest = free[0], free[1:]
    return any(_completes(spec, (*bound, (factor, value)), rest) for value in values)


def required_pairs(spec: Any, features: Iterable[str] | None = None) -> frozenset[Pair]:
    """Every pair of values of two factors of ``spec`` that one case can hold."""
    return _required(spec, None if features is None else frozenset(features))


@functools.cache
def _required(spec: Any, features: frozenset[str] | None) -> frozenset[Pair]:
    domains = space(spec, features)
    required = set()
    for f, g in itertools.combinations(domains, 2):
        for v in domains[f]:
            for w in domains[g]:
                if v == spec.na(f) or w == spec.na(g):
                    continue
                if extendable(spec, domains, {f: v, g: w}):
                    required.add(((f, v), (g, w)))
    return frozenset(required)


def pairs_of(spec: Any, row: Mapping[str, str]) -> set[Pair]:
    """The pairs a row holds, each as ((f, v), (g, w)) with f before g in the spec's order."""
    present = [(f, row[f]) for f in spec.factors if f in row and row[f] != spec.na(f)]
    return set(itertools.combinations(present, 2))


def covering_rows(
    spec: Any, features: Iterable[str] | None = None, seeds: Iterable[Mapping[str, str]] = ()
) -> list[Row]:
    """Rows (a value for every factor of ``spec``'s space) that, with ``seeds``, hold every
    required pair: a covering array of strength 2, greedy and deterministic."""
    domains = space(spec, features)
    uncovered = set(required_pairs(spec, features))
    for seed in seeds:
        uncovered -= pairs_of(spec, seed)
    claimed = sorted(features) if features is not None else "*"
    rng = random.Random(f"covering {spec.name} {claimed}")
    rank = {factor: i for i, factor in enumerate(domains)}
    rows: list[Row] = []
    while uncovered:
        candidates = [_candidate(spec, domains, rank, uncovered, rng) for _ in range(_CANDIDATES)]
        best = max(candidates, key=lambda row: len(pairs_of(spec, row) & uncovered))
        rows.append(best)
        uncovered -= pairs_of(spec, best)
    return _without_redundant(spec, rows, required_pairs(spec, features))


def _without_redundant(spec: Any, rows: list[Row], required: frozenset[Pair]) -> list[Row]:
    """``rows`` less each row (latest first) whose required pairs the others all hold."""
    kept = list(rows)
    for row in reversed(rows):
        others = [other for other in kept if other is not row]
        held = set().union(*(pairs_of(spec, other) for other in others))
        if pairs_of(spec, row) & required <= held:
            kept = others
    return kept


def _candidate(
    spec: Any, domains: dict[str, tuple[str, ...]], order: dict[str, int], uncovered: set[Pair],
    rng: random.Random,
) -> Row:  # fmt: skip
    """One candidate row: the value in the most uncovered pairs first, then each other factor,
    in random order, at the value covering most uncovered pairs with those already set (the
    earliest such value)."""
    counts: dict[tuple[str, str], int] = {}
    for first, second in uncovered:
        counts[first] = counts.get(first, 0) + 1
        counts[second] = counts.get(second, 0) + 1
    top = max(counts.values())
    factor, value = rng.choice(sorted(key for key, count in counts.items() if count == top))
    row = {factor: value}
    rest = [f for f in order if f != factor]
    rng.shuffle(rest)
    constrained = spec.constrained
    for factor in rest:
        scored = []
        for value in domains[factor]:
            if factor in constrained and not extendable(spec, domains, {**row, factor: value}):
                continue
            gain = sum(
                _pair(order, (factor, value), (other, row[other])) in uncovered for other in row
            )
            scored.append((gain, value))
        top = max(gain for gain, _ in scored)
        row[factor] = next(value for gain, value in scored if gain == top)  # off first
    return row


def _pair(order: dict[str, int], a: tuple[str, str], b: tuple[str, str]) -> Pair:
    return (a, b) if order[a[0]] < order[b[0]] else (b, a)


def uncovered(
    spec: Any, cases: Iterable[Any], features: Iterable[str] | None = None
) -> frozenset[Pair]:
    """The required pairs of ``spec`` (for ``features``) that no case of ``cases`` holds."""
    held: set[Pair] = set()
    for case in cases:
        held |= pairs_of(spec, spec.values_of(case))
    return required_pairs(spec, features) - held


class Coverage(NamedTuple):
    """The pair coverage of a spec's battery: ``required`` and ``missing`` pairs, and for each
    factor how many cases hold each of its values."""

    required: int
    missing: frozenset[Pair]
    counts: dict[str, dict[str, int]]

    @property
    def fraction(self) -> float:
        return 1.0 - len(self.missing) / self.required if self.required else 1.0


def coverage(spec: Any, cases: Iterable[Any], features: Iterable[str] | None = None) -> Coverage:
    """The pair coverage of ``cases`` for ``spec`` (and ``features``), computed from the cases."""
    cases = list(cases)
    domains = space(spec, features)
    counts = {factor: dict.fromkeys(values, 0) for factor, values in domains.items()}
    for case in cases:
        for factor, value in spec.values_of(case).items():
            if value in counts[factor]:
                counts[factor][value] += 1
    for factor, values in counts.items():
        values.pop(spec.na(factor), None)  # type: ignore[arg-type]
    required = required_pairs(spec, features)
    return Coverage(len(required), uncovered(spec, cases, features), counts)
