"""The decode specs' same-dtype baseline Bl: flash-attn's ``flash_attn_with_kvcache`` (and
FlashMLA's ``flash_mla_with_kvcache``) computed plainly in torch, in the inputs' dtype, with no
upcasting: each sequence's pages gathered in table order, the new keys rotated and written in place,
then ``reference.plain_attention_lse`` aligned bottom-right, with the keys before ``cache_leftpad``
hidden by a bool mask. The decode pitfalls (``checker.pitfalls.flash_kvcache``) are built from the
same pieces, each with one step broken. docs/decoding.md states the semantics.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size, L_b the keys of sequence b.

Tests: tests/checker/golden/test_decode_baseline.py
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .attention_baseline import plain_attention_lse


def pages_of(b: int, block_table: Any, cache_batch_idx: Any) -> list[int]:
    """The pages of sequence b in order: its row of the block table, or its one cache row."""
    if block_table is not None:
        return [int(page) for page in block_table[b]]
    return [b if cache_batch_idx is None else int(cache_batch_idx[b])]


def read_tokens(pool: torch.Tensor, pages: list[int], lo: int, hi: int) -> torch.Tensor:
    """Tokens [lo, hi) of a sequence, (hi - lo, H_kv, W): its pages of the pool
    (num_pages, P, H_kv, W) concatenated in table order, then sliced."""
    tokens = torch.cat([pool[page] for page in pages])  # (pages * P, H_kv, W)
    return tokens[lo:hi]


def write_tokens(pool: torch.Tensor, pages: list[int], start: int, tokens: torch.Tensor) -> None:
    """Write ``tokens`` (s, H_kv, W) at positions start, start + 1, ... of a sequence, in place:
    position t is page pages[t // P], slot t % P."""
    size = pool.shape[1]
    for i, token in enumerate(tokens):
        t = start + i
        pool[pages[t // size], t % size] = token


def rotate_tokens(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:  # fmt: skip
    """flash-attn's rotary on the first rotary_dim coordinates of x (s, heads, D), at
    ``positions`` (s,), in x's dtype: pairs (x_2i, x_2i+1) when interleaved, else (x_i,
    x_i+rotary_dim/2)."""
    cos, sin = (t[positions][:, None, :].to(x.dtype) for t in (cos, sin))  # (s, 1, rot / 2)
    width = 2 * cos.shape[-1]
    part = x[..., :width]
    if interleaved:
        a, b = part[..., 0::2], part[..., 1::2]
        turned = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = part[..., : width // 2], part[..., width // 2 :]
        turned = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return torch.cat((turned, x[..., width:]), dim=-1)


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    lo: int,
    causal: bool,
    window: tuple[int | None, int | None] | None,
    softcap: float,
    slopes: torch.Tensor | None,
    scale: float | None,
    align: str = "bottom-right",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's attention: query (s_q, H, D) over keys, values (L, H_kv, W), keys before
    ``lo`` hidden; ``plain_attention_lse`` in the inputs' dtype. Returns out (s_q, H, Dv) and
    lse (H, s_q)."""
    q, k, v = (t.transpose(0, 1)[None] for t in (query, keys, values))  # -> (1, heads, L, W)
    allowed = None
    if lo:
        allowed = (torch.arange(keys.shape[0], device=keys.device) >= lo).expand(
            1, 1, query.shape[0], -1
        )  # (1, 1, s_q, L), True = may attend
    out, lse = plain_attention_lse(
        q, k, v, allowed, 0.0, causal, scale, q.shape[1] != k.shape[1], align=align,
        window=window, softcap=softcap, alibi_slopes=slopes,
    )  # fmt: skip
    return out[0].transpose(0, 1), lse[0]


def flash_window(window_size: tuple[int, int]) -> tuple[int | None, int | None] | None:
    """flash-attn's ``window_size`` (-1 unbounded) as the pipeline's (None unbounded)."""
    left, right = window_size
    if left < 0 and right < 0:
        return None
    return (None if left < 0 else left, None if right < 0 else right)


def plain_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                  cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                  softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                  rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                  return_softmax_lse=False):  # fmt: skip
    """``flash_attn_with_kvcache``'s signature and meaning, computed plainly in the inputs' dtype;
    the caches are written in place. Returns out (B, s_q, H, Dv), and (out, lse (B, H, s_q))
    with ``return_softmax_lse``."""
    batch, s_q = q.shape[:2]
    s_new = 0 if k is None else k.shape[1]
    capacity = k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])
    window = flash_window(window_size)
    local = window is not None and any(s is not None and s < capacity for s in window)
    outs, lses = [], []
    for b in range(batch):
        pages = pages_of(b, block_table, cache_batch_idx)
        start = int(cache_seqlens[b])
        query = q[b]
        if k is not None:
            new_k = k[b]
            if rotary_cos is not None:
                steps = torch.arange(s_q, device=q.device)
                q_pos = start + (steps if causal or local else 0 * steps)
                query = rotate_tokens(query, q_pos, rotary_cos, rotary_sin, rotary_interleaved)
                k_pos = start + torch.arange(s_new, device=q.device)
                new_k = rotate_tokens(new_k, k_pos, rotary_cos, rotary_sin, rotary_interleaved)
            write_tokens(k_cache, pages, start, new_k)
            write_tokens(v_cache, pages, start, v[b])
        total = start + s_new
        keys, values = (read_tokens(c, pages, 0, total) for c in (k_cache, v_cache))
        slopes = alibi_slopes
        if slopes is not None and slopes.ndim == 2:
            slopes = slopes[b]
        lo = 0 if cache_leftpad is None else int(cache_leftpad[b])
        out, lse = attend(
            query, keys, values, lo=lo, causal=causal, window=window, softcap=softcap,
            slopes=slopes, scale=softmax_scale,
        )  # fmt: skip
        outs.append(out)
        lses.append(lse)
    out, lse = torch.stack(outs), torch.stack(lses)
    return (out, lse) if return_softmax_lse else out


def plain_mla(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
              num_splits, softmax_scale=None, causal=False):  # fmt: skip
    """FlashMLA's ``flash_mla_with_kvcache`` computed plainly in the inputs' dtype: one latent
    head in pages, V the first ``head_dim_v`` coordinates of K, ``cache_seqlens`` counting the
    queries' own tokens (already in the cache). Returns (out (B, s_q, H, head_dim_v), lse
    (B, H, s_q)); the default scale is 1 / sqrt(D) of the whole 576-wide K."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    return plain_kvcache(
        q, k_cache, k_cache[..., :head_dim_v], cache_seqlens=cache_seqlens,
        block_table=block_table, softmax_scale=scale, causal=causal, return_softmax_lse=True,
    )  # fmt: skip
