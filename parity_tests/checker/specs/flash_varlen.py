"""The "flash_varlen" spec: flash-attn's ``flash_attn_varlen_func(q, k, v, cu_seqlens_q,
cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False,
window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
return_attn_probs=False)``; packed (T, H, D), ``cu_seqlens`` int32, lse (H, T); bottom-right per
sequence.

A batched case runs as its B sequences packed one after another; a packed case (``seqlens``)
as it is. The keywords are the "flash" spec's (``flash.flash_keywords``).

Shape legend: B batch, H heads, N query length, D head width; T packed token count.

Tests: tests/checker/specs/test_attention.py, tests/checker/test_spec.py (every claim's
coverage)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..battery.attention.case import Case
from .flash import CORE, OPTIONS, FlashSpec, flash_keywords


class FlashVarlenSpec(FlashSpec):
    name = "flash_varlen"
    signature = (
        "flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, "
        "max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
        "softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)"
    )
    factor_names = (*CORE, *OPTIONS, "dropout", "sequences")
    quick_teeth = ("packed",)

    def layout(self, case: Case, t: torch.Tensor) -> torch.Tensor:
        if not case.packed:
            t = t.transpose(1, 2)  # (B, H, L, W) -> (B, L, H, W)
            t = t.reshape(-1, *t.shape[2:])  # (B, L, H, W) -> (B*L, H, W)
        return t

    def unlayout(self, case: Case, t: torch.Tensor, heads: int) -> torch.Tensor:
        if not case.packed:
            t = t.reshape(case.batch, -1, heads, t.shape[-1])  # (B*L, H, W) -> (B, L, H, W)
            t = t.transpose(1, 2)  # (B, L, H, W) -> (B, H, L, W)
        return t

    def lse_shape(self, case: Case) -> tuple[int, ...]:
        return (case.heads, case.n * (1 if case.packed else case.batch))

    def unlayout_lse(self, case: Case, lse: torch.Tensor) -> torch.Tensor:
        if not case.packed:
            lse = lse.reshape(case.heads, case.batch, case.n).transpose(
                0, 1
            )  # (H, B*N) -> (B, H, N)
        return lse

    def extras(self, case, attn_mask, slopes, device) -> dict[str, torch.Tensor]:
        given = super().extras(case, attn_mask, slopes, device)
        for name, offsets in zip(("cu_seqlens_q", "cu_seqlens_k"), case.cu_seqlens, strict=True):
            given[name] = torch.as_tensor(offsets, dtype=torch.int32, device=device)
        return given

    def invoke(self, kernel: Callable[..., Any], case: Case, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, given: dict[str, torch.Tensor], want_lse: bool, *,
               deterministic: bool = False) -> Any:  # fmt: skip
        lengths = case.seqlens or ((case.n, case.m),)
        return kernel(
            q,
            k,
            v,
            given["cu_seqlens_q"],
            given["cu_seqlens_k"],
            max(n for n, _ in lengths),
            max(m for _, m in lengths),
            **flash_keywords(case, given.get("alibi_slopes"), want_lse, deterministic),
        )


SPEC = FlashVarlenSpec()
