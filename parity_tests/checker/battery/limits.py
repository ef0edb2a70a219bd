"""A kernel's limits: the head widths, lengths, memory layouts and page sizes it takes, besides
its features (``specs.FEATURES``) and its dtypes, and the battery they leave, for every spec.

Real tiled kernels have limits that no option expresses: head widths that are powers of two
(``tl.arange`` needs one), lengths that are a multiple of their block (no masked loads), N = M
(no alignment rule), contiguous inputs (pointers built from shapes, not strides), the page sizes
a paged kernel was compiled for. ``KernelLimits`` declares them. A case outside them
(``Any.outside``) is not run ("not-run", outside the kernel's limits), and the battery gains,
right after it, its *nearest* case inside them (``Any.nearest``, every option of the case
kept: for the attention specs each length rounded up to the multiple, keeping N < M or N > M,
D and Dv at the nearest allowed widths, contiguous inputs, ``battery.attention.limits``; for the
decode specs the nearest allowed head width and page size, the same lengths at that page size).
So declaring limits never empties a feature's coverage: every pair of values the limits allow
that the battery held is still held (``allowed_pairs``: the required pairs less those of
``Any.outside_values``, the values no case inside them can hold; a test proves it). A
replacement whose name (what it holds) is already in the battery is not added twice. A case
named explicitly (``cases=[...]``, ``--case``) outside the limits is a ValueError instead
(``pipeline.within_limits``): the limits exclude what was asked for.

Where the limits mean something differs by spec (``Any.check_limits``): the attention specs
apply them all but ``page_sizes``; the ring spec's ranks get contiguous shards of one
self-attention (N = M), so ``equal_lengths`` and ``contiguous_only`` are met already,
``head_dims`` applies, and a ``seqlen_multiple`` is refused (the ranks split one length of 48
into shards the battery fixes); the decode specs take ``head_dims`` and ``page_sizes`` (a
FlashMLA kernel must take its 576 and 512 wide heads and pages of 64), ``contiguous_only`` is
met already (their inputs are contiguous), and ``seqlen_multiple`` and ``equal_lengths`` are
refused, since their lengths (a cache of 0, 1, a page edge +- 1 tokens against s_q queries) are
what their battery tests. ``nondeterministic`` leaves every battery as it is: it spares the kernel
the second call of each case, in every spec.

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value
width; for a packed case, each sequence's (N, M).

Tests: tests/checker/battery/test_limits.py
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import pairs

MAX_MULTIPLE = 1024  # the longest length of a battery (the split-KV path's keys)
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
        page_sizes: the page sizes (tokens per page) a decode kernel takes, 16, 64, say; None:
            any. Kept as a sorted tuple.
        nondeterministic: its results may change from call to call on identical inputs (it adds
            in whatever order its blocks finish): each case is called once, not compared with a
            second call (``running.calls.repeated``). A kernel that claims "deterministic"
            cannot declare it.
    """

    head_dims: tuple[int, ...] | None = None
    seqlen_multiple: int = 1
    equal_lengths: bool = False
    contiguous_only: bool = False
    page_sizes: tuple[int, ...] | None = None
    nondeterministic: bool = False

    def __post_init__(self) -> None:
        if self.head_dims is not None:
            widths = tuple(self.head_dims)
            if any(isinstance(w, bool) or not isinstance(w, int) for w in widths):
                raise TypeError(f"head_dims must be integers, got {list(widths)}")
            if not widths or min(widths) < 1:
                raise ValueError(f"head_dims must be widths >= 1, at least one, got {widths}")
            object.__setattr__(self, "head_dims", tuple(sorted(set(widths))))
        if self.page_sizes is not None:
            sizes = tuple(self.page_sizes)
            if any(isinstance(p, bool) or not isinstance(p, int) for p in sizes):
                raise TypeError(f"page_sizes must be integers, got {list(sizes)}")
            if not sizes or min(sizes) < 1:
                raise ValueError(f"page_sizes must be sizes >= 1, at least one, got {sizes}")
            object.__setattr__(self, "page_sizes", tuple(sorted(set(sizes))))
        multiple = self.seqlen_multiple
        if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
            raise ValueError(f"seqlen_multiple must be an integer >= 1, got {multiple!r}")
        # Past these the nearest cases would be larger than any the battery was calibrated on,
        # and their float64 goldens (B * H * N * M doubles) could exhaust the memory.
        if multiple > MAX_MULTIPLE:
            raise ValueError(f"seqlen_multiple must be at most {MAX_MULTIPLE} (the battery's "
                             f"longest length), got {multiple}")  # fmt: skip
        if self.head_dims is not None and max(self.head_dims) > MAX_WIDTH:
            raise ValueError(f"head_dims must be widths <= {MAX_WIDTH}, got "
                             f"{list(self.head_dims)}")  # fmt: skip
        for name in ("equal_lengths", "contiguous_only", "nondeterministic"):
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
        if self.page_sizes is not None:
            found["page_sizes"] = list(self.page_sizes)
        if self.nondeterministic:
            found["nondeterministic"] = True
        return found


def check_claims(claimed: frozenset[str], limits: KernelLimits | None) -> None:
    """A ValueError for ``limits`` that contradict the features ``claimed``: a kernel declared
    nondeterministic that claims "deterministic"."""
    if limits is not None and limits.nondeterministic and "deterministic" in claimed:
        raise ValueError(
            'the kernel claims "deterministic" and its limits declare it nondeterministic: '
            "give one of them"
        )


def check(spec: Any, limits: KernelLimits) -> None:
    """A ValueError naming the limit that ``spec``'s battery cannot honour."""
    spec.check_limits(limits)


def apply(
    spec: Any, limits: KernelLimits | None, battery: Iterable[Any], claimed: frozenset[str]
) -> tuple[tuple[Any, ...], dict[str, tuple[str, str]]]:
    """``battery`` with, after each case outside ``limits`` whose features the kernel claims,
    its nearest case inside them (unless one of that name is there already), and for each case
    outside them (why, the name of the case judged instead). Cases needing features not
    claimed stay as they are (not run for that)."""
    battery = tuple(battery)
    if limits is None or not limits.declared:
        return battery, {}
    reasons = {case.name: spec.outside(limits, case) for case in battery if case.needs <= claimed}
    inside = {case.name for case in battery if reasons.get(case.name) is None}
    kept: list[Any] = []
    excluded: dict[str, tuple[str, str]] = {}
    for case in battery:
        kept.append(case)
        why = reasons.get(case.name)
        if why is None:
            continue
        instead = spec.nearest(limits, case)
        if instead.name in reasons and instead.name not in inside:  # a Dv the name does not say
            instead = dataclasses.replace(instead, name=f"{instead.name}-inside")
        excluded[case.name] = (why, instead.name)
        if instead.name not in inside:
            inside.add(instead.name)
            kept.append(instead)
    return tuple(kept), excluded


def not_run(case: Any, claimed: frozenset[str], excluded: dict[str, tuple[str, str]]) -> str | None:
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


def allowed_pairs(
    spec: Any, limits: KernelLimits | None, features: Iterable[str] | None = None
) -> frozenset[pairs.Pair]:
    """The required pairs of ``spec`` (for ``features``) that a case inside ``limits`` can hold:
    the pair coverage a battery within them owes (the values of ``Any.outside_values`` take
    part in no rule of ``Any.allowed`` that another value needs)."""
    required = pairs.required_pairs(spec, features)
    if limits is None:
        return required
    gone = spec.outside_values(limits)
    return frozenset(pair for pair in required if not set(pair) & gone)
