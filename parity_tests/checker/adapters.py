"""``torch_attention.functional.attention`` behind flash-attn's signatures: correct kernels of the
"flash" and "flash_varlen" specs, for machines without flash-attn (this one) and as the checker's
proof that those specs pass a correct kernel.

``flash_attn_func`` takes (B, N, H, D) and aligns causal, windows and ALiBi bottom-right;
``window_size`` (-1 = unbounded side); returns out (B, N, H, Dv), and with
``return_attn_probs=True`` (out, lse (B, H, N) float32 for half inputs, None).
``flash_attn_varlen_func`` takes packed (T, H, D) with ``cu_seqlens`` and attends each sequence
alone; lse (H, T_q). ``dropout_p`` is inverted dropout on the weights, its keep-mask drawn from
torch's generator by ``torch_attention`` (flash-attn draws its own from a Philox stream, which
no caller sees: the checker judges both by draws, statistically).

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T_q, T_k packed token counts.

Tests: tests/checker/test_adapters.py
"""

from __future__ import annotations

from torch_attention.functional import attention
from torch_attention.varlen import varlen_attention


def _options(q, k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes) -> dict:
    """flash-attn's keywords as ``torch_attention``'s: bottom-right, a window side of -1 is
    unbounded, GQA when k has fewer heads than q (axis -2 in both flash layouts), with lse."""
    left, right = window_size
    window = None if left < 0 and right < 0 else (None if left < 0 else left,
                                                   None if right < 0 else right)  # fmt: skip
    return {
        "causal": causal,
        "window": window,
        "align": "bottom-right",
        "scale": softmax_scale,
        "softcap": softcap,
        "alibi_slopes": alibi_slopes,
        "enable_gqa": q.shape[-2] != k.shape[-2],
        "dropout_p": dropout_p,
        "return_lse": True,
    }


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):  # fmt: skip
    """flash-attn's ``flash_attn_func`` computed by ``torch_attention``."""
    options = _options(q, k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, L, H, W) -> (B, H, L, W)
    result = attention(q, k, v, **options)
    out = result.out.transpose(1, 2)  # (B, H, N, Dv) -> (B, N, H, Dv)
    return (out, result.lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False):  # fmt: skip
    """flash-attn's ``flash_attn_varlen_func`` computed by ``torch_attention.varlen_attention``
    (packed (T, H, W), one sequence at a time, bottom-right per sequence)."""
    options = _options(q, k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    result = varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, **options)
    return (result.out, result.lse, None) if return_attn_probs else result.out
