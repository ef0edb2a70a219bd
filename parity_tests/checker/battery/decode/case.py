"""The batteries of the decode specs ("flash_kvcache", "flash_mla"): what each case exercises and
how its inputs are drawn.

A decode case is a batch of sequences, each with its own cache length, a cache (contiguous rows,
or a pool of pages reached through a shuffled block table), s_q queries and s_new new tokens per
sequence, and the options of flash-attn's ``flash_attn_with_kvcache`` (docs/decoding.md). The
"flash_kvcache" battery is generated, not picked: a covering array (``covering_cases``) meets
every allowed pair of option values in at least one case (the page size with rotary, leftpad
with ALiBi, ...), and in every case the sequences take the lengths where decode kernels break,
cycled so that each page size meets them all: 0, 1, odd, a page boundary - 1, on it and + 1, and
the full capacity (the new tokens end exactly at the last slot). Pages are 16, 64 and 256 tokens,
and shuffled in the pool: a kernel that reads them as contiguous reads other sequences' tokens.
The "flash_mla" battery is FlashMLA's shape (one latent head of 576 = 512 + 64 numbers, pages of
64, the layer's scale) over the same lengths, ``cache_seqlens`` counting the new tokens.

Inputs are drawn in float64 from a generator seeded by (seed, case name); every slot of a cache,
beyond the lengths too, holds random numbers, so that reading a slot it should not is visible.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/battery/test_decode_case.py
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

DECODE_SPECS = ("flash_kvcache", "flash_mla")
ROTARY = ("none", "interleaved", "half", "partial")  # partial: half of D, half-split pairs
ALIBI = ("none", "H", "BH")
LENGTHS = ("0", "1", "odd", "P-1", "P", "P+1", "full")
SEQUENCES = 4  # B of every case
HEADS = 4
# FlashMLA's shape: DeepSeek-V3's latent (512) and rope (64) widths, pages of 64, and the layer's
# scale (qk_nope_head_dim + qk_rope_head_dim = 128 + 64)^-0.5, never the 576^-0.5 default.
MLA_D, MLA_DV, MLA_PAGE, MLA_SCALE = 576, 512, 64, (128 + 64) ** -0.5


@dataclass(frozen=True)
class DecodeCase:
    """One decode call: the spec's arguments and how its inputs are drawn.

    Attributes:
        name: unique; seeds the inputs.
        spec: "flash_kvcache" or "flash_mla".
        seqlens: per sequence, ``cache_seqlens`` as the spec means it: before the new tokens
            (flash_kvcache), including them (flash_mla).
        s_q: queries per sequence.
        s_new: new tokens appended per sequence (0: no k, v given; flash_mla: always 0, the
            cache holds them already).
        heads, heads_kv, d, dv: H, H_kv, D, Dv.
        page_size: P, or None for a contiguous cache of ``capacity`` rows.
        capacity: tokens one sequence can hold (pages per sequence x P).
        causal, window, softcap, alibi: flash-attn's options (``window`` as its (left, right),
            -1 unbounded; None for (-1, -1)); ``logits`` the typical score magnitude.
        rotary: "none", "interleaved", "half" or "partial" (half-split on the first D/2).
        leftpad: per sequence, ``cache_leftpad``; None for none.
        batch_idx: the sequences live in shuffled rows of a larger contiguous cache.
        num_splits: flash-attn's ``num_splits`` (0: its heuristic).
        scale: ``softmax_scale``; None for the default 1 / sqrt(D).
    """

    name: str
    spec: str
    seqlens: tuple[int, ...]
    s_q: int
    s_new: int
    heads: int
    heads_kv: int
    d: int
    dv: int
    page_size: int | None
    capacity: int
    causal: bool = False
    window: tuple[int, int] | None = None
    softcap: float = 0.0
    logits: float = 1.0
    alibi: str = "none"
    rotary: str = "none"
    leftpad: tuple[int, ...] | None = None
    batch_idx: bool = False
    num_splits: int = 0
    scale: float | None = None

    def __post_init__(self) -> None:
        if self.spec not in DECODE_SPECS:
            raise ValueError(f"case {self.name}: spec must be one of {DECODE_SPECS}")
        if self.rotary not in ROTARY or self.alibi not in ALIBI:
            raise ValueError(f"case {self.name}: rotary in {ROTARY}, alibi in {ALIBI}")
        totals = [n + self.s_new for n in self.seqlens]
        if min(self.seqlens, default=0) < 0 or max(totals, default=0) > self.capacity:
            raise ValueError(
                f"case {self.name}: lengths {self.seqlens} + {self.s_new} must fit in "
                f"[0, {self.capacity}]"
            )
        if self.page_size is not None and self.capacity % self.page_size:
            raise ValueError(f"case {self.name}: the capacity must be whole pages")
        if self.rotary != "none" and not self.s_new:
            raise ValueError(f"case {self.name}: rotary rotates the new keys: it needs s_new > 0")
        if self.page_size is not None and (self.leftpad is not None or self.batch_idx):
            raise ValueError(f"case {self.name}: leftpad and batch_idx are for contiguous caches")
        if self.leftpad is not None and any(
            not 0 <= pad <= n for pad, n in zip(self.leftpad, self.seqlens, strict=True)
        ):
            raise ValueError(f"case {self.name}: 0 <= leftpad <= cache_seqlens per sequence")

    @property
    def batch(self) -> int:
        return len(self.seqlens)

    @property
    def pages_per_sequence(self) -> int:
        return 1 if self.page_size is None else self.capacity // self.page_size

    @property
    def rotary_dim(self) -> int:
        return 0 if self.rotary == "none" else self.d // 2 if self.rotary == "partial" else self.d

    @property
    def needs(self) -> frozenset[str]:
        """The features (``specs.FEATURES``) a kernel must have to run this case."""
        needs = {
            "causal": self.causal,
            "gqa": self.heads_kv != self.heads and self.spec == "flash_kvcache",
            "window": self.window is not None,
            "softcap": bool(self.softcap),
            "alibi": self.alibi != "none",
            "rotary": self.rotary != "none",
            "paged": self.page_size is not None and self.spec == "flash_kvcache",
            "append": bool(self.s_new),
            "leftpad": self.leftpad is not None,
            "batch_idx": self.batch_idx,
            "splits": bool(self.num_splits),
        }
        return frozenset(name for name, needed in needs.items() if needed)

    @property
    def shape(self) -> dict[str, int]:
        """The sizes of the case by legend letter, as the reports show every case's: B, H, N
        (s_q), M (the most keys a sequence attends), D, Dv; and the decode call's own: s_new,
        H_kv, P (0 for a contiguous cache)."""
        flash_kvcache = self.spec == "flash_kvcache"
        return {
            "B": self.batch,
            "H": self.heads,
            "N": self.s_q,
            "M": max((n + self.s_new if flash_kvcache else n) for n in self.seqlens),
            "D": self.d,
            "Dv": self.dv,
            "s_new": self.s_new,
            "H_kv": self.heads_kv,
            "P": self.page_size or 0,
        }


class DecodeInputs(NamedTuple):
    """float64 inputs of a decode case (integers as int32, as flash-attn takes them); None where
    the case does not use an argument. q (B, s_q, H, D); k_cache, v_cache (B_cache, capacity,
    H_kv, W) or pages (num_blocks, P, H_kv, W) (flash_mla: v_cache is None, V being the first
    Dv of k_cache); k, v (B, s_new, H_kv, W); rotary_cos, rotary_sin (capacity + s_q,
    rotary_dim / 2); cache_seqlens (B,); cache_batch_idx, cache_leftpad (B,); block_table
    (B, pages per sequence); alibi_slopes (H,) or (B, H)."""

    q: np.ndarray
    k_cache: np.ndarray
    v_cache: np.ndarray | None
    k: np.ndarray | None
    v: np.ndarray | None
    rotary_cos: np.ndarray | None
    rotary_sin: np.ndarray | None
    cache_seqlens: np.ndarray
    cache_batch_idx: np.ndarray | None
    cache_leftpad: np.ndarray | None
    block_table: np.ndarray | None
    alibi_slopes: np.ndarray | None


def make_decode_inputs(case: DecodeCase, seed: int) -> DecodeInputs:
    """The float64 inputs of ``case`` for ``seed``; the same (case, seed) gives the same arrays."""
    rng = np.random.default_rng([seed, zlib.crc32(case.name.encode())])
    b, h, h_kv, d, dv = case.batch, case.heads, case.heads_kv, case.d, case.dv
    scale = 1.0 / math.sqrt(d) if case.scale is None else case.scale
    stretch = math.sqrt(case.logits / (math.sqrt(d) * scale))  # scores of spread ~ logits
    q = rng.standard_normal((b, case.s_q, h, d)) * stretch
    table = batch_idx = None
    if case.page_size is not None:
        pages = b * case.pages_per_sequence
        spare = pages // 4 + 1  # pages no sequence owns
        order = rng.permutation(pages + spare)  # shuffled: never contiguous by accident
        table = order[:pages].reshape(b, case.pages_per_sequence).astype(np.int32)
        pool: tuple[int, ...] = (pages + spare, case.page_size, h_kv)
    else:
        rows = b + 2 if case.batch_idx else b
        if case.batch_idx:
            batch_idx = rng.permutation(rows)[:b].astype(np.int32)
        pool = (rows, case.capacity, h_kv)
    k_cache = rng.standard_normal(pool + (d,)) * stretch
    v_cache = None if case.spec == "flash_mla" else rng.standard_normal(pool + (dv,))
    k = v = cos = sin = None
    if case.s_new:
        k = rng.standard_normal((b, case.s_new, h_kv, d)) * stretch
        v = rng.standard_normal((b, case.s_new, h_kv, dv))
    if case.rotary != "none":
        width = case.rotary_dim
        angles = np.arange(case.capacity + case.s_q)[:, None] * 10000.0 ** (
            -np.arange(0, width, 2) / width
        )  # (positions, rotary_dim / 2)
        cos, sin = np.cos(angles), np.sin(angles)
    slopes = None
    if case.alibi != "none":
        slopes = 2.0 ** (-8.0 * np.arange(1, h + 1) / h)  # (H,)
        if case.alibi == "BH":  # per sequence: a kernel reading row 0 for all is wrong
            slopes = slopes[None, :] * (1.0 + 0.5 * np.arange(b))[:, None]
    leftpad = None if case.leftpad is None else np.array(case.leftpad, np.int32)
    return DecodeInputs(
        q, k_cache, v_cache, k, v, cos, sin, np.array(case.seqlens, np.int32), batch_idx,
        leftpad, table, slopes,
    )  # fmt: skip


# -- the flash_kvcache battery: a covering array of its options --------------------------------

# Each option of flash_attn_with_kvcache and the values where kernels differ. "append": s_new
# equal to s_q, one new token for several queries (a speculative step re-checking a draft), or
# no new tokens (k=None). "kv": H_kv of H = 4.
FACTORS: dict[str, tuple[Any, ...]] = {
    "page": (None, 16, 64, 256),
    "kv": (4, 2, 1),
    "s_q": (1, 4),
    "append": ("s_q", "one", "none"),
    "causal": (False, True),
    "window": ("none", "left", "both"),
    "softcap": (False, True),
    "alibi": ALIBI,
    "rotary": ROTARY,
    "leftpad": (False, True),
    "batch_idx": (False, True),
    "splits": (0, 1, 3),
}


def allowed(values: dict[str, Any]) -> bool:
    """Whether option values can meet in one call (flash-attn refuses leftpad and batch indices
    with pages; rotary rotates new keys, so it needs some)."""
    paged = values.get("page") is not None and "page" in values
    if paged and (values.get("leftpad") or values.get("batch_idx")):
        return False
    return not (values.get("rotary", "none") != "none" and values.get("append") == "none")


def required_pairs() -> set[tuple[tuple[str, Any], tuple[str, Any]]]:
    """Every pair of values of two options that ``allowed`` lets meet."""
    pairs = set()
    for (f1, values1), (f2, values2) in itertools.combinations(FACTORS.items(), 2):
        for v1, v2 in itertools.product(values1, values2):
            if allowed({f1: v1, f2: v2}):
                pairs.add(((f1, v1), (f2, v2)))
    return pairs


def covered_pairs(assignment: dict[str, Any]) -> set[tuple[tuple[str, Any], tuple[str, Any]]]:
    items = [(name, assignment[name]) for name in FACTORS]
    return set(itertools.combinations(items, 2))


def covering_cases() -> list[dict[str, Any]]:
    """A covering array of ``FACTORS``: option values per case such that every pair of
    ``required_pairs`` meets in some case. Greedy and deterministic: each case starts from the
    first uncovered pair and takes, option by option, the allowed value that covers most
    uncovered pairs (the first such value on a tie)."""
    uncovered = required_pairs()
    names = list(FACTORS)
    cases = []
    while uncovered:
        (f1, v1), (f2, v2) = min(uncovered, key=lambda pair: _pair_order(pair, names))
        assignment = {f1: v1, f2: v2}
        for name in names:
            if name in assignment:
                continue
            best, best_gain = None, -1
            for value in FACTORS[name]:
                trial = {**assignment, name: value}
                if not allowed(trial):
                    continue
                gain = sum(
                    ((other, assignment[other]), (name, value)) in uncovered
                    or ((name, value), (other, assignment[other])) in uncovered
                    for other in assignment
                )
                if gain > best_gain:
                    best, best_gain = value, gain
            assignment[name] = best
        cases.append({name: assignment[name] for name in names})
        uncovered -= covered_pairs(cases[-1])
    return cases


def _pair_order(pair: tuple, names: list[str]) -> tuple:
    (f1, v1), (f2, v2) = pair
    return (
        names.index(f1),
        FACTORS[f1].index(v1),
        names.index(f2),
        FACTORS[f2].index(v2),
    )


def lengths_for(page: int | None, capacity: int, s_new: int, turn: int) -> tuple[int, ...]:
    """The ``cache_seqlens`` of one case's sequences: ``LENGTHS`` cycled from ``turn``, so that
    consecutive cases of one page size meet every length. "full" ends the new tokens at the last
    slot; a contiguous cache's boundary lengths sit around its middle."""
    size = page if page is not None else capacity // 2
    values = {
        "0": 0,
        "1": 1,
        "odd": size + size // 2 + 1,
        "P-1": size - 1,
        "P": size,
        "P+1": size + 1,
        "full": capacity - s_new,
    }
    picked = [LENGTHS[(turn + i) % len(LENGTHS)] for i in range(SEQUENCES)]
    return tuple(min(values[name], capacity - s_new) for name in picked)


def kvcache_case(index: int, values: dict[str, Any], turn: int) -> DecodeCase:
    """The case of one row of the covering array."""
    page, s_q = values["page"], values["s_q"]
    s_new = {"s_q": s_q, "one": 1, "none": 0}[values["append"]]
    capacity = 48 if page is None else page * (2 if page == 256 else 3)
    seqlens = lengths_for(page, capacity, s_new, turn)
    window = {"none": None, "left": (7, -1), "both": (7, 3)}[values["window"]]
    leftpad = None
    if values["leftpad"]:  # from nothing hidden to everything cached hidden
        leftpad = tuple((n * i) // (SEQUENCES - 1) for i, n in enumerate(seqlens))
    labels = [
        ("causal", values["causal"]),
        (f"win{window[0]}" + (f"+{window[1]}" if window[1] >= 0 else "") if window else "", window),
        ("softcap", values["softcap"]),
        (f"alibi{values['alibi']}", values["alibi"] != "none"),
        (f"rotary-{values['rotary']}", values["rotary"] != "none"),
        ("leftpad", values["leftpad"]),
        ("batchidx", values["batch_idx"]),
        (f"splits{values['splits']}", values["splits"] != 0),
    ]
    where = "contig" if page is None else f"p{page}"
    head = [f"kv{index:02d}", where, f"h{HEADS}kv{values['kv']}", f"q{s_q}n{s_new}"]
    name = "-".join(head + [label for label, on in labels if on])
    return DecodeCase(
        name, "flash_kvcache", seqlens, s_q, s_new, HEADS, values["kv"], 32, 32, page, capacity,
        causal=values["causal"], window=window, softcap=5.0 if values["softcap"] else 0.0,
        logits=30.0 if values["softcap"] else 1.0, alibi=values["alibi"],
        rotary=values["rotary"], leftpad=leftpad, batch_idx=values["batch_idx"],
        num_splits=values["splits"],
    )  # fmt: skip


# The plain decode step at every page size: GQA, causal, the new tokens appended and nothing
# else, so that a kernel without the other options (most have few) is still judged on each
# page size and length. One query, or four (a speculative step), alternately.
BASE = {
    **{name: values[0] for name, values in FACTORS.items()},
    "kv": 2,
    "append": "s_q",
    "causal": True,
}


def _kvcache_battery() -> tuple[DecodeCase, ...]:
    """The covering array's cases, then the plain step per page size (``BASE``)."""
    rows = covering_cases()
    rows += [{**BASE, "page": page, "s_q": (1, 4)[i % 2]} for i, page in enumerate(FACTORS["page"])]
    turns: dict[Any, int] = {}
    cases = []
    for index, values in enumerate(rows):
        turn = turns.get(values["page"], 0)
        turns[values["page"]] = turn + SEQUENCES
        cases.append(kvcache_case(index, {name: values[name] for name in FACTORS}, turn))
    return tuple(cases)


def _mla_battery() -> tuple[DecodeCase, ...]:
    """FlashMLA's shape over the lengths (counting the new tokens), s_q 1 and 2, causal or not."""
    cases = []
    for index, (s_q, causal) in enumerate(itertools.product((1, 2), (False, True))):
        capacity = 3 * MLA_PAGE
        seqlens = lengths_for(MLA_PAGE, capacity, 0, index * SEQUENCES)
        name = f"mla{index:02d}-p{MLA_PAGE}-h{HEADS}-q{s_q}" + ("-causal" if causal else "")
        cases.append(
            DecodeCase(
                name,
                "flash_mla",
                seqlens,
                s_q,
                0,
                HEADS,
                1,
                MLA_D,
                MLA_DV,
                MLA_PAGE,
                capacity,
                causal=causal,
                scale=MLA_SCALE,
            )  # fmt: skip
        )
    return tuple(cases)


KVCACHE: tuple[DecodeCase, ...] = _kvcache_battery()
MLA: tuple[DecodeCase, ...] = _mla_battery()
DECODE_BATTERIES = {"flash_kvcache": KVCACHE, "flash_mla": MLA}


def resolve_decode(spec: str, cases: str | Sequence[DecodeCase | str] | None) -> tuple:
    """The cases of ``spec`` named by ``cases``: None, "default" or "quick" (the spec's battery,
    small enough to be its quick one too), or a sequence of cases and names of its battery."""
    battery = DECODE_BATTERIES[spec]
    if cases is None or cases in ("default", "quick"):
        return battery
    if isinstance(cases, str):
        raise ValueError(
            f"the {spec} spec runs its own battery (cases None, 'default' or 'quick', or its "
            f"case names), not {cases!r}"
        )
    by_name = {case.name: case for case in battery}
    resolved = []
    for case in cases:
        if isinstance(case, DecodeCase) and case.spec == spec:
            resolved.append(case)
        elif isinstance(case, str) and case in by_name:
            resolved.append(by_name[case])
        else:
            raise ValueError(f"unknown {spec} case {case!r}; known: {sorted(by_name)}")
    if not resolved:
        raise ValueError("cases is empty")
    names = [case.name for case in resolved]
    if len(set(names)) != len(names):
        raise ValueError(
            f"cases has repeated names: {sorted({n for n in names if names.count(n) > 1})}"
        )
    return tuple(resolved)
