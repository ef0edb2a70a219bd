"""``torch_attention`` behind flash-attn's signatures: correct kernels of the "flash" and
"flash_varlen" specs, for machines without flash-attn (this one) and as the checker's proof that
those specs pass a correct kernel.

They are ``torch_attention.flash_api``'s entries with backend "auto" (the translation of
flash-attn's keywords lives there, shared with the Triton kernel's entries): ``flash_attn_func``
takes (B, N, H, D) and aligns causal, windows and ALiBi bottom-right; ``window_size`` (-1 =
unbounded side); returns out (B, N, H, Dv), and with ``return_attn_probs=True`` (out, lse
(B, H, N) float32 for half inputs, None). ``flash_attn_varlen_func`` takes packed (T, H, D) with
``cu_seqlens`` and attends each sequence alone; lse (H, T_q). ``dropout_p`` is inverted dropout
on the weights, its keep-mask drawn from torch's generator by ``torch_attention`` (flash-attn
draws its own from a Philox stream, which no caller sees: the checker judges both by draws,
statistically).

Shape legend: B batch, H heads, N query length, D head width, Dv value width; T packed tokens,
T_q packed query tokens.

Tests: tests/checker/targets/test_adapters.py
"""

from __future__ import annotations

from torch_attention.flash_api import flash_attn_func, flash_attn_varlen_func

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]
