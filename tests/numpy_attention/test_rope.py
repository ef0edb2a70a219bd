"""Rotary position embedding (numpy_attention.rope): gradcheck of both layouts with shared and
per-batch positions, torch autograd in float64, the properties that make it RoPE (relative
positions, a rotation's inverse), the default frequencies, float32 with float64 angles, bad input;
the interleaved pairs of latent attention gathered into halves and back.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.gradcheck import gradcheck
from numpy_attention.rope import (
    deinterleave,
    deinterleave_backward,
    rope_backward,
    rope_forward,
    rope_inv_freq,
)

from ..conftest import assert_close, assert_gradcheck, to_torch

B, H, N, D = 2, 3, 7, 8
LAYOUTS = {"half": False, "interleaved": True}


def torch_rope(x, positions, inv_freq, *, interleaved, factor=1.0):
    """The oracle, torch tensors: half-split as Hugging Face writes it (``rotate_half``), the
    interleaved layout as a complex product, each pair (a, b) as a + ib times f e^{i angle}.

    x (..., N, D); positions (N,) or (B, N), with B x's first axis.
    """
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (N, D/2) or (B, N, D/2)
    if positions.dim() == 2:
        angles = angles.reshape(angles.shape[:1] + (1,) * (x.dim() - 3) + angles.shape[1:])
    if interleaved:
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
        turned = pairs * torch.polar(torch.full_like(angles, factor), angles)
        return torch.view_as_real(turned).flatten(-2)
    emb = torch.cat([angles, angles], dim=-1)  # (..., N, D)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # rotate_half
    return x * (emb.cos() * factor) + rotated * (emb.sin() * factor)


def positions_for(kind, rng, batch=B, n=N):
    """Shared positions (N,), or per-batch (B, N) as left padding and a cache offset make them."""
    if kind == "shared":
        return np.arange(n) + 3
    return np.stack([np.arange(n) + 5 * b - 2 for b in range(batch)])  # negative ones included


# (shape of x, kind of positions): every rank rope meets, per-batch positions where x is batched
CASES = [
    ((N, D), "shared"),
    ((B, N, D), "shared"),
    ((B, N, D), "per_batch"),
    ((B, H, N, D), "shared"),
    ((B, H, N, D), "per_batch"),
]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("shape", "kind"), CASES, ids=[f"{len(s)}d-{k}" for s, k in CASES])
def test_gradcheck(rng, layout, shape, kind):
    x = rng.standard_normal(shape)

    report = gradcheck(
        rope_forward,
        x,
        backward=rope_backward,
        positions=positions_for(kind, rng),
        inv_freq=rope_inv_freq(D),
        interleaved=LAYOUTS[layout],
        attention_factor=1.3,
    )

    assert_gradcheck(report)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("shape", "kind"), CASES, ids=[f"{len(s)}d-{k}" for s, k in CASES])
@pytest.mark.parametrize("factor", [1.0, 0.7])
def test_matches_torch_autograd(rng, layout, shape, kind, factor):
    x = rng.standard_normal(shape)
    positions = positions_for(kind, rng)
    inv_freq = rope_inv_freq(D, 500.0)
    dout = rng.standard_normal(shape)
    tx = to_torch(x, requires_grad=True)

    out, ctx = rope_forward(
        x, positions, inv_freq=inv_freq, interleaved=LAYOUTS[layout], attention_factor=factor
    )
    dx = rope_backward(dout, ctx)
    expected = torch_rope(
        tx, to_torch(positions), to_torch(inv_freq), interleaved=LAYOUTS[layout], factor=factor
    )
    expected.backward(to_torch(dout))

    assert_close(out, expected, name="out")
    assert_close(dx, tx.grad, name="dx")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_partial_rotary_turns_the_first_r_coordinates_as_a_head_of_width_r(rng, layout):
    """GLM's and Phi-3's partial rotary: coordinates 0 .. R-1 rotate exactly as a head of width
    R would (pairs and frequencies within them), R .. D-1 pass through; gradcheck and torch
    autograd on that reading."""
    x = rng.standard_normal((B, H, N, D))
    positions = positions_for("per_batch", rng)
    options = {"inv_freq": rope_inv_freq(4, 500.0), "interleaved": LAYOUTS[layout]}
    dout = rng.standard_normal(x.shape)
    tx = to_torch(x, requires_grad=True)

    out, ctx = rope_forward(x, positions, attention_factor=1.3, rotary_dim=4, **options)
    dx = rope_backward(dout, ctx)
    head = torch_rope(
        tx[..., :4], to_torch(positions), to_torch(options["inv_freq"]),
        interleaved=LAYOUTS[layout], factor=1.3,
    )  # fmt: skip
    expected = torch.cat([head, tx[..., 4:]], dim=-1)
    expected.backward(to_torch(dout))
    report = gradcheck(
        rope_forward, x, backward=rope_backward, positions=positions, rotary_dim=4, **options
    )

    assert_close(out, expected, name="out")
    assert_close(dx, tx.grad, name="dx")
    assert np.array_equal(out[..., 4:], x[..., 4:]) and np.array_equal(dx[..., 4:], dout[..., 4:])
    assert_gradcheck(report)


def test_rotary_dim_0_is_the_identity(rng):
    """A NoPE layer (SmolLM 3's, Cohere 2's full layers): no coordinate turns."""
    x = rng.standard_normal((B, N, D))
    dout = rng.standard_normal(x.shape)

    out, ctx = rope_forward(x, np.arange(N), inv_freq=np.zeros(0), rotary_dim=0)

    assert np.array_equal(out, x) and np.array_equal(rope_backward(dout, ctx), dout)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_scores_depend_only_on_the_distance_between_positions(rng, layout):
    """RoPE's point: rope(q, m) . rope(k, n) is a function of m - n. Shifting both positions
    leaves every score unchanged; shifting one changes them."""
    q, k = rng.standard_normal((2, N, D))
    inv_freq = rope_inv_freq(D)
    options = {"inv_freq": inv_freq, "interleaved": LAYOUTS[layout]}
    positions = np.arange(N)

    def scores(shift_q, shift_k):
        rq = rope_forward(q, positions + shift_q, **options)[0]
        rk = rope_forward(k, positions + shift_k, **options)[0]
        return rq @ rk.T  # (N, N)

    assert_close(scores(11, 11), scores(0, 0), name="shifted both")
    assert np.abs(scores(1, 0) - scores(0, 0)).max() > 1e-2 * np.abs(scores(0, 0)).max()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_backward_is_the_inverse_rotation(rng, layout):
    """R^T R = I: the backward of f R applied to f R x gives f^2 x, and position 0 is f x."""
    x = rng.standard_normal((B, H, N, D))
    positions = positions_for("per_batch", rng)
    options = {"inv_freq": rope_inv_freq(D), "interleaved": LAYOUTS[layout]}

    out, ctx = rope_forward(x, positions, attention_factor=1.5, **options)
    at_zero, _ = rope_forward(x, np.zeros(N, dtype=int), attention_factor=1.5, **options)

    assert_close(rope_backward(out, ctx), 2.25 * x, name="R^T R x")
    assert_close(at_zero, 1.5 * x, name="position 0")
    assert_close(np.linalg.norm(out, axis=-1), 1.5 * np.linalg.norm(x, axis=-1), name="norms")


def test_the_layouts_differ_by_a_permutation_of_coordinates(rng):
    """Interleaved pair i is (2i, 2i+1), half-split pair i is (i, i + D/2): reordering the
    coordinates [0, 2, 4, ..., 1, 3, 5, ...] turns one into the other."""
    x = rng.standard_normal((B, N, D))
    positions = positions_for("shared", rng)
    order = np.concatenate([np.arange(0, D, 2), np.arange(1, D, 2)])  # interleaved -> half-split
    inv_freq = rope_inv_freq(D)

    interleaved, _ = rope_forward(x, positions, inv_freq=inv_freq, interleaved=True)
    half, _ = rope_forward(x[..., order], positions, inv_freq=inv_freq, interleaved=False)

    assert_close(half, interleaved[..., order], name="permuted")


def test_default_frequencies_are_theta_to_the_minus_2i_over_d():
    """The formula, and Hugging Face's float32 computation of it (the converter passes the
    model's own float32 values; they agree to float32 rounding)."""
    theta = 1_000_000.0
    hf = 1.0 / (theta ** (torch.arange(0, 128, 2, dtype=torch.int64).to(torch.float) / 128))

    freqs = rope_inv_freq(128, theta)

    assert freqs.dtype == np.float64 and freqs.shape == (64,)
    assert freqs[0] == 1.0 and freqs[1] == theta ** (-2 / 128)
    assert_close(freqs.astype(np.float32), hf, name="Hugging Face's inv_freq")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_float32_keeps_its_dtype_with_float64_angles(rng, layout):
    """At position ~1e5 a float32 angle is off by up to 4e-3 rad; the tables are computed in
    float64, so float32 RoPE stays within float32 rounding of the float64 result."""
    x = rng.standard_normal((B, N, D))
    positions = 100_003 + np.arange(N)
    options = {"inv_freq": rope_inv_freq(D), "interleaved": LAYOUTS[layout]}
    dout = rng.standard_normal(x.shape)

    out32, ctx32 = rope_forward(x.astype(np.float32), positions, **options)
    out64, ctx64 = rope_forward(x, positions, **options)
    dx32 = rope_backward(dout.astype(np.float32), ctx32)

    assert out32.dtype == dx32.dtype == np.float32
    assert_close(out32, out64, dtype=np.float32, name="out")
    assert_close(dx32, rope_backward(dout, ctx64), dtype=np.float32, name="dx")


@pytest.mark.parametrize(
    ("x_shape", "positions", "inv_freq_len", "error", "match"),
    [
        ((B, N, 7), np.arange(N), 3, ValueError, r"even head width.*\(2, 7, 7\)"),
        ((N,), np.arange(N), 4, ValueError, r"even head width"),
        ((B, N, D), np.arange(N), 3, ValueError, r"inv_freq must be \(R/2,\) = \(4,\).*got \(3,\)"),
        ((B, N, D), np.arange(N + 1), 4, ValueError, r"positions must be \(N,\) = \(7,\).*\(8,\)"),
        ((B, N, D), np.zeros((B + 1, N), int), 4, ValueError, r"\(B, N\) = \(2, 7\).*\(3, 7\)"),
        ((B, N, D), np.zeros((B, N, 1), int), 4, ValueError, r"positions.*\(2, 7, 1\)"),
        ((N, D), np.zeros((1, N), int), 4, ValueError, r"positions must be \(N,\) = \(7,\) for"),
        ((B, N, D), np.ones(N, bool), 4, TypeError, r"positions must be integers.*bool"),
        ((B, N, D), np.full(N, np.nan), 4, ValueError, r"positions must be finite"),
    ],
)
def test_bad_input_is_refused_naming_the_shapes(
    rng, x_shape, positions, inv_freq_len, error, match
):
    x = rng.standard_normal(x_shape)

    with pytest.raises(error, match=match):
        rope_forward(x, positions, inv_freq=np.ones(inv_freq_len))


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"interleaved": 1}, TypeError, "interleaved must be a bool"),
        ({"attention_factor": np.inf}, ValueError, "attention_factor must be finite"),
        ({"inv_freq": np.arange(4)}, TypeError, "inv_freq must be a floating-point array"),
        ({"rotary_dim": 3}, ValueError, r"rotary_dim must be even .* D = 8 .* got 3"),
        ({"rotary_dim": 10}, ValueError, r"at most D = 8 for x of shape \(2, 7, 8\), got 10"),
        ({"rotary_dim": -2}, ValueError, "rotary_dim must be a non-negative int"),
    ],
)
def test_bad_options_are_refused(rng, options, error, match):
    x = rng.standard_normal((B, N, D))

    with pytest.raises(error, match=match):
        rope_forward(x, np.arange(N), **{"inv_freq": rope_inv_freq(D), **options})


@pytest.mark.parametrize(
    ("head_dim", "theta", "error", "match"),
    [
        (7, 10000.0, ValueError, "head_dim must be even, got 7"),
        (0, 10000.0, ValueError, "head_dim must be a positive int"),
        (8, 0.0, ValueError, "rope_theta must be > 0"),
        (8, "1e4", TypeError, "rope_theta must be a real number"),
    ],
)
def test_inv_freq_refuses_bad_arguments(head_dim, theta, error, match):
    with pytest.raises(error, match=match):
        rope_inv_freq(head_dim, theta)


def test_backward_checks_dout_shape(rng):
    x = rng.standard_normal((B, N, D))
    _, ctx = rope_forward(x, np.arange(N), inv_freq=rope_inv_freq(D))

    with pytest.raises(ValueError, match=r"dout must have the output's shape \(2, 7, 8\)"):
        rope_backward(np.zeros((B, N, D + 2)), ctx)


def test_deinterleave_gathers_the_pairs_into_halves_and_back(rng):
    x = rng.standard_normal((2, 3, 6))

    np.testing.assert_array_equal(deinterleave(np.arange(6.0)), [0, 2, 4, 1, 3, 5])
    np.testing.assert_array_equal(deinterleave_backward(deinterleave(x)), x)


def test_negated_frequencies_turn_the_pairs_the_other_way_as_nanochat_does(rng):
    """nanochat's rotate_half is (x2, -x1), Llama's (-x2, x1): x cos + rotate_half(x) sin turns
    each pair by -angle, which is RoPE with -inv_freq (cos even, sin odd); the backward too."""
    x = rng.standard_normal((B, H, N, D))
    dout = rng.standard_normal(x.shape)
    positions = np.arange(N)
    inv_freq = rope_inv_freq(D, 500.0)
    x_t = to_torch(x, requires_grad=True)
    angles = torch.from_numpy(np.outer(positions, inv_freq))  # (N, D/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    first, second = x_t[..., : D // 2], x_t[..., D // 2 :]
    expected = x_t * cos + torch.cat([second, -first], -1) * sin  # nanochat's apply_rotary_pos_emb
    expected.backward(to_torch(dout))

    out, ctx = rope_forward(x, positions, inv_freq=-inv_freq)
    dx = rope_backward(dout, ctx)

    assert_close(out, expected, name="out")
    assert_close(dx, x_t.grad, name="dx")
    assert np.abs(out - rope_forward(x, positions, inv_freq=inv_freq)[0]).max() > 0.1
