"""The NumPy attention core: gradcheck, torch autograd in float64, SDPA outputs, masks, dtypes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numpy_attention.functional import attention, attention_backward, attention_forward
from numpy_attention.gradcheck import gradcheck

from ..conftest import assert_close, assert_gradcheck, to_torch

# (leading axes, N, M, D, Dv): N != M, Dv != D, B = H = 1, unbatched, odd sizes.
SHAPES = {
    "B2H3-N5-M7-D4-Dv6": ((2, 3), 5, 7, 4, 6),
    "B1H1-N3-M3-D2": ((1, 1), 3, 3, 2, 2),
    "B2-N7-M5-D3-Dv2": ((2,), 7, 5, 3, 2),
    "unbatched-N4-M6": ((), 4, 6, 3, 5),
}
MASKS = ["none", "bool", "float"]
# key_padding_mask needs a batched q: unbatched + padding is a ValueError, tested on its own.
SHAPE_PADDING = [
    (name, padded) for name in SHAPES for padded in (False, True) if SHAPES[name][0] or not padded
]


def make_qkv(rng, lead, n, m, d, dv, dtype=np.float64):
    q = rng.standard_normal((*lead, n, d)).astype(dtype)
    k = rng.standard_normal((*lead, m, d)).astype(dtype)
    v = rng.standard_normal((*lead, m, dv)).astype(dtype)
    return q, k, v


def make_attn_mask(rng, kind, n, m):
    """A (N, M) mask with one fully masked query row (row 0) whatever its kind."""
    if kind == "none":
        return None
    allowed = rng.random((n, m)) > 0.3
    allowed[0] = False
    allowed[1:, 0] = True  # every other row keeps at least one key
    if kind == "bool":
        return allowed
    bias = rng.standard_normal((n, m))
    return np.where(allowed, bias, -np.inf)


def make_padding(lead, m):
    """(B, M) key padding: the last batch element fully padded, the first one's last key padded."""
    padding = np.zeros((lead[0], m), dtype=bool)
    padding[0, -1] = True
    padding[-1] = True if lead[0] > 1 else padding[-1]
    return padding


def options(rng, shape_name, causal, mask_kind, padded, dropout):
    lead, n, m, d, dv = SHAPES[shape_name]
    kwargs = {"causal": causal, "attn_mask": make_attn_mask(rng, mask_kind, n, m)}
    if padded:
        kwargs["key_padding_mask"] = make_padding(lead, m)
    if dropout:
        kwargs["dropout_p"] = 0.25
        kwargs["dropout_mask"] = rng.random((*lead, n, m)) > 0.25
    return kwargs


@pytest.mark.parametrize(("shape_name", "padded"), SHAPE_PADDING)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("dropout", [False, True])
def test_gradcheck(rng, shape_name, causal, mask_kind, padded, dropout):
    q, k, v = make_qkv(rng, *SHAPES[shape_name])
    kwargs = options(rng, shape_name, causal, mask_kind, padded, dropout)

    report = gradcheck(attention_forward, q, k, v, backward=attention_backward, **kwargs)

    assert_gradcheck(report)


def torch_reference(q, k, v, *, causal, attn_mask, key_padding_mask, dropout_p, dropout_mask):
    """Attention in explicit torch ops (autograd does the backward), fully masked rows -> 0."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    n, m = scores.shape[-2:]
    allowed = torch.ones(scores.shape, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(n, m, dtype=torch.bool).tril()
    if key_padding_mask is not None:
        view = (key_padding_mask.shape[0],) + (1,) * (q.dim() - 2) + (m,)
        allowed = allowed & ~key_padding_mask.reshape(view)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        else:
            scores = scores + attn_mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    # Rows with nothing to attend to: softmax of 0s, then zeroed, so no NaN reaches autograd.
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    if dropout_mask is not None:
        probs = probs * dropout_mask / (1 - dropout_p)
    return probs @ v


@pytest.mark.parametrize(("shape_name", "padded"), SHAPE_PADDING)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("dropout", [False, True])
def test_matches_torch_autograd_float64(rng, shape_name, causal, mask_kind, padded, dropout):
    q, k, v = make_qkv(rng, *SHAPES[shape_name])
    kwargs = options(rng, shape_name, causal, mask_kind, padded, dropout)
    dout = rng.standard_normal(q.shape[:-1] + v.shape[-1:])
    tq, tk, tv = (to_torch(t, requires_grad=True) for t in (q, k, v))
    torch_kwargs = {
        "causal": causal,
        "attn_mask": None if kwargs["attn_mask"] is None else to_torch(kwargs["attn_mask"]),
        "key_padding_mask": to_torch(kwargs["key_padding_mask"]) if padded else None,
        "dropout_p": kwargs.get("dropout_p", 0.0),
        "dropout_mask": to_torch(kwargs["dropout_mask"]) if dropout else None,
    }

    out, _, ctx = attention_forward(q, k, v, **kwargs)
    grads = attention_backward(dout, ctx)[:3]
    expected = torch_reference(tq, tk, tv, **torch_kwargs)
    expected.backward(to_torch(dout))

    assert_close(out, expected, name="out")
    for name, grad, tensor in zip(("dq", "dk", "dv"), grads, (tq, tk, tv), strict=True):
        assert_close(grad, tensor.grad, name=name)


@pytest.mark.parametrize("shape_name", ["B2H3-N5-M7-D4-Dv6", "B1H1-N3-M3-D2"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_matches_sdpa_output(rng, shape_name, causal, mask_kind, scale):
    lead, n, m, d, dv = SHAPES[shape_name]
    q, k, v = make_qkv(rng, lead, n, m, d, dv)
    attn_mask = make_attn_mask(rng, mask_kind, n, m)
    if attn_mask is not None:
        attn_mask[0] = True if mask_kind == "bool" else 0.0  # SDPA's float path NaNs on -inf rows

    out = attention(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    sdpa_mask = None if attn_mask is None else to_torch(attn_mask)
    if causal and sdpa_mask is not None:  # SDPA takes is_causal or attn_mask, not both
        causal_allowed = torch.ones(n, m, dtype=torch.bool).tril()
        if sdpa_mask.dtype == torch.bool:
            sdpa_mask = sdpa_mask & causal_allowed
        else:
            sdpa_mask = sdpa_mask.masked_fill(~causal_allowed, float("-inf"))
    expected = F.scaled_dot_product_attention(
        *(to_torch(t) for t in (q, k, v)),
        attn_mask=sdpa_mask,
        is_causal=causal and sdpa_mask is None,
        scale=scale,
    )

    assert_close(out, expected, name="out")


def test_fully_masked_rows_give_zero_output_and_zero_gradient(rng):
    q, k, v = make_qkv(rng, (2, 2), 4, 5, 3, 3)
    padding = np.zeros((2, 5), dtype=bool)
    padding[1] = True
    allowed = np.ones((4, 5), dtype=bool)
    allowed[2] = False

    out, _, ctx = attention_forward(q, k, v, key_padding_mask=padding, attn_mask=allowed)
    dq, dk, dv, _ = attention_backward(rng.standard_normal(out.shape), ctx)

    assert np.all(np.isfinite(out)) and np.all(np.isfinite(dq))
    assert np.all(out[1] == 0) and np.all(out[0, :, 2] == 0)
    assert np.all(dq[1] == 0) and np.all(dq[0, :, 2] == 0)
    assert np.all(dk[1] == 0) and np.all(dv[1] == 0)
    assert np.any(out[0, :, 0] != 0)


def test_dropout_mask_rescales_kept_weights(rng):
    q, k, v = make_qkv(rng, (1,), 3, 4, 2, 2)
    keep = rng.random((1, 3, 4)) > 0.5

    dropped = attention(q, k, v, dropout_p=0.5, dropout_mask=keep)
    ctx = attention_forward(q, k, v).ctx
    expected = (ctx.probs * keep * 2.0) @ v

    np.testing.assert_array_equal(dropped, expected)


def test_dropout_without_mask_is_reproducible_from_the_seed(rng):
    q, k, v = make_qkv(rng, (2,), 6, 6, 3, 3)

    first = attention(q, k, v, dropout_p=0.3, rng=7)
    second = attention(q, k, v, dropout_p=0.3, rng=7)
    plain = attention(q, k, v)

    np.testing.assert_array_equal(first, second)
    assert not np.allclose(first, plain)


def test_causal_is_top_left_aligned_when_n_differs_from_m(rng):
    q, k, v = make_qkv(rng, (1,), 3, 5, 2, 2)

    out, _, ctx = attention_forward(q, k, v, causal=True)

    expected_allowed = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=bool)
    np.testing.assert_array_equal(ctx.probs[0] > 0, expected_allowed)


def test_default_scale_is_inverse_sqrt_of_head_width(rng):
    q, k, v = make_qkv(rng, (1,), 3, 3, 4, 2)

    assert_close(attention(q, k, v), attention(q, k, v, scale=0.5), name="out")
    with pytest.raises(AssertionError):
        assert_close(attention(q, k, v), attention(q, k, v, scale=0.25), name="out")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_stays_in_its_dtype(rng, dtype):
    q, k, v = make_qkv(rng, (2,), 5, 6, 4, 3, dtype=dtype)
    mask = np.where(rng.random((5, 6)) > 0.5, 0.0, -1.0)  # a float64 mask must not promote

    out, _, ctx = attention_forward(q, k, v, causal=True, attn_mask=mask, scale=np.float64(0.5))
    grads = attention_backward(rng.standard_normal(out.shape).astype(dtype), ctx)[:3]

    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert (
        ctx.probs.dtype == np.float32 and ctx.q_scaled.dtype == np.float32
    )  # float16 -> float32 inside


def test_float32_is_accurate_to_float32_rounding(rng):
    q, k, v = make_qkv(rng, (2, 3), 37, 113, 16, 16)

    out = attention(*(t.astype(np.float32) for t in (q, k, v)), causal=True)
    reference = attention(q, k, v, causal=True)

    assert_close(out, reference.astype(np.float32), dtype=np.float32, name="out")


def test_float16_is_computed_in_float32_and_rounded_once(rng):
    q, k, v = make_qkv(rng, (2,), 7, 9, 4, 4, dtype=np.float16)

    out = attention(q, k, v, causal=True)
    in_float32 = attention(*(t.astype(np.float32) for t in (q, k, v)), causal=True)

    np.testing.assert_array_equal(out, in_float32.astype(np.float16))
