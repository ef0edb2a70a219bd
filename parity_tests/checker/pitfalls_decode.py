"""Broken decode kernels, one mistake each, to prove that the decode specs have teeth: where
decode kernels go wrong in the wild (the issue's list; flash-attn #772, #2709).

Each has the signature of its spec (flash-attn's ``flash_attn_with_kvcache`` or FlashMLA's
``flash_mla_with_kvcache``) and is the checker's plain decode (``checker.decode_reference``)
with one step broken, computing half precision in float32 and returning lse in float32 as the
real kernels do, so that only the mistake is wrong. ``DECODE_PITFALLS`` names, for each, its
spec, a case of its battery and a tensor that flags it in every dtype; the tests assert exactly
that, and ``python -m parity_tests.checker.calibration.decode 60`` measures the margin over
seeds (docs/decoding.md).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/test_pitfalls_decode.py
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .battery.decode_case import KVCACHE, MLA, DecodeCase
from .golden.decode_baseline import (
    attend,
    flash_window,
    pages_of,
    read_tokens,
    rotate_tokens,
    write_tokens,
)
from .pitfalls import Pitfall

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
    cache_batch_idx[b])."""
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
                write_tokens(k_cache, written, start, keys_new.to(dtype))
                write_tokens(v_cache, written, start, v[b])
        total = start + s_new
        if mistake.get("no_write") and k is not None:
            keys = torch.cat([read_tokens(k_cache, pages, 0, start).to(compute), keys_new])
            values = torch.cat([read_tokens(v_cache, pages, 0, start), v[b]]).to(compute)
        else:
            keys = read_tokens(k_cache, pages, 0, total).to(compute)
            values = read_tokens(v_cache, pages, 0, total).to(compute)
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


# -- FlashMLA's signature -------------------------------------------------------------------------


def _mla(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, *,
         v_from_end=False, default_scale=False, seqlens_before=False,
         transpose_lse=False) -> Any:  # fmt: skip
    """FlashMLA's math, correct but for one mistake: V the last head_dim_v coordinates of K;
    the default 576^-0.5 scale in place of the one given; cache_seqlens read as before the
    queries' own tokens (s_q more keys attended); lse returned (B, s_q, H)."""
    values = k_cache[..., -head_dim_v:] if v_from_end else k_cache[..., :head_dim_v]
    scale = (
        1.0 / math.sqrt(q.shape[-1]) if default_scale or softmax_scale is None else softmax_scale
    )
    seqlens = cache_seqlens + q.shape[1] if seqlens_before else cache_seqlens
    args = {
        "q": q, "k_cache": k_cache, "v_cache": values, "k": None, "v": None,
        "rotary_cos": None, "rotary_sin": None, "cache_seqlens": seqlens,
        "cache_batch_idx": None, "cache_leftpad": None, "block_table": block_table,
        "softmax_scale": scale, "causal": causal, "window_size": (-1, -1), "softcap": 0.0,
        "rotary_interleaved": True, "alibi_slopes": None, "return_softmax_lse": True,
    }  # fmt: skip
    out, lse = _decode(args)
    return out, lse.transpose(1, 2) if transpose_lse else lse


def mla_v_wrong_end(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                    num_splits, softmax_scale=None, causal=False):  # fmt: skip
    """V taken from the wrong end of K: its last head_dim_v coordinates (the rope part and most
    of the latent) instead of the first."""
    return _mla(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                v_from_end=True)  # fmt: skip


def mla_default_scale(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                      num_splits, softmax_scale=None, causal=False):  # fmt: skip
    """The default scale of the 576-wide K, 576^-0.5, where the layer's was given (DeepSeek's
    (128 + 64)^-0.5, times YaRN's mscale^2)."""
    return _mla(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                default_scale=True)  # fmt: skip


def mla_seqlens_before(q, k_cache, block_table, cache_seqlens, head_dim_v,
                       tile_scheduler_metadata, num_splits, softmax_scale=None,
                       causal=False):  # fmt: skip
    """cache_seqlens read as the length before the queries' tokens (flash_attn_with_kvcache's
    meaning): s_q slots past the end are attended."""
    return _mla(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                seqlens_before=True)  # fmt: skip


def mla_lse_transposed(q, k_cache, block_table, cache_seqlens, head_dim_v,
                       tile_scheduler_metadata, num_splits, softmax_scale=None,
                       causal=False):  # fmt: skip
    """lse returned (B, s_q, H), the queries' layout, instead of (B, H, s_q)."""
    return _mla(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                transpose_lse=True)  # fmt: skip


# -- where each is flagged ------------------------------------------------------------------------


def _first(battery: tuple[DecodeCase, ...], test: Callable[[DecodeCase], bool]) -> str:
    """The first case of ``battery`` that ``test`` accepts (the battery is generated: cases are
    found by what they hold, not by name)."""
    return next(case.name for case in battery if test(case))


_PLAIN = {"causal", "gqa", "paged", "append"}  # the plain decode step of the battery
_BASE = _first(KVCACHE, lambda c: c.page_size == 16 and c.needs == _PLAIN)
_ROOM = _first(  # no sequence full: a write one slot late stays in the table
    KVCACHE, lambda c: c.needs == _PLAIN and max(c.seqlens) + c.s_new < c.capacity
)
_ROTARY = _first(KVCACHE, lambda c: c.rotary == "interleaved" and c.page_size is not None)
_LEFTPAD = _first(KVCACHE, lambda c: c.leftpad is not None and c.window is None)
_WINDOW = _first(KVCACHE, lambda c: c.window is not None and c.s_new > 0 and not c.softcap)
_BATCH_IDX = _first(KVCACHE, lambda c: c.batch_idx and c.s_new > 0)
_TOP_LEFT = _first(KVCACHE, lambda c: c.page_size == 64 and c.needs == _PLAIN)
_MLA = MLA[0].name
_MLA_CAUSAL = _first(MLA, lambda c: c.causal and c.s_q > 1)

DECODE_PITFALLS: dict[str, Pitfall] = {
    "seqlens_after_append": Pitfall(seqlens_after_append, _BASE, "out", "flash_kvcache"),
    "append_offset_by_one": Pitfall(append_offset_by_one, _ROOM, "k_cache", "flash_kvcache"),
    "no_append": Pitfall(no_append, _BASE, "k_cache", "flash_kvcache"),
    "rotary_at_zero": Pitfall(rotary_at_zero, _ROTARY, "out", "flash_kvcache"),
    "rotary_layout_swapped": Pitfall(rotary_layout_swapped, _ROTARY, "out", "flash_kvcache"),
    "top_left_causal": Pitfall(top_left_causal, _TOP_LEFT, "out", "flash_kvcache"),
    "pages_as_contiguous": Pitfall(pages_as_contiguous, _BASE, "out", "flash_kvcache"),
    "leftpad_ignored": Pitfall(leftpad_ignored, _LEFTPAD, "out", "flash_kvcache"),
    "lse_base2": Pitfall(lse_base2, _BASE, "lse", "flash_kvcache"),
    "gqa_modulo": Pitfall(gqa_modulo, _BASE, "out", "flash_kvcache"),
    "kvcache_window_off_by_one": Pitfall(
        kvcache_window_off_by_one, _WINDOW, "out", "flash_kvcache"
    ),
    "batch_idx_wrong_row": Pitfall(batch_idx_wrong_row, _BATCH_IDX, "out", "flash_kvcache"),
    "mla_v_wrong_end": Pitfall(mla_v_wrong_end, _MLA, "out", "flash_mla"),
    "mla_default_scale": Pitfall(mla_default_scale, _MLA, "out", "flash_mla"),
    "mla_seqlens_before": Pitfall(mla_seqlens_before, _MLA_CAUSAL, "out", "flash_mla"),
    "mla_lse_transposed": Pitfall(mla_lse_transposed, _MLA, "-", "flash_mla"),
}
