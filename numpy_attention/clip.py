"""The clip of q, k and v: each projection's output clamped to [-c, c] before the heads are split
(OLMo and OLMoE's ``clip_qkv``, DBRX's and MPT's clamp of the fused Wqkv projection).

    y = clip(x, -c, c) = min(max(x, -c), c)
    dx = dy  where -c <= x <= c,   0 where |x| > c

The gradient passes at the tie x = +-c, as ``torch.clamp``'s autograd passes it (its mask is
``min <= x <= max``); the clamp is not differentiable there, and this is the one-sided choice the
models were trained with. Elementwise: any shape.

Derivation: docs/derivations/clip-qkv.md.
Tests: tests/numpy_attention/test_clip.py; in the layer, tests/numpy_attention/test_grouped.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation

__all__ = ["ClipCtx", "check_clip", "clip_backward", "clip_forward"]


def check_clip(clip: Any, after_norm: Any, qk_norm: bool) -> float | None:
    """``clip_qkv`` checked (None: no clip; else finite and > 0) and returned as a float;
    ``clip_after_norm`` needs both a clip and a QK-norm (it would do nothing otherwise)."""
    after_norm = validation.flag("clip_after_norm", after_norm)
    if clip is not None:
        clip = validation.finite_real("clip_qkv", clip)
        if clip <= 0:
            raise ValueError(f"clip_qkv must be > 0 (None = no clip), got {clip}")
    if after_norm and (clip is None or not qk_norm):
        raise ValueError(
            f"clip_after_norm=True places the clip after the QK-norm, but clip_qkv is {clip!r} "
            f"and qk_norm is {qk_norm}"
        )
    return clip


class ClipCtx(NamedTuple):
    passed: np.ndarray  # bool, x's shape: True where -c <= x <= c (the gradient passes)


def clip_forward(x: np.ndarray, clip: float) -> tuple[np.ndarray, ClipCtx]:
    """y = min(max(x, -c), c), elementwise.

    Args:
        x: any shape, a float array.
        clip: c > 0 (the caller has checked it).

    Returns:
        y in x's dtype and the backward's ctx.
    """
    c = x.dtype.type(clip)  # float32 stays float32
    passed = np.abs(x) <= c  # the tie passes, as torch.clamp's autograd
    return np.clip(x, -c, c), ClipCtx(passed)


def clip_backward(dout: np.ndarray, ctx: ClipCtx) -> np.ndarray:
    """dx = dy where -c <= x <= c, else 0. Derivation: docs/derivations/clip-qkv.md.

    Args:
        dout: the gradient of y, x's shape.
        ctx: ``clip_forward``'s.

    Returns:
        dx, x's shape.
    """
    return np.where(ctx.passed, dout, dout.dtype.type(0))
