"""Broken decode kernels with FlashMLA's ``flash_mla_with_kvcache`` signature, one mistake each:
``_mla`` is FlashMLA's math (``pitfalls.flash_kvcache._decode``, correct) but for the mistake.

Shape legend: B sequences, s_q queries per sequence, H query heads.

Tests: tests/checker/pitfalls/test_init.py
"""

from __future__ import annotations

import math
from typing import Any

from ..specs.flash_mla import SPEC, TILE
from . import Pitfall
from .flash_kvcache import _decode, _first


def _mla(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, *,
         v_from_end=False, default_scale=False, seqlens_before=False,
         transpose_lse=False, one_tile=False) -> Any:  # fmt: skip
    """FlashMLA's math, correct but for one mistake: V the last head_dim_v coordinates of K;
    the default 576^-0.5 scale in place of the one given; cache_seqlens read as before the
    queries' own tokens (s_q more keys attended); lse returned (B, s_q, H); only the first
    64-row tile of the s_q * H query rows written (the rest left zero)."""
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
    if one_tile:  # the s_q * H query rows folded in 64-row tiles: only the first one written
        b, s_q, h, dv = out.shape
        rows = out.reshape(b, s_q * h, dv).clone()
        rows[:, TILE:] = 0
        out = rows.reshape(b, s_q, h, dv)
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


def mla_second_tile_unwritten(q, k_cache, block_table, cache_seqlens, head_dim_v,
                              tile_scheduler_metadata, num_splits, softmax_scale=None,
                              causal=False):  # fmt: skip
    """The s_q * H query rows folded into 64-row tiles, and only the first tile written: right
    for the 4 or 16 heads of a test, wrong for a DeepSeek shard of 64 or 128."""
    return _mla(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                one_tile=True)  # fmt: skip


_BATTERY = SPEC.default_battery()
_MLA = _first(_BATTERY, lambda c: c.s_q == 1 and not c.causal)
_MLA_CAUSAL = _first(_BATTERY, lambda c: c.causal and c.s_q > 1)
_TWO_TILES = _first(_BATTERY, lambda c: c.s_q * c.heads > TILE)

PITFALLS: dict[str, Pitfall] = {
    "mla_v_wrong_end": Pitfall(mla_v_wrong_end, _MLA, "out", SPEC.name),
    "mla_default_scale": Pitfall(mla_default_scale, _MLA, "out", SPEC.name),
    "mla_seqlens_before": Pitfall(mla_seqlens_before, _MLA_CAUSAL, "out", SPEC.name),
    "mla_lse_transposed": Pitfall(mla_lse_transposed, _MLA, "-", SPEC.name),
    "mla_second_tile_unwritten": Pitfall(mla_second_tile_unwritten, _TWO_TILES, "out", SPEC.name),
}
