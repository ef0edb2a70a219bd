"""The batteries of cases the kernel checker runs, built by code from what they must cover, and
the cases by name.

For a spec (``checker.specs``) and the features a kernel claims, the default battery
(``default_battery``, built by ``checker.generate``) is a covering array of the spec's factors
(``checker.pairs``: every pair of values that one case can hold meets in some case: causal with
each mask and alignment, a window under bottom-right, softcap with a window, ALiBi per head and
per batch element under GQA, Dv < D and > D under GQA, varlen with every option, every memory
layout with each), its rows sized to meet ``checker.sizes.requirements`` (block edges, the
split-KV paths, head widths). Every generated case is named by what it holds, so the same case
built for two specs or feature sets is one case, and a report's name says what failed.
``quick_battery`` keeps, from the default battery, the cheapest case for each of the teeth the
spec's pitfalls need (``QUICK_TEETH``: predicates of ``TEETH``; ``pick`` names the case) and for
each value of each factor: it still flags every pitfall. Both are functions of (spec, features),
so a kernel that claims fewer features gets a battery with every pair of what it claims.

``DEFAULT`` holds every case addressable by name outside the stress and ring batteries: each
spec's default battery (every feature claimed) and the named cases of ``checker.named``;
``QUICK`` each spec's quick battery; ``STRESS`` the stress battery; ``RING`` the ring spec's
battery (its own: self-attention of 48 positions, a covering array of its factors grown from
the named ring cases).

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; for a packed (varlen) case S sequences.

Tests: tests/checker/battery/test_catalog.py (pair coverage: tests/checker/battery/test_pairs.py)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import pairs
from .case import ALIBI, ALIGNS, INPUTS, LAYOUTS, MASKS, MEMORY, Case, CaseInputs, make_inputs
from .generate import GENERATED_SPECS, default_battery, features_key, name_of, unique_by_name
from .handwritten import NAMED, STRESS
from .sizes import (
    BLOCK,
    EDGES,
    SPLIT_KEYS,
    WIDTHS,
    Requirement,
    requirements,
    size_coverage,
    size_summary,
    sizes_of,
)

__all__ = [
    "ALIBI", "ALIGNS", "BLOCK", "EDGES", "INPUTS", "LAYOUTS", "MASKS", "MEMORY", "NAMED",
    "QUICK_TEETH", "SPLIT_KEYS", "STRESS", "TEETH", "WIDTHS", "Case", "CaseInputs",
    "Requirement", "case_cost", "default_battery", "lookup", "make_inputs", "name_of", "pick",
    "quick_battery", "requirements", "resolve", "size_coverage", "size_summary", "sizes_of",
]  # fmt: skip


# What the pitfalls need (``checker.pitfalls`` picks its cases by these labels): the quick
# battery holds the cheapest default case of each that the spec's battery has.
TEETH: dict[str, Callable[[Case], bool]] = {
    "any": lambda c: not c.packed,
    "plain": lambda c: not c.needs and c.logits < 10 and c.inputs == "gauss" and c.n > 1
    and c.scale is None and not c.packed,
    # long rows and columns: the RMS of a small error everywhere stands out of rounding's
    "plain, long": lambda c: not c.needs and c.logits < 10 and c.inputs == "gauss"
    and min(c.n, c.m) >= 64 and c.scale is None and not c.packed,
    "n<m": lambda c: c.n < c.m and not c.causal and c.window is None and c.scale is None
    and not c.dropout_p and not c.packed,
    "causal n<m": lambda c: c.causal and 1 < c.n < c.m and not c.packed,
    "bool mask": lambda c: c.mask == "bool",
    "float mask": lambda c: c.mask == "float" and c.logits < 10,
    "dead rows": lambda c: c.mask.startswith("dead"),
    "scale": lambda c: c.scale is not None,
    "dv != d": lambda c: c.scale is None and c.value_width != c.d,
    "dropout": lambda c: bool(c.dropout_p),
    "gqa": lambda c: c.heads == 4 and c.kv_heads == 2,
    "window": lambda c: c.window is not None and not c.packed,
    "alibi": lambda c: c.alibi != "none" and not c.packed,
    "softcap": lambda c: bool(c.softcap),
    "softcap with alibi": lambda c: bool(c.softcap) and c.alibi != "none",
    "alibi under gqa": lambda c: c.alibi != "none" and c.kv_heads < c.heads,
    "kv strides": lambda c: c.memory == "kv-strides",
    "padded keys": lambda c: not c.causal and c.n % 128 == 0 and c.m % 128 != 0
    and not c.packed,
    "last key of a block": lambda c: c.m % 64 == 1 and not c.packed,
    "even square": lambda c: not c.causal and c.n == c.m and c.n % 128 == 0 and not c.packed,
    "split causal": lambda c: c.causal and c.m >= SPLIT_KEYS and c.batch * c.heads <= 4,
    "packed": lambda c: c.packed,
}  # fmt: skip


# The teeth each spec's pitfalls (``checker.pitfalls``) need.
QUICK_TEETH: dict[str, tuple[str, ...]] = {
    "sdpa": ("plain", "plain, long", "n<m", "causal n<m", "bool mask", "float mask", "dead rows",
             "scale", "dv != d", "dropout", "gqa"),
    "flash": ("any", "causal n<m", "window", "alibi", "softcap", "softcap with alibi",
              "alibi under gqa", "kv strides", "padded keys", "last key of a block",
              "even square", "split causal", "dropout"),
    "flash_varlen": ("packed",),
    "flex": (),
}  # fmt: skip


def quick_battery(spec: str, features: Iterable[str] | None = None) -> tuple[Case, ...]:
    """The cheapest default case of ``spec`` for each of its ``QUICK_TEETH`` and for each value
    of each factor (``features`` as for ``default_battery``), in the default battery's order."""
    return _quick(spec, features_key(spec, features))


@functools.cache
def _quick(spec: str, features: frozenset[str] | None) -> tuple[Case, ...]:
    battery = default_battery(spec, features)
    if spec == "ring":
        return battery
    by_cost = sorted(battery, key=case_cost)
    teeth = (TEETH[label] for label in QUICK_TEETH[spec])
    chosen = {name: None for name in (_cheapest(by_cost, test) for test in teeth) if name}
    wanted = {(f, v) for f, values in pairs.space(spec, features).items() for v in values}
    for case in battery:
        if case.name in chosen:
            wanted -= set(pairs.case_values(spec, case).items())
    for case in by_cost:
        held = set(pairs.case_values(spec, case).items()) & wanted
        if held:
            chosen[case.name] = None
            wanted -= held
    return tuple(case for case in battery if case.name in chosen)


def _cheapest(by_cost: list[Case], test: Callable[[Case], bool]) -> str | None:
    """The first case of ``by_cost`` that ``test`` accepts, preferring, in this order, more
    than one query row (a single query hides what depends on the rows), no dropout, unsharp
    logits and Gaussian inputs: where the half-precision baseline is close, a mistake stands
    out most."""
    found = [case for case in by_cost if test(case)]
    found.sort(key=lambda c: (c.n == 1, bool(c.dropout_p), c.logits >= 10, c.inputs == "heavy"))
    return found[0].name if found else None


def case_cost(case: Case) -> int:
    """The work of one call, about B * H * N * M * (D + Dv) (summed over packed sequences)."""
    return case.heads * (case.d + case.value_width) * sum(n * m for n, m in case.lengths)


def pick(spec: str, teeth: str, features: Iterable[str] | None = None) -> str:
    """The name of the case the quick battery of ``spec`` holds for ``TEETH[teeth]`` (one of
    the spec's ``QUICK_TEETH``)."""
    if teeth not in QUICK_TEETH[spec]:
        raise ValueError(f"{teeth!r} is not among the quick teeth of {spec}: {QUICK_TEETH[spec]}")
    name = _cheapest(sorted(default_battery(spec, features), key=case_cost), TEETH[teeth])
    if name is None:
        raise ValueError(f"the {spec} battery has no case for {teeth!r}")
    return name


# -- by name -------------------------------------------------------------------------------------


def __getattr__(name: str) -> Any:
    """``DEFAULT``, ``QUICK`` and ``RING``, built when first asked for."""
    if name == "DEFAULT":
        return _everything()
    if name == "QUICK":
        return unique_by_name(case for spec in GENERATED_SPECS for case in _quick(spec, None))
    if name == "RING":
        return default_battery("ring")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _everything() -> tuple[Case, ...]:
    generated = (case for spec in GENERATED_SPECS for case in default_battery(spec))
    return unique_by_name([*generated, *NAMED])


def batteries(spec: str, features: Iterable[str] | None = None) -> dict[str, tuple[Case, ...]]:
    """The named batteries of ``spec`` for ``features``: default, quick, stress, ring."""
    key = features_key(spec, features)
    return {
        "default": default_battery(spec, key),
        "quick": _quick(spec, key),
        "stress": STRESS,
        "ring": default_battery("ring"),
    }


def lookup(name: str, spec: str | None = None, features: Iterable[str] | None = None) -> Case:
    """The case called ``name``: of ``spec``'s batteries for ``features``, of any spec's default
    battery, a named, stress or ring case."""
    pools: list[Iterable[Case]] = []
    if spec is not None:
        pools += batteries(spec, features).values()
    pools += [_everything(), STRESS, default_battery("ring")]
    for pool in pools:
        for case in pool:
            if case.name == name:
                return case
    raise ValueError(f"unknown case {name!r}; --list-cases names them")


def resolve(
    cases: str | Sequence[Case | str] | None,
    spec: str | None = None,
    features: Iterable[str] | None = None,
) -> tuple[Case, ...]:
    """The cases named by ``cases``: None (the default battery), a battery name ("default",
    "quick", "stress", "ring"), or a sequence of ``Case`` objects and case names; batteries
    and names are ``spec``'s for ``features`` (without a spec: every spec's)."""
    if cases is None or isinstance(cases, str):
        name = cases or "default"
        if name not in ("default", "quick", "stress", "ring"):
            raise ValueError(
                f"cases must be one of ['default', 'quick', 'ring', 'stress'] or a sequence, "
                f"got {cases!r}"
            )
        if spec is None:
            return {"default": _everything(), "stress": STRESS, "ring": default_battery("ring"),
                    "quick": __getattr__("QUICK")}[name]  # fmt: skip
        return batteries(spec, features)[name]
    resolved = [case if isinstance(case, Case) else _named(case, spec, features) for case in cases]
    if not resolved:
        raise ValueError("cases is empty")
    names = [case.name for case in resolved]
    if len(set(names)) != len(names):
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"cases has repeated names: {repeated}")
    return tuple(resolved)


def _named(name: object, spec: str | None, features: Iterable[str] | None) -> Case:
    if not isinstance(name, str):
        raise ValueError(f"unknown case {name!r}; cases are Case objects or names")
    return lookup(name, spec, features)
