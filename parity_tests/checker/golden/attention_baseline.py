"""The checker's same-dtype baseline Bl: textbook attention in torch, in the inputs' dtype, with
no upcasting and autograd's backward, with every option of today's attention family.

The bound of every judged tensor is relative to how far this baseline lands from the float64
golden (``checker.pipeline``), so the baseline must be plain: no fused kernel, no float32
accumulation of half-precision inputs. The pitfalls (``checker.pitfalls``) are built from the same
pieces, each with one step broken.

The score pipeline, in the order of docs/design.md ("Today's attention family"): S = Q K^T * scale
(query head h reads key head h // (H / H_kv)); S = softcap * tanh(S / softcap); S -= slope_h *
|p_i - j|; S += float mask; S = -inf where hidden (causal j > p_i, outside the window p_i - left
<= j <= p_i + right, a False in a bool mask); P = softmax(S), 0 on a row with nothing to see;
O = P V. p_i = i + offset is query i's position on the key axis: offset 0 top-left, M - N
bottom-right.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T_q, T_k packed token counts.

Tests: tests/checker/golden/test_attention_baseline.py
"""

from __future__ import annotations

import math
from typing import Any

import torch


def positions(n: int, m: int, align: str, device: torch.device) -> torch.Tensor:
    """p_i, query i's position on the key axis, (N, 1) int64."""
    offset = m - n if align == "bottom-right" else 0
    return (torch.arange(n, device=device) + offset)[:, None]


def visible(
    n: int,
    m: int,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    align: str = "top-left",
    device: torch.device | None = None,
) -> torch.Tensor | None:
    """Bool (N, M), True where query i may see key j by the causal and window rules; None when
    neither applies."""
    if not causal and window is None:
        return None
    device = torch.device("cpu") if device is None else device
    p = positions(n, m, align, device)  # (N, 1)
    j = torch.arange(m, device=device)[None, :]  # (1, M)
    allowed = torch.ones(n, m, dtype=torch.bool, device=device)
    if causal:
        allowed &= j <= p
    left, right = window if window is not None else (None, None)
    if left is not None:
        allowed &= j >= p - left
    if right is not None:
        allowed &= j <= p + right
    return allowed


def expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H_kv, M, W) -> (B, H, M, W): query head h reads kv head h // (H / H_kv)."""
    return t.repeat_interleave(heads // t.shape[-3], dim=-3)


def attention_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    align: str = "top-left",
    window: tuple[int | None, int | None] | None = None,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    enable_gqa: bool = False,
    mask_in_float32: bool = False,
) -> torch.Tensor:
    """The score pipeline up to the softmax, in the inputs' dtype; with ``mask_in_float32`` a
    float mask is added to the scores in float32 (at least), and the scores stay there: how every
    half-precision kernel adds a mask that shifts whole rows far below zero, which the inputs'
    dtype cannot add to a score without losing it (float16's spacing at 65,504 is 32).

    Args:
        query: (B, H, N, D); key: (B, H_kv, M, D) (H_kv = H unless ``enable_gqa``);
            attn_mask: bool (True = may attend) or float, broadcasting to (B, H, N, M);
            alibi_slopes: (H,) or (B, H). ``scale`` defaults to 1 / sqrt(D).

    Returns:
        scores (B, H, N, M), -inf where hidden.
    """
    n, m, d = query.shape[-2], key.shape[-2], query.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if enable_gqa:
        key = expand_kv(key, query.shape[-3])
    scores = (query @ key.transpose(-2, -1)) * scale  # (B, H, N, D) @ (B, H, D, M) -> (B, H, N, M)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        p = positions(n, m, align, query.device)
        distance = (p - torch.arange(m, device=query.device)[None, :]).abs().to(scores.dtype)
        slopes = alibi_slopes.to(scores.dtype)[..., None, None]  # (..., H) -> (..., H, 1, 1)
        scores = scores - slopes * distance
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        if mask_in_float32:
            wide = torch.promote_types(scores.dtype, torch.float32)
            scores, attn_mask = scores.to(wide), attn_mask.to(wide)
        scores = scores + attn_mask
    allowed = visible(n, m, causal=is_causal, window=window, align=align, device=query.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, -math.inf)
    return scores


def masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the keys (last axis); a fully masked row (all -inf) gets weights 0, not NaN."""
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True).detach()
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


def plain_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    keep: torch.Tensor | None = None,
    **options: Any,
) -> torch.Tensor:
    """The baseline Bl, with SDPA's signature: textbook attention in the inputs' dtype.

    S as ``attention_scores``; P = softmax(S), 0 on fully masked rows; P' = P * keep / (1 - p);
    O = P' V. Without an explicit bool ``keep`` (B, H, N, M), dropout draws it from torch's
    generator. ``options`` are ``attention_scores``' keywords (align, window, softcap,
    alibi_slopes).

    Args:
        query: (B, H, N, D); key: (B, H_kv, M, D); value: (B, H_kv, M, Dv).

    Returns:
        (B, H, N, Dv).
    """
    return plain_attention_lse(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, keep=keep, **options
    )[0]


def plain_attention_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    keep: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``plain_attention`` and lse = logsumexp of each row of scores (B, H, N), -inf on a row
    with nothing to see, both in the inputs' dtype."""
    scores = attention_scores(
        query, key, attn_mask, is_causal, scale, enable_gqa=enable_gqa, **options
    )
    probs = masked_softmax(scores).to(query.dtype)
    if dropout_p:
        if keep is None:
            keep = torch.rand(probs.shape, device=probs.device) >= dropout_p
        probs = probs * keep.to(probs.dtype) * (1.0 / (1.0 - dropout_p))
    if enable_gqa:
        value = expand_kv(value, query.shape[-3])
    out = probs @ value  # (B, H, N, M) @ (B, H, M, Dv) -> (B, H, N, Dv)
    return out, torch.logsumexp(scores.detach(), dim=-1).to(query.dtype)


def dropout_variance(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    **options: Any,
) -> torch.Tensor:
    """The variance of each output entry under inverted dropout: with P' = P * keep / (1 - p),
    keep ~ Bernoulli(1 - p) per (row, key), Var(O_ic) = p / (1 - p) * sum_j P_ij^2 V_jc^2.

    Args:
        query: (B, H, N, D); key: (B, H_kv, M, D); value: (B, H_kv, M, Dv); ``options`` as
            ``attention_scores``' keywords (align, window, softcap, alibi_slopes).

    Returns:
        (B, H, N, Dv), in the inputs' dtype (float64 for an exact answer).
    """
    scores = attention_scores(query, key, None, is_causal, scale, enable_gqa=enable_gqa, **options)
    probs = masked_softmax(scores)
    if enable_gqa:
        value = expand_kv(value, query.shape[-3])
    rate = dropout_p / (1.0 - dropout_p)
    return rate * (probs * probs) @ (value * value)  # (B, H, N, M) @ (B, H, M, Dv)


def plain_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    alibi_slopes: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline over packed sequences: ``plain_attention_lse`` on each sequence alone.

    Args:
        query: (T_q, H, D); key: (T_k, H_kv, D); value: (T_k, H_kv, Dv); cu_seqlens_q and
            cu_seqlens_k: (S + 1,) offsets; alibi_slopes: (H,) or (S, H).

    Returns:
        out (T_q, H, Dv) and lse (H, T_q).
    """
    outs, lses = [], []
    for q, k, v, slopes in per_sequence(query, key, value, cu_seqlens_q, cu_seqlens_k,
                                        alibi_slopes):  # fmt: skip
        out, lse = plain_attention_lse(q, k, v, alibi_slopes=slopes, **options)
        outs.append(out[0].transpose(0, 1))  # (1, H, n_s, Dv) -> (n_s, H, Dv)
        lses.append(lse[0])  # (H, n_s)
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


def per_sequence(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    alibi_slopes: torch.Tensor | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Each packed sequence alone: q (1, H, n_s, D), k (1, H_kv, m_s, D), v (1, H_kv, m_s, Dv)
    and its ALiBi slopes ((H,), row s of (S, H) slopes)."""
    found = []
    bounds = list(zip(cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), strict=True))
    for s, ((q0, k0), (q1, k1)) in enumerate(zip(bounds, bounds[1:], strict=False)):
        slopes = alibi_slopes
        if alibi_slopes is not None and alibi_slopes.ndim == 2:
            slopes = alibi_slopes[s]
        q, k, v = (
            t[start:stop].transpose(0, 1)[None]  # (L, H, W) -> (1, H, L, W)
            for t, start, stop in ((query, q0, q1), (key, k0, k1), (value, k0, k1))
        )
        found.append((q, k, v, slopes))
    return found
