"""flash-attn's two entry points over ``torch_attention``: ``flash_attn_func`` and
``flash_attn_varlen_func`` with flash-attn's signatures and conventions, computed by any backend
of ``functional.attention`` (``backend=``, keyword only). The one translation of flash-attn's
keywords in the project: the checker's correct kernels of the "flash" and "flash_varlen" specs
(``parity_tests.checker.targets.adapters``, backend "auto") and the Triton kernel's entries
(``torch_attention.triton.flash``, backend "triton") are both this.

The translation: q (B, N, H, D) and k, v (B, M, H_kv, W) as (B, H, L, W) views; causal, windows
and ALiBi aligned bottom-right; a ``window_size`` side of -1 unbounded (under causal, flash-attn's
right side 0 is what causal means already); GQA when k has fewer heads than q (axis -2 in both
flash layouts); ``softcap`` 0 is none. ``dropout_p`` is inverted dropout on the weights, its
keep-mask drawn as the backend draws it (from torch's generator, or, for "triton", a Philox
stream seeded from it); ``deterministic`` is accepted and has nothing to change (the backward is
deterministic on every backend). ``return_attn_probs=True`` returns (out, lse, None): lse
float32 for half-precision inputs, (B, H, N), or (H, T_q) for packed sequences, as flash-attn
returns its softmax_lse (flash-attn's third item, the probabilities, it returns only for testing
and with dropout: None here). A ``max_seqlen_*`` below a sequence's length is a ValueError
(flash-attn would read past it); every other check and refusal is the backend's.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length, D head
width, W either of D and Dv, Dv value width; T_q, T_k packed token counts, S sequences.

Tests: tests/torch_attention/test_flash_api.py, tests/checker/targets/test_adapters.py,
tests/torch_attention/triton/test_flash.py
"""

from __future__ import annotations

from typing import Any

import torch

from . import functional, varlen


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
    *,
    backend: str = "auto",
) -> Any:
    """flash-attn's ``flash_attn_func``: q (B, N, H, D), k (B, M, H_kv, D), v (B, M, H_kv, Dv)
    -> out (B, N, H, Dv), or (out, lse (B, H, N), None) with ``return_attn_probs``."""
    options = _options(q, k, causal, window_size)
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))  # (B, L, H, W) -> (B, H, L, W), views
    result = functional.attention(
        q_,
        k_,
        v_,
        dropout_p=dropout_p,
        scale=softmax_scale,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        backend=backend,
        return_lse=True,
        **options,
    )
    out = result.out.transpose(1, 2)  # (B, H, N, Dv) -> (B, N, H, Dv)
    return (out, result.lse, None) if return_attn_probs else out


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
    *,
    backend: str = "auto",
) -> Any:
    """flash-attn's ``flash_attn_varlen_func``: packed q (T_q, H, D), k (T_k, H_kv, D),
    v (T_k, H_kv, Dv) with offsets ``cu_seqlens`` (S + 1,), each sequence attended alone,
    bottom-right -> out (T_q, H, Dv), or (out, lse (H, T_q), None)."""
    options = _options(q, k, causal, window_size)
    for name, offsets, given in (
        ("max_seqlen_q", cu_seqlens_q, max_seqlen_q),
        ("max_seqlen_k", cu_seqlens_k, max_seqlen_k),
    ):
        longest = int((offsets[1:] - offsets[:-1]).max()) if len(offsets) > 1 else 0
        if given < longest:
            raise ValueError(f"{name} = {given} is below the longest sequence, {longest}")
    result = varlen.varlen_attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        dropout_p=dropout_p,
        scale=softmax_scale,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        backend=backend,
        return_lse=True,
        **options,
    )
    return (result.out, result.lse, None) if return_attn_probs else result.out


def _options(
    q: torch.Tensor, k: torch.Tensor, causal: bool, window_size: tuple[int, int]
) -> dict[str, Any]:
    """flash-attn's causal and window as ``torch_attention``'s: bottom-right, a side of -1
    unbounded, GQA when k has fewer heads than q (axis -2 in both flash layouts)."""
    left, right = window_size
    window = None
    if left >= 0 or right >= 0:
        window = (None if left < 0 else left, None if right < 0 else right)
    return {
        "causal": causal,
        "window": window,
        "align": "bottom-right",
        "enable_gqa": q.shape[-2] != k.shape[-2],
    }
