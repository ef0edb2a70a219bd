"""The clip of q, k and v in torch, the twin of ``numpy_attention.clip``: each projection's output
clamped to [-c, c] (OLMo and OLMoE's ``clip_qkv``, DBRX's clamp of the fused Wqkv projection).

    y = clamp(x, -c, c)

``torch.clamp``'s autograd passes the gradient where -c <= x <= c (the tie included), as the
NumPy twin's backward does.

Derivation: docs/derivations/clip-qkv.md (the NumPy twin's backward; autograd here).
Tests: tests/torch_attention/test_grouped.py (in the layer, against the NumPy twin).
"""

from __future__ import annotations

import torch

from numpy_attention.clip import check_clip  # the rules are pure Python, shared

__all__ = ["check_clip", "clip"]


def clip(x: torch.Tensor, clip_qkv: float) -> torch.Tensor:
    """x clamped to [-clip_qkv, clip_qkv], elementwise, in x's dtype."""
    return x.clamp(min=-clip_qkv, max=clip_qkv)
