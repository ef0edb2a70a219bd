"""Broken kernels for today's options (GQA, alignment, windows, softcap, ALiBi, lse, varlen),
one mistake each, to prove that the checker has teeth there too.

Each has the signature of the spec it breaks (``Pitfall.spec`` in ``checker.pitfalls``) and is
the checker's own plain baseline (``reference``) with one step broken; the flash-signature ones
compute half precision in float32, return lse in float32 and draw dropout from torch's
generator, as a correct kernel may, so that only their mistake is wrong (``_flash``, which the
pitfalls of ``checker.pitfalls_kernels`` share). ``checker.pitfalls.PITFALLS`` names the case
and tensor that flag each.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T packed token count.

Tests: tests/checker/test_pitfalls_today.py
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .golden.baseline import attention_scores, masked_softmax, plain_attention

_HALF = (torch.float16, torch.bfloat16)


# -- GQA (SDPA's signature with enable_gqa) -------------------------------------------------------


def gqa_head_modulo(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):  # fmt: skip
    """Query head h reads kv head h % H_kv (``repeat``) instead of h // (H / H_kv)
    (``repeat_interleave``): right only when H_kv = 1 or H_kv = H."""
    if enable_gqa:
        group = query.shape[-3] // key.shape[-3]
        key, value = key.repeat(1, group, 1, 1), value.repeat(1, group, 1, 1)
    return plain_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)


def gqa_no_group_sum(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, enable_gqa=False):  # fmt: skip
    """A right forward whose dK and dV take only the first query head of each group instead of
    the sum over the group (the others read a detached copy)."""
    if enable_gqa:
        group = query.shape[-3] // key.shape[-3]
        key, value = (_first_of_group_only(t, group) for t in (key, value))
    return plain_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)


def _first_of_group_only(t: torch.Tensor, group: int) -> torch.Tensor:
    """(B, H_kv, M, W) -> (B, H, M, W), gradient flowing from the first head of a group only."""
    copies = [t if i == 0 else t.detach() for i in range(group)]
    return torch.stack(copies, dim=2).flatten(1, 2)  # (B, H_kv, g, M, W) -> (B, H, M, W)


# -- flash-attn's signature --------------------------------------------------------------------


def _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
           *, align="bottom-right", left_shift=0, slope_sign=1.0, soft=None, lse_map=None,
           dropout_p=0.0, edit=None):  # fmt: skip
    """Correct flash-attn math on (B, N, H, D), inverted dropout from torch's generator, with
    one optional mistake: ``align`` where causal/windows/ALiBi sit, ``left_shift`` added to the
    window's left side, ``slope_sign`` on the slopes, ``soft`` replacing the softcap,
    ``lse_map`` applied to lse, ``edit(scores, v) -> (scores, v)`` changing the scores
    (B, H, N, M) and the values (B, H, M, Dv) before the softmax."""
    dtype = q.dtype
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, L, H, W) -> (B, H, L, W)
    if dtype in _HALF:
        q, k, v = q.float(), k.float(), v.float()
    left, right = window_size
    window = None
    if left >= 0 or right >= 0:
        window = (None if left < 0 else left + left_shift, None if right < 0 else right)
    slopes = None if alibi_slopes is None else slope_sign * alibi_slopes
    options: dict[str, Any] = {"align": align, "window": window, "alibi_slopes": slopes}
    if soft is None:
        options["softcap"] = softcap
    scores = attention_scores(q, k, None, causal, softmax_scale,
                              enable_gqa=q.shape[1] != k.shape[1], **options)  # fmt: skip
    if soft is not None and softcap:
        scores = soft(scores, softcap)
    if q.shape[1] != k.shape[1]:
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if edit is not None:
        scores, v = edit(scores, v)
    probs = masked_softmax(scores)
    if dropout_p:
        keep = torch.rand(probs.shape, device=probs.device) >= dropout_p
        probs = probs * keep / (1 - dropout_p)
    out = (probs @ v).to(dtype).transpose(1, 2)  # (B, H, N, Dv) -> (B, N, H, Dv)
    if not return_attn_probs:
        return out
    lse_of = (lambda s, _: torch.logsumexp(s, dim=-1)) if lse_map is None else lse_map
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    return out, lse_of(scores.detach(), scale), None  # lse (B, H, N), float32


def flash_top_left(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                   softcap=0.0, alibi_slopes=None, deterministic=False,
                   return_attn_probs=False):  # fmt: skip
    """flash-attn's signature with SDPA's top-left causal alignment where bottom-right is
    specified: right whenever N == M."""
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, align="top-left", dropout_p=dropout_p)  # fmt: skip


def window_off_by_one(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                      window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                      return_attn_probs=False):  # fmt: skip
    """A window that sees one key fewer on the left (``j > p_i - left`` for ``>=``)."""
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, left_shift=-1, dropout_p=dropout_p)  # fmt: skip


def alibi_sign(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
               softcap=0.0, alibi_slopes=None, deterministic=False,
               return_attn_probs=False):  # fmt: skip
    """ALiBi added with the wrong sign: far keys are favoured instead of penalised."""
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, slope_sign=-1.0, dropout_p=dropout_p)  # fmt: skip


class _CapWithoutChainRule(torch.autograd.Function):
    """softcap * tanh(S / softcap) forward, and a backward that passes dS through unchanged,
    missing the factor 1 - tanh^2(S / softcap)."""

    @staticmethod
    def forward(ctx: Any, scores, softcap):
        return softcap * torch.tanh(scores / softcap)

    @staticmethod
    def backward(ctx: Any, dcapped):
        return dcapped, None


def softcap_no_tanh_grad(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                         window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                         deterministic=False, return_attn_probs=False):  # fmt: skip
    """Softcap whose backward lacks the 1 - tanh^2 factor: a right forward, wrong dq and dk."""
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, soft=_CapWithoutChainRule.apply,
                  dropout_p=dropout_p)  # fmt: skip


def softcap_last(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                 softcap=0.0, alibi_slopes=None, deterministic=False,
                 return_attn_probs=False):  # fmt: skip
    """The cap applied last, after ALiBi and the masks, instead of right after the scale: hidden
    scores (-inf) become -softcap, so hidden keys get weight, and ALiBi's bias is capped too.
    Right with no mask, no window and no ALiBi."""
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, soft=_cap, dropout_p=dropout_p)  # fmt: skip


def _cap(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    return softcap * torch.tanh(scores / softcap)


def lse_log2(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
             softcap=0.0, alibi_slopes=None, deterministic=False,
             return_attn_probs=False):  # fmt: skip
    """lse in base 2 (log2-sum-exp2, as kernels that use exp2 keep it internally) returned where
    the natural log is specified."""
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, lse_map=_log2, dropout_p=dropout_p)  # fmt: skip


def _log2(scores: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.logsumexp(scores, dim=-1) / math.log(2.0)


def _unscaled(scores: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.logsumexp(scores / scale, dim=-1)  # of the scores before the scale


def lse_without_scale(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                      window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                      return_attn_probs=False):  # fmt: skip
    """lse of the scores before the softmax scale (q k^T, not q k^T * scale)."""
    return _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs, lse_map=_unscaled, dropout_p=dropout_p)  # fmt: skip


# -- flash-attn's varlen signature -------------------------------------------------------------


def varlen_leak(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                alibi_slopes=None, deterministic=False, return_attn_probs=False):  # fmt: skip
    """Every sequence but the first also sees the last key of the sequence before it (an offset
    read as ``cu_seqlens_k[s] - 1``): one key leaks across each boundary."""
    outs, lses = [], []
    bounds = list(zip(cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), strict=True))
    for s, ((q0, k0), (q1, k1)) in enumerate(zip(bounds, bounds[1:], strict=False)):
        k0 = max(k0 - 1, 0) if s else k0
        slopes = alibi_slopes
        if alibi_slopes is not None and alibi_slopes.ndim == 2:
            slopes = alibi_slopes[s : s + 1]
        parts = (t[None] for t in (q[q0:q1], k[k0:k1], v[k0:k1]))  # (L, H, W) -> (1, L, H, W)
        out, lse, _ = _flash(
            *parts, softmax_scale, causal, window_size, softcap, slopes, True, dropout_p=dropout_p
        )
        outs.append(out[0])
        lses.append(lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, dim=1)
    return (out, lse, None) if return_attn_probs else out


# -- ring_attention's signature ------------------------------------------------------------------


def ring_wrong_block_offset(q, k, v, **options):
    """Ring attention that believes each key/value block comes from one rank further back than
    it does (a wrong block offset): every block is placed at the wrong positions."""
    from unittest import mock

    from torch_attention import distributed

    def origin(rank: int, step: int, world: int) -> int:
        return (rank - step + 1) % world

    with mock.patch.object(distributed, "_kv_origin", origin):
        return distributed.ring_attention(q, k, v, **options)
