"""The clip of q, k and v in torch, the twin of ``numpy_attention.clip``: each projection's output
clamped to [-c, c] (OLMo and OLMoE's ``clip_qkv``, DBRX's clamp of the fused Wqkv projection).

    y = clamp(x, -c, c)

``torch.clamp``'s autograd passes the gradient where -c <= x <= c (the tie included), as the
NumPy twin's backward does.

Derivation: docs/derivations/clip-qkv.md (the NumPy twin's backward; autograd here).
Tests: tests/torch_attention/test_grouped.py (in the layer, against the NumPy twin).
"""

from __future__ import annotations

from typing import Any

import torch

from . import validation

__all__ = ["check_clip", "clip"]


def check_clip(clip_qkv: Any, after_norm: Any, qk_norm: bool) -> float | None:
    """``clip_qkv`` checked (None: no clip; else finite and > 0), the NumPy twin's rules;
    ``clip_after_norm`` needs both a clip and a QK-norm."""
    after_norm = validation.flag("clip_after_norm", after_norm)
    if clip_qkv is not None:
        clip_qkv = validation.finite_real("clip_qkv", clip_qkv)
        if clip_qkv <= 0:
            raise ValueError(f"clip_qkv must be > 0 (None = no clip), got {clip_qkv}")
    if after_norm and (clip_qkv is None or not qk_norm):
        raise ValueError(
            f"clip_after_norm=True places the clip after the QK-norm, but clip_qkv is "
            f"{clip_qkv!r} and qk_norm is {qk_norm}"
        )
    return clip_qkv


def clip(x: torch.Tensor, clip_qkv: float) -> torch.Tensor:
    """x clamped to [-clip_qkv, clip_qkv], elementwise, in x's dtype."""
    return x.clamp(min=-clip_qkv, max=clip_qkv)
