"""Pages of a pool shared by sequences, in torch: the twin of ``numpy_attention.decode.pages``,
where a token lives (``read_tokens``, ``write_tokens``) and which pages each sequence holds
(``PagePool``, the bookkeeping of ``PagedKVCache`` and ``PagedLatentCache``), on any device.

A sequence's cache is a list of pages of P tokens, its row of the block table: token t lies in
page ``pages[t // P]`` at slot ``t % P``. A pool is any tensor (num_pages, P, H_kv, W); a
contiguous cache is one page of ``capacity`` tokens per row. The tables are Python lists here
(read on the host once per call); pages that are one run of the pool are read in place (a view,
as in the NumPy twin), any other table is gathered with one ``index_select``.

The pool's allocation is the NumPy twin's, page for page: B sequences starting together get a
region of ``num_blocks // B`` consecutive pages each, and a sequence's next page is the one after
its last when free, else the lowest free page of its region, else of the pool, so each
sequence's pages stay one run.

Shape legend: P page size, H_kv heads of the pool, W their width.

Derivation: docs/decoding.md (section 3, where a token lives; section 6, the pool's allocation).
Tests: tests/torch_attention/decode/test_pages.py.
"""

from __future__ import annotations

import abc

import torch

from .. import validation

__all__ = ["PagePool", "read_tokens", "write_tokens"]


def read_tokens(pool: torch.Tensor, pages: list[int], lo: int, hi: int) -> torch.Tensor:
    """Tokens [lo, hi) of the sequence whose pages, in order, are ``pages``, (hi - lo, H_kv, W),
    from the pool (num_pages, P, H_kv, W): a view when the covering pages are consecutive in the
    pool, else those pages gathered in table order."""
    size = pool.shape[1]
    if hi <= lo:
        return pool[:0, :0].reshape((0,) + tuple(pool.shape[2:]))
    first, last = lo // size, -(-hi // size)
    ids = pages[first:last]
    if ids == list(range(ids[0], ids[0] + len(ids))):  # one run of pages: a view, nothing copied
        tokens = pool[ids[0] : ids[0] + len(ids)].reshape((-1,) + tuple(pool.shape[2:]))
    else:
        index = torch.tensor(ids, device=pool.device)
        tokens = pool.index_select(0, index).reshape((-1,) + tuple(pool.shape[2:]))  # gathered
    return tokens[lo - first * size : hi - first * size]


def write_tokens(
    pool: torch.Tensor, pages: list[int], positions: list[int], tokens: torch.Tensor
) -> None:
    """Write ``tokens`` (len(positions), H_kv, W) at ``positions`` of the sequence whose pages
    are ``pages``, in place: position t goes to page pages[t // P], slot t % P."""
    size = pool.shape[1]
    index = torch.tensor([pages[t // size] for t in positions], device=pool.device)
    slots = torch.tensor([t % size for t in positions], device=pool.device)
    pool[index, slots] = tokens.to(pool.dtype)


class PagePool(abc.ABC):
    """Which pages of a pool each sequence holds, and how many tokens every sequence has; the
    twin of ``numpy_attention.decode.pages.PagePool`` (the same allocation: the sequences start
    in regions of ``num_blocks // B`` pages, a sequence's next page is the one after its last
    when free, else the lowest free page of its region, else of the pool). A subclass holds
    the tensors, pages on their first axis, on its ``device``, and says what a token of it is
    (``_check_reserve``).

    Args:
        num_blocks: pages in the pool.
        page_size: P, tokens per page.
    """

    def __init__(self, num_blocks: int, page_size: int) -> None:
        num_blocks = validation.positive_int("num_blocks", num_blocks)
        self.page_size = validation.positive_int("page_size", page_size)
        self._owned = [False] * num_blocks
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
        """The pages set aside for each sequence when they started, in order (the NumPy
        twin's)."""
        size = len(self._owned) // self.batch if self.batch else 0
        return [range(start, start + size) for start in self._starts]

    @property
    @abc.abstractmethod
    def device(self) -> torch.device:
        """Where the pool's tensors live."""

    @property
    def cache_seqlens(self) -> torch.Tensor:
        """(B,) int32 on the pool's device: every sequence's length."""
        return torch.full((self.batch,), self._length, dtype=torch.int32, device=self.device)

    @property
    def block_table(self) -> torch.Tensor:
        """(B, pages held) int32 on the pool's device: each sequence's pages in order."""
        table = torch.tensor(self._tables, dtype=torch.int32, device=self.device)
        return table.reshape(self.batch, -1)

    @abc.abstractmethod
    def _check_reserve(self, batch: int, n: int) -> None:
        """Raise unless ``n`` more tokens of ``batch`` sequences fit. Writes nothing."""

    def _check_room(self, batch: int, n: int) -> None:
        """Raise unless the pool has the free pages that ``n`` more tokens of ``batch``
        sequences need."""
        needed = batch * self._new_pages(n)
        free = self._owned.count(False)
        if needed > free:
            raise ValueError(
                f"the cache is full: {batch} sequences of {self._length} tokens need {needed} "
                f"more pages of {self.page_size} for {n} new tokens, {free} are free"
            )

    def reserve(self, batch: int, n: int) -> None:
        """Give each of the ``batch`` sequences the pages for ``n`` more tokens (starting the
        sequences if there are none), without changing their length."""
        self._check_reserve(batch, n)
        if not self._tables:  # the sequences start: region b begins at page b * (pages // B)
            self._tables = [[] for _ in range(batch)]
            self._starts = [b * (len(self._owned) // batch) for b in range(batch)]
        new = self._new_pages(n)
        for table, region in zip(self._tables, self.regions, strict=True):
            for _ in range(new):
                table.append(self._take_page(table[-1] + 1 if table else region.start, region))

    def advance(self, n: int) -> None:
        """Count ``n`` more tokens in every sequence, once a kernel has written them."""
        n = validation.non_negative_int("n", n)
        held = len(self._tables[0]) * self.page_size if self._tables else 0
        if self._length + n > held:
            raise ValueError(
                f"the sequences hold pages for {held} tokens, {self._length} + {n} do not fit: "
                "reserve them first"
            )
        self._length += n

    def reset(self) -> None:
        """Forget every sequence and free every page (the pool's tensors are kept)."""
        self._owned = [False] * len(self._owned)
        self._tables = []
        self._starts = []
        self._length = 0

    def _write(self, pool: torch.Tensor, tokens: torch.Tensor) -> None:
        """Write ``tokens`` (B, N, H_kv, W) after every sequence's ``length`` tokens, into the
        pages ``reserve`` gave them (detached: a cache is for inference)."""
        positions = list(range(self._length, self._length + tokens.shape[1]))
        with torch.no_grad():
            for table, sequence in zip(self._tables, tokens, strict=True):
                write_tokens(pool, table, positions, sequence)

    def _read(self, pool: torch.Tensor, b: int) -> torch.Tensor:
        """Every token of sequence b, (length, H_kv, W): ``read_tokens`` of its pages."""
        return read_tokens(pool, self._tables[b], 0, self._length)

    def _new_pages(self, n: int) -> int:
        held = len(self._tables[0]) if self._tables else 0
        return max(0, -(-(self._length + n) // self.page_size) - held)

    def _take_page(self, preferred: int, region: range) -> int:
        """``preferred`` if free, else the lowest free page of ``region``, else of the pool (the
        NumPy twin's rule); now owned."""
        if not (preferred < len(self._owned) and not self._owned[preferred]):
            own = next((page for page in region if not self._owned[page]), None)
            preferred = self._owned.index(False) if own is None else own
        self._owned[preferred] = True
        return preferred
