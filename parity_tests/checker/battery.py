"""The batteries of cases the kernel checker runs, built by code from what they must cover.

For a spec (``checker.specs``) and the features a kernel claims, the default battery is
1. a covering array of the spec's factors (``checker.pairs``): every pair of values that one
   case can hold meets in some case (causal with each mask and alignment, a window under
   bottom-right, softcap with a window, ALiBi per head and per batch element under GQA,
   Dv < D and > D under GQA, varlen with every option, every memory layout with each);
2. concrete sizes for its rows, chosen greedily to meet ``requirements``, the sizes where
   block-tiled kernels break: each block-edge length 63, 64, 65, 127, 128, 129, 255, 256, 257
   as N and as M, causal and not; non-causal N a multiple of 128 with M not (where
   zero-padded keys enter the softmax) and N = M a multiple of 128; a decode step N = 1; many
   keys (M = 1024) with a small B * H, causal and not (the split-KV paths); head widths 16 ...
   256 with N > M and with N < M, and an odd one. A row with no option is added only for a
   size the array's rows could not take.
Every generated case is named by what it holds (its options, then N x M and D), so the same
case built for two specs or feature sets is one case, and a report's name says what failed.
``quick_battery`` keeps, from the default battery, the cheapest case for each of ``TEETH``
(what the pitfalls need) and for each value of each factor: it still flags every pitfall.
Both are functions of (spec, features), so a kernel that claims fewer features gets a battery
with every pair of the features it claims.

``DEFAULT`` holds every case addressable by name outside the stress and ring batteries: each
spec's default battery (every feature claimed) and the named cases of ``checker.named``;
``QUICK`` each spec's quick battery; ``STRESS`` the stress battery; ``RING`` the ring spec's
battery (its own: self-attention of 48 positions, a covering array of its factors grown from
the named ring cases).

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; for a packed (varlen) case S sequences.

Tests: tests/checker/test_battery.py (pair coverage: tests/checker/test_pairs.py)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from . import pairs
from .case import ALIBI, ALIGNS, INPUTS, LAYOUTS, MASKS, MEMORY, Case, CaseInputs, make_inputs
from .named import NAMED, RING_SEEDS, STRESS

__all__ = [
    "ALIBI", "ALIGNS", "INPUTS", "LAYOUTS", "MASKS", "MEMORY", "Case", "CaseInputs",
    "make_inputs", "NAMED", "STRESS", "default_battery", "quick_battery", "requirements",
    "size_coverage", "resolve", "lookup", "pick", "TEETH",
]  # fmt: skip

EDGES = (63, 64, 65, 127, 128, 129, 255, 256, 257)
SPLIT_KEYS = 1024
BLOCK = 128  # the key block of the kernels the sizes aim at
WIDTHS = (16, 32, 64, 128, 256)
ODD_WIDTH = 33
DROPOUT_P = 0.3
SHARP_LOGITS = 30.0
SOFTCAP = 5.0
GENERATED_SPECS = ("sdpa", "flash", "flash_varlen", "flex")
WIDE_MODEL = 256  # the widest H * D a case takes (wide heads go to rows of few heads)

_N_POOL = (1, 37, *EDGES)
_M_POOL = (37, 113, *EDGES, SPLIT_KEYS)
_FILLER = {"n<m": (37, 113), "n=m": (48, 48), "n>m": (113, 37)}
_D_POOL = (64, 32, 16, 128, 256, ODD_WIDTH)  # ties go to the first
_PACKED_REST = ((1, 64), (64, 37), (20, 20))  # a packed row's sequences after its own (N, M)
_MEMORY_TAGS = {"fused": "fused", "kv-strides": "kvstrides", "offset": "offset"}


class Sizes(NamedTuple):
    """What the size requirements read of a case (of one sequence of a packed case)."""

    n: int
    m: int
    d: int
    causal: bool
    batch_heads: int
    packed: bool
    align: str = "top-left"


class Requirement(NamedTuple):
    """A size a battery must hold: met when ``test`` holds for some case's sizes. Head width
    requirements (``widths``) are chosen after the lengths."""

    label: str
    test: Callable[[Sizes], bool]
    widths: bool = False
    edge: bool = False  # a block-edge length as N or M


def requirements(spec: str, features: Iterable[str] | None = None) -> tuple[Requirement, ...]:
    """The size requirements of ``spec``'s default battery (the ring spec has none: its
    ranks split one length)."""
    if spec == "ring":
        return ()
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


def _width(d: int, relation: str) -> Callable[[Sizes], bool]:
    return lambda s: s.d == d and (s.n > s.m if relation == ">" else s.n < s.m)


def sizes_of(case: Case) -> list[Sizes]:
    """The sizes of a case, one per sequence of a packed case."""
    return [
        Sizes(n, m, case.d, case.causal, case.batch * case.heads, case.packed, case.align)
        for n, m in dict.fromkeys(case.lengths)
    ]


def size_coverage(
    spec: str, cases: Iterable[Case], features: Iterable[str] | None = None
) -> dict[str, bool]:
    """For each size requirement of ``spec``, whether some case of ``cases`` meets it."""
    sizes = [s for case in cases for s in sizes_of(case)]
    return {r.label: any(r.test(s) for s in sizes) for r in requirements(spec, features)}


def size_summary(
    spec: str, cases: Iterable[Case], features: Iterable[str] | None = None
) -> list[str]:
    """``size_coverage`` as lines to print: the block-edge lengths met as N and as M, causal and
    not, on one line each, then every other requirement with the first case that meets it."""
    cases = list(cases)
    reqs = requirements(spec, features)
    edges = {r.label: r for r in reqs if r.edge}
    lines = []
    for side in ("N", "M"):
        for causal in ("", ", causal"):
            labels = [f"{side} = {length}{causal}" for length in EDGES]
            if labels[0] in edges:
                held = [label.split()[2].rstrip(",") for label in labels
                        if _met_by(edges[label], cases)]  # fmt: skip
                lines.append(f"{side}{causal or ', non-causal'} at the block edges: "
                             f"{len(held)} of {len(labels)} ({' '.join(held)})")  # fmt: skip
    for r in reqs:
        if not r.edge:
            found = _met_by(r, cases)
            lines.append(f"{r.label}: {found.name if found else 'NOT MET'}")
    return lines


def _met_by(requirement: Requirement, cases: list[Case]) -> Case | None:
    return next((c for c in cases if any(requirement.test(s) for s in sizes_of(c))), None)


# -- building ------------------------------------------------------------------------------------


def default_battery(spec: str, features: Iterable[str] | None = None) -> tuple[Case, ...]:
    """The default battery of ``spec`` for a kernel claiming ``features`` (None: all)."""
    return _default(spec, _key(spec, features))


def _key(spec: str, features: Iterable[str] | None) -> frozenset[str] | None:
    """The features that shape ``spec``'s battery: those with a factor in its space (lse has
    none); None when that is all of them."""
    if features is None:
        return None
    factors = frozenset(pairs.FEATURE_FACTORS) & frozenset(pairs.SPACES[spec])
    claimed = frozenset(features) & factors
    return None if claimed == factors else claimed


@functools.cache
def _default(spec: str, features: frozenset[str] | None) -> tuple[Case, ...]:
    if spec == "ring":
        return _ring(features)
    if spec not in GENERATED_SPECS:
        raise ValueError(f"no battery for spec {spec!r}")
    # A kernel claiming fewer features keeps the full battery's cases it can run (shared with
    # every other kernel of the spec), and gets rows for the pairs and sizes they leave.
    seeds = (
        ()
        if features is None
        else tuple(case for case in _default(spec, None) if case.needs <= features)
    )
    reqs = requirements(spec, features)
    lengths = [r for r in reqs if not r.widths and not _met_by(r, list(seeds))]
    widths = [r for r in reqs if r.widths and not _met_by(r, list(seeds))]
    array = pairs.covering_rows(spec, features, [pairs.case_values(spec, c) for c in seeds])
    for row in array:
        row.setdefault("align", pairs.ALIGN.get(spec, pairs.NA))  # a spec of one alignment
    rows = [(row, *_pick_lengths(row, lengths)) for row in array]
    while lengths:  # what the array's rows could not take: plain rows
        rows.append(_plain_for_lengths(spec, features, lengths))
    sized = []
    for row, n, m in sorted(rows, key=lambda r: _cost(*r)):  # cheap rows take the wide heads
        sized.append((row, n, m, _pick_width(row, n, m, widths)))
    while widths:  # rare: a head width no row of its relation could take
        row = _plain_row(spec, "off", "n>m" if "N >" in widths[0].label else "n<m")
        n, m = _FILLER[row["lengths"]]
        sized.append((row, n, m, _pick_width(row, n, m, widths)))
    order = {id(row): i for i, (row, *_) in enumerate(rows)}
    sized.sort(key=lambda entry: order.get(id(entry[0]), len(order)))
    return _unique([*seeds, *(_case(spec, row, n, m, d) for row, n, m, d in sized)])


def _pick_lengths(row: pairs.Row, unmet: list[Requirement]) -> tuple[int, int]:
    """(N, M) for ``row``'s relation meeting the most unmet length requirements (then the
    cheapest), which are removed from ``unmet``; a small odd pair when none is met."""
    best, best_gain = _FILLER[row.get("lengths", "n<m")], 0
    for n, m in _candidates(row.get("lengths", "n<m")):
        if n == 1 and _top_left_causal(row):
            continue  # query 0 would see key 0 alone: dq and dk exactly 0, nothing to judge
        if m == SPLIT_KEYS and row.get("dropout") == "on":
            continue  # dropout's probes and draws repeat the call: not on the longest keys
        sizes = _sizes(row, n, m, 0)
        gain = sum(r.test(sizes) for r in unmet)
        if gain > best_gain or (gain == best_gain > 0 and _cost(row, n, m) < _cost(row, *best)):
            best, best_gain = (n, m), gain
    sizes = _sizes(row, *best, 0)
    unmet[:] = [r for r in unmet if not r.test(sizes)]
    return best


def _top_left_causal(row: pairs.Row) -> bool:
    """Whether the row is causal aligned top-left (query i sees keys j <= i)."""
    return row.get("causal") == "on" and row.get("align") == "top-left"


def _candidates(relation: str) -> list[tuple[int, int]]:
    """(N, M) pairs of a relation; a length past 2 blocks pairs with one within them, at a
    fraction of the cost of two long ones."""
    if relation == "n=m":
        pairs_ = [(length, length) for length in (37, *EDGES)]
    elif relation == "n<m":
        pairs_ = [(n, m) for n in _N_POOL for m in _M_POOL if n < m]
    else:
        pairs_ = [(n, m) for n in (113, *EDGES) for m in (37, *EDGES) if n > m]
    return [(n, m) for n, m in pairs_ if min(n, m) <= BLOCK + 1]


def _plain_for_lengths(
    spec: str, features: frozenset[str] | None, unmet: list[Requirement]
) -> tuple[pairs.Row, int, int]:
    """A row with no option but causal, at the sizes meeting the most unmet requirements."""
    causal = ("off", "on") if features is None or "causal" in features else ("off",)
    best = None
    for value in causal:
        for relation in pairs.FACTORS["lengths"]:
            row = _plain_row(spec, value, relation)
            for n, m in _candidates(relation):
                if n == 1 and _top_left_causal(row):
                    continue
                sizes = _sizes(row, n, m, 0)
                gain = sum(r.test(sizes) for r in unmet)
                key = (-gain, _cost(row, n, m))
                if best is None or key < best[0]:
                    best = (key, row, n, m)
    if best is None or best[0][0] == 0:
        raise ValueError(f"no size meets {[r.label for r in unmet]}")
    _, row, n, m = best
    sizes = _sizes(row, n, m, 0)
    unmet[:] = [r for r in unmet if not r.test(sizes)]
    return row, n, m


def _plain_row(spec: str, causal: str, relation: str) -> pairs.Row:
    """Every factor of ``spec`` off but causal and the lengths; aligned where positioned."""
    row = {factor: values[0] for factor, values in pairs.space(spec).items()}
    row.update(causal=causal, lengths=relation)
    if spec in pairs.ALIGN:
        row["align"] = pairs.ALIGN[spec]
    else:
        row["align"] = "top-left" if causal == "on" and relation != "n=m" else pairs.NA
    return row


def _pick_width(row: pairs.Row, n: int, m: int, unmet: list[Requirement]) -> int:
    """D meeting the most unmet head width requirements (when none: 64, or 16 with many keys,
    where the width changes nothing the lengths test)."""
    best, best_gain = (16 if m >= SPLIT_KEYS else _D_POOL[0]), 0
    heads = _shape(row, n, m)[1]
    for d in _D_POOL:
        if heads * d > WIDE_MODEL:
            continue  # a model width H * D past it makes projections (nn.MultiheadAttention's) slow
        gain = sum(r.test(_sizes(row, n, m, d)) for r in unmet)
        if gain > best_gain:
            best, best_gain = d, gain
    sizes = _sizes(row, n, m, best)
    unmet[:] = [r for r in unmet if not r.test(sizes)]
    return best


def _sizes(row: pairs.Row, n: int, m: int, d: int) -> Sizes:
    batch, heads, _ = _shape(row, n, m)
    packed = row.get("sequences") == "packed"
    align = row.get("align", "top-left")
    return Sizes(n, m, d, row.get("causal") == "on", batch * heads, packed, align)


def _cost(row: pairs.Row, n: int, m: int) -> float:
    """B * H * N * M * (D + Dv) / D: the work of a row per unit of head width."""
    batch, heads, _ = _shape(row, n, m)
    value_width = {"equal": 1.0, "smaller": 0.5, "larger": 2.0}[row.get("dv", "equal")]
    return batch * heads * n * m * (1.0 + value_width)


def _shape(row: pairs.Row, n: int, m: int) -> tuple[int, int, int]:
    """(B, H, H_kv) of a row at lengths (N, M): 4 query heads under GQA; at least 2 heads for
    a per-head mask or k and v of different strides; one head with many keys (the split-KV
    path: few (batch, head) pairs); two batch elements where cheap (one per sequence for a
    packed row, two for ALiBi per batch element)."""
    grouping = row.get("gqa", "mha")
    if grouping != "mha":
        heads, heads_kv = 4, 2 if grouping == "gqa" else 1
    else:
        per_head = row.get("mask") in ("float", "dead-bool", "dead-float")
        # k token-major and v head-major differ only along a heads axis longer than 1.
        cycle = (2, 3) if per_head or row.get("memory") == "kv-strides" else (1, 2, 3)
        heads = 1 if m >= 1024 else cycle[(n + m) % len(cycle)]
        heads_kv = heads
    if row.get("sequences") == "packed":
        batch = 1 + len(_PACKED_REST)
    elif row.get("alibi") == "per-batch":
        batch = 2
    else:
        batch = 1 if m >= 1024 or n * m * heads > 2 * 128 * 128 else 2
    return batch, heads, heads_kv


def _case(spec: str, row: pairs.Row, n: int, m: int, d: int) -> Case:
    """The case of a row at (N, M, D), named by what it holds."""

    def value(factor: str) -> str:
        return row.get(factor, pairs.FACTORS[factor][0])

    batch, heads, heads_kv = _shape(row, n, m)
    align = row.get("align", pairs.NA)
    windows = {"none": None, "left": (max(1, m // 8), None),
               "two-sided": (max(1, m // 8), max(1, m // 16))}  # fmt: skip
    seqlens = ((n, m), *_PACKED_REST) if value("sequences") == "packed" else None
    case = Case(
        "",
        batch,
        heads,
        sum(q for q, _ in seqlens) if seqlens else n,
        sum(k for _, k in seqlens) if seqlens else m,
        d,
        dv={"equal": None, "smaller": max(8, d // 2), "larger": min(2 * d, d + 128)}[value("dv")],
        causal=value("causal") == "on",
        mask=value("mask"),
        scale=1.0 / d if value("scale") == "given" else None,
        inputs=value("inputs"),
        logits=SHARP_LOGITS if value("logits") == "sharp" else 1.0,
        dropout_p=DROPOUT_P if value("dropout") == "on" else 0.0,
        heads_kv=heads_kv if heads_kv != heads else None,
        align=pairs.ALIGN.get(spec, "top-left") if align == pairs.NA else align,
        window=windows[value("window")],
        softcap=SOFTCAP if value("softcap") == "on" else 0.0,
        alibi={"none": "none", "per-head": "H", "per-batch": "BH"}[value("alibi")],
        seqlens=seqlens,
        layout=value("layout"),
        memory=value("memory"),
    )
    if not case.positioned:  # top-left and bottom-right are one case here
        case = dataclasses.replace(case, align="top-left")
    return dataclasses.replace(case, name=name_of(case))


def name_of(case: Case, prefix: str = "") -> str:
    """What a generated case holds, as its name: its options (the mask first), then N x M (of
    its first sequence) and D, e.g. ``dead-bool-gqa-dv<-fused-127x257-d64``."""
    tags = [] if case.mask == "none" else [case.mask]
    if case.causal:
        tags.append("causal")
    if case.window is not None:
        left, right = case.window
        tags.append("win" if not right else "win2" if left is not None else "winr")
    if case.positioned and case.align == "bottom-right":
        tags.append("br")
    if case.softcap:
        tags.append("cap")
    tags += {"none": [], "H": ["alibi"], "BH": ["alibi-bh"]}[case.alibi]
    if case.kv_heads != case.heads:
        tags.append("mqa" if case.kv_heads == 1 else "gqa")
    if case.value_width != case.d:
        tags.append("dv<" if case.value_width < case.d else "dv>")
    if case.dropout_p:
        tags.append("drop")
    if case.scale is not None:
        tags.append("scale")
    if case.inputs == "heavy":
        tags.append("heavy")
    if case.logits >= 10 and not case.softcap:
        tags.append("sharp")
    if case.memory != "contiguous":
        tags.append(_MEMORY_TAGS[case.memory])
    if case.packed:
        tags.append("varlen")
    if case.layout != "contiguous":
        tags.append(case.layout)
    n, m = case.lengths[0]
    return prefix + "-".join(tags or ["plain"]) + f"-{n}x{m}-d{case.d}"


def _unique(cases: Iterable[Case]) -> tuple[Case, ...]:
    """``cases`` in order, each name once (a repeated name must be the same case)."""
    found: dict[str, Case] = {}
    for case in cases:
        if found.setdefault(case.name, case) != case:
            raise ValueError(f"two different cases are named {case.name!r}")
    return tuple(found.values())


def _ring(features: frozenset[str] | None) -> tuple[Case, ...]:
    """The ring battery: the named ring cases the features allow, and the rows of the ring's
    covering array they leave (48 positions, D = 16)."""
    claimed = None if features is None else features
    seeds = [c for c in RING_SEEDS if claimed is None or c.needs <= claimed]
    rows = pairs.covering_rows(
        "ring", features, [pairs.case_values("ring", case) for case in seeds]
    )
    generated = []
    for row in rows:
        case = _case("ring", row, 48, 48, 16)
        if case.window is not None:  # a window that cuts 48 positions on both sides
            window = (5, None) if case.window[1] is None else (5, 3)
            case = dataclasses.replace(case, window=window)
        generated.append(dataclasses.replace(case, name=name_of(case, "ring-")))
    return _unique([*seeds, *generated])


# -- the quick battery ---------------------------------------------------------------------------

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
    return _quick(spec, _key(spec, features))


@functools.cache
def _quick(spec: str, features: frozenset[str] | None) -> tuple[Case, ...]:
    battery = _default(spec, features)
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
    name = _cheapest(sorted(_default(spec, _key(spec, features)), key=case_cost), TEETH[teeth])
    if name is None:
        raise ValueError(f"the {spec} battery has no case for {teeth!r}")
    return name


# -- by name -------------------------------------------------------------------------------------


def __getattr__(name: str) -> Any:
    """``DEFAULT``, ``QUICK`` and ``RING``, built when first asked for."""
    if name == "DEFAULT":
        return _everything()
    if name == "QUICK":
        return _unique(case for spec in GENERATED_SPECS for case in _quick(spec, None))
    if name == "RING":
        return _default("ring", None)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _everything() -> tuple[Case, ...]:
    generated = (case for spec in GENERATED_SPECS for case in _default(spec, None))
    return _unique([*generated, *NAMED])


def batteries(spec: str, features: Iterable[str] | None = None) -> dict[str, tuple[Case, ...]]:
    """The named batteries of ``spec`` for ``features``: default, quick, stress, ring."""
    key = _key(spec, features)
    return {
        "default": _default(spec, key),
        "quick": _quick(spec, key),
        "stress": STRESS,
        "ring": _default("ring", None),
    }


def lookup(name: str, spec: str | None = None, features: Iterable[str] | None = None) -> Case:
    """The case called ``name``: of ``spec``'s batteries for ``features``, of any spec's default
    battery, a named, stress or ring case."""
    pools: list[Iterable[Case]] = []
    if spec is not None:
        pools += batteries(spec, features).values()
    pools += [_everything(), STRESS, _default("ring", None)]
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
            return {"default": _everything(), "stress": STRESS, "ring": _default("ring", None),
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
