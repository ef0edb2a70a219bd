"""flash-attn's entries, computed by the project's Triton kernel: ``flash_attn_func`` and
``flash_attn_varlen_func`` with flash-attn's signatures, which the checker's ``"flash"`` and
``"flash_varlen"`` specs certify.

Each is ``torch_attention.flash_api``'s entry with backend "triton" (the one translation of
flash-attn's keywords: bottom-right alignment, a window side of -1 unbounded, GQA when k has fewer
heads than q), which calls ``functional.attention(..., backend="triton")`` or
``varlen_attention(..., backend="triton")``, so that every check and refusal is theirs: the checks
of ``rules.prepare`` and the kernel's limits (``launch.limit_refusal``), each a ``ValueError``
naming the limit. Dropout runs in the kernel (a Philox keep-mask drawn from a seed that the inputs'
device's generator gives, read by the kernel on the device); ``deterministic`` is accepted and has
nothing to change (the backward always is); ``return_attn_probs=True`` returns (out, lse, None), lse
float32 (B, H, N), or (H, T_q) for packed sequences, as flash-attn returns its softmax_lse.

Features for the checker: causal, window, softcap, alibi, gqa, lse, dv, dropout; no masks (the
flash specs have none). Limits: head widths D, Dv <= 256; any lengths, strides and layouts.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length, D head
width, Dv value width; T_q, T_k packed token counts.

Tests: tests/torch_attention/triton/test_flash.py
"""

from __future__ import annotations

from typing import Any

import torch

from .. import flash_api


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """flash-attn's ``flash_attn_func``: q (B, N, H, D), k (B, M, H_kv, D), v (B, M, H_kv, Dv)
    -> out (B, N, H, Dv), or (out, lse (B, H, N), None) with ``return_attn_probs``."""
    return flash_api.flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, backend="triton",
    )  # fmt: skip


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """flash-attn's ``flash_attn_varlen_func``: packed q (T_q, H, D), k (T_k, H_kv, D),
    v (T_k, H_kv, Dv) with offsets ``cu_seqlens`` (S + 1,) -> out (T_q, H, Dv), or (out,
    lse (H, T_q), None). ``max_seqlen_*`` below a sequence's length is a ``ValueError``
    (flash-attn would read past it)."""
    return flash_api.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, backend="triton",
    )  # fmt: skip
