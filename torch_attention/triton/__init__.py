"""The project's own FlashAttention-2 kernel in Triton: forward and backward with today's options.

Importing this package imports Triton (the optional extra ``triton``). To run the kernels on CPU
tensors under Triton's interpreter (how the tests prove them without a GPU), set
``TRITON_INTERPRET=1`` before Triton itself is first imported (torch imports it with
``torch._inductor``): Triton decorates its own library then. ``torch_attention`` never imports
this package by itself: ``functional.attention(..., backend="triton")`` does, on first use.
docs/triton-kernel.md has the schedule, the options and the limits.

Tests: tests/torch_attention/triton/.
"""

from __future__ import annotations

from .flash import flash_attn_func, flash_attn_varlen_func
from .launch import (
    attention,
    draw_seed,
    dropout_mask,
    interpreted,
    limit_refusal,
    varlen_attention,
)

__all__ = [
    "attention",
    "draw_seed",
    "dropout_mask",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "interpreted",
    "limit_refusal",
    "varlen_attention",
]
