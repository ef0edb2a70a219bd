"""Rotary position embedding (RoPE): each pair of coordinates of a query or key head rotated by an
angle proportional to the token's position, so that q_m . k_n depends on m - n alone.

Shape legend: B batch, H heads, N sequence length, D head width (even); "..." leading axes.

Pair i of D/2 turns by angle_i = position * inv_freq_i, with inv_freq_i = theta^(-2i / D) by
default (``rope_inv_freq``). Two layouts say which coordinates form pair i:

- half-split (``interleaved=False``, Llama / Hugging Face's ``rotate_half``): (x_i, x_{i + D/2});
- interleaved (``interleaved=True``, GPT-J, Meta's original Llama): (x_{2i}, x_{2i+1}).

Each pair (a, b) becomes f * (a cos - b sin, a sin + b cos), f the ``attention_factor`` that
YaRN and LongRoPE multiply cos and sin by (1 elsewhere).

DeepSeek's interleaved rope dims are gathered into halves before a half-split rotation
(``deinterleave``, and its inverse permutation ``deinterleave_backward``), as transformers'
``apply_rotary_pos_emb_interleave`` does for latent attention.

Partial rotary (``rotary_dim`` R < D, GLM's and Phi-3's ``partial_rotary_factor``): only the
first R coordinates of each head rotate, paired within them as above (i < R/2, pair i of the
layout (x_i, x_{i + R/2}) or (x_{2i}, x_{2i+1})), with R/2 frequencies; the last D - R pass
through unchanged. R = 0 rotates nothing (a NoPE layer).

Precision: angles are computed in float64 from float64 positions and ``inv_freq``, then cos and
sin, and only the (N, D/2) tables are cast to x's dtype. A float32 angle at position 10^5 is off
by up to 4e-3 rad (half its spacing there), which float32 attention would inherit; the tables are
small, and the rotation itself runs in x's dtype. Hugging Face computes the angles in float32
from its float32 ``inv_freq``: a float32 frequency times an integer position is exact in float64,
so passing the model's own ``inv_freq`` gives Hugging Face's angles up to its float32 rounding
of the product (which is what a float64 comparison wants to leave out).

Derivation: docs/derivations/rope.md.
Tests: tests/numpy_attention/test_rope.py; in the layer, tests/numpy_attention/test_grouped.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation


def rope_inv_freq(head_dim: int, rope_theta: float = 10000.0) -> np.ndarray:
    """The default frequencies, ``1 / rope_theta ** (arange(0, D, 2) / D)``, float64 (D/2,).

    Hugging Face computes the same formula in float32; a converted model passes its own
    ``inv_freq`` instead (see the module docstring).
    """
    head_dim = validation.positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(
            f"RoPE rotates pairs of coordinates: head_dim must be even, got {head_dim}"
        )
    theta = validation.finite_real("rope_theta", rope_theta)
    if theta <= 0:
        raise ValueError(f"rope_theta must be > 0, got {rope_theta}")
    return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def check_positions(positions: Any, x_shape: tuple[int, ...]) -> np.ndarray:
    """``positions`` checked against x (..., N, D): (N,), or (B, N) with B = x's first axis
    (x (B, ..., N, D)); integer or float, finite. ``TypeError``/``ValueError`` naming the shapes.
    """
    positions = np.asarray(positions)
    if positions.dtype.kind not in "iuf":
        raise TypeError(f"positions must be integers (or floats), got dtype {positions.dtype}")
    n = x_shape[-2]
    batched = len(x_shape) >= 3 and positions.shape == (x_shape[0], n)
    if positions.shape != (n,) and not batched:
        per_batch = f" or (B, N) = {(x_shape[0], n)}" if len(x_shape) >= 3 else ""
        raise ValueError(
            f"positions must be (N,) = ({n},){per_batch} for x of shape {x_shape}, "
            f"got {positions.shape}"
        )
    if positions.dtype.kind == "f" and not np.all(np.isfinite(positions)):
        raise ValueError("positions must be finite")
    return positions


class RopeCtx(NamedTuple):
    cos: np.ndarray  # f * cos(angle), (N, R/2) or (B, 1, ..., 1, N, R/2), x's dtype
    sin: np.ndarray  # f * sin(angle), same shape
    interleaved: bool
    rotary_dim: int  # R, the coordinates that rotate (the first R of each head)
    shape: tuple[int, ...]  # x's shape, which dout must have
    dtype: np.dtype


def rope_forward(
    x: np.ndarray,
    positions: Any,
    *,
    inv_freq: np.ndarray,
    interleaved: bool = False,
    attention_factor: float = 1.0,
    rotary_dim: int | None = None,
) -> tuple[np.ndarray, RopeCtx]:
    """Rotate each pair of the first R coordinates of x by angle = position * inv_freq, times f.

    (a, b) -> f * (a cos - b sin, a sin + b cos), pair i being (x_i, x_{i+R/2}) (half-split) or
    (x_{2i}, x_{2i+1}) (interleaved); coordinates R .. D - 1 pass through.

    Args:
        x: (..., N, D); typically q or k (B, H, N, D).
        positions: (N,), or (B, N) with B = x's first axis: each batch element its own positions
            (left padding, cache offsets). Integers (or floats), finite.
        inv_freq: (R/2,) frequencies, e.g. ``rope_inv_freq(R, theta)`` or a model's own.
        interleaved: the pair layout (see the module docstring).
        attention_factor: f, multiplies cos and sin (YaRN's and LongRoPE's attention factor).
        rotary_dim: R, even, 0 <= R <= D: the coordinates that rotate (partial rotary; 0 for
            none); None for D (which must then be even and > 0).

    Returns:
        out (..., N, D) in x's dtype and the ctx for ``rope_backward`` (its cos and sin tables:
        kept also under ``no_grad()``, as they cost nothing beyond the forward's own work).
    """
    x = validation.float_array("x", x)
    rotary = check_rotary_dim(rotary_dim, x.shape)
    half = rotary // 2
    positions = check_positions(positions, x.shape)
    inv_freq = validation.float_array("inv_freq", inv_freq)
    if inv_freq.shape != (half,):
        raise ValueError(
            f"inv_freq must be (R/2,) = ({half},) for x of shape {x.shape} and rotary_dim "
            f"R = {rotary}, got {inv_freq.shape}"
        )
    interleaved = validation.flag("interleaved", interleaved)
    factor = validation.finite_real("attention_factor", attention_factor)

    # float64 angles (see the module docstring), then tables in x's dtype
    angles = positions.astype(np.float64)[..., None] * inv_freq.astype(np.float64)  # (.., N, R/2)
    cos = (np.cos(angles) * factor).astype(x.dtype)
    sin = (np.sin(angles) * factor).astype(x.dtype)
    if positions.ndim == 2:  # (B, N, R/2) -> (B, 1, ..., 1, N, R/2), against x (B, ..., N, D)
        cos = cos.reshape(cos.shape[:1] + (1,) * (x.ndim - 3) + cos.shape[1:])
        sin = sin.reshape(cos.shape)
    ctx = RopeCtx(cos, sin, interleaved, rotary, x.shape, x.dtype)
    return _rotate(x, cos, sin, interleaved, rotary), ctx


def rope_backward(dout: np.ndarray, ctx: RopeCtx) -> np.ndarray:
    """Gradient of x: the forward is the linear map f R(angle) on each pair, so its backward is
    the transpose, f R(angle)^T = f R(-angle):

        (da, db) = f * (dy_a cos + dy_b sin, -dy_a sin + dy_b cos);

    the coordinates past R are the identity, so their gradient passes through.

    Derivation: docs/derivations/rope.md.

    Args:
        dout: (..., N, D), the shape of the forward's x.
        ctx: from ``rope_forward``.

    Returns:
        dx (..., N, D) in x's dtype.
    """
    dout = validation.grad_output(dout, ctx.shape, ctx.dtype)
    # rotate back: sin(-a) = -sin(a)
    return _rotate(dout, ctx.cos, -ctx.sin, ctx.interleaved, ctx.rotary_dim)


def check_rotary_dim(rotary_dim: Any, x_shape: tuple[int, ...]) -> int:
    """R for x (..., N, D): ``rotary_dim`` even in [0, D], or D (even, > 0) when None."""
    width = x_shape[-1] if x_shape else 0
    if len(x_shape) < 2 or (rotary_dim is None and (width % 2 or width == 0)):
        raise ValueError(
            f"RoPE needs x (..., N, D) with an even head width D > 0 (it rotates pairs), "
            f"got shape {x_shape}"
        )
    if rotary_dim is None:
        return width
    rotary = validation.non_negative_int("rotary_dim", rotary_dim)
    if rotary % 2 or rotary > width:
        raise ValueError(
            f"rotary_dim must be even (RoPE rotates pairs) and at most D = {width} for x of "
            f"shape {x_shape}, got {rotary}"
        )
    return rotary


def _rotate(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, rotary: int
) -> np.ndarray:
    """(a, b) -> (a cos - b sin, a sin + b cos) on every pair of x's first ``rotary``
    coordinates (x (..., N, D)); the others are copied."""
    if interleaved:
        first, second = slice(0, rotary, 2), slice(1, rotary, 2)
    else:
        first, second = slice(0, rotary // 2), slice(rotary // 2, rotary)
    a, b = x[..., first], x[..., second]  # (..., N, R/2) each
    # cos and sin broadcast against x's leading axes; the pass-through part is copied
    out = np.empty_like(x) if rotary == x.shape[-1] else x.copy()
    out[..., first] = a * cos - b * sin
    out[..., second] = a * sin + b * cos
    return out


def rotate_pairs(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool = False
) -> np.ndarray:
    """The rotation of ``rope_forward`` with the tables given instead of built from positions:
    (a, b) -> (a cos - b sin, a sin + b cos) on every pair of x (..., N, D), in x's dtype.

    For callers that hold cos and sin already (flash-attn's ``rotary_cos``/``rotary_sin``,
    ``numpy_attention.decode.paged``); cos and sin (..., N, D/2) broadcast against x's leading axes.
    No checks: the caller has made them.
    """
    return _rotate(x, cos, sin, interleaved, x.shape[-1])


def deinterleave(x: np.ndarray) -> np.ndarray:
    """(..., R) -> (..., R): the interleaved pairs (x_2i, x_2i+1) gathered into halves,
    [x_0, x_2, ...; x_1, x_3, ...], as transformers' ``apply_rotary_pos_emb_interleave`` lays
    them out for the half-split rotation."""
    return np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


def deinterleave_backward(dout: np.ndarray) -> np.ndarray:
    """A permutation's gradient is the inverse permutation: the halves back to their pairs."""
    half = dout.shape[-1] // 2
    dx = np.empty_like(dout)
    dx[..., 0::2], dx[..., 1::2] = dout[..., :half], dout[..., half:]
    return dx
