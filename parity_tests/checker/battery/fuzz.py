"""Random cases for a kernel: ``--fuzz N --seed S`` draws N cases from the spec's space, beyond
what its battery holds (``python -m parity_tests --kernel K --fuzz 2000``).

Case ``index`` of a run with ``seed`` is the spec's own draw (``Spec.fuzz_case``: the attention
specs' ``battery.attention.fuzz``, the decode specs' ``battery.decode.fuzz``), by a generator
seeded by (spec, seed, index) and the features claimed: a value for every factor, each drawn
among the values that keep the row one case can hold (``pairs.extendable``), then sizes drawn
for it; so ``--fuzz-case index --seed S`` reruns case ``index`` alone, and a kernel with limits
gets the nearest case inside them. Its name is ``fuzz<index>-`` and what it holds; its inputs
are seeded by the seed and that name, as every case's. The ring spec has no fuzzer (its
battery splits one length over ranks).

Tests: tests/checker/battery/test_fuzz.py
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..specs import get
from .limits import KernelLimits


def fuzz_cases(
    spec: Any,
    count: int,
    seed: int,
    features: Iterable[str] | None = None,
    limits: KernelLimits | None = None,
) -> tuple[Any, ...]:
    """Cases 0 .. ``count`` - 1 of ``spec``'s fuzzer for ``seed`` (``fuzz_case``)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}")
    return tuple(fuzz_case(spec, index, seed, features, limits) for index in range(count))


def fuzz_case(
    spec: Any,
    index: int,
    seed: int,
    features: Iterable[str] | None = None,
    limits: KernelLimits | None = None,
) -> Any:
    """Case ``index`` of ``spec``'s fuzzer for ``seed``, for a kernel claiming ``features``
    (None: every feature of the spec) within ``limits``."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"a drawn case's index must be an integer >= 0, got {index!r}")
    claimed = None if features is None else frozenset(features)
    return get(spec).fuzz_case(index, seed, claimed, limits)
