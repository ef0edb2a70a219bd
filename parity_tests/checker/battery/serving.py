"""The cases of the serving specs ("flashinfer_paged", "vllm_paged", "flashinfer_merge"): what
one call of a serving engine's attention holds and how its inputs are drawn
(docs/decoding.md, "Prefill over pages and the serving APIs").

A paged case (``PagedCase``) is a mixed batch as an engine schedules it: four sequences, each
with its own number of queries n_b and of keys L_b (its queries' own tokens the last n_b of
them), over a pool of pages reached through a shuffled table. ``BATCHES`` says what the four
sequences are: "mixed" a whole prefill, a decode step, a chunk of a prefill and a sequence with
no queries this step; "decode" four decode steps (FlashInfer's decode wrapper's case); "prefill"
four whole prompts. Their key counts hold every page edge (P - 1, P, P + 1) at every page size,
so that a kernel reading last_page_len or the page count one off is seen. The table is always
wider than the sequences need (vLLM's block_table has spare columns, FlashInfer's
``paged_kv_indices`` buffer spare entries): FlashInfer #4270 read a wide table with the wrong
row stride. Every page of the pool holds numbers, spare ones too, so that reading a page or a
slot a sequence does not own is visible; a vLLM case's pool keeps block 0 as the null block and
holds numbers at the slots its new tokens go to, so that a kernel attending before it writes is
seen. The values (``VALUES``): Gaussian; "outliers", a few channels of q, k and v 8-30 times the
rest, as real hidden states have; "shifted", every key plus one constant vector, which moves each
query's scores by one large finite constant (about 1e4, negative for half the queries): softmax
does not change, and a kernel reading far-below-zero logits as masked gives zeros
(FlashInfer #4450).

A merge case (``MergeCase``) is FlashInfer's cascade operator: per token and head, S partial
attentions (v, s) with s their log-sum-exp in base 2, merged into one; ``MERGE_PATTERNS`` draws s
close together, far apart (2^200 overflows float32), with -inf states (a part with nothing to see)
and with rows whose every state is -inf.

Shape legend: B sequences, T query tokens (all sequences'), H query heads, H_kv key/value heads,
D head width, P page size, S states of a merge.

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

PAGED_SPECS = ("flashinfer_paged", "vllm_paged")
BATCHES = ("mixed", "decode", "prefill")
VALUES = ("gauss", "outliers", "shifted")
MERGE_PATTERNS = ("close", "far", "neginf", "dead")
SEQUENCES = 4
TABLE_EXTRA = 2  # spare table columns (entries) past what the sequences need
WIDE_IDS = 2**16  # page ids from here on need more than 16 bits
SHIFT = 1e4  # the spread of the "shifted" values' per-query constant, in scaled score units
WINDOW = 3  # window_left = P // 2 + WINDOW: a window edge inside a page, crossing pages


@dataclass(frozen=True)
class PagedCase:
    """One call of a serving engine's paged attention.

    Attributes:
        name: unique; seeds the inputs.
        spec: "flashinfer_paged" or "vllm_paged".
        batch: what the sequences are (``BATCHES``).
        page_size: P.
        heads, heads_kv, d: H, H_kv, D (Dv = D).
        causal, window, softcap, sinks: the options (``window`` FlashInfer's window_left, -1
            none).
        layout: "NHD" or "HND" (FlashInfer's page layout; vLLM's is NHD).
        cache: "pair" (a (k, v) pair of pools) or "5d" (one (pages, 2, ...) tensor), FlashInfer's.
        values: how q, k, v are drawn (``VALUES``).
        prefix: vLLM's cascade: the first ``prefix`` keys (whole pages) shared by every sequence,
            the same pages in every table row; 0 none.
        pool_pages: the fewest pages the pool holds (past 65,536: page ids past 16 bits).
    """

    name: str
    spec: str
    batch: str
    page_size: int
    heads: int
    heads_kv: int
    d: int
    causal: bool = False
    window: int = -1
    softcap: float = 0.0
    sinks: bool = False
    layout: str = "NHD"
    cache: str = "pair"
    values: str = "gauss"
    prefix: int = 0
    pool_pages: int = 0

    def __post_init__(self) -> None:
        if self.spec not in PAGED_SPECS or self.batch not in BATCHES:
            raise ValueError(f"case {self.name}: spec in {PAGED_SPECS}, batch in {BATCHES}")
        if self.values not in VALUES or self.heads % self.heads_kv:
            raise ValueError(f"case {self.name}: values in {VALUES}, H_kv must divide H")
        if self.prefix % self.page_size:
            raise ValueError(f"case {self.name}: the shared prefix must be whole pages")

    @property
    def dv(self) -> int:
        return self.d

    @property
    def q_lens(self) -> tuple[int, ...]:
        """n_b: each sequence's queries this call."""
        return lengths(self.batch, self.page_size)[0]

    @property
    def kv_lens(self) -> tuple[int, ...]:
        """L_b: each sequence's keys, its queries' own tokens the last n_b, the prefix first."""
        return tuple(self.prefix + n for n in lengths(self.batch, self.page_size)[1])

    @property
    def tokens(self) -> int:
        return sum(self.q_lens)

    @property
    def needs(self) -> frozenset[str]:
        """The features a kernel must have to run this case."""
        needs = {
            "causal": self.causal,
            "gqa": self.heads_kv != self.heads,
            "window": self.window >= 0,
            "softcap": bool(self.softcap),
            "sinks": self.sinks,
            "cascade": bool(self.prefix),
        }
        return frozenset(name for name, held in needs.items() if held)

    @property
    def shape(self) -> dict[str, int]:
        """The sizes by legend letter, as the reports show every case's."""
        return {"B": SEQUENCES, "H": self.heads, "N": self.tokens, "M": max(self.kv_lens),
                "D": self.d, "H_kv": self.heads_kv, "P": self.page_size}  # fmt: skip


def lengths(batch: str, page: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(n_b, L_b) of the four sequences of a batch kind at page size ``page``: every page edge
    P - 1, P, P + 1 among the key counts (P - 1 at least 1)."""
    edges = (max(page - 1, 1), page, page + 1)
    odd = 2 * page + page // 2 + 1  # past two pages, not on an edge
    if batch == "decode":
        kv = (1, *edges)
        return (1, 1, 1, 1), kv
    if batch == "prefill":
        kv = (*edges, odd)
        return kv, kv
    kv = (page + 1, edges[0], odd, page)  # a prefill, a decode, a chunk, no queries
    return (page + 1, 1, odd // 3 + 1, 0), kv


@dataclass(frozen=True)
class MergeCase:
    """One call of FlashInfer's cascade merge: ``states`` partial attentions per token and
    head (2: ``merge_state``; else ``merge_states``), drawn by ``pattern``."""

    name: str
    spec: str
    tokens: int
    heads: int
    d: int
    states: int
    pattern: str = "close"

    def __post_init__(self) -> None:
        if self.spec != "flashinfer_merge" or self.pattern not in MERGE_PATTERNS:
            raise ValueError(f"case {self.name}: a flashinfer_merge case, pattern in "
                             f"{MERGE_PATTERNS}")  # fmt: skip

    @property
    def needs(self) -> frozenset[str]:
        return frozenset({"states"}) if self.states != 2 else frozenset()

    @property
    def shape(self) -> dict[str, int]:
        return {"N": self.tokens, "H": self.heads, "D": self.d, "S": self.states}


class Requirement(NamedTuple):
    """A size a serving battery must hold: ``kind`` "width" (D = ``value``) or "pool" (a pool
    of more than ``value`` pages)."""

    label: str
    kind: str
    value: int

    def met(self, case: PagedCase | MergeCase) -> bool:
        if self.kind == "width":
            return case.d == self.value
        return isinstance(case, PagedCase) and case.pool_pages > self.value


class PagedInputs(NamedTuple):
    """A paged case's float64 inputs and integer metadata. q (T, H, D); k_pages, v_pages
    (pages, P, H_kv, D) NHD, holding every token of every sequence (vLLM: but its new ones,
    which ``key``, ``value`` (T, H_kv, D) bring); block_table (B, pages needed +
    TABLE_EXTRA), padded with 0 (vLLM) or spare pages (FlashInfer); kv_lens (B,); qo_indptr
    (B + 1,); slot_mapping (T,) vLLM's slots of the new tokens; sinks (H,) or None."""

    q: np.ndarray
    k_pages: np.ndarray
    v_pages: np.ndarray
    key: np.ndarray | None
    value: np.ndarray | None
    block_table: np.ndarray
    kv_lens: np.ndarray
    qo_indptr: np.ndarray
    slot_mapping: np.ndarray | None
    sinks: np.ndarray | None


def _rng(name: str, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def make_paged_inputs(case: PagedCase, seed: int) -> PagedInputs:
    """The inputs of ``case`` for ``seed``; the same (case, seed) gives the same arrays."""
    rng = _rng(case.name, seed)
    p, h, h_kv, d = case.page_size, case.heads, case.heads_kv, case.d
    q_lens, kv_lens = case.q_lens, case.kv_lens
    needed = [-(-n // p) for n in kv_lens]
    shared = case.prefix // p
    width = max(needed) + TABLE_EXTRA
    owned = shared + sum(n - shared for n in needed)
    spare = owned // 4 + SEQUENCES * TABLE_EXTRA + 1
    vllm = case.spec == "vllm_paged"
    total = max(owned + spare + int(vllm), case.pool_pages)
    order = rng.permutation(np.arange(int(vllm), total))  # vLLM: block 0 is the null block
    if total > WIDE_IDS:  # a page read by the longest sequence with queries past 16 bits
        b = max((b for b in range(SEQUENCES) if q_lens[b]), key=lambda b: kv_lens[b])
        last = shared + sum(n - shared for n in needed[: b + 1]) - 1  # its last page's place
        wide = owned + int(np.argmax(order[owned:] >= WIDE_IDS))
        order[[last, wide]] = order[[wide, last]]
    prefix_pages, taken = order[:shared], shared
    table = np.zeros((SEQUENCES, width), dtype=np.int64)
    spares = order[owned:]
    for b, n in enumerate(needed):
        own = order[taken : taken + n - shared]
        taken += n - shared
        table[b, : n] = np.concatenate([prefix_pages, own])
        if not vllm:  # FlashInfer's CSR buffer: spare entries naming pages no sequence owns
            table[b, n:] = spares[(b * TABLE_EXTRA + np.arange(width - n)) % len(spares)]
    scale = 1.0 / math.sqrt(d)
    named = np.arange(total) if total <= WIDE_IDS else np.unique(table)
    k_pages, v_pages = np.zeros((total, p, h_kv, d)), np.zeros((total, p, h_kv, d))
    k_pages[named] = rng.standard_normal((len(named), p, h_kv, d))
    v_pages[named] = rng.standard_normal((len(named), p, h_kv, d))
    q = rng.standard_normal((sum(q_lens), h, d)) * 1.2
    if case.values == "outliers":  # a few channels far above the rest, as hidden states have
        channels = np.array([1, d // 2, d - 1])
        q[..., channels] *= 8.0
        k_pages[..., channels] *= 8.0
        v_pages[..., channels[:1]] *= 30.0
        q *= 0.35  # scores of spread ~1.5 with the outliers
    elif case.values == "shifted":  # every key + c: query i's scores move by q_i . c * scale
        c = np.full(d, SHIFT / (scale * math.sqrt(d) * 1.2))
        k_pages[named] += c
    key = value = slots = None
    qo_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int64)
    if vllm:  # the new tokens: brought by key, value; their slots hold other numbers
        positions = [np.arange(kv - n, kv) for n, kv in zip(q_lens, kv_lens, strict=True)]
        slots = np.concatenate([table[b, pos // p] * p + pos % p
                                for b, pos in enumerate(positions)]).astype(np.int64)
        pages, offsets = slots // p, slots % p
        key, value = k_pages[pages, offsets].copy(), v_pages[pages, offsets].copy()
        k_pages[pages, offsets] = rng.standard_normal(key.shape)
        v_pages[pages, offsets] = rng.standard_normal(value.shape)
    sinks = rng.standard_normal(h) + 1.0 if case.sinks else None
    return PagedInputs(q, k_pages, v_pages, key, value, table, np.array(kv_lens, np.int64),
                       qo_indptr, slots, sinks)  # fmt: skip


class MergeInputs(NamedTuple):
    """v (T, S, H, D) float64, s (T, S, H) base-2 log-sum-exps (-inf for a state with nothing to
    see)."""

    v: np.ndarray
    s: np.ndarray


def make_merge_inputs(case: MergeCase, seed: int) -> MergeInputs:
    """The inputs of ``case`` for ``seed``."""
    rng = _rng(case.name, seed)
    shape = (case.tokens, case.states, case.heads)
    v = rng.standard_normal((*shape, case.d))
    s = rng.standard_normal(shape) * 2.0
    if case.pattern == "far":  # 2^200 overflows float32: a merge must subtract the max first
        s += rng.choice([-200.0, 0.0, 200.0], size=shape)
    elif case.pattern == "neginf":  # a third of the states saw nothing: weight 0, v anything
        s[rng.random(shape) < 1 / 3] = -np.inf
    elif case.pattern == "dead":  # every other token: nothing seen by any state
        s[::2] = -np.inf
    v[np.isneginf(s)] = 0.0  # a state with nothing to see has v 0 (FlashInfer writes so)
    return MergeInputs(v, s)
