"""The quick battery of an attention spec: from its default battery, the cheapest case for each
of the teeth its pitfalls need (``Spec.quick_teeth``, predicates of ``TEETH``; ``pick``
names the case) and for each value of each factor. It still flags every pitfall
(tests/checker/test_pitfalls.py), at a fraction of the default battery's cost.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width.

Tests: tests/checker/battery/attention/test_generate.py
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import pairs
from .case import Case
from .generate import default_battery
from .sizes import SPLIT_KEYS

if TYPE_CHECKING:
    from ...spec import Spec

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
    "shifted": lambda c: c.mask == "shifted",
    "broadcast 1 mod 32": lambda c: c.memory == "broadcast" and c.m % 32 == 1 and c.m > 32,
    "outliers": lambda c: c.inputs == "outliers" and not c.packed,
    "two row tiles": lambda c: c.n > 64 and not c.packed,
}  # fmt: skip


@functools.cache
def quick_battery(spec: Spec, features: frozenset[str] | None) -> tuple[Case, ...]:
    """The cheapest default case of ``spec`` for each of its quick teeth and for each value of
    each factor (``features``: the claimed features with a factor, None for all), in the
    default battery's order."""
    battery = spec.default_battery(features)
    by_cost = sorted(battery, key=case_cost)
    teeth = (TEETH[label] for label in spec.quick_teeth)
    chosen = {name: None for name in (_cheapest(by_cost, test) for test in teeth) if name}
    wanted = {(f, v) for f, values in pairs.space(spec, features).items() for v in values}
    for case in battery:
        if case.name in chosen:
            wanted -= set(spec.values_of(case).items())
    for case in by_cost:
        held = set(spec.values_of(case).items()) & wanted
        if held:
            chosen[case.name] = None
            wanted -= held
    return tuple(case for case in battery if case.name in chosen)


def _cheapest(by_cost: list[Case], test: Callable[[Case], bool]) -> str | None:
    """The first case of ``by_cost`` that ``test`` accepts, preferring, in this order, more
    than one query row (a single query hides what depends on the rows), no dropout, unsharp
    logits and Gaussian inputs (neither heavy-tailed, nor outliers, nor correlated): where the
    half-precision baseline is close, a mistake stands out most."""
    found = [case for case in by_cost if test(case)]
    found.sort(key=lambda c: (c.n == 1, bool(c.dropout_p), c.logits >= 10, c.inputs != "gauss"))
    return found[0].name if found else None


def case_cost(case: Case) -> int:
    """The work of one call, about B * H * N * M * (D + Dv) (summed over packed sequences)."""
    return case.heads * (case.d + case.value_width) * sum(n * m for n, m in case.lengths)


def pick(spec: Spec, teeth: str) -> str:
    """The name of the case the quick battery of ``spec`` holds for ``TEETH[teeth]`` (one of
    the spec's quick teeth)."""
    if teeth not in spec.quick_teeth:
        raise ValueError(f"{teeth!r} is not among the quick teeth of {spec.name}: "
                         f"{spec.quick_teeth}")  # fmt: skip
    name = _cheapest(sorted(default_battery(spec, None), key=case_cost), TEETH[teeth])
    if name is None:
        raise ValueError(f"the {spec.name} battery has no case for {teeth!r}")
    return name
