"""The cases of the decode specs ("flash_kvcache", "flash_mla"): what one decode call holds and
how its inputs are drawn (``battery.decode.generate`` builds the batteries).

A decode case is a batch of sequences, each with its own cache length, a cache (contiguous rows,
or a pool of pages reached through a shuffled block table), s_q queries and s_new new tokens per
sequence, and the options of flash-attn's ``flash_attn_with_kvcache`` (docs/decoding.md); a
"flash_mla" case is FlashMLA's shape (one latent head of 576 = 512 + 64 numbers, pages of 64, the
layer's scale), ``cache_seqlens`` counting the queries' own tokens. Pages are shuffled in the
pool: a kernel that reads them as contiguous reads other sequences' tokens.

Inputs are drawn in float64 from a generator seeded by (seed, case name); every slot of a cache,
beyond the lengths too, holds random numbers, so that reading a slot it should not is visible.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/battery/decode/test_generate.py
"""

from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

DECODE_SPECS = ("flash_kvcache", "flash_mla")
ROTARY = ("none", "interleaved", "half", "partial")  # partial: half of D, half-split pairs
ALIBI = ("none", "H", "BH")
# The lengths a sequence's cache takes, by what they are for the page size P: empty, one token,
# odd (1.5 P + 1), a page edge - 1, on it and + 1, and full (the new tokens end at the last
# slot). A contiguous cache of capacity C takes C / 2 for P.
LENGTHS = ("0", "1", "odd", "P-1", "P", "P+1", "full")
SEQUENCES = 4  # B of every case
WIDE_IDS = 2**16  # page ids from here on need more than 16 bits
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
        length_labels: what each sequence's length stands for (``LENGTHS``), as it was built.
        table_extra: block table columns past the pages a sequence can hold, each naming a
            page no sequence owns (a table wider than the sequences need: FlashInfer #4270
            read it with the wrong row stride).
        pool_pages: the fewest pages the pool holds (past 65,536: page ids past 16 bits).
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
    length_labels: tuple[str, ...] = ()
    table_extra: int = 0
    pool_pages: int = 0

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
        if self.page_size is None and (self.table_extra or self.pool_pages):
            raise ValueError(f"case {self.name}: a table and a pool are for paged caches")
        if self.leftpad is not None and any(
            not 0 <= pad <= n for pad, n in zip(self.leftpad, self.seqlens, strict=True)
        ):
            raise ValueError(f"case {self.name}: 0 <= leftpad <= cache_seqlens per sequence")

    @property
    def latent(self) -> bool:
        """FlashMLA's convention: one latent head whose first Dv numbers are V, and
        ``cache_seqlens`` counting the queries' own tokens (already in the cache)."""
        return self.spec == "flash_mla"

    @property
    def batch(self) -> int:
        return len(self.seqlens)

    @property
    def pages_per_sequence(self) -> int:
        return 1 if self.page_size is None else self.capacity // self.page_size

    @property
    def rotary_dim(self) -> int:
        """The coordinates rotated: D (half of it when partial), rounded down to pairs."""
        if self.rotary == "none":
            return 0
        width = self.d // 2 if self.rotary == "partial" else self.d
        return width - width % 2

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


def _sparse(rng: np.random.Generator, shape: tuple[int, ...], named: np.ndarray,
            stretch: float) -> np.ndarray:  # fmt: skip
    """A pool of ``shape`` whose pages ``named`` are drawn and the rest are zeros: a pool of
    70,000 pages costs the pages its table names, its unused columns included (``np.zeros``
    leaves the others' memory uncommitted)."""
    pool = np.zeros(shape)
    pool[named] = rng.standard_normal((len(named), *shape[1:])) * stretch
    return pool


# The most memory the pools of one case may take as the checker holds them (float64 arrays,
# the kernel's and the golden's copies: POOL_COPIES of each cache).
POOL_COPIES = 4


def check_pool_fits(case: DecodeCase, pages: int) -> None:
    """A MemoryError naming the case when its pools of ``pages`` pages, as the checker holds
    them, would take more than half this machine's memory: refused before a byte is drawn,
    never an out-of-memory part way through a battery."""
    widths = case.d + (0 if case.spec == "flash_mla" else case.dv)
    needed = pages * case.page_size * case.heads_kv * widths * 8 * POOL_COPIES
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: nothing to compare
        return
    if needed > memory // 2:
        raise MemoryError(
            f"case {case.name!r}: a pool of {pages:,} pages of {case.page_size} tokens needs "
            f"{needed / 2**30:.1f} GiB as the checker holds it, more than half of this "
            f"machine's {memory / 2**30:.1f} GiB"
        )


def _wide_id_read(case: DecodeCase, order: np.ndarray) -> np.ndarray:
    """``order`` (the shuffled pool, sequence s's pages from s * pages_per_sequence on) with a
    page id past 16 bits on the page that holds the last token of the longest sequence, which
    every kernel reads: on sequence 0's first page, an empty sequence 0 hid it, and a kernel
    truncating ids to 16 bits passed such a seed (seed 42 of the float64 calibration)."""
    assert case.page_size is not None
    totals = [n + case.s_new for n in case.seqlens]
    seq = int(np.argmax(totals))
    slot = seq * case.pages_per_sequence + max(totals[seq] - 1, 0) // case.page_size
    first_wide = int(np.argmax(order >= WIDE_IDS))
    order = order.copy()
    order[[slot, first_wide]] = order[[first_wide, slot]]
    return order


def make_decode_inputs(case: DecodeCase, seed: int) -> DecodeInputs:
    """The float64 inputs of ``case`` for ``seed``; the same (case, seed) gives the same arrays."""
    rng = np.random.default_rng([seed, zlib.crc32(case.name.encode())])
    b, h, h_kv, d, dv = case.batch, case.heads, case.heads_kv, case.d, case.dv
    scale = 1.0 / math.sqrt(d) if case.scale is None else case.scale
    stretch = math.sqrt(case.logits / (math.sqrt(d) * scale))  # scores of spread ~ logits
    q = rng.standard_normal((b, case.s_q, h, d)) * stretch
    table = batch_idx = None
    if case.page_size is not None:
        pages, extra = b * case.pages_per_sequence, b * case.table_extra
        spare = max(pages // 4 + 1, extra)  # pages no sequence owns (the wide table's columns)
        total = max(pages + spare, case.pool_pages)
        check_pool_fits(case, total)
        order = rng.permutation(total)  # shuffled: never contiguous by accident
        if total > WIDE_IDS:  # a page id past 16 bits in every such table, on a page read:
            order = _wide_id_read(case, order)
        table = order[:pages].reshape(b, case.pages_per_sequence)
        if extra:
            table = np.concatenate([table, order[pages : pages + extra].reshape(b, -1)], axis=1)
        table = table.astype(np.int32)
        pool: tuple[int, ...] = (total, case.page_size, h_kv)
    else:
        rows = b + 2 if case.batch_idx else b
        if case.batch_idx:
            batch_idx = rng.permutation(rows)[:b].astype(np.int32)
        pool = (rows, case.capacity, h_kv)
    # Every page drawn, spare ones too (a kernel reading a page it should not reads numbers),
    # but in a pool past 16-bit ids only the pages the table names.
    named = np.arange(pool[0]) if pool[0] <= WIDE_IDS or table is None else np.unique(table)
    k_cache = _sparse(rng, pool + (d,), named, stretch)
    v_cache = None if case.spec == "flash_mla" else _sparse(rng, pool + (dv,), named, 1.0)
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


def length_of(label: str, page: int | None, capacity: int, s_new: int) -> int:
    """The cache length ``label`` (one of ``LENGTHS``) stands for, at most ``capacity - s_new``
    (the new tokens must fit)."""
    size = page if page is not None else capacity // 2
    values = {"0": 0, "1": 1, "odd": size + size // 2 + 1, "P-1": size - 1, "P": size,
              "P+1": size + 1, "full": capacity - s_new}  # fmt: skip
    return min(values[label], capacity - s_new)


def crosses(case: DecodeCase) -> bool:
    """Whether the new tokens of some sequence span two pages (of a contiguous cache: its half)."""
    size = case.page_size or case.capacity // 2
    return case.s_new > 1 and any(
        start // size != (start + case.s_new - 1) // size for start in case.seqlens
    )
