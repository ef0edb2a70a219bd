"""The sizes a battery must hold: where block-tiled kernels break.

``requirements`` lists them for a spec: each block-edge length 63, 64, 65, 127, 128, 129, 255, 256,
257 (both sides of the 64- and 128-key blocks) as N and as M, causal and not; non-causal N a
multiple of 128 with M not (where zero-padded keys enter the softmax) and N = M a multiple of 128
(the even-length path); a decode step N = 1; many keys (M = 1024) for few (batch, head) pairs,
non-causal and causal with a whole block of keys hidden from a row (the split-KV paths); head widths
D = 16 ... 256 with N > M and with N < M, and an odd one. ``checker.battery.attention.generate``
meets them while it gives the covering array's rows their sizes; ``size_coverage`` reads from a
battery's cases which it meets.

Shape legend: B batch, H heads, N query length, M key/value length, D head width.

Tests: tests/checker/battery/attention/test_generate.py
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from .case import Case

EDGES = (63, 64, 65, 127, 128, 129, 255, 256, 257)
SPLIT_KEYS = 1024
BLOCK = 128  # the key block of the kernels the sizes aim at
WIDTHS = (16, 32, 64, 128, 256)
ODD_WIDTH = 33


class Sizes(NamedTuple):
    """What the size requirements read of a case (of one sequence of a packed case)."""

    n: int
    m: int
    d: int
    causal: bool
    batch_heads: int
    packed: bool
    align: str = "top-left"
    memory: str = "contiguous"


class Requirement(NamedTuple):
    """A size a battery must hold: met when ``test`` holds for some case's sizes. Head width
    requirements (``widths``) are chosen after the lengths."""

    label: str
    test: Callable[[Sizes], bool]
    widths: bool = False
    edge: bool = False  # a block-edge length as N or M

    def met(self, case: Case) -> bool:
        """Whether ``case`` meets it (any sequence of a packed case)."""
        return any(self.test(sizes) for sizes in sizes_of(case))


def requirements(features: Iterable[str] | None = None) -> tuple[Requirement, ...]:
    """The size requirements of an attention spec's default battery, for a kernel claiming
    ``features`` (None: all; the ring spec has none: its ranks split one length)."""
    causal = (False, True) if features is None or "causal" in set(features) else (False,)
    found = [
        Requirement(
            f"{side} = {length}{', causal' if c else ''}", _edge(side, length, c), edge=True
        )
        for side in ("N", "M")
        for length in EDGES
        for c in causal
    ]
    found += [
        Requirement(
            "non-causal, N a multiple of 128 and M not (zero-padded keys)",
            lambda s: not s.causal and s.n % 128 == 0 and s.m % 128 != 0,
        ),
        Requirement(
            "non-causal, N = M a multiple of 128",
            lambda s: not s.causal and s.n == s.m and s.n % 128 == 0,
        ),
        Requirement("N = 1 (a decode step)", lambda s: s.n == 1),
    ]
    found.append(Requirement(f"split-KV: M = {SPLIT_KEYS}, N <= 256, B * H <= 4", _split(False)))
    if True in causal:
        found.append(Requirement(
            f"split-KV, causal: M = {SPLIT_KEYS}, B * H <= 4, the last {BLOCK} keys hidden "
            "from a row",
            _split(True),
        ))  # fmt: skip
    found += [
        Requirement(f"D = {d}, N {relation} M", _width(d, relation), widths=True)
        for d in WIDTHS
        for relation in (">", "<")
    ]
    found.append(Requirement("an odd D", lambda s: s.d % 2 == 1, widths=True))
    found += [
        Requirement(f"broadcast (stride-0) K and V, M % {step} = 1" + (", M % 64 != 1"
                    if step == 32 else ""), _broadcast(step))
        for step in (64, 32)
    ]  # fmt: skip
    return tuple(found)


def _edge(side: str, length: int, causal: bool) -> Callable[[Sizes], bool]:
    return lambda s: (s.n if side == "N" else s.m) == length and s.causal == causal


def _split(causal: bool) -> Callable[[Sizes], bool]:
    """Many keys for few rows: the split-KV path; causal, a row must have a whole block of its
    keys hidden (the last BLOCK keys, M being a multiple of it: row 0 sees M - 1 keys fewer
    top-left, N - 1 bottom-right), where a split's running max stays -inf."""
    if not causal:
        return lambda s: (
            not s.packed and not s.causal and s.m >= SPLIT_KEYS and s.n <= 256
            and s.batch_heads <= 4
        )  # fmt: skip
    return lambda s: (
        not s.packed and s.causal and s.m >= SPLIT_KEYS and s.batch_heads <= 4
        and (s.m - 1 if s.align == "top-left" else s.n - 1) >= BLOCK
    )  # fmt: skip


def _broadcast(step: int) -> Callable[[Sizes], bool]:
    """K and V as stride-0 views at a key length 1 mod ``step`` (and not 1 mod 64 for 32):
    where SDPA's efficient kernel went wrong on them (PyTorch #191937)."""
    return lambda s: (
        s.memory == "broadcast" and not s.packed and s.m % step == 1
        and (step == 64 or s.m % 64 != 1)
    )  # fmt: skip


def _width(d: int, relation: str) -> Callable[[Sizes], bool]:
    return lambda s: s.d == d and (s.n > s.m if relation == ">" else s.n < s.m)


def sizes_of(case: Case) -> list[Sizes]:
    """The sizes of a case, one per sequence of a packed case."""
    return [
        Sizes(
            n, m, case.d, case.causal, case.batch * case.heads, case.packed, case.align, case.memory
        )
        for n, m in dict.fromkeys(case.lengths)
    ]


def size_summary(reqs: Iterable[Requirement], cases: Iterable[Case]) -> list[str]:
    """Which of ``reqs`` (an attention spec's requirements) ``cases`` meet, as lines to print:
    the block-edge lengths met as N and as M, causal and not, on one line each, then every
    other requirement with the first case that meets it."""
    cases, reqs = list(cases), tuple(reqs)
    edges = {r.label: r for r in reqs if r.edge}
    lines = []
    for side in ("N", "M"):
        for causal in ("", ", causal"):
            labels = [f"{side} = {length}{causal}" for length in EDGES]
            if labels[0] in edges:
                held = [label.split()[2].rstrip(",") for label in labels
                        if met_by(edges[label], cases)]  # fmt: skip
                lines.append(f"{side}{causal or ', non-causal'} at the block edges: "
                             f"{len(held)} of {len(labels)} ({' '.join(held)})")  # fmt: skip
    for r in reqs:
        if not r.edge:
            found = met_by(r, cases)
            lines.append(f"{r.label}: {found.name if found else 'NOT MET'}")
    return lines


def met_by(requirement: Requirement, cases: list[Case]) -> Case | None:
    """The first case of ``cases`` that meets ``requirement``, or None."""
    return next((c for c in cases if any(requirement.test(s) for s in sizes_of(c))), None)
