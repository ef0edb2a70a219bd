"""Rotary position embedding (RoPE) in torch, the twin of ``numpy_attention.rope``: each pair of
coordinates of a query or key head rotated by an angle proportional to the token's position.

Shape legend: B batch, H heads, N sequence length, D head width (even); "..." leading axes.

``deinterleave`` gathers DeepSeek's interleaved pairs into halves, as in the NumPy twin.

Partial rotary as in the NumPy twin: ``rotary_dim`` R rotates the first R coordinates of each
head and passes the rest through (R = 0: a NoPE layer).

Precision as in the NumPy twin: angles are computed in float64 from float64 positions and
``inv_freq``, and only the cos and sin tables are cast to x's dtype. The backward is autograd's
(the NumPy twin derives it: a rotation's backward is its transpose).

Derivation: docs/derivations/rope.md.
Tests: tests/torch_attention/test_rope.py; in the layer, tests/torch_attention/test_grouped.py.
"""

from __future__ import annotations

from typing import Any

import torch

from . import validation


def rope_inv_freq(head_dim: int, rope_theta: float = 10000.0) -> torch.Tensor:
    """The default frequencies, ``1 / rope_theta ** (arange(0, D, 2) / D)``, float64 (D/2,) on
    the CPU."""
    head_dim = validation.positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(
            f"RoPE rotates pairs of coordinates: head_dim must be even, got {head_dim}"
        )
    theta = validation.finite_real("rope_theta", rope_theta)
    if theta <= 0:
        raise ValueError(f"rope_theta must be > 0, got {rope_theta}")
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def check_positions(positions: Any, x_shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``positions`` on ``device``, checked against x (..., N, D): (N,), or (B, N) with B = x's
    first axis (x (B, ..., N, D)); integer or float, finite."""
    positions = torch.as_tensor(positions, device=device)
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be integers (or floats), got dtype {positions.dtype}")
    n = x_shape[-2]
    shape = tuple(positions.shape)
    batched = len(x_shape) >= 3 and shape == (x_shape[0], n)
    if shape != (n,) and not batched:
        per_batch = f" or (B, N) = {(x_shape[0], n)}" if len(x_shape) >= 3 else ""
        raise ValueError(
            f"positions must be (N,) = ({n},){per_batch} for x of shape {tuple(x_shape)}, "
            f"got {shape}"
        )
    if positions.is_floating_point() and not bool(torch.isfinite(positions).all()):
        raise ValueError("positions must be finite")
    return positions


def rope(
    x: torch.Tensor,
    positions: Any,
    *,
    inv_freq: Any,
    interleaved: bool = False,
    attention_factor: float = 1.0,
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Rotate each pair of the first R coordinates of x by angle = position * inv_freq, times f.

    (a, b) -> f * (a cos - b sin, a sin + b cos), pair i being (x_i, x_{i+R/2}) (half-split,
    Hugging Face's ``rotate_half``) or (x_{2i}, x_{2i+1}) (interleaved); coordinates R .. D - 1
    pass through (partial rotary; R = 0 is a NoPE layer). Differentiable by autograd (the
    backward rotates by -angle, docs/derivations/rope.md).

    Args:
        x: (..., N, D); typically q or k (B, H, N, D).
        positions: (N,), or (B, N) with B = x's first axis: each batch element its own positions
            (left padding, cache offsets). Integers (or floats), finite.
        inv_freq: (R/2,) frequencies, e.g. ``rope_inv_freq(R, theta)`` or a model's own.
        interleaved: the pair layout.
        attention_factor: f, multiplies cos and sin (YaRN's and LongRoPE's attention factor).
        rotary_dim: R, even, 0 <= R <= D; None for D (which must then be even and > 0).

    Returns:
        (..., N, D) in x's dtype.
    """
    x = validation.float_tensor("x", x)
    rotary = check_rotary_dim(rotary_dim, tuple(x.shape))
    half = rotary // 2
    positions = check_positions(positions, tuple(x.shape), x.device)
    freqs = validation.float_tensor("inv_freq", torch.as_tensor(inv_freq))
    if tuple(freqs.shape) != (half,):
        raise ValueError(
            f"inv_freq must be (R/2,) = ({half},) for x of shape {tuple(x.shape)} and rotary_dim "
            f"R = {rotary}, got {tuple(freqs.shape)}"
        )
    interleaved = validation.flag("interleaved", interleaved)
    factor = validation.finite_real("attention_factor", attention_factor)

    # float64 angles, then tables in x's dtype (numpy_attention.rope says why)
    angles = positions.to(torch.float64)[..., None] * freqs.to(x.device, torch.float64)
    cos = (torch.cos(angles) * factor).to(x.dtype)  # (N, R/2) or (B, N, R/2)
    sin = (torch.sin(angles) * factor).to(x.dtype)
    if positions.ndim == 2:  # (B, N, R/2) -> (B, 1, ..., 1, N, R/2), against x (B, ..., N, D)
        shape = cos.shape[:1] + (1,) * (x.ndim - 3) + cos.shape[1:]
        cos, sin = cos.reshape(shape), sin.reshape(shape)
    turned, passed = x[..., :rotary], x[..., rotary:]  # (..., N, R), (..., N, D - R)
    turned = rotate_pairs(turned, cos, sin, interleaved=interleaved)
    return torch.cat((turned, passed), dim=-1)  # (..., N, D)


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


def rotate_pairs(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False
) -> torch.Tensor:
    """The rotation of ``rope`` with the tables given instead of built from positions:
    (a, b) -> (a cos - b sin, a sin + b cos) on every pair of x (..., N, D); the twin of
    ``numpy_attention.rope.rotate_pairs``. cos and sin (..., N, D/2) broadcast against x's
    leading axes. No checks: the caller has made them.
    """
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]  # (..., N, D/2) each
        pairs = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)  # (..., N, D/2, 2)
        return pairs.flatten(-2)  # -> (..., N, D)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)  # (..., N, D)


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """(..., R) -> (..., R): DeepSeek's interleaved pairs gathered into halves (the NumPy
    twin's ``deinterleave``; autograd differentiates it)."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
