"""The serving APIs' argument checks, in pure Python: prefill over pages (``prefill.py``),
FlashInfer's CSR page tables and vLLM's metadata (``serving.py``), written once for both twins,
as ``arguments.py`` is for the decode call.

Each twin reads its arrays or tensors into shapes and ``arguments.Integers`` (dtype name, shape,
values) and checks what only it can (floating, one dtype, one device); every other refusal is made
here, in one order, with one message, before anything is written:

- ``plan_prefill``: the packed queries' ``qo_indptr``, the block table, ``kv_lens`` (a sequence
  with more queries than keys, a length past its table, a page outside the pool) and the score
  options; it leaves ``PrefillPlan``, each sequence's rows, pages and first visible key;
- ``check_prefix``: a cascade's shared prefix (whole pages, the same in every row of the table,
  before every query, no window);
- ``csr_pages``: FlashInfer's ``paged_kv_indptr`` / ``paged_kv_indices`` /
  ``paged_kv_last_page_len`` (int32 only: FlashInfer reads int64 metadata as int32 and returns
  zeros without an error, FlashInfer #725); ``paged_kv_cache_shapes``: its NHD / HND layouts;
- ``plan_vllm``: vLLM's ``query_start_loc``, ``seq_lens``, ``block_table`` and ``slot_mapping``,
  with block 0 as the null block.

Shape legend: T packed query tokens, B sequences, n_b the queries of sequence b, H query heads,
H_kv key/value heads, D head width, Dv value head width, P page size.

Derivation: docs/decoding.md ("Prefill over pages and the serving APIs").
Tests: tests/numpy_attention/decode/test_prefill.py and test_serving.py (their refusals), and the
torch twins' tests/torch_attention/decode/test_prefill.py and test_serving.py.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

from .arguments import Integers

__all__ = [
    "PrefillPlan",
    "VllmPlan",
    "check_int32",
    "check_kv_layout",
    "check_prefix",
    "csr_pages",
    "paged_kv_cache_shapes",
    "plan_prefill",
    "plan_vllm",
]

Shape = tuple[int, ...]


class PrefillPlan(NamedTuple):
    """One prefill call's arguments, checked."""

    starts: list[int]  # (B + 1,): sequence b's queries are rows starts[b]:starts[b + 1]
    pages: list[list[int]]  # the ceil(kv_lens[b] / P) pages each sequence reads, in order
    kv_lens: list[int]  # (B,): each sequence's keys, its own queries' tokens included
    lo: list[int]  # (B,): the first key any query of the sequence can see (the window's)
    options: dict[str, Any]  # the score options of attention_forward / functional.attention


class VllmPlan(NamedTuple):
    """One vLLM call's metadata, checked."""

    prefill: PrefillPlan  # over the first ``tokens`` rows of the query
    tokens: int  # query_start_loc[-1]: the rows past it are padding
    slots: list[int]  # (T,): slot_mapping, -1 for a token not written
    prefix_len: int  # common_prefix_len


def plan_prefill(
    *,
    q: Shape,
    k_pages: Shape,
    v_pages: Shape,
    qo_indptr: Integers,
    block_table: Integers,
    kv_lens: Integers,
    softmax_scale: Any,
    causal: bool,
    window_left: Any,
    softcap: Any,
    sinks: Shape | None,
    names: tuple[str, str] = ("qo_indptr", "kv_lens"),
) -> PrefillPlan:
    """Every argument of a prefill over pages checked; what it resolves to.

    Args:
        q, k_pages, v_pages: the shapes (T, H, D), (num_pages, P, H_kv, D), (num_pages, P, H_kv,
            Dv), already checked floating and of one dtype by the twin.
        qo_indptr: (B + 1,) integers, 0 = qo_indptr[0] <= ... <= qo_indptr[B] = T.
        block_table: (B, max_pages) integers; only the first ceil(kv_lens[b] / P) of row b are
            read, and checked.
        kv_lens: (B,) integers, n_b <= kv_lens[b] <= max_pages * P.
        softmax_scale, window_left, softcap: as given; causal: a bool checked by the twin.
        sinks: the shape of the sinks, or None.
        names: what the caller calls qo_indptr and kv_lens, for the messages (vLLM's
            query_start_loc and seq_lens).

    Raises:
        TypeError, ValueError: naming the argument, the shapes or the sequence.
    """
    for name, shape, axes in (("q", q, 3), ("k_pages", k_pages, 4), ("v_pages", v_pages, 4)):
        if len(shape) != axes:
            raise ValueError(f"{name} must have {axes} axes, got shape {shape}")
    tokens, heads, width = q
    num_pages, size, kv_heads = k_pages[:3]
    if v_pages[:3] != k_pages[:3] or k_pages[-1] != width or width == 0 or size == 0:
        raise ValueError(
            f"k_pages and v_pages must be (num_pages, P, H_kv, W) with P > 0 and k_pages' W the "
            f"head width D > 0 of q: got q {q}, k_pages {k_pages}, v_pages {v_pages}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {q}, k_pages {k_pages})"
        )
    starts = _indptr(names[0], qo_indptr, end=tokens, exact=True)
    batch = len(starts) - 1
    lengths = _values(names[1], kv_lens, (batch,))
    table = _values("block_table", block_table, (batch, None))
    columns = block_table.shape[1]
    pages = []
    for b, length in enumerate(lengths):
        queries = starts[b + 1] - starts[b]
        if length < 0:
            raise ValueError(f"sequence {b}: {names[1]} is negative ({length})")
        if queries > length:
            raise ValueError(
                f"sequence {b}: {queries} queries but {names[1]} {length}: the keys include the "
                f"queries' own tokens, so a sequence has at least as many keys as queries"
            )
        if length > columns * size:
            raise ValueError(
                f"sequence {b}: {names[1]} {length} keys, but its block_table row holds "
                f"{columns * size} ({columns} pages of {size})"
            )
        needed = table[b][: -(-length // size)]
        for i, page in enumerate(needed):
            if not 0 <= page < num_pages:
                raise ValueError(
                    f"sequence {b}: block_table[{b}, {i}] = {page} is not one of the "
                    f"{num_pages} pages"
                )
        pages.append(needed)
    left = _window_left(window_left)
    lo = [0] * batch
    if left is not None:  # keys left of the first query's window are hidden from every query
        lo = [max(0, lengths[b] - (starts[b + 1] - starts[b]) - left) for b in range(batch)]
    scale = 1.0 / math.sqrt(width) if softmax_scale is None else softmax_scale
    cap = _finite_real("softcap", softcap)
    if cap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    if sinks is not None and sinks != (heads,):
        raise ValueError(f"sinks must be (H,) = ({heads},), one logit per query head, got {sinks}")
    options = {
        "causal": causal,
        "window": None if left is None else (left, None),
        "align": "bottom-right",
        "scale": _finite_real("softmax_scale", scale),
        "softcap": cap,
        "enable_gqa": True,
    }
    return PrefillPlan(starts, pages, lengths, lo, options)


def check_prefix(
    plan: PrefillPlan, prefix_len: Any, page_size: int, name: str = "prefix_len"
) -> int:
    """A cascade's shared prefix, checked: whole pages, the same pages at the head of every row
    of the table, before every query of every sequence (prefix_len <= kv_lens[b] - n_b, so
    that no mask touches it; vLLM caps its common prefix the same way, at the fewest computed
    tokens), and no window (its left edge would cut the prefix differently for each query).

    Returns:
        prefix_len as an int.
    """
    if isinstance(prefix_len, bool) or not isinstance(prefix_len, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {prefix_len!r}")
    prefix_len = int(prefix_len)
    if prefix_len < 0 or prefix_len % page_size:
        raise ValueError(
            f"{name} must be a multiple >= 0 of the page size {page_size}, got {prefix_len}"
        )
    if prefix_len and plan.options["window"] is not None:
        raise ValueError(
            f"{name} = {prefix_len} with a window: a window cuts the shared prefix at another "
            f"key for every query; give window_left=-1 or no prefix"
        )
    shared = prefix_len // page_size
    for b, length in enumerate(plan.kv_lens):
        computed = length - (plan.starts[b + 1] - plan.starts[b])
        if prefix_len > computed:
            raise ValueError(
                f"sequence {b}: {name} {prefix_len} reaches past its {computed} keys before its "
                f"first query; the shared prefix must lie before every query"
            )
        if plan.pages[b][:shared] != plan.pages[0][:shared]:
            raise ValueError(
                f"sequence {b}: its first {shared} pages {plan.pages[b][:shared]} are not "
                f"sequence 0's {plan.pages[0][:shared]}: the {name} {prefix_len} keys must be "
                f"the same pages in every row of block_table"
            )
    return prefix_len


def check_int32(name: str, value: Integers) -> None:
    """FlashInfer's metadata are int32: another integer dtype is a ``TypeError`` (FlashInfer
    reads int64 indices as int32 and returns zeros without an error, FlashInfer #725)."""
    if value.dtype not in ("int32", "torch.int32"):
        raise TypeError(
            f"{name} must be int32, as FlashInfer takes it, got dtype {value.dtype} (FlashInfer "
            f"reads int64 metadata as int32 and silently returns zeros, FlashInfer #725)"
        )


def csr_pages(
    paged_kv_indptr: Integers,
    paged_kv_indices: Integers,
    paged_kv_last_page_len: Integers,
    page_size: Any,
    num_pages: Any,
) -> tuple[list[list[int]], list[int]]:
    """FlashInfer's CSR page table checked: each sequence's pages and length.

    Sequence b's pages are paged_kv_indices[indptr[b]:indptr[b + 1]], and its length
    (pages - 1) * P + last_page_len[b] (0 with no pages, where last_page_len must be 0).

    Raises:
        TypeError: an array not int32 (``check_int32``), a page_size or num_pages not an int.
        ValueError: an array not 1-D, indptr not starting at 0, decreasing or past the indices,
            a last_page_len outside [1, P] (0 for a sequence with no pages), a page id outside
            [0, num_pages); naming the array and the sequence.
    """
    size, pool = _int("page_size", page_size, 1), _int("num_pages", num_pages, 0)
    arrays = (
        ("paged_kv_indptr", paged_kv_indptr),
        ("paged_kv_indices", paged_kv_indices),
        ("paged_kv_last_page_len", paged_kv_last_page_len),
    )
    for name, value in arrays:
        if len(value.shape) != 1:
            raise ValueError(f"{name} must be 1-D, got shape {value.shape}")
        check_int32(name, value)
    indices = paged_kv_indices.values
    starts = _indptr("paged_kv_indptr", paged_kv_indptr, end=len(indices), exact=False)
    batch = len(starts) - 1
    last = _values("paged_kv_last_page_len", paged_kv_last_page_len, (batch,))
    pages, lengths = [], []
    for b in range(batch):
        held = indices[starts[b] : starts[b + 1]]
        if not held and last[b] != 0:
            raise ValueError(
                f"sequence {b}: no pages but paged_kv_last_page_len {last[b]} (must be 0)"
            )
        if held and not 1 <= last[b] <= size:
            raise ValueError(
                f"sequence {b}: paged_kv_last_page_len {last[b]} is outside [1, page_size = {size}]"
            )
        for i, page in enumerate(held):
            if not 0 <= page < pool:
                raise ValueError(
                    f"sequence {b}: paged_kv_indices[{starts[b] + i}] = {page} is not one of "
                    f"the {pool} pages"
                )
        pages.append(list(held))
        lengths.append((len(held) - 1) * size + last[b] if held else 0)
    return pages, lengths


def check_kv_layout(kv_layout: Any) -> bool:
    """FlashInfer's ``kv_layout``, "NHD" or "HND": whether it is HND."""
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    return kv_layout == "HND"


def paged_kv_cache_shapes(shapes: list[Shape], kv_layout: Any) -> tuple[bool, bool]:
    """FlashInfer's ``paged_kv_cache`` checked from its shapes (one array, or a (k, v) pair).

    Returns:
        (fused, hnd): whether it is one (num_pages, 2, ...) array, whether its layout is HND
        (num_pages, H_kv, P, D) rather than NHD (num_pages, P, H_kv, D).
    """
    hnd = check_kv_layout(kv_layout)
    if len(shapes) == 1:
        if len(shapes[0]) != 5 or shapes[0][1] != 2:
            raise ValueError(
                f"paged_kv_cache as one array must be (num_pages, 2, P, H_kv, D) (NHD) or "
                f"(num_pages, 2, H_kv, P, D) (HND), got {shapes[0]}"
            )
        return True, hnd
    if len(shapes) != 2 or any(len(shape) != 4 for shape in shapes):
        raise ValueError(
            f"paged_kv_cache must be one 5-D array or a (k, v) pair of 4-D ones "
            f"(num_pages, P, H_kv, D) (NHD) or (num_pages, H_kv, P, D) (HND), got {shapes}"
        )
    return False, hnd


def plan_vllm(
    *,
    query: Shape,
    key: Shape,
    value: Shape,
    kv_cache: Shape,
    query_start_loc: Integers,
    seq_lens: Integers,
    block_table: Integers,
    slot_mapping: Integers,
    softmax_scale: Any,
    causal: bool,
    window_left: Any,
    softcap: Any,
    sinks: Shape | None,
    common_prefix_len: Any,
) -> VllmPlan:
    """vLLM's metadata checked, before anything is written; what the call resolves to.

    query (T, H, D); key, value (T, H_kv, D) this step's tokens; kv_cache (2, num_blocks, P,
    H_kv, D). Rows past query_start_loc[-1] are padding (their slot must be -1, or any free
    slot: they are written as given and attend nothing). Block 0 is the null block: no slot and
    no page a sequence reads may lie in it.

    Raises:
        TypeError, ValueError: naming the argument, the shapes, the sequence or the token.
    """
    if len(kv_cache) != 5 or kv_cache[0] != 2:
        raise ValueError(f"kv_cache must be (2, num_blocks, P, H_kv, D), got {kv_cache}")
    if len(query) != 3:
        raise ValueError(f"query must be (T, H, D), got {query}")
    tokens_shape = (query[0],) + kv_cache[3:]
    if key != tokens_shape or value != tokens_shape:
        raise ValueError(
            f"key and value must be (T, H_kv, D) = {tokens_shape} for query {query} and kv_cache "
            f"{kv_cache}, got key {key} and value {value}"
        )
    end = _indptr("query_start_loc", query_start_loc, end=query[0], exact=False)[-1]
    pages = kv_cache[1:]
    plan = plan_prefill(
        q=(end,) + query[1:],
        k_pages=pages,
        v_pages=pages,
        qo_indptr=query_start_loc,
        block_table=block_table,
        kv_lens=seq_lens,
        softmax_scale=softmax_scale,
        causal=causal,
        window_left=window_left,
        softcap=softcap,
        sinks=sinks,
        names=("query_start_loc", "seq_lens"),
    )
    for b, held in enumerate(plan.pages):
        if 0 in held:
            raise ValueError(
                f"sequence {b}: block_table[{b}, {held.index(0)}] = 0, but block 0 is the null "
                f"block (vLLM never gives it to a sequence)"
            )
    num_blocks, size = kv_cache[1], kv_cache[2]
    slots = _values("slot_mapping", slot_mapping, (query[0],))
    written: dict[int, int] = {}
    for t, slot in enumerate(slots):
        if not -1 <= slot < num_blocks * size:
            raise ValueError(
                f"token {t}: slot_mapping {slot} is outside the pool's {num_blocks} x {size} "
                f"slots (-1 marks a padding token)"
            )
        if 0 <= slot < size:
            raise ValueError(
                f"token {t}: slot_mapping {slot} lies in block 0, but block 0 is the null block"
            )
        if slot >= 0 and slot in written:
            raise ValueError(
                f"tokens {written[slot]} and {t} both write slot {slot}: one would overwrite "
                f"the other"
            )
        written[slot] = t
    prefix = check_prefix(plan, common_prefix_len, size, name="common_prefix_len")
    return VllmPlan(plan, end, slots, prefix)


def _indptr(name: str, value: Integers, *, end: int, exact: bool) -> list[int]:
    """An index pointer (B + 1,): integers from 0, never decreasing, ending at ``end``
    (``exact``) or at most there."""
    starts = _values(name, value, (None,))
    if not starts or starts[0] != 0:
        raise ValueError(f"{name} must start at 0 (B + 1 entries), got {starts[:1]}")
    for b in range(len(starts) - 1):
        if starts[b + 1] < starts[b]:
            raise ValueError(f"sequence {b}: {name} decreases, {starts[b]} then {starts[b + 1]}")
    if starts[-1] > end or (exact and starts[-1] != end):
        bound = f"at {end}" if exact else f"at or before {end}"
        raise ValueError(f"{name} must end {bound}, got {starts[-1]}")
    return starts


def _values(name: str, value: Integers, shape: tuple[int | None, ...]) -> Any:
    """The values of integers of ``shape`` (None: any size); ``TypeError`` for another dtype,
    ``ValueError`` for another shape."""
    if not value.integral:
        raise TypeError(f"{name} must be an integer array, got dtype {value.dtype}")
    if len(value.shape) != len(shape) or any(
        want is not None and got != want for got, want in zip(value.shape, shape, strict=True)
    ):
        wanted = tuple("any" if want is None else want for want in shape)
        raise ValueError(f"{name} must have shape {wanted}, got {value.shape}")
    return value.values


def _int(name: str, value: Any, least: int) -> int:
    """An int (not a bool) >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    return int(value)


def _window_left(value: Any) -> int | None:
    """FlashInfer's ``window_left``: keys j >= p_i - window_left; -1 for none (None)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"window_left must be an int, got {value!r}")
    if value < -1:
        raise ValueError(f"window_left must be >= 0, or -1 for no window, got {value}")
    return None if value == -1 else int(value)


def _finite_real(name: str, value: Any) -> float:
    """A finite real number (not a bool), as float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)
