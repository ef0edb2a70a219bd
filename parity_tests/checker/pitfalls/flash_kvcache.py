"""Broken decode kernels with flash-attn's ``flash_attn_with_kvcache`` signature, one mistake
each, where decode kernels go wrong in the wild (flash-attn #772, #2709): ``_decode`` is the
checker's plain decode (``golden.decode_baseline``) with one step broken, computing half
precision in float32 and returning lse in float32 as the real kernels do, so that only the
mistake is wrong (FlashMLA's pitfalls, ``pitfalls.flash_mla``, share it). ``PITFALLS`` names,
for each, a case of the spec's default battery (found by what it holds) and a tensor that flags
it in every dtype.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/pitfalls/test_init.py
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..battery.decode.case import DecodeCase
from ..golden.decode_baseline import (
    attend,
    flash_window,
    pages_of,
    read_tokens,
    rotate_tokens,
    write_tokens,
)
from ..specs.flash_kvcache import SPEC
from . import Pitfall

_HALF = (torch.float16, torch.bfloat16)


def _decode(args: dict[str, Any], **mistake: Any) -> Any:
    """flash_attn_with_kvcache's math, correct but for ``mistake`` (one keyword of):
    ``seqlens_after`` (cache_seqlens read as counting the new tokens: they go s_new slots
    early, and that many fewer keys are attended); ``start_shift`` added to where the new tokens
    go (and the length attended);
    ``no_write`` (attend over the cache and the new tokens, write nothing); ``rotary_at_zero``
    (the new keys and queries rotated from position 0); ``swap_rotary`` (interleaved read as
    half-split and back); ``align`` ("top-left"); ``contiguous_pages`` (sequence b's pages read
    as b * pages + 0, 1, ..., ignoring the table); ``ignore_leftpad``; ``lse_map`` (applied to
    lse); ``gqa_modulo`` (query head h reads kv head h % H_kv); ``left_shift`` (added to the
    window's left side); ``write_row_b`` (new tokens written to cache row b, read from row
    cache_batch_idx[b]); ``slot_wrap`` (a token's slot in its page taken modulo that many rows,
    reading and writing); ``id_bits`` (page ids kept in that many bits); ``row_stride`` (the
    table read as rows of the pages the longest sequence needs, not of its own width);
    ``d64`` (at D = 64, the last 16 channels of V dropped)."""
    q, k_cache, v_cache, k, v = (args[n] for n in ("q", "k_cache", "v_cache", "k", "v"))
    dtype = q.dtype
    compute = torch.float32 if dtype in _HALF else dtype
    table, batch_idx = args["block_table"], args["cache_batch_idx"]
    s_q, s_new = q.shape[1], 0 if k is None else k.shape[1]
    window = flash_window(args["window_size"])
    if window is not None and window[0] is not None:
        window = (window[0] + mistake.get("left_shift", 0), window[1])
    capacity = k_cache.shape[1] * (1 if table is None else table.shape[1])
    local = window is not None and any(s is not None and s < capacity for s in window)
    outs, lses = [], []
    for b in range(q.shape[0]):
        pages = pages_of(b, table, batch_idx)
        if mistake.get("contiguous_pages") and table is not None:
            pages = list(range(b * table.shape[1], (b + 1) * table.shape[1]))
        if mistake.get("row_stride") and table is not None:
            pages = _rows_of_needed_width(table, args["cache_seqlens"], s_new, k_cache.shape[1], b)
        if "id_bits" in mistake:
            pages = [page & ((1 << mistake["id_bits"]) - 1) for page in pages]
        wrap = mistake.get("slot_wrap")
        start = int(args["cache_seqlens"][b]) + mistake.get("start_shift", 0)
        start = max(0, start - (s_new if mistake.get("seqlens_after") else 0))
        query, keys_new = q[b].to(compute), None
        if k is not None:
            keys_new = k[b].to(compute)
            if args["rotary_cos"] is not None:
                base = 0 if mistake.get("rotary_at_zero") else start
                steps = torch.arange(s_q, device=q.device)
                q_pos = base + (steps if args["causal"] or local else 0 * steps)
                k_pos = base + torch.arange(s_new, device=q.device)
                pairs = args["rotary_interleaved"] != bool(mistake.get("swap_rotary"))
                cos, sin = args["rotary_cos"].to(compute), args["rotary_sin"].to(compute)
                query = rotate_tokens(query, q_pos, cos, sin, pairs).to(dtype).to(compute)
                keys_new = rotate_tokens(keys_new, k_pos, cos, sin, pairs)
            if not mistake.get("no_write"):
                written = [b] if mistake.get("write_row_b") else pages
                write = _write_wrapped if wrap else write_tokens
                extra = {"wrap": wrap} if wrap else {}
                write(k_cache, written, start, keys_new.to(dtype), **extra)
                write(v_cache, written, start, v[b], **extra)
        total = start + s_new
        if mistake.get("no_write") and k is not None:
            keys = torch.cat([read_tokens(k_cache, pages, 0, start).to(compute), keys_new])
            values = torch.cat([read_tokens(v_cache, pages, 0, start), v[b]]).to(compute)
        elif wrap:
            keys = _read_wrapped(k_cache, pages, total, wrap).to(compute)
            values = _read_wrapped(v_cache, pages, total, wrap).to(compute)
        else:
            keys = read_tokens(k_cache, pages, 0, total).to(compute)
            values = read_tokens(v_cache, pages, 0, total).to(compute)
        if mistake.get("d64") and values.shape[-1] == 64:
            values = torch.cat([values[..., :48], torch.zeros_like(values[..., 48:])], dim=-1)
        if mistake.get("gqa_modulo"):
            group = q.shape[2] // keys.shape[1]
            keys, values = keys.repeat(1, group, 1), values.repeat(1, group, 1)
        leftpad = args["cache_leftpad"]
        lo = 0 if leftpad is None or mistake.get("ignore_leftpad") else int(leftpad[b])
        slopes = args["alibi_slopes"]
        if slopes is not None and slopes.ndim == 2:
            slopes = slopes[b]
        out, lse = attend(
            query, keys, values, lo=lo, causal=args["causal"], window=window,
            softcap=args["softcap"], slopes=slopes, scale=args["softmax_scale"],
            align=mistake.get("align", "bottom-right"),
        )  # fmt: skip
        outs.append(out.to(dtype))
        lses.append(lse.float() if dtype in _HALF else lse)
    out, lse = torch.stack(outs), torch.stack(lses)
    lse = mistake.get("lse_map", lambda x: x)(lse)
    return (out, lse) if args["return_softmax_lse"] else out


def _rows_of_needed_width(table, seqlens, s_new: int, size: int, b: int) -> list[int]:
    """Sequence b's pages read from the table's storage as rows of the pages the longest
    sequence needs (FlashInfer #4270's row stride), not of the table's own width."""
    needed = max(-(-(int(n) + s_new) // size) for n in seqlens)
    flat = [int(page) for page in table.flatten()]
    return flat[b * needed : b * needed + table.shape[1]]


def _read_wrapped(pool: torch.Tensor, pages: list[int], total: int, wrap: int) -> torch.Tensor:
    """Tokens [0, total) of a sequence with each slot taken modulo ``wrap``."""
    size = pool.shape[1]
    return torch.stack([pool[pages[t // size], (t % size) % wrap] for t in range(total)])


def _write_wrapped(pool: torch.Tensor, pages: list[int], start: int, tokens: torch.Tensor,
                   wrap: int) -> None:  # fmt: skip
    """Write ``tokens`` at positions start, start + 1, ... with each slot modulo ``wrap``."""
    size = pool.shape[1]
    for i, token in enumerate(tokens):
        t = start + i
        pool[pages[t // size], (t % size) % wrap] = token


def _flash_kvcache(name: str, doc: str, **mistake: Any) -> Callable[..., Any]:
    """A kernel named ``name`` with flash_attn_with_kvcache's signature making ``mistake``."""

    def kernel(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
               cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
               rotary_interleaved=True, alibi_slopes=None, num_splits=0,
               return_softmax_lse=False):  # fmt: skip
        return _decode(locals(), **mistake)

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc
    return kernel


def _base2(lse: torch.Tensor) -> torch.Tensor:
    return lse / math.log(2.0)


seqlens_after_append = _flash_kvcache(
    "seqlens_after_append",
    "cache_seqlens read as the length after the new tokens (FlashMLA's meaning): they are "
    "written s_new slots early, over cached keys, and that many fewer keys are attended.",
    seqlens_after=True,
)

append_offset_by_one = _flash_kvcache(
    "append_offset_by_one",
    "The new tokens written one slot late: a never-written slot is attended; at capacity the "
    "write runs past the table.",
    start_shift=1,
)

no_append = _flash_kvcache(
    "no_append",
    "Attends over the cache and the new tokens, but never writes them into it.",
    no_write=True,
)

rotary_at_zero = _flash_kvcache(
    "rotary_at_zero",
    "New keys and queries rotated from position 0, not from cache_seqlens.",
    rotary_at_zero=True,
)

rotary_layout_swapped = _flash_kvcache(
    "rotary_layout_swapped",
    "Interleaved (GPT-J) pairs read as half-split (GPT-NeoX), and back.",
    swap_rotary=True,
)

top_left_causal = _flash_kvcache(
    "top_left_causal",
    "Causal (and windows, ALiBi) aligned top-left, query i at key i, not bottom-right.",
    align="top-left",
)

pages_as_contiguous = _flash_kvcache(
    "pages_as_contiguous",
    "The block table ignored: sequence b's pages read and written as b * max_blocks + 0, 1, ...",
    contiguous_pages=True,
)

leftpad_ignored = _flash_kvcache(
    "leftpad_ignored",
    "cache_leftpad ignored: the padding before it is attended.",
    ignore_leftpad=True,
)

lse_base2 = _flash_kvcache(
    "lse_base2",
    "lse in base 2 (FlashInfer's convention) where the natural log is specified.",
    lse_map=_base2,
)

gqa_modulo = _flash_kvcache(
    "gqa_modulo",
    "Query head h reads kv head h % H_kv instead of h // (H / H_kv).",
    gqa_modulo=True,
)

kvcache_window_off_by_one = _flash_kvcache(
    "kvcache_window_off_by_one",
    "The window sees one key fewer on the left (j > p_i - left).",
    left_shift=-1,
)

batch_idx_wrong_row = _flash_kvcache(
    "batch_idx_wrong_row",
    "New tokens written to cache row b instead of cache_batch_idx[b] (flash-attn #772), while "
    "attention reads row cache_batch_idx[b].",
    write_row_b=True,
)
page_over_128_wrapped = _flash_kvcache(
    "page_over_128_wrapped",
    "A token's slot in its page kept in 7 bits (modulo 128): right for pages of up to 128 "
    "tokens, wrong past them (FlashInfer #4347, a P0).",
    slot_wrap=128,
)
page_ids_16_bit = _flash_kvcache(
    "page_ids_16_bit",
    "Page ids kept in 16 bits: right for pools of up to 65,536 pages, another page past them "
    "(ROCm ATOM #702, tokenspeed #522).",
    id_bits=16,
)
table_row_stride = _flash_kvcache(
    "table_row_stride",
    "The block table read with the row stride of the pages the longest sequence needs, not the "
    "table's own width: every sequence but the first reads the wrong pages (FlashInfer #4270).",
    row_stride=True,
)
d64_drops_channels = _flash_kvcache(
    "d64_drops_channels",
    "At head width 64 the last 16 channels of V are dropped: right at every width but the one "
    "nobody tested in that dtype (FlashInfer #4748).",
    d64=True,
)


def _first(battery: tuple[DecodeCase, ...], test: Callable[[DecodeCase], bool]) -> str:
    """The first case of ``battery`` that ``test`` accepts (the battery is generated: cases are
    found by what they hold, not by name)."""
    return next(case.name for case in battery if test(case))


_BATTERY = SPEC.default_battery()
_PLAIN = {"causal", "gqa", "paged", "append"}  # the plain decode step of the battery
_BASE = _first(_BATTERY, lambda c: c.page_size == 16 and c.needs == _PLAIN)
_ROOM = _first(  # no sequence full: a write one slot late stays in the table
    _BATTERY, lambda c: c.needs == _PLAIN and max(c.seqlens) + c.s_new < c.capacity
)
_ROTARY = _first(_BATTERY, lambda c: c.rotary == "interleaved" and c.page_size is not None)
_LEFTPAD = _first(_BATTERY, lambda c: c.leftpad is not None and c.window is None)
_WINDOW = _first(_BATTERY, lambda c: c.window is not None and c.s_new > 0 and not c.softcap)
_BATCH_IDX = _first(_BATTERY, lambda c: c.batch_idx and c.s_new > 0)
_TOP_LEFT = _first(_BATTERY, lambda c: c.page_size == 64 and c.needs == _PLAIN)
_PAST_128 = _first(  # a page past 128 tokens, a sequence past its 128th slot
    _BATTERY,
    lambda c: (
        (c.page_size or 0) > 128
        and c.needs <= _PLAIN
        and any(n % c.page_size > 128 for n in c.seqlens)
    ),
)
_WIDE_IDS = _first(_BATTERY, lambda c: c.pool_pages > 65536)
_D64 = _first(_BATTERY, lambda c: c.d == 64)

PITFALLS: dict[str, Pitfall] = {
    "seqlens_after_append": Pitfall(seqlens_after_append, _BASE, "out", SPEC.name),
    "append_offset_by_one": Pitfall(append_offset_by_one, _ROOM, "k_cache", SPEC.name),
    "no_append": Pitfall(no_append, _BASE, "k_cache", SPEC.name),
    "rotary_at_zero": Pitfall(rotary_at_zero, _ROTARY, "out", SPEC.name),
    "rotary_layout_swapped": Pitfall(rotary_layout_swapped, _ROTARY, "out", SPEC.name),
    "top_left_causal": Pitfall(top_left_causal, _TOP_LEFT, "out", SPEC.name),
    "pages_as_contiguous": Pitfall(pages_as_contiguous, _BASE, "out", SPEC.name),
    "leftpad_ignored": Pitfall(leftpad_ignored, _LEFTPAD, "out", SPEC.name),
    "lse_base2": Pitfall(lse_base2, _BASE, "lse", SPEC.name),
    "gqa_modulo": Pitfall(gqa_modulo, _BASE, "out", SPEC.name),
    "kvcache_window_off_by_one": Pitfall(kvcache_window_off_by_one, _WINDOW, "out", SPEC.name),
    "batch_idx_wrong_row": Pitfall(batch_idx_wrong_row, _BATCH_IDX, "out", SPEC.name),
    "page_over_128_wrapped": Pitfall(page_over_128_wrapped, _PAST_128, "out", SPEC.name),
    "page_ids_16_bit": Pitfall(page_ids_16_bit, _WIDE_IDS, "out", SPEC.name),
    "table_row_stride": Pitfall(table_row_stride, _BASE, "out", SPEC.name),
    "d64_drops_channels": Pitfall(d64_drops_channels, _D64, "out", SPEC.name),
}
