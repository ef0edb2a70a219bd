"""``torch_attention.functional.attention`` behind flash-attn's signatures: correct kernels of the
"flash" and "flash_varlen" specs, for machines without flash-attn (this one) and as the checker's
proof that those specs pass a correct kernel.

``flash_attn_func`` takes (B, N, H, D) and aligns causal, windows and ALiBi bottom-right;
``window_size`` (-1 = unbounded side); returns out (B, N, H, Dv), and with
``return_attn_probs=True`` (out, lse (B, H, N) float32 for half inputs, None).
``flash_attn_varlen_func`` takes packed (T, H, D) with ``cu_seqlens`` and attends each sequence
alone; lse (H, T_q). Dropout is refused (``KernelUnsupported``): its mask is flash-attn's own.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T_q, T_k packed token counts.

Tests: tests/checker/test_adapters.py
"""

from __future__ import annotations

from typing import Any

import torch

from torch_attention.functional import attention

from .report import KernelUnsupported


def _window(window_size: tuple[int, int]) -> tuple[int | None, int | None] | None:
    left, right = window_size
    if left < 0 and right < 0:
        return None
    return (None if left < 0 else left, None if right < 0 else right)


def _attend(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes) -> Any:
    """attention on (H, L, W) or (B, H, L, W) tensors, bottom-right, with lse."""
    return attention(
        q,
        k,
        v,
        causal=causal,
        window=_window(window_size),
        align="bottom-right",
        scale=softmax_scale,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        enable_gqa=q.shape[-3] != k.shape[-3],
        return_lse=True,
    )


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):  # fmt: skip
    """flash-attn's ``flash_attn_func`` computed by ``torch_attention``."""
    if dropout_p:
        raise KernelUnsupported("dropout: flash-attn's keep-mask is its own")
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, L, H, W) -> (B, H, L, W)
    result = _attend(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes)
    out = result.out.transpose(1, 2)  # (B, H, N, Dv) -> (B, N, H, Dv)
    return (out, result.lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False):  # fmt: skip
    """flash-attn's ``flash_attn_varlen_func`` computed by ``torch_attention``, one sequence at a
    time."""
    if dropout_p:
        raise KernelUnsupported("dropout: flash-attn's keep-mask is its own")
    outs, lses = [], []
    starts = list(zip(cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), strict=True))
    for s, ((q0, k0), (q1, k1)) in enumerate(zip(starts, starts[1:], strict=False)):
        slopes = alibi_slopes
        if alibi_slopes is not None and alibi_slopes.ndim == 2:
            slopes = alibi_slopes[s]
        # (L, H, W) -> (H, L, W)
        parts = (t.transpose(0, 1) for t in (q[q0:q1], k[k0:k1], v[k0:k1]))
        result = _attend(*parts, softmax_scale, causal, window_size, softcap, slopes)
        outs.append(result.out.transpose(0, 1))  # (H, n_s, Dv) -> (n_s, H, Dv)
        lses.append(result.lse)  # (H, n_s)
    out, lse = torch.cat(outs), torch.cat(lses, dim=1)
    return (out, lse, None) if return_attn_probs else out
