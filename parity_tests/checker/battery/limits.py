"""A kernel's limits: the head widths, lengths and memory layouts it takes, besides its features
(``specs.FEATURES``) and its dtypes, and the battery they leave.

Real tiled kernels have limits that no option expresses: head widths that are powers of two
(``tl.arange`` needs one), lengths that are a multiple of their block (no masked loads), N = M
(no alignment rule), contiguous inputs (pointers built from shapes, not strides).
``KernelLimits`` declares them. A case outside them is not run ("not-run", outside the kernel's
limits), and the battery gains, right after it, its *nearest* case inside them
(``nearest``): each length rounded up to the multiple (N = M = the longer one where equal
lengths are required), keeping N < M or N > M; D and Dv at the nearest allowed widths, keeping
Dv < D or Dv > D; contiguous inputs; every option of the case kept. So declaring limits never
empties a feature's coverage: every pair of values the limits allow that the battery held is
still held (``allowed_pairs``: the required pairs less those of ``outside_values``, the values
no case inside them can hold; a test proves it). A replacement whose name
(``generate.name_of``: what it holds) is already in the battery is not added twice: the case of
that name holds the same options and sizes. A case named explicitly (``cases=[...]``, ``--case``)
outside the limits is a ValueError instead (``kernels.within_limits``): the limits exclude what
was asked for.

Where the limits mean something differs by spec (``check_spec``): the prefill specs apply them
all; the ring spec's ranks get contiguous shards of one self-attention (N = M), so
``equal_lengths`` and ``contiguous_only`` are met already, ``head_dims`` applies, and a
``seqlen_multiple`` is refused (the ranks split one length of 48 into shards the battery
fixes); the decode specs are refused any limit but ``contiguous_only`` (their inputs are
contiguous) and a ``head_dims`` that holds their widths (32 for flash_kvcache, FlashMLA's 576
and 512), since their lengths (a cache of 0, 1, a page edge +- 1 tokens against s_q queries)
are what their battery tests.

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value
width; for a packed case, each sequence's (N, M).

Tests: tests/checker/battery/test_limits.py
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import pairs
from .case import Case
from .generate import name_of
from .sizes import SPLIT_KEYS

# The head widths each decode spec's battery uses (its cases' D and Dv).
DECODE_WIDTHS = {"flash_kvcache": (32,), "flash_mla": (576, 512)}
OUTSIDE = "outside the kernel's limits"
MAX_WIDTH = 1024  # the widest head a limit may name (FlashMLA's is 576)


@dataclass(frozen=True)
class KernelLimits:
    """What a kernel takes besides its features and dtypes.

    Attributes:
        head_dims: the head widths it takes, for D and Dv alike (16, 32, 64, 128, say, or
            ``range(1, 257)``); None: any. Kept as a sorted tuple.
        seqlen_multiple: every length (N and M; of each sequence, when packed) a multiple of it.
        equal_lengths: N = M (of each sequence).
        contiguous_only: q, k and v contiguous (no views of a fused projection, no storage
            offset, k and v of the same strides).
    """

    head_dims: tuple[int, ...] | None = None
    seqlen_multiple: int = 1
    equal_lengths: bool = False
    contiguous_only: bool = False

    def __post_init__(self) -> None:
        if self.head_dims is not None:
            widths = tuple(self.head_dims)
            if any(isinstance(w, bool) or not isinstance(w, int) for w in widths):
                raise TypeError(f"head_dims must be integers, got {list(widths)}")
            if not widths or min(widths) < 1:
                raise ValueError(f"head_dims must be widths >= 1, at least one, got {widths}")
            object.__setattr__(self, "head_dims", tuple(sorted(set(widths))))
        multiple = self.seqlen_multiple
        if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
            raise ValueError(f"seqlen_multiple must be an integer >= 1, got {multiple!r}")
        # Past these the nearest cases would be larger than any the battery was calibrated on,
        # and their float64 goldens (B * H * N * M doubles) could exhaust the memory.
        if multiple > SPLIT_KEYS:
            raise ValueError(f"seqlen_multiple must be at most {SPLIT_KEYS} (the battery's "
                             f"longest length), got {multiple}")  # fmt: skip
        if self.head_dims is not None and max(self.head_dims) > MAX_WIDTH:
            raise ValueError(f"head_dims must be widths <= {MAX_WIDTH}, got "
                             f"{list(self.head_dims)}")  # fmt: skip
        for name in ("equal_lengths", "contiguous_only"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def declared(self) -> dict[str, Any]:
        """The limits that restrict anything, by name (the JSON report's ``limits.declared``)."""
        found: dict[str, Any] = {}
        if self.head_dims is not None:
            found["head_dims"] = list(self.head_dims)
        if self.seqlen_multiple > 1:
            found["seqlen_multiple"] = self.seqlen_multiple
        if self.equal_lengths:
            found["equal_lengths"] = True
        if self.contiguous_only:
            found["contiguous_only"] = True
        return found


def check_spec(spec: str, limits: KernelLimits) -> None:
    """A ValueError naming the limit that ``spec``'s battery cannot honour (module docstring)."""
    if spec == "ring" and limits.seqlen_multiple > 1:
        raise ValueError(
            "the ring spec takes no seqlen_multiple: its ranks split one length (48) into "
            "shards its battery fixes"
        )
    if spec in DECODE_WIDTHS:
        if limits.seqlen_multiple > 1 or limits.equal_lengths:
            raise ValueError(
                f"the {spec} spec takes no seqlen_multiple and no equal_lengths: its cache "
                "lengths (0, 1, a page edge +- 1) against s_q queries are what it tests"
            )
        widths = DECODE_WIDTHS[spec]
        if limits.head_dims is not None and not set(widths) <= set(limits.head_dims):
            raise ValueError(
                f"the {spec} spec's cases have head widths {list(widths)}, outside head_dims "
                f"{list(limits.head_dims)}"
            )


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


def apply(
    limits: KernelLimits | None, battery: Iterable[Case], claimed: frozenset[str]
) -> tuple[tuple[Case, ...], dict[str, tuple[str, str]]]:
    """``battery`` with, after each case outside ``limits`` whose features the kernel claims,
    its nearest case inside them (unless one of that name is there already), and for each case
    outside them (why, the name of the case judged instead). Cases needing features not
    claimed stay as they are (not run for that)."""
    battery = tuple(battery)
    if limits is None or not limits.declared:
        return battery, {}
    reasons = {case.name: outside(limits, case) for case in battery if case.needs <= claimed}
    inside = {case.name for case in battery if reasons.get(case.name) is None}
    kept: list[Case] = []
    excluded: dict[str, tuple[str, str]] = {}
    for case in battery:
        kept.append(case)
        why = reasons.get(case.name)
        if why is None:
            continue
        instead = nearest(limits, case)
        if instead.name in reasons and instead.name not in inside:  # a Dv the name does not say
            instead = dataclasses.replace(instead, name=f"{instead.name}-inside")
        excluded[case.name] = (why, instead.name)
        if instead.name not in inside:
            inside.add(instead.name)
            kept.append(instead)
    return tuple(kept), excluded


def not_run(
    case: Case, claimed: frozenset[str], excluded: dict[str, tuple[str, str]]
) -> str | None:
    """Why ``case`` is not run for a kernel claiming ``claimed``, whose limits excluded
    ``excluded`` (``apply``): the features it needs and the kernel does not claim, or the limits
    it is outside of and the case judged instead; None when it runs."""
    missing = case.needs - claimed
    if missing:
        return f"needs {', '.join(sorted(missing))}, not in the kernel's features"
    if case.name in excluded:
        why, instead = excluded[case.name]
        return f"{OUTSIDE}: {why}; judged instead: {instead}"
    return None


def outside_values(spec: str, limits: KernelLimits) -> frozenset[tuple[str, str]]:
    """The (factor, value) pairs of ``spec``'s space (``checker.pairs``) that no case inside
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
        found |= {("memory", "fused"), ("memory", "kv-strides"), ("memory", "offset")}
    return frozenset(value for value in found if value[0] in pairs.SPACES[spec])


def allowed_pairs(
    spec: str, limits: KernelLimits | None, features: Iterable[str] | None = None
) -> frozenset[pairs.Pair]:
    """The required pairs of ``spec`` (for ``features``) that a case inside ``limits`` can hold:
    the pair coverage a battery within them owes (the values of ``outside_values`` take part in
    no rule of ``pairs.allowed`` that another value needs)."""
    required = pairs.required_pairs(spec, features)
    if limits is None:
        return required
    gone = outside_values(spec, limits)
    return frozenset(pair for pair in required if not set(pair) & gone)
