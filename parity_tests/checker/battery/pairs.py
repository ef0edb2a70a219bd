"""What each spec's battery must cover: its factors and their values, the pairs of them that a
case can hold, and a covering array that holds every such pair.

A *factor* is one way a case varies (causal or not, the mask, the GQA grouping, where q, k, v
sit in memory ...) and its *values* are the ones that matter to a kernel: each takes another
code path, or breaks where another value does not. ``SPACES`` names the factors of each spec:
those its signature can express; a kernel that claims fewer features (``space(spec,
features)``) has the unclaimed ones held at their first value, "off". A *pair* is two values of
two factors. It is *required* when some case can hold both; the rules of ``allowed`` say which
cannot: SDPA takes a mask or is_causal, not both; a softcap is only bent by sharp logits; under
causal a window's right side is moot; heavy-tailed inputs at sharp logits overflow the plain
half-precision baseline (q k^T reaches 1e5 before the scale: a stress condition, the stress
battery's heavy-logits-100); an alignment exists only where positions matter (causal, a window
or ALiBi with N != M; ``NA`` elsewhere, never part of a pair).

``covering_rows`` builds rows (a value for every factor) until every required pair is in one:
a covering array of strength 2, greedily (AETG: each row starts from the value in the most
uncovered pairs, then takes for each factor, in a random order, the value that covers the most
new pairs, ties going to the earlier value, "off" first, so that an option costly to judge such
as dropout appears only as often as its pairs need; the best of a few candidate rows is kept),
deterministic for a spec and its features.
``case_values`` reads the values back from a case's own fields, so ``uncovered`` computes the
coverage of a battery from its cases, never from the rows that made them.

Tests: tests/checker/battery/test_pairs.py
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

NA = "-"  # the value of a factor that does not apply to a case (an alignment without positions)

FACTORS: dict[str, tuple[str, ...]] = {
    "lengths": ("n<m", "n=m", "n>m"),
    "causal": ("off", "on"),
    "align": ("top-left", "bottom-right"),
    "window": ("none", "left", "two-sided"),
    "softcap": ("off", "on"),
    "alibi": ("none", "per-head", "per-batch"),
    "mask": ("none", "bool", "float", "dead-bool", "dead-float"),
    "gqa": ("mha", "gqa", "mqa"),
    "dv": ("equal", "smaller", "larger"),
    "dropout": ("off", "on"),
    "scale": ("default", "given"),
    "inputs": ("gauss", "heavy"),
    "logits": ("normal", "sharp"),
    "memory": ("contiguous", "fused", "kv-strides", "offset"),
    "sequences": ("batched", "packed"),
    "layout": ("contiguous", "zigzag"),
}
# The factor each feature of specs.FEATURES turns on (lse is a tensor every case judges).
FEATURE_FACTORS = ("mask", "causal", "dropout", "gqa", "window", "softcap", "alibi", "dv")

_CORE = ("lengths", "causal", "gqa", "dv", "scale", "inputs", "logits", "memory")
_OPTIONS = ("window", "softcap", "alibi")
SPACES: dict[str, tuple[str, ...]] = {
    "sdpa": (*_CORE, "mask", "dropout"),
    "flash": (*_CORE, *_OPTIONS, "dropout"),
    "flash_varlen": (*_CORE, *_OPTIONS, "dropout", "sequences"),
    "flex": (*_CORE, "align", "mask", *_OPTIONS),
    # The ring's cases are self-attention of one length that the ranks split; q, k, v are
    # each rank's own shards, so neither lengths nor memory layouts vary there.
    "ring": ("causal", "window", "softcap", "gqa", "dv", "scale", "layout"),
}
# Where a spec with one alignment puts causal, windows and ALiBi (flex has the align factor).
ALIGN = {"sdpa": "top-left", "flash": "bottom-right", "flash_varlen": "bottom-right",
         "ring": "top-left"}  # fmt: skip
# The factors ``allowed`` reads; the others are free, so a row is complete once these are.
_CONSTRAINED = (
    "causal", "mask", "window", "softcap", "logits", "inputs", "alibi", "lengths", "align"
)  # fmt: skip
_CANDIDATES = 8  # candidate rows per row of the covering array; the one covering most is kept

Row = dict[str, str]
Pair = tuple[tuple[str, str], tuple[str, str]]


def space(spec: str, features: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
    """The values of each factor of ``spec``; a factor whose feature is not in ``features``
    (None: every feature) has its "off" value only. The align factor also has ``NA``."""
    claimed = None if features is None else frozenset(features)
    values = {}
    for factor in SPACES[spec]:
        domain = FACTORS[factor] + ((NA,) if factor == "align" else ())
        if claimed is not None and factor in FEATURE_FACTORS and factor not in claimed:
            domain = domain[:1]
        values[factor] = domain
    return values


def allowed(spec: str, row: Mapping[str, str]) -> bool:
    """False when the values assigned so far in ``row`` cannot be held by one case of
    ``spec`` (factors not yet assigned are not judged)."""
    get = row.get
    if spec == "sdpa" and get("causal") == "on" and get("mask") not in (None, "none"):
        return False  # SDPA takes attn_mask or is_causal, not both
    if get("softcap") == "on" and get("logits") == "normal":
        return False  # a cap of 5 on scores of spread 1 bends nothing
    if get("inputs") == "heavy" and get("logits") == "sharp":
        return False  # plain half precision overflows there: the stress battery's business
    if get("window") == "two-sided" and get("causal") == "on":
        return False  # causal already hides everything right of p_i
    if "align" in row:
        positioned = _positioned(spec, row)
        if positioned is not None and (row["align"] != NA) != positioned:
            return False
    return True


def _positioned(spec: str, row: Mapping[str, str]) -> bool | None:
    """Whether the row's query positions matter (causal, a window or ALiBi, with N != M);
    None while that depends on factors not yet assigned."""
    rules = [row.get(f) for f in ("causal", "window", "alibi") if f in SPACES[spec]]
    uses = [value not in (None, "off", "none") for value in rules]
    lengths = row.get("lengths")
    if lengths == "n=m" or (all(value is not None for value in rules) and not any(uses)):
        return False
    if lengths is not None and any(uses):
        return True
    return None


def extendable(spec: str, domains: Mapping[str, tuple[str, ...]], row: Mapping[str, str]) -> bool:
    """Whether ``row`` (some factors assigned) can be completed to a whole row that
    ``allowed`` accepts, with values from ``domains``."""
    bound = tuple((f, row[f]) for f in _CONSTRAINED if f in row)
    free = tuple((f, domains[f]) for f in _CONSTRAINED if f in domains and f not in row)
    return _completes(spec, bound, free)


@functools.cache
def _completes(
    spec: str, bound: tuple[tuple[str, str], ...], free: tuple[tuple[str, tuple[str, ...]], ...]
) -> bool:
    """Whether the constrained values ``bound`` extend, through the values of ``free``, to a
    row that ``allowed`` accepts (the other factors take part in no rule)."""
    if not allowed(spec, dict(bound)):
        return False
    if not free:
        return True
    (factor, values), rest = free[0], free[1:]
    return any(_completes(spec, (*bound, (factor, value)), rest) for value in values)


def required_pairs(spec: str, features: Iterable[str] | None = None) -> frozenset[Pair]:
    """Every pair of values of two factors of ``spec`` that one case can hold (``NA`` never)."""
    return _required(spec, None if features is None else frozenset(features))


@functools.cache
def _required(spec: str, features: frozenset[str] | None) -> frozenset[Pair]:
    domains = space(spec, features)
    required = set()
    for f, g in itertools.combinations(domains, 2):
        for v in domains[f]:
            for w in domains[g]:
                if NA not in (v, w) and extendable(spec, domains, {f: v, g: w}):
                    required.add(((f, v), (g, w)))
    return frozenset(required)


def pairs_of(row: Mapping[str, str], order: Iterable[str]) -> set[Pair]:
    """The pairs a row holds, each as ((f, v), (g, w)) with f before g in ``order``."""
    present = [(f, row[f]) for f in order if f in row and row[f] != NA]
    return set(itertools.combinations(present, 2))


def covering_rows(
    spec: str, features: Iterable[str] | None = None, seeds: Iterable[Mapping[str, str]] = ()
) -> list[Row]:
    """Rows (a value for every factor of ``spec``'s space) that, with ``seeds``, hold every
    required pair: a covering array of strength 2, greedy and deterministic."""
    domains = space(spec, features)
    order = list(domains)
    uncovered = set(required_pairs(spec, features))
    for seed in seeds:
        uncovered -= pairs_of(seed, order)
    rng = random.Random(f"covering {spec} {sorted(features) if features is not None else '*'}")
    rank = {factor: i for i, factor in enumerate(order)}
    rows: list[Row] = []
    while uncovered:
        candidates = [_candidate(spec, domains, rank, uncovered, rng) for _ in range(_CANDIDATES)]
        best = max(candidates, key=lambda row: len(pairs_of(row, order) & uncovered))
        rows.append(best)
        uncovered -= pairs_of(best, order)
    return _without_redundant(rows, order, required_pairs(spec, features))


def _without_redundant(rows: list[Row], order: list[str], required: frozenset[Pair]) -> list[Row]:
    """``rows`` less each row (latest first) whose required pairs the others all hold."""
    kept = list(rows)
    for row in reversed(rows):
        others = [other for other in kept if other is not row]
        held = set().union(*(pairs_of(other, order) for other in others))
        if pairs_of(row, order) & required <= held:
            kept = others
    return kept


def _candidate(
    spec: str, domains: dict[str, tuple[str, ...]], order: dict[str, int], uncovered: set[Pair],
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
    for factor in rest:
        scored = []
        for value in domains[factor]:
            if factor in _CONSTRAINED and not extendable(spec, domains, {**row, factor: value}):
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


def case_values(spec: str, case: Any) -> Row:
    """The value of each factor of ``spec`` that ``case`` (a ``checker.case.Case``) holds, read
    from its fields (a value outside a factor's values, such as a right-only window, is kept
    as it is and meets no required pair)."""
    n, m = case.lengths[0] if case.lengths else (case.n, case.m)
    left, right = case.window if case.window is not None else (None, None)
    window = "none"
    if left is not None:
        window = "left" if right in (None, 0) or case.causal else "two-sided"
    elif right is not None:
        window = "right"
    kv, heads = case.kv_heads, case.heads
    dv = case.value_width
    values = {
        "lengths": "n<m" if n < m else "n=m" if n == m else "n>m",
        "causal": "on" if case.causal else "off",
        "align": case.align if case.positioned else NA,
        "window": window,
        "softcap": "on" if case.softcap else "off",
        "alibi": {"none": "none", "H": "per-head", "BH": "per-batch"}[case.alibi],
        "mask": case.mask,
        "gqa": "mha" if kv == heads else "mqa" if kv == 1 else "gqa",
        "dv": "equal" if dv == case.d else "smaller" if dv < case.d else "larger",
        "dropout": "on" if case.dropout_p else "off",
        "scale": "default" if case.scale is None else "given",
        "inputs": case.inputs,
        "logits": "sharp" if case.logits >= 10 else "normal",
        "memory": case.memory,
        "sequences": "packed" if case.packed else "batched",
        "layout": case.layout,
    }
    return {factor: values[factor] for factor in SPACES[spec]}


def uncovered(
    spec: str, cases: Iterable[Any], features: Iterable[str] | None = None
) -> frozenset[Pair]:
    """The required pairs of ``spec`` (for ``features``) that no case of ``cases`` holds."""
    order = list(SPACES[spec])
    held: set[Pair] = set()
    for case in cases:
        held |= pairs_of(case_values(spec, case), order)
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


def coverage(spec: str, cases: Iterable[Any], features: Iterable[str] | None = None) -> Coverage:
    """The pair coverage of ``cases`` for ``spec`` (and ``features``), computed from the cases."""
    cases = list(cases)
    domains = space(spec, features)
    counts = {factor: dict.fromkeys(values, 0) for factor, values in domains.items()}
    for case in cases:
        for factor, value in case_values(spec, case).items():
            if value in counts[factor]:
                counts[factor][value] += 1
    for values in counts.values():
        values.pop(NA, None)
    required = required_pairs(spec, features)
    return Coverage(len(required), uncovered(spec, cases, features), counts)
