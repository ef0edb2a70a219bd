"""The attention specs' fuzzer (``battery.fuzz`` draws through it): case ``index`` of a run with
``seed`` is drawn by its own generator, seeded by (spec, seed, index): a value for every factor
of ``pairs.space(spec, features)``, each drawn among the values that keep the row one case can
hold (``pairs.extendable``: no mask with SDPA's is_causal, softcap only at sharp logits, ...),
then N and M for the row's length relation (half the time from the block edges and the sizes a
battery holds, half the time any length from 1 to 300; M = 1024, the split-KV path, now and
then) and D among the head widths (powers of two, an odd one, other even ones), and
``generate.case_of`` makes the case, as every battery does. So case ``index`` is the same case
whatever N is. A kernel with limits gets the nearest case inside them.

Shape legend: N query length, M key/value length, D head width.

Tests: tests/checker/battery/test_fuzz.py
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .. import pairs
from ..limits import KernelLimits
from .case import Case
from .generate import case_of, one_query_excluded
from .limits import nearest, outside
from .sizes import EDGES, ODD_WIDTH, SPLIT_KEYS, WIDTHS

if TYPE_CHECKING:
    from ...spec import Spec

LENGTHS = (1, 2, 16, 17, 37, 48, 113, *EDGES)
ANY_LENGTH = 300  # the longest length drawn freely
SPLIT_SHARE = 0.05  # how often M is the split-KV path's many keys (N < M rows)
HEAD_WIDTHS = (*WIDTHS, ODD_WIDTH, 24, 48, 80, 96)


def fuzz_case(
    spec: Spec,
    index: int,
    seed: int,
    features: Iterable[str] | None = None,
    limits: KernelLimits | None = None,
) -> Case:
    """Case ``index`` of ``spec``'s fuzzer for ``seed``, for a kernel claiming ``features``
    (None: every feature of the spec) within ``limits``."""
    claimed = None if features is None else sorted(features)
    rng = random.Random(f"fuzz {spec.name} {seed} {index} {claimed}")
    row = _row(spec, pairs.space(spec, features), rng)
    n, m = _lengths(row, spec.align or "top-left", rng)
    case = case_of(spec, row, n, m, rng.choice(HEAD_WIDTHS))
    if limits is not None and outside(limits, case) is not None:
        case = nearest(limits, case)
    return dataclasses.replace(case, name=f"fuzz{index}-{case.name}")


def _row(spec: Spec, domains: dict[str, tuple[str, ...]], rng: random.Random) -> pairs.Row:
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
