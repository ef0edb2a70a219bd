"""Broken kernels with flash-attn's signature, one bug each of the kind real tiled kernels have:
wrong strides, block edges, paths taken only for some shapes, the wrong head, dropout ignored.

Each is ``pitfalls.flash._flash`` (correct flash-attn math, half precision computed in float32,
dropout from torch's generator) with one step broken, and most are right on most shapes: that
is what makes them real. The tiled kernels they stand for work in blocks of 64 or 128 keys;
where a bug depends on a block, the block is named. ``PITFALLS`` names the default battery's
case and tensor that flag each.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width.

Tests: tests/checker/pitfalls/test_flash.py
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..battery.attention.quick import pick
from ..golden.attention_baseline import attention_scores
from ..specs.flash import SPEC
from . import Pitfall
from .flash import _flash

BLOCK = 128  # keys per block of the kernels these stand for (64 for the loop bound's)

SPLIT_MIN_KEYS = 1024  # a split-KV path is taken from this many keys ...

SPLIT_MAX_ROWS = 4  # ... for at most this many (batch, head) pairs


def k_with_v_strides(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                     return_attn_probs=False):  # fmt: skip
    """k's pointers built with v's strides (one stride tuple passed for both): right whenever k
    and v are laid out alike, garbage when they are not (k and v from separate buffers with
    different layouts, or a fused KV buffer with Dv != D)."""
    k = _read_with_strides(k, v.stride())
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, dropout_p=dropout_p)  # fmt: skip


def _read_with_strides(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """What a kernel reads for ``t`` walking its memory from its first element with
    ``strides``: offsets past the end of t's storage wrap around (a stand-in for reading
    whatever lies there)."""
    available = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    memory = torch.as_strided(t, (available,), (1,), t.storage_offset())  # from t's first element
    offsets = torch.zeros(t.shape, dtype=torch.long, device=t.device)
    for axis, (size, stride) in enumerate(zip(t.shape, strides, strict=True)):
        shape = [1] * t.ndim
        shape[axis] = size
        offsets = offsets + torch.arange(size, device=t.device).reshape(shape) * stride
    return memory[offsets % available]


def padded_keys_in_softmax(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False):  # fmt: skip
    """Keys padded with zeros to a multiple of the block, and the padding masked only when N is
    not a multiple of it (the flag for the queries' block read for the keys'): non-causal with
    N a multiple of 128 and M not, zero keys (score 0, value 0) enter every row's softmax.
    Causal hides them: they sit past every query's position."""
    n, m = q.shape[1], k.shape[1]
    edit = None
    if not causal and n % BLOCK == 0 and m % BLOCK:
        edit = _pad_keys((-m) % BLOCK)
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, dropout_p=dropout_p, edit=edit)  # fmt: skip


def _pad_keys(pad: int):
    def edit(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        zeros = scores.new_zeros((*scores.shape[:-1], pad))  # the padded keys' scores, q . 0
        values = v.new_zeros((*v.shape[:-2], pad, v.shape[-1]))  # and their values
        return torch.cat([scores, zeros], dim=-1), torch.cat([v, values], dim=-2)

    return edit


def last_key_of_block_dropped(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):  # fmt: skip
    """The key loop ``for start in range(0, M - 1, 64)``, its bound off by one: when M = 64 k + 1
    the last block, holding one key, is never visited, and that key is missing from every row
    (M = 65, 129, 257; right for every other M)."""
    edit = _hide_last_key if k.shape[1] % 64 == 1 else None
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, dropout_p=dropout_p, edit=edit)  # fmt: skip


def _hide_last_key(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
    hidden[-1] = True
    return scores.masked_fill(hidden, -math.inf), v


def always_causal_backward(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False):  # fmt: skip
    """A right forward, and a backward launched as causal on the path taken when N = M is a
    multiple of the block (the even-length path): its non-causal gradients are those of causal
    attention."""
    args = (softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs)
    result = _flash(q, k, v, *args, dropout_p=dropout_p)
    n, m = q.shape[1], k.shape[1]
    if causal or n != m or n % BLOCK:
        return result
    out = result[0] if return_attn_probs else result
    causal_out = _flash(q, k, v, softmax_scale, True, window_size, softcap, alibi_slopes, False,
                        dropout_p=dropout_p)  # fmt: skip
    out = out.detach() + (causal_out - causal_out.detach())  # forward: out; backward: causal's
    return (out, *result[1:]) if return_attn_probs else out


def nan_on_split_kv(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):  # fmt: skip
    """The split-KV path taken for many keys and few (batch, head) pairs: the keys split into
    blocks of 128, each block's running max m_b, sum l_b and acc_b computed alone, then merged.
    A block a row cannot see has m_b = -inf, and exp(S - m_b) = exp(-inf + inf) is NaN: the row
    is NaN where a correct merge skips the block (with causal and N > 1 some block is hidden
    from the first rows)."""
    b, n, h, _ = q.shape
    m = k.shape[1]
    args = (softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs)
    if m < SPLIT_MIN_KEYS or b * h > SPLIT_MAX_ROWS or dropout_p:
        return _flash(q, k, v, *args, dropout_p=dropout_p)
    dtype = q.dtype
    q, k, v = (t.transpose(1, 2).float() for t in (q, k, v))  # (B, L, H, W) -> (B, H, L, W)
    left, right = window_size
    window = None if left < 0 and right < 0 else (None if left < 0 else left,
                                                   None if right < 0 else right)  # fmt: skip
    scores = attention_scores(q, k, None, causal, softmax_scale, align="bottom-right",
                              window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                              enable_gqa=h != k.shape[1])  # fmt: skip
    v = v.repeat_interleave(h // v.shape[1], dim=1)
    blocks = []
    for start in range(0, m, BLOCK):
        s = scores[..., start : start + BLOCK]  # (B, H, N, block)
        top = s.amax(dim=-1, keepdim=True)  # m_b, -inf where the row sees nothing here
        p = torch.exp(s - top)  # NaN there: -inf - (-inf)
        blocks.append((top, p.sum(dim=-1, keepdim=True), p @ v[..., start : start + BLOCK, :]))
    top = torch.stack([t for t, _, _ in blocks]).amax(dim=0)  # the merged max
    total = sum(torch.exp(t - top) * row_sum for t, row_sum, _ in blocks)
    acc = sum(torch.exp(t - top) * a for t, _, a in blocks)
    out = (acc / total).to(dtype).transpose(1, 2)  # (B, H, N, Dv) -> (B, N, H, Dv)
    if not return_attn_probs:
        return out
    return out, (top + torch.log(total))[..., 0].detach(), None  # lse (B, H, N)


def alibi_by_kv_head(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                     return_attn_probs=False):  # fmt: skip
    """Under GQA, query head h's ALiBi slope read at its kv head's index h // (H / H_kv), the
    index the kernel already has for k and v: right when H_kv = H."""
    heads, heads_kv = q.shape[2], k.shape[2]
    if alibi_slopes is not None and heads != heads_kv:
        kv_head = torch.arange(heads, device=q.device) // (heads // heads_kv)
        alibi_slopes = alibi_slopes[..., kv_head]
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, dropout_p=dropout_p)  # fmt: skip


def ignores_dropout(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):  # fmt: skip
    """``dropout_p`` accepted and ignored: its output at p = 0.3 is its output at p = 0."""
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs)  # fmt: skip


SATURATION = 8.0  # backward_wrong_on_outliers: k saturates at this many times its RMS

ROW_TILE = 64  # query rows per tile of epilogue_rows_permuted's kernel


def backward_wrong_on_outliers(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                               window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                               deterministic=False, return_attn_probs=False):  # fmt: skip
    """A right forward, and a backward that recomputes the scores from k cast to a narrow format
    whose range was sized on Gaussian activations: entries past ``SATURATION`` times k's RMS
    saturate. Gaussian inputs never reach it (their largest entry is about 5 RMS); real
    activations do, through their outlier channels and sink keys (TransformerEngine #3216: a
    backward wrong on real activations and right on Gaussian ones)."""
    args = (softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs)
    result = _flash(q, k, v, *args, dropout_p=dropout_p)
    limit = SATURATION * k.detach().float().pow(2).mean().sqrt().item()
    saturated = k.clamp(-limit, limit)
    if torch.equal(saturated, k):
        return result
    out = result[0] if return_attn_probs else result
    recomputed = _flash(q, saturated, v, softmax_scale, causal, window_size, softcap,
                        alibi_slopes, False, dropout_p=dropout_p)  # fmt: skip
    out = out.detach() + (recomputed - recomputed.detach())  # forward: out; backward: recomputed
    return (out, *result[1:]) if return_attn_probs else out


def epilogue_rows_permuted(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False):  # fmt: skip
    """Every query tile after the first written back with its rows swapped in pairs (row 2 i
    to 2 i + 1 and back), an epilogue's wrong thread-to-row map: each row holds a neighbour's
    answer, and the output's norm is unchanged to the last bit, so a test that compares norms
    passes (flash-attention #2553: norms matched, values off by 0.5-3.9). Right while N <=
    ``ROW_TILE``."""
    result = _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    return_attn_probs, dropout_p=dropout_p)  # fmt: skip
    out = result[0] if return_attn_probs else result
    n = out.shape[1]
    if n <= ROW_TILE:
        return result
    rows = torch.arange(n, device=out.device)
    tail = rows[ROW_TILE:]
    swapped = tail ^ 1  # pairs (2 i, 2 i + 1) swapped; past the end, a row keeps its place
    rows[ROW_TILE:] = torch.where(swapped < n, swapped, tail)
    out = out[:, rows]  # (B, N, H, Dv), rows of the later tiles swapped in pairs
    return (out, *result[1:]) if return_attn_probs else out


def _flagged(kernel: Any, teeth: str, tensor: str) -> Pitfall:
    return Pitfall(kernel, pick(SPEC, teeth), tensor, "flash")


PITFALLS: dict[str, Pitfall] = {
    "k_with_v_strides": _flagged(k_with_v_strides, "kv strides", "out"),
    "padded_keys_in_softmax": _flagged(padded_keys_in_softmax, "padded keys", "out"),
    "last_key_of_block_dropped": _flagged(last_key_of_block_dropped, "last key of a block", "dv"),
    "always_causal_backward": _flagged(always_causal_backward, "even square", "dq"),
    "nan_on_split_kv": _flagged(nan_on_split_kv, "split causal", "out"),
    "alibi_by_kv_head": _flagged(alibi_by_kv_head, "alibi under gqa", "out"),
    "ignores_dropout": _flagged(ignores_dropout, "dropout", "keep"),
    "backward_wrong_on_outliers": _flagged(backward_wrong_on_outliers, "outliers", "dq"),
    "epilogue_rows_permuted": _flagged(epilogue_rows_permuted, "two row tiles", "out"),
}
