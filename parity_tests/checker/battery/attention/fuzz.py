"""Random cases for a kernel: ``--fuzz N --seed S`` draws N cases from the spec's space, beyond
what its battery holds (``python -m parity_tests --kernel K --fuzz 2000``).

Case ``index`` of a run with ``seed`` (``fuzz_case``) is drawn by its own generator, seeded by
(spec, seed, index): a value for every factor of ``pairs.space(spec, features)``, each drawn
among the values that keep the row one case can hold (``pairs.extendable``: no mask with
SDPA's is_causal, softcap only at sharp logits, ...), then N and M for the row's length relation
(half the time from the block edges and the sizes a battery holds, half the time any length
from 1 to 300; M = 1024, the split-KV path, now and then) and D among the head widths (powers of
two, an odd one, other even ones), and ``generate.case_of`` makes the case, as every battery
does. So case ``index`` is the same case whatever N is, and ``--fuzz-case index --seed S``
reruns it alone. Its name is ``fuzz<index>-`` and what it holds (``generate.name_of``); its
inputs are seeded by the seed and that name, as every case's. A kernel with limits
(``checker.limits``) gets the nearest case inside them. The ring and decode specs have no
fuzzer: their batteries split one length over ranks, or cover a cache's lengths.

Shape legend: N query length, M key/value length, D head width.

Tests: tests/checker/battery/test_fuzz.py
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable

from . import pairs
from .case import Case
from .generate import GENERATED_SPECS, case_of, one_query_excluded
from .limits import KernelLimits, nearest, outside
from .sizes import EDGES, ODD_WIDTH, SPLIT_KEYS, WIDTHS

LENGTHS = (1, 2, 16, 17, 37, 48, 113, *EDGES)
ANY_LENGTH = 300  # the longest length drawn freely
SPLIT_SHARE = 0.05  # how often M is the split-KV path's many keys (N < M rows)
HEAD_WIDTHS = (*WIDTHS, ODD_WIDTH, 24, 48, 80, 96)


def fuzz_cases(
    spec: str,
    count: int,
    seed: int,
    features: Iterable[str] | None = None,
    limits: KernelLimits | None = None,
) -> tuple[Case, ...]:
    """Cases 0 .. ``count`` - 1 of ``spec``'s fuzzer for ``seed`` (``fuzz_case``)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}")
    return tuple(fuzz_case(spec, index, seed, features, limits) for index in range(count))


def fuzz_case(
    spec: str,
    index: int,
    seed: int,
    features: Iterable[str] | None = None,
    limits: KernelLimits | None = None,
) -> Case:
    """Case ``index`` of ``spec``'s fuzzer for ``seed``, for a kernel claiming ``features``
    (None: every feature of the spec) within ``limits``."""
    if spec not in GENERATED_SPECS:
        raise ValueError(
            f"the {spec} spec has no fuzzer (its battery splits one length over ranks, or "
            f"covers a cache's lengths): fuzz one of {list(GENERATED_SPECS)}"
        )
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"a drawn case's index must be an integer >= 0, got {index!r}")
    claimed = None if features is None else sorted(features)
    rng = random.Random(f"fuzz {spec} {seed} {index} {claimed}")
    row = _row(spec, pairs.space(spec, features), rng)
    n, m = _lengths(row, pairs.ALIGN.get(spec, "top-left"), rng)
    case = case_of(spec, row, n, m, rng.choice(HEAD_WIDTHS))
    if limits is not None and outside(limits, case) is not None:
        case = nearest(limits, case)
    return dataclasses.replace(case, name=f"fuzz{index}-{case.name}")


def _row(spec: str, domains: dict[str, tuple[str, ...]], rng: random.Random) -> pairs.Row:
    """A value for every factor, each drawn among those that keep the row one case can hold."""
    row: pairs.Row = {}
    for factor, values in domains.items():
        held = [v for v in values if pairs.extendable(spec, domains, {**row, factor: v})]
        row[factor] = rng.choice(held)
    return row


def _lengths(row: pairs.Row, align: str, rng: random.Random) -> tuple[int, int]:
    """(N, M) in the row's relation; never N = 1 where one query's gradients cannot be judged
    (``generate.one_query_excluded``; ``align``: the spec's, unless the row has its own), and
    never M = 1: over one key the softmax is constant, so the golden dq and dk are exactly 0 and
    their bound is 0, which a correct kernel's rounding (1e-7 in float32: it subtracts dO . O
    from dO . v, equal but rounded apart) exceeds; the batteries hold no M = 1 either."""
    relation = row.get("lengths", "n=m")
    while True:
        first, second = _length(rng), _length(rng)
        if relation == "n=m":
            n = m = first
        elif first == second:
            continue
        else:
            n, m = sorted((first, second), reverse=relation == "n>m")
        if relation == "n<m" and rng.random() < SPLIT_SHARE:
            m = SPLIT_KEYS
        if m == 1:
            continue  # one key: the softmax is constant, dq and dk exactly 0 (a bound of 0)
        if not (n == 1 and one_query_excluded(row, align)):
            return n, m


def _length(rng: random.Random) -> int:
    return rng.choice(LENGTHS) if rng.random() < 0.5 else rng.randint(1, ANY_LENGTH)
