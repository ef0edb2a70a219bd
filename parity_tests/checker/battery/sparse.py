"""The cases of the sparse specs ("sparse", "flash_mla_sparse"): attention of each query token
over the key rows its indices name (docs/derivations/sparse.md), what one call holds, how its
inputs are drawn, and the default battery built for the features a kernel claims.

A sparse case is token-major, as FlashMLA's sparse kernels are: S_q query tokens, S_kv key
tokens, H query heads over H_kv key heads, and an index list of ``topk`` entries per query token
and key head. The lists are drawn as an indexer draws them (``PATTERNS``): each query token sees
the keys up to its position (S_kv - S_q + t), names the last ``topk / 2`` of them and as many
earlier ones at random, so that neighbouring queries share most of their keys (a key row's
gradient is a sum over many queries: cudnn-frontend #385 overwrote it); then, per pattern,
entries copied within a row (a gather counts each entry), sentinels of every kind (-1, -2, S_kv,
S_kv + 1, 2^31 - 1: each reads and writes nothing; flash-attention's sparse backward wrote a -1's
gradient to row -1), or whole rows with no valid entry. ``topk_length`` (on) gives each query a
length among 0, 1, 63, 64, 65, 127 and ``topk`` (64-entry tiles, and short lists beside sinks:
cudnn-frontend PR #421 left the sink out of the backward); the entries past it are valid keys, so
that a kernel reading them is visible.

The battery (``default_battery``) is the covering array of the spec's factors (``battery.pairs``,
as every spec's) for the claimed features, each row given the head width that meets the most
requirements still unmet (``Spec.requirements``: every width of ``spec.widths``; for FlashMLA a
call of more than 64 query rows); a requirement no row met gets a row of its own.

Shape legend: S_q query tokens, S_kv key tokens, H query heads, H_kv key heads, D head width,
Dv value width, topk entries per list.

Tests: tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    pass

SPARSE_SPECS = ("sparse", "flash_mla_sparse")
PATTERNS = ("overlap", "duplicates", "sentinels", "dead")
# The sentinels a list may hold beside -1, by what they are for S_kv (every kind FlashMLA's
# signature allows: negative, at or past S_kv, the largest int32).
INT32_MAX = 2**31 - 1
TOPK = 128  # two 64-entry tiles
TILE = 64
LENGTHS = (0, 1, TILE - 1, TILE, TILE + 1, 2 * TILE - 1)  # and topk itself


@dataclass(frozen=True)
class SparseCase:
    """One sparse call: the spec's arguments and how its inputs are drawn.

    Attributes:
        name: unique; seeds the inputs.
        spec: "sparse" or "flash_mla_sparse".
        s_q, s_kv, heads, heads_kv, d, dv, topk: S_q, S_kv, H, H_kv, D, Dv, topk.
        latent: V is the first Dv numbers of K (MLA's latent; ``v`` None, ``d_v`` given).
        pattern: how the lists are drawn (``PATTERNS``).
        sinks: one sink logit per query head.
        topk_length: per query token, how many of its entries are read (``LENGTHS``, topk).
        scale: ``softmax_scale``; None for the default 1 / sqrt(D).
    """

    name: str
    spec: str
    s_q: int
    s_kv: int
    heads: int
    heads_kv: int
    d: int
    dv: int
    topk: int = TOPK
    latent: bool = False
    pattern: str = "overlap"
    sinks: bool = False
    topk_length: bool = False
    scale: float | None = None

    def __post_init__(self) -> None:
        if self.spec not in SPARSE_SPECS or self.pattern not in PATTERNS:
            raise ValueError(f"case {self.name}: spec in {SPARSE_SPECS}, pattern in {PATTERNS}")
        if self.heads % self.heads_kv or not 0 < self.dv <= self.d:
            raise ValueError(f"case {self.name}: H_kv must divide H, 0 < Dv <= D")
        if self.s_kv - self.s_q < self.topk:
            raise ValueError(f"case {self.name}: every query must see at least topk keys")

    @property
    def needs(self) -> frozenset[str]:
        """The features a kernel must have to run this case."""
        needs = {
            "gqa": self.spec == "sparse" and self.heads_kv != self.heads,
            "latent": self.spec == "sparse" and self.latent,
            "sinks": self.sinks,
            "topk_length": self.topk_length,
        }
        return frozenset(name for name, held in needs.items() if held)

    @property
    def shape(self) -> dict[str, int]:
        """The sizes by legend letter, as the reports show every case's."""
        return {"H": self.heads, "N": self.s_q, "M": self.s_kv, "D": self.d, "Dv": self.dv,
                "H_kv": self.heads_kv, "topk": self.topk}  # fmt: skip


class SparseInputs(NamedTuple):
    """A case's float64 inputs (``v`` None when latent; ``sinks``, ``topk_length`` None when
    off) and its int64 lists."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray | None
    indices: np.ndarray
    dout: np.ndarray
    sinks: np.ndarray | None
    topk_length: np.ndarray | None


def make_sparse_inputs(case: SparseCase, seed: int) -> SparseInputs:
    """The inputs of ``case`` for ``seed``; the same (case, seed) gives the same arrays."""
    rng = np.random.default_rng([seed, zlib.crc32(case.name.encode())])
    q = rng.standard_normal((case.s_q, case.heads, case.d))
    k = rng.standard_normal((case.s_kv, case.heads_kv, case.d))
    scale = 1.0 / math.sqrt(case.d) if case.scale is None else case.scale
    q *= 1.5 / (math.sqrt(case.d) * scale) ** 0.5  # scores of spread ~1.5
    k *= 1.5 / (math.sqrt(case.d) * scale) ** 0.5
    v = None if case.latent else rng.standard_normal((case.s_kv, case.heads_kv, case.dv))
    indices = np.stack([_lists(case, rng) for _ in range(case.heads_kv)], axis=1)
    dout = rng.standard_normal((case.s_q, case.heads, case.dv))
    sinks = rng.standard_normal(case.heads) + 1.0 if case.sinks else None
    lengths = None
    if case.topk_length:
        choices = np.array([n for n in LENGTHS if n < case.topk] + [case.topk])
        lengths = choices[(np.arange(case.s_q) + rng.integers(len(choices))) % len(choices)]
    return SparseInputs(q, k, v, indices, dout, sinks, lengths)


def _lists(case: SparseCase, rng: np.random.Generator) -> np.ndarray:
    """(S_q, topk) lists for one key head: each query's last topk / 2 keys up to its position and
    as many earlier ones at random, then the pattern's changes."""
    topk, near = case.topk, case.topk // 2
    out = np.empty((case.s_q, topk), dtype=np.int64)
    for t in range(case.s_q):
        position = case.s_kv - case.s_q + t
        recent = np.arange(position - near + 1, position + 1)
        earlier = rng.choice(position - near + 1, size=topk - near, replace=False)
        out[t] = rng.permutation(np.concatenate([recent, earlier]))
    if case.pattern == "duplicates":  # a quarter of each list copies other entries of it
        for t in range(case.s_q):
            slots = rng.choice(topk, size=topk // 4, replace=False)
            out[t, slots] = out[t, rng.integers(topk, size=slots.size)]
    elif case.pattern == "sentinels":  # a quarter of the entries are sentinels of every kind
        kinds = np.array([-1, -2, case.s_kv, case.s_kv + 1, INT32_MAX])
        hit = rng.random(out.shape) < 0.25
        out[hit] = kinds[rng.integers(len(kinds), size=int(hit.sum()))]
    elif case.pattern == "dead":  # every third query has no valid entry (-1 and S_kv)
        dead = np.arange(case.s_q) % 3 == 1
        out[dead] = np.where(rng.random((int(dead.sum()), topk)) < 0.5, -1, case.s_kv)
    return out


class Requirement(NamedTuple):
    """A size a sparse battery must hold: ``kind`` "width" (D = ``value``) or "rows" (a call of
    more than ``value`` query rows, S_q * H)."""

    label: str
    kind: str
    value: int

    def met(self, case: SparseCase) -> bool:
        if self.kind == "width":
            return case.d == self.value
        return case.s_q * case.heads > self.value
