"""A kernel's limits on the attention cases: which cases lie outside them, and the nearest case
inside them (``battery.limits`` applies them to any spec's battery).

The nearest case keeps every option: each length rounded up to the multiple (N = M = the longer
one where equal lengths are required), keeping N < M or N > M; D and Dv at the nearest allowed
widths, keeping Dv < D or Dv > D; contiguous inputs. A replacement is named by what it holds
(``generate.name_of``), so one already in the battery is not added twice.

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value
width; for a packed case, each sequence's (N, M).

Tests: tests/checker/battery/test_limits.py
"""

from __future__ import annotations

import dataclasses
import math

from ..limits import KernelLimits
from .case import Case
from .generate import name_of


def outside(limits: KernelLimits, case: Case) -> str | None:
    """Why ``case`` is outside ``limits`` (each limit it breaks), or None when it is inside."""
    reasons = []
    if limits.head_dims is not None:
        widths = [f"{name} = {width}" for name, width in (("D", case.d), ("Dv", case.value_width))
                  if width not in limits.head_dims]  # fmt: skip
        if widths:
            reasons.append(f"{', '.join(widths)} not in head_dims")
    lengths = dict.fromkeys(length for pair in case.lengths for length in pair)
    odd = ", ".join(str(length) for length in lengths if length % limits.seqlen_multiple)
    if odd:
        many = "," in odd
        reasons.append(f"length{'s' if many else ''} {odd} not {'' if many else 'a '}"
                       f"multiple{'s' if many else ''} of {limits.seqlen_multiple}")  # fmt: skip
    if limits.equal_lengths and any(n != m for n, m in case.lengths):
        reasons.append("N != M")
    if limits.contiguous_only and case.memory != "contiguous":
        reasons.append(f"{case.memory} memory, not contiguous")
    return "; ".join(reasons) or None


def nearest(limits: KernelLimits, case: Case) -> Case:
    """The case inside ``limits`` nearest to ``case``, with every option of it, named by what it
    holds: each length rounded up to the multiple (N = M = the longer one where equal lengths
    are required), keeping N < M or N > M; D and Dv the nearest allowed widths (ties: the
    wider), keeping Dv < D or Dv > D where two widths allow it; contiguous inputs."""
    lengths = tuple(_lengths(limits, n, m) for n, m in case.lengths)
    d, dv = _widths(limits.head_dims, case.d, case.value_width)
    found = dataclasses.replace(
        case,
        n=sum(n for n, _ in lengths) if case.packed else lengths[0][0],
        m=sum(m for _, m in lengths) if case.packed else lengths[0][1],
        seqlens=lengths if case.packed else None,
        d=d,
        dv=None if dv == d else dv,
        memory="contiguous" if limits.contiguous_only else case.memory,
    )
    if not found.positioned:  # top-left and bottom-right are one case here (as generated)
        found = dataclasses.replace(found, align="top-left")
    return dataclasses.replace(found, name=name_of(found))


def _lengths(limits: KernelLimits, n: int, m: int) -> tuple[int, int]:
    """(N, M) rounded up to the multiple, keeping their order; equal where required."""
    step = limits.seqlen_multiple
    if limits.equal_lengths:
        n = m = max(n, m)
    n2, m2 = step * math.ceil(n / step), step * math.ceil(m / step)
    if n < m and n2 >= m2:
        m2 = n2 + step
    if n > m and m2 >= n2:
        n2 = m2 + step
    return n2, m2


def _widths(allowed: tuple[int, ...] | None, d: int, dv: int) -> tuple[int, int]:
    """The allowed (D, Dv) nearest to (d, dv), keeping the sign of Dv - D where possible."""
    if allowed is None:
        return d, dv
    candidates = {w: _near(allowed, w) for w in (d, dv)}
    pairs = [(a, b) for a in candidates[d] for b in candidates[dv]]

    def cost(pair: tuple[int, int]) -> tuple[bool, int, int]:
        a, b = pair
        kept = (b > a) == (dv > d) and (b < a) == (dv < d)
        return (not kept, abs(a - d) + abs(b - dv), -(a + b))

    return min(pairs, key=cost)


def _near(allowed: tuple[int, ...], width: int) -> list[int]:
    """The two allowed widths on each side of ``width`` (it too, if allowed)."""
    below = [w for w in allowed if w <= width][-2:]
    above = [w for w in allowed if w > width][:2]
    return below + above


def outside_values(limits: KernelLimits) -> frozenset[tuple[str, str]]:
    """The (factor, value) pairs of ``spec``'s space (``checker.battery.pairs``) that no case inside
    ``limits`` holds: N != M where equal lengths are required (and so any alignment: positions
    never matter then); Dv != D with one head width; any memory layout but contiguous where
    contiguous inputs are required."""
    found = set()
    if limits.equal_lengths:
        found |= {("lengths", "n<m"), ("lengths", "n>m")}
        found |= {("align", "top-left"), ("align", "bottom-right")}
    if limits.head_dims is not None and len(limits.head_dims) == 1:
        found |= {("dv", "smaller"), ("dv", "larger")}
    if limits.contiguous_only:
        found |= {("memory", value) for value in ("fused", "kv-strides", "offset", "broadcast")}
    return frozenset(found)
