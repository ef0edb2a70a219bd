"""Pages of a pool shared by sequences: where a token lives (``read_tokens``, ``write_tokens``)
and which pages each sequence holds (``PagePool``, the bookkeeping of ``PagedKVCache`` and
``PagedLatentCache``).

A sequence's cache is a list of pages of P tokens, its row of the block table: token t lies in
page ``pages[t // P]`` at slot ``t % P``, whatever the order of those pages in the pool. A pool
is any array with pages on its first axis and tokens on its second, (num_pages, P, H_kv, W): the
keys of a ``PagedKVCache``, its values, or the latent rows of a ``PagedLatentCache``. A
contiguous cache is the same thing with one page of ``capacity`` tokens per row, which is how
``paged.kvcache_attention_forward`` reads both layouts through these two functions.

The pool's allocation (``PagePool``): when B sequences start, each is given its own region of
the pool, ``num_blocks // B`` consecutive pages, sequence b's from page ``b * (num_blocks // B)``
on; a sequence's next page is the one after its last when that one is free, else the lowest free
page of its region, else the lowest free page of the pool. Every sequence holds as many pages as
the others (they share one length) and B of them fit in the pool, so no sequence ever holds more
than its region: its pages are always one run, read in place however the decode steps of the
batch alternate. Without the regions, sequences that start together interleave as soon as they
grow (the next page after a sequence's last is its neighbour's first), and every read of a batch
gathers.

Shape legend: P page size, H_kv heads of the pool, W their width.

Derivation: docs/decoding.md (section 3, where a token lives; section 6, the pool's allocation).
Tests: tests/numpy_attention/decode/test_pages.py.
"""

from __future__ import annotations

import abc
import math
import threading
from typing import Any

import numpy as np

from .. import validation

__all__ = ["PagePool", "read_tokens", "write_tokens"]


def read_tokens(
    pool: np.ndarray, pages: np.ndarray, lo: int, hi: int, scratch: int | None = None
) -> np.ndarray:
    """Tokens [lo, hi) of the sequence whose pages, in order, are ``pages``, (hi - lo, H_kv, W).

    pool: (num_pages, P, H_kv, W). A view when the pages holding them are consecutive in the
    pool; otherwise the pages are gathered, into a new array, or with ``scratch`` (a slot
    number) into this thread's buffer of that slot, reused from call to call: the result is
    then valid until the next gather into the same slot. A fresh array of a cache's size costs
    a page fault per 4 KiB when first written: measured, gathering 16 MiB of keys took 4.6 ms
    into new arrays, 1.8 ms into a reused buffer.
    """
    size = pool.shape[1]
    if hi <= lo:
        return pool[:0, :0].reshape((0,) + pool.shape[2:])
    first, last = lo // size, -(-hi // size)  # the pages covering [lo, hi)
    ids = pages[first:last]
    if np.all(np.diff(ids) == 1):  # one run of pages: a view, nothing copied
        tokens = pool[ids[0] : ids[-1] + 1].reshape((-1,) + pool.shape[2:])
    elif scratch is None:
        tokens = pool[ids].reshape((-1,) + pool.shape[2:])  # (pages * P, H_kv, W), gathered
    else:
        out = _buffer(scratch, (len(ids),) + pool.shape[1:], pool.dtype)
        # the ids were checked against the pool: "clip" never clips, and spares take's buffer
        np.take(pool, ids, axis=0, out=out, mode="clip")
        tokens = out.reshape((-1,) + pool.shape[2:])  # (pages * P, H_kv, W)
    return tokens[lo - first * size : hi - first * size]


_GATHERED = threading.local()


def _buffer(slot: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """This thread's buffer number ``slot``, grown to hold ``shape`` of ``dtype``, as that."""
    buffers = getattr(_GATHERED, "buffers", None)
    if buffers is None:
        buffers = _GATHERED.buffers = {}
    size = math.prod(shape)
    buffer = buffers.get(slot)
    if buffer is None or buffer.dtype != dtype or buffer.size < size:
        buffer = buffers[slot] = np.empty(size, dtype)
    return buffer[:size].reshape(shape)


def write_tokens(pool: np.ndarray, pages: np.ndarray, positions: np.ndarray, tokens: Any) -> None:
    """Write ``tokens`` (len(positions), H_kv, W) at ``positions`` of the sequence whose pages
    are ``pages``, in place: position t goes to page pages[t // P], slot t % P."""
    size = pool.shape[1]
    pool[pages[positions // size], positions % size] = tokens


class PagePool(abc.ABC):
    """Which pages of a pool each sequence holds, and how many tokens every sequence has: the
    bookkeeping a serving engine keeps beside a paged cache's arrays (which a subclass holds,
    pages on their first axis, and whose ``_check_reserve`` says what a token of it is).

    The first ``reserve`` of B sequences starts them, each in its own region of ``num_blocks // B``
    consecutive pages (``regions``); every later one gives each the same number of tokens, so
    they share one ``length`` (a layer's decode step). A sequence's next page is the one after its
    last when that one is free, else the lowest free page of its region, else of the pool; since
    the sequences hold equal numbers of pages, none outgrows its region, and each sequence's
    pages are one run of the pool, read in place (the module's docstring says why).

    Args:
        num_blocks: pages in the pool.
        page_size: P, tokens per page.
    """

    def __init__(self, num_blocks: int, page_size: int) -> None:
        num_blocks = validation.positive_int("num_blocks", num_blocks)
        self.page_size = validation.positive_int("page_size", page_size)
        self._owned = np.zeros(num_blocks, dtype=bool)
        self._tables: list[list[int]] = []
        self._starts: list[int] = []  # each sequence's first page: where its region begins
        self._length = 0

    @property
    def length(self) -> int:
        """How many tokens every sequence holds."""
        return self._length

    @property
    def batch(self) -> int:
        """How many sequences the cache holds (0 before the first append)."""
        return len(self._tables)

    @property
    def regions(self) -> list[range]:
        """The pages set aside for each sequence when they started, in order: sequence b's pages
        are ``regions[b]``'s first ones, one run (empty before the sequences start)."""
        size = len(self._owned) // self.batch if self.batch else 0
        return [range(start, start + size) for start in self._starts]

    @property
    def cache_seqlens(self) -> np.ndarray:
        """(B,) int32: every sequence's length, as flash-attn's ``cache_seqlens`` wants it."""
        return np.full(self.batch, self._length, dtype=np.int32)

    @property
    def block_table(self) -> np.ndarray:
        """(B, pages held) int32: each sequence's pages in order, as flash-attn's
        ``block_table`` wants it."""
        return np.array(self._tables, dtype=np.int32).reshape(self.batch, -1)

    @abc.abstractmethod
    def _check_reserve(self, batch: int, n: int) -> None:
        """Raise unless ``n`` more tokens of ``batch`` sequences fit (``_check_room`` and the
        subclass's own checks). Writes nothing."""

    def _check_room(self, batch: int, n: int) -> None:
        """Raise unless the pool has the free pages that ``n`` more tokens of ``batch``
        sequences need."""
        needed = batch * self._new_pages(n)
        free = int(np.count_nonzero(~self._owned))
        if needed > free:
            raise ValueError(
                f"the cache is full: {batch} sequences of {self._length} tokens need {needed} "
                f"more pages of {self.page_size} for {n} new tokens, {free} are free"
            )

    def reserve(self, batch: int, n: int) -> None:
        """Give each of the ``batch`` sequences the pages for ``n`` more tokens (starting the
        sequences if there are none), without changing their length: what an engine does
        before a kernel writes the tokens in place (then ``advance(n)``)."""
        self._check_reserve(batch, n)
        if not self._tables:  # the sequences start: region b begins at page b * (pages // B)
            self._tables = [[] for _ in range(batch)]
            self._starts = [b * (len(self._owned) // batch) for b in range(batch)]
        new = self._new_pages(n)
        for table, region in zip(self._tables, self.regions, strict=True):
            for _ in range(new):
                table.append(self._take_page(table[-1] + 1 if table else region.start, region))

    def advance(self, n: int) -> None:
        """Count ``n`` more tokens in every sequence, once they have been written (by a kernel
        given ``block_table`` and ``cache_seqlens``) into the pages ``reserve`` gave."""
        n = validation.non_negative_int("n", n)
        held = len(self._tables[0]) * self.page_size if self._tables else 0
        if self._length + n > held:
            raise ValueError(
                f"the sequences hold pages for {held} tokens, {self._length} + {n} do not fit: "
                "reserve them first"
            )
        self._length += n

    def reset(self) -> None:
        """Forget every sequence and free every page (the pool's arrays are kept)."""
        self._owned[:] = False
        self._tables = []
        self._starts = []
        self._length = 0

    def _write(self, pool: np.ndarray, tokens: np.ndarray) -> None:
        """Write ``tokens`` (B, N, H_kv, W) after every sequence's ``length`` tokens, into the
        pages ``reserve`` gave them."""
        positions = np.arange(self._length, self._length + tokens.shape[1])
        for table, sequence in zip(self._tables, tokens, strict=True):
            write_tokens(pool, np.asarray(table, np.int64), positions, sequence)

    def _read(self, pool: np.ndarray, b: int, scratch: int | None = None) -> np.ndarray:
        """Every token of sequence b, (length, H_kv, W): ``read_tokens`` of its pages."""
        return read_tokens(pool, np.asarray(self._tables[b], np.int64), 0, self._length, scratch)

    def _new_pages(self, n: int) -> int:
        """Pages each sequence needs for ``n`` more tokens."""
        held = len(self._tables[0]) if self._tables else 0
        return max(0, -(-(self._length + n) // self.page_size) - held)

    def _take_page(self, preferred: int, region: range) -> int:
        """``preferred`` if it is a free page, else the lowest free page of the sequence's
        ``region``, else the lowest free page of the pool; now owned. (Sequences of equal length
        in their regions always find ``preferred`` free; the fallbacks keep the allocation total
        for a pool whose pages are held otherwise.)"""
        if not (preferred < len(self._owned) and not self._owned[preferred]):
            own = np.flatnonzero(~self._owned[region.start : region.stop])
            preferred = (
                region.start + int(own[0]) if len(own) else int(np.flatnonzero(~self._owned)[0])
            )
        self._owned[preferred] = True
        return preferred
