"""What the failing cases of a check have in common: the few factor values that every failing
(case, dtype) group holds and that no passing group holds all of, e.g. "every failing case:
M % 16 != 0 and causal = off".

Each group is described by *facts*, strings such as "causal = off", "M % 16 != 0" or "dtype =
bfloat16": its case's factor values as its spec reads them back (``Spec.values_of``, kept in
``KernelReport.factors``) and its dtype, each also as what it is not where the check saw three
values or more ("window != none", "dtype != float32"), and size predicates read from the case's
shape, those a tiled kernel's bugs follow:

- attention cases (B, H, N, M, D, Dv): N and M modulo 16, 32, 64 and 128, N = 1, N against M
  (N < M, N = M or N > M, and N != M), the head widths D and Dv, B = 1 and B * H below 4 (few
  programs in the grid);
- decode cases (their shape has P, the page size): P, D, the queries s_q, the new tokens s_new,
  the heads H and H_kv.

The diagnosis is the smallest set of facts, at most ``MOST`` of them and fewer than the
failing cases (a few facts set one case apart by chance as much as by cause), that every
failing group holds and no passing group holds all of; among sets of one size, the one whose
facts are the most specific (held by the fewest groups of the check), listed most specific
first. A fact that nearly every group holds (all but less than ``RARE`` of them: "H = 4" where
two cases of 42 have other heads) is not named: it describes the few passing cases, not the
failing ones. Groups that were not judged (skipped, not run, expected failures) take no part.
A check with fewer than two failing cases, or whose failing groups no such set tells apart, has
none: its failing rows say where it fails.

Tests: tests/checker/report/test_diagnosis.py
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

# At most this many facts in one diagnosis: more is a description of the cases, not a cause.
MOST = 3
# Fewer failing cases than this get no diagnosis: one case's facts all "separate" it.
FEWEST_CASES = 2
# A fact is named only if at least this share of the groups do not hold it.
RARE = 0.1
MODULI = (16, 32, 64, 128)
FAILED = ("fail", "error", "refused")  # report.rows.FAILED_GROUPS: the three outcomes


def factor_values(spec: Any, case: Any) -> dict[str, str]:
    """The value of each factor ``case`` holds (``spec.values_of``), but those meaning "does
    not apply" (``spec.na``): what ``KernelReport.factors`` keeps of each case."""
    values = spec.values_of(case)
    return {factor: value for factor, value in values.items() if value != spec.na(factor)}


def case_facts(values: Mapping[str, str], shape: Mapping[str, int]) -> list[str]:
    """The facts of a case: each factor's value (``factor_values``), then the size predicates
    of its ``shape``."""
    facts = [f"{factor} = {value}" for factor, value in values.items()]
    if "topk" in shape:
        return facts + _sparse_sizes(shape)
    if "T" in shape:
        return facts + _linear_sizes(shape)
    if "S" in shape:  # a merge of S states (flashinfer_merge)
        return facts + [f"{name} = {shape[name]}" for name in ("S", "H", "D")]
    return facts + (_decode_sizes(shape) if "P" in shape else _attention_sizes(shape))


def _attention_sizes(shape: Mapping[str, int]) -> list[str]:
    n, m = shape["N"], shape["M"]
    facts = [
        f"{name} % {k} {'=' if size % k == 0 else '!='} 0"
        for name, size in (("N", n), ("M", m))
        for k in MODULI
    ]
    facts.append("N = 1" if n == 1 else "N > 1")
    facts.append("N < M" if n < m else "N = M" if n == m else "N > M")
    facts += ["N != M"] if n != m else []
    facts += [f"D = {shape['D']}", f"Dv = {shape['Dv']}"]
    facts.append("B = 1" if shape["B"] == 1 else "B > 1")
    facts.append("B*H < 4" if shape["B"] * shape["H"] < 4 else "B*H >= 4")
    return facts


def _decode_sizes(shape: Mapping[str, int]) -> list[str]:
    page = f"P = {shape['P']}" if shape["P"] else "P = none (a contiguous cache)"
    sizes = [f"{name} = {shape[key]}" for name, key in _DECODE_SIZES.items() if key in shape]
    return [page, *sizes]


def _sparse_sizes(shape: Mapping[str, int]) -> list[str]:
    """A sparse case's sizes: the widths and heads, and the list length against 64-entry
    tiles."""
    topk = shape["topk"]
    sizes = [f"{name} = {shape[name]}" for name in ("D", "Dv", "H", "H_kv")]
    return [*sizes, f"topk = {topk}", f"topk % 64 {'=' if topk % 64 == 0 else '!='} 0"]


def _linear_sizes(shape: Mapping[str, int]) -> list[str]:
    """A linear case's sizes: T against 64-token chunks, the widths, the states."""
    t = shape["T"]
    facts = [f"T % 64 {'=' if t % 64 == 0 else '!='} 0", "T = 1" if t == 1 else "T > 1"]
    facts += [f"{name} = {shape[name]}" for name in ("K", "V", "H", "B", "N")]
    return facts + ["K = V" if shape["K"] == shape["V"] else "K != V"]


# The sizes a decode case's facts name, by the key of its shape holding each (N: s_q).
_DECODE_SIZES = {"D": "D", "s_q": "N", "s_new": "s_new", "H": "H", "H_kv": "H_kv"}


def diagnose(
    statuses: Mapping[tuple[str, str], str],
    factors: Mapping[str, Mapping[str, str]],
    shapes: Mapping[str, Mapping[str, int]],
) -> list[str]:
    """The facts that set the failing groups apart (see the module docstring), most specific
    first; [] when there is no such set of at most ``MOST`` facts.

    Args:
        statuses: each (case, dtype) group's status ("pass"; "fail", "error" or "refused" are
            failing; any other is left out).
        factors: each case's factor values (``Spec.values_of``), by case name.
        shapes: each case's shape (``case.shape``), by case name.
    """
    failing = [group for group, status in statuses.items() if status in FAILED]
    passing = [group for group, status in statuses.items() if status == "pass"]
    if len({case for case, _ in failing}) < FEWEST_CASES:
        return []
    values = {(case, dtype): {**factors.get(case, {}), "dtype": dtype} for case, dtype in statuses}
    seen: dict[str, set[str]] = {}
    for group in failing + passing:
        for factor, value in values[group].items():
            seen.setdefault(factor, set()).add(value)
    facts = {
        group: {
            *case_facts(values[group], shapes[group[0]]),
            *(
                f"{factor} != {other}"
                for factor, held in seen.items()
                if len(held) > 2
                for other in held
                if other != values[group].get(factor)
            ),
        }  # fmt: skip
        for group in failing + passing
    }
    order = list(dict.fromkeys(fact for group in facts.values() for fact in sorted(group)))
    held = {fact: sum(fact in group for group in facts.values()) for fact in order}
    named = [fact for fact in order if len(facts) - held[fact] >= RARE * len(facts)]
    shared = [fact for fact in named if all(fact in facts[group] for group in failing)]
    # bit i of a fact's mask: passing group i holds it
    masks = {fact: _mask(fact in facts[group] for group in passing) for fact in shared}
    everyone = (1 << len(passing)) - 1
    for size in range(1, min(MOST, len({case for case, _ in failing}) - 1) + 1):
        sets = [
            chosen
            for chosen in itertools.combinations(shared, size)
            if _all(masks[fact] for fact in chosen) & everyone == 0
        ]
        if sets:
            best = min(sets, key=lambda chosen: sorted(held[fact] for fact in chosen))
            return sorted(best, key=lambda fact: held[fact])
    return []


def _mask(bits: Iterable[bool]) -> int:
    return sum(1 << i for i, bit in enumerate(bits) if bit)


def _all(masks: Iterable[int]) -> int:
    """The bitwise AND of ``masks``: the passing groups that hold every fact."""
    result = -1
    for mask in masks:
        result &= mask
    return result


def sentence(diagnosis: list[str]) -> str:
    """The diagnosis as the reports print it: "every failing case: A and B"; "" for none."""
    return f"every failing case: {' and '.join(diagnosis)}" if diagnosis else ""


def report_diagnosis(report: Any, statuses: Mapping[tuple[str, str], str]) -> list[str]:
    """``diagnose`` for a ``KernelReport`` whose groups got ``statuses`` (the CLI's, with its
    expected failures; ``report.groups`` otherwise)."""
    shapes = {name: case.shape for name, case in report.cases.items()}
    return diagnose(statuses, report.factors, shapes)
