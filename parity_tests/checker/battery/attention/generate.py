"""Each spec's default battery, generated: a covering array of its factors given sizes, shapes
and names.

For a spec and the features a kernel claims (``default_battery``): the rows of
``pairs.covering_rows`` (every pair of values that one case can hold) get lengths, then head
widths, chosen greedily to meet ``sizes.requirements`` (rows with no option but causal are added
only for what the array's rows cannot take); shapes follow from each row (``_shape``), and each
case is named by what it holds (``name_of``). A kernel claiming fewer features keeps the full
battery's cases it can run and gets rows for the pairs and sizes they leave. The ring spec's
battery grows its covering array from the named ring cases, at 48 positions.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; for a packed (varlen) case S sequences.

Tests: tests/checker/battery/attention/test_generate.py (pair coverage:
tests/checker/battery/test_pairs.py)"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import TYPE_CHECKING

from .. import pairs
from ..names import unique_by_name
from .case import Case
from .handwritten import RING_SEEDS
from .sizes import (
    BLOCK,
    EDGES,
    ODD_WIDTH,
    SPLIT_KEYS,
    WIDTHS,
    Requirement,
    Sizes,
    met_by,
    requirements,
)
from .space import FACTORS, NA

if TYPE_CHECKING:
    from ...spec import Spec

DROPOUT_P = 0.3
SHARP_LOGITS = 30.0
SOFTCAP = 5.0
WIDE_MODEL = 256  # the widest H * D a case takes (wide heads go to rows of few heads)

_N_POOL = (1, 37, *EDGES)
_M_POOL = (37, 97, 113, *EDGES, SPLIT_KEYS)
_FILLER = {"n<m": (37, 113), "n=m": (48, 48), "n>m": (113, 37)}
_D_POOL = (64, 32, 16, 128, 256, ODD_WIDTH)  # ties go to the first
_PACKED_REST = ((1, 64), (64, 37), (20, 20))  # a packed row's sequences after its own (N, M)
_MEMORY_TAGS = {"fused": "fused", "kv-strides": "kvstrides", "offset": "offset",
                "broadcast": "bcast"}  # fmt: skip


def default_battery(spec: Spec, features: frozenset[str] | None = None) -> tuple[Case, ...]:
    """The default battery of ``spec`` for a kernel claiming ``features`` (the claimed features
    that have a factor, ``Spec.claim_key``; None: all)."""
    return _default(spec, features)


@functools.cache
def _default(spec: Spec, features: frozenset[str] | None) -> tuple[Case, ...]:
    # A kernel claiming fewer features keeps the full battery's cases it can run (shared with
    # every other kernel of the spec), and gets rows for the pairs and sizes they leave.
    seeds = (
        ()
        if features is None
        else tuple(case for case in _default(spec, None) if case.needs <= features)
    )
    reqs = requirements(features)
    lengths = [r for r in reqs if not r.widths and not met_by(r, list(seeds))]
    widths = [r for r in reqs if r.widths and not met_by(r, list(seeds))]
    array = pairs.covering_rows(spec, features, [spec.values_of(c) for c in seeds])
    for row in array:
        row.setdefault("align", spec.align or NA)  # a spec of one alignment
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
    return unique_by_name([*seeds, *(case_of(spec, row, n, m, d) for row, n, m, d in sized)])


def one_query_excluded(row: pairs.Row, align: str | None = None) -> bool:
    """Whether no case of this row may have one query (N = 1). Its gradients cannot be judged by
    a max-error bound under top-left causal (query 0 sees key 0 alone: dq and dk exactly 0), or
    where one query's softmax is nearly one-hot, sharp logits, heavy-tailed inputs (their
    outlier channels make a few logits large) or a float mask (its bias falls by half a logit
    per key of distance in head 0): dq = scale * sum_j P_j (dP_j - delta) k_j is then a
    near-total cancellation of large terms, and a correct kernel lands 10-70 times past a lucky
    same-dtype baseline (calibration: nn.MultiheadAttention with a float mask, N = 1, M = 1024,
    float32 and bfloat16; SDPA's CPU flash kernel and nn.MultiheadAttention on heavy-tailed
    inputs, N = 1, seeds 13, 14 and 18, float32, float16 and bfloat16). And a dead-rows mask
    cannot hold its dead rows: they are never every row, so with B * H = 1 the case would hold
    none (the main job's xpass on mha[need_weights=True]).
    ``align`` is the alignment of a row that names none (the fuzzer's: its spec's)."""
    top_left = row.get("causal") == "on" and row.get("align", align) == "top-left"
    mask = row.get("mask", "none")
    peaked = (
        row.get("logits") == "sharp" or row.get("inputs") in ("heavy", "outliers")
        or mask == "float"
    )  # fmt: skip
    return top_left or peaked or mask.startswith("dead")


def _pick_lengths(row: pairs.Row, unmet: list[Requirement]) -> tuple[int, int]:
    """(N, M) for ``row``'s relation meeting the most unmet length requirements (then the
    cheapest), which are removed from ``unmet``; a small odd pair when none is met."""
    best, best_gain = _FILLER[row.get("lengths", "n<m")], 0
    for n, m in _candidates(row.get("lengths", "n<m")):
        if n == 1 and one_query_excluded(row):
            continue
        if m == SPLIT_KEYS and row.get("dropout") == "on":
            continue  # dropout's probes and draws repeat the call: not on the longest keys
        sizes = _sizes(row, n, m, 0)
        gain = sum(r.test(sizes) for r in unmet)
        if gain > best_gain or (gain == best_gain > 0 and _cost(row, n, m) < _cost(row, *best)):
            best, best_gain = (n, m), gain
    sizes = _sizes(row, *best, 0)
    unmet[:] = [r for r in unmet if not r.test(sizes)]
    return best


def _candidates(relation: str) -> list[tuple[int, int]]:
    """(N, M) pairs of a relation; a length past 2 blocks pairs with one within them, at a
    fraction of the cost of two long ones."""
    if relation == "n=m":
        pairs_ = [(length, length) for length in (37, *EDGES)]
    elif relation == "n<m":
        pairs_ = [(n, m) for n in _N_POOL for m in _M_POOL if n < m]
    else:
        pairs_ = [(n, m) for n in (113, *EDGES) for m in (37, 97, *EDGES) if n > m]
    return [(n, m) for n, m in pairs_ if min(n, m) <= BLOCK + 1]


def _plain_for_lengths(
    spec: Spec, features: frozenset[str] | None, unmet: list[Requirement]
) -> tuple[pairs.Row, int, int]:
    """A row with no option but causal (and a broadcast layout where a requirement asks for
    one), at the sizes meeting the most unmet requirements."""
    causal = ("off", "on") if features is None or "causal" in features else ("off",)
    layouts = [None] + (["broadcast"] if "broadcast" in pairs.space(spec).get("memory", ()) else [])
    best = None
    for value, relation, layout in itertools.product(causal, FACTORS["lengths"], layouts):
        row = _plain_row(spec, value, relation)
        if layout is not None:
            row["memory"] = layout
        for n, m in _candidates(relation):
            if n == 1 and one_query_excluded(row):
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


def _plain_row(spec: Spec, causal: str, relation: str) -> pairs.Row:
    """Every factor of ``spec`` off but causal and the lengths; aligned where positioned."""
    row = {factor: values[0] for factor, values in pairs.space(spec).items()}
    row.update(causal=causal, lengths=relation)
    if spec.align is not None:
        row["align"] = spec.align
    else:
        row["align"] = "top-left" if causal == "on" and relation != "n=m" else NA
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
    memory = row.get("memory", "contiguous")
    return Sizes(n, m, d, row.get("causal") == "on", batch * heads, packed, align, memory)


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
        per_head = row.get("mask") in ("float", "dead-bool", "dead-float", "shifted")
        # k token-major and v head-major differ only along a heads axis longer than 1, and a
        # broadcast over the heads needs two of them.
        two = per_head or row.get("memory") in ("kv-strides", "broadcast")
        cycle = (2, 3) if two else (1, 2, 3)
        heads = 1 if m >= 1024 else cycle[(n + m) % len(cycle)]
        heads_kv = heads
    if row.get("sequences") == "packed":
        batch = 1 + len(_PACKED_REST)
    elif row.get("alibi") == "per-batch" or (row.get("memory") == "broadcast" and heads_kv == 1):
        batch = 2  # per batch element, or one kv head broadcast over the batch
    else:
        batch = 1 if m >= 1024 or n * m * heads > 2 * 128 * 128 else 2
    return batch, heads, heads_kv


def case_of(spec: Spec, row: pairs.Row, n: int, m: int, d: int) -> Case:
    """The case of ``row`` (a value for factors of ``pairs.space(spec)``; a factor left out is
    "off") at lengths (N, M) and head width D, named by what it holds: how every battery makes
    its cases, and how a draw of random values and sizes makes one too. Its shape follows from
    the row (``_shape``); a packed row's sequences are (N, M), (1, 64), (64, 37), (20, 20)."""

    def value(factor: str) -> str:
        return row.get(factor, FACTORS[factor][0])

    batch, heads, heads_kv = _shape(row, n, m)
    align = row.get("align", NA)
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
        align=(spec.align or "top-left") if align == NA else align,
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
    if case.inputs != "gauss":
        tags.append({"heavy": "heavy", "outliers": "outliers", "correlated": "corr"}[case.inputs])
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


@functools.cache
def ring_battery(spec: Spec, features: frozenset[str] | None) -> tuple[Case, ...]:
    """The ring battery: the named ring cases the features allow, the rows of the ring's
    covering array they leave (48 positions, D = 16), and one case per other head width of the
    requirements (32, 64, 128, 256 and an odd one; causal where claimed)."""
    claimed = None if features is None else features
    seeds = [c for c in RING_SEEDS if claimed is None or c.needs <= claimed]
    rows = pairs.covering_rows(spec, features, [spec.values_of(case) for case in seeds])
    generated = []
    for row in rows:
        case = case_of(spec, row, 48, 48, 16)
        if case.window is not None:  # a window that cuts 48 positions on both sides
            window = (5, None) if case.window[1] is None else (5, 3)
            case = dataclasses.replace(case, window=window)
        generated.append(dataclasses.replace(case, name=name_of(case, "ring-")))
    causal = "on" if claimed is None or "causal" in claimed else "off"
    for d in (*WIDTHS, ODD_WIDTH):
        if d == 16:
            continue  # the array's width
        case = case_of(spec, _plain_row(spec, causal, "n=m"), 48, 48, d)
        generated.append(dataclasses.replace(case, name=name_of(case, "ring-")))
    return unique_by_name([*seeds, *generated])
