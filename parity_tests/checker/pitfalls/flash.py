"""Broken kernels with flash-attn's ``flash_attn_func`` signature for today's options (alignment,
windows, softcap, ALiBi, lse), one mistake each, and the table of every "flash" pitfall (those of
real tiled kernels are in ``pitfalls.tiled``, with a table of their own). Each is ``_flash``,
flash-attn's math computed plainly (half precision in float32, lse in float32, dropout from torch's
generator, as a correct kernel may), with one step broken.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width.

Tests: tests/checker/pitfalls/test_flash.py
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..battery.attention.quick import pick
from ..golden.attention_baseline import attention_scores, masked_softmax
from ..specs.flash import SPEC
from . import Pitfall

_HALF = (torch.float16, torch.bfloat16)


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


def _on(teeth: str) -> str:
    """The case of the quick battery (and default) for ``quick.TEETH[teeth]``."""
    return pick(SPEC, teeth)


def _flagged(kernel: Any, teeth: str, tensor: str) -> Pitfall:
    return Pitfall(kernel, _on(teeth), tensor, "flash")


PITFALLS: dict[str, Pitfall] = {
    "flash_top_left": _flagged(flash_top_left, "causal n<m", "out"),
    "window_off_by_one": _flagged(window_off_by_one, "window", "out"),
    "alibi_sign": _flagged(alibi_sign, "alibi", "out"),
    "softcap_no_tanh_grad": _flagged(softcap_no_tanh_grad, "softcap", "dq"),
    "softcap_last": _flagged(softcap_last, "softcap with alibi", "out"),
    "lse_log2": _flagged(lse_log2, "any", "lse"),
    "lse_without_scale": _flagged(lse_without_scale, "any", "lse"),
}
