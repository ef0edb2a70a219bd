"""torch_attention.rules: the checks of ``prepare`` and the rules it keeps in the form the
backends read (float masks' -inf as hidden positions, half types computed in float32, the
default scale, causal, windows and the alignment as one band, slopes and sinks shaped to
broadcast, padded rows of k and v zeroed before any product). The NumPy twin's:
tests/numpy_attention/test_rules.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_attention.rules import prepare

from ..conftest import to_torch

NAN = float("nan")


def qkv(rng, n=5, m=7, d=4):
    q, k, v = (to_torch(rng.standard_normal(shape)) for shape in ((2, n, d), (2, m, d), (2, m, 3)))
    return q, k, v


def rules_for(rng, n=5, m=7, **options):
    q = to_torch(rng.standard_normal((2, 4, n, 3)))
    k = to_torch(rng.standard_normal((2, 4, m, 3)))
    return prepare(q, k, k, **options).rules


def test_prepare_turns_the_minus_inf_of_a_float_mask_into_hidden_positions(rng):
    bias = rng.standard_normal((5, 7))
    bias[1, 2] = -np.inf

    _, _, _, rules = prepare(*qkv(rng), attn_mask=to_torch(bias))

    assert rules.bias[1, 2] == 0.0
    assert not rules.allowed[1, 2]
    assert int(rules.allowed.sum()) == 5 * 7 - 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_prepare_computes_half_types_in_float32(rng, dtype):
    q, k, v = (t.to(dtype) for t in qkv(rng))

    rules = prepare(q, k, v, attn_mask=torch.zeros(5, 7, dtype=dtype)).rules

    expected = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    assert rules.compute == expected and rules.bias.dtype == expected


def test_prepare_defaults_the_scale_to_one_over_sqrt_d(rng):
    assert prepare(*qkv(rng, d=9)).rules.scale == 1 / 3


@pytest.mark.parametrize(
    ("options", "offset", "left", "right"),
    [
        ({}, 0, None, None),
        ({"causal": True}, 0, None, 0),
        ({"causal": True, "align": "bottom-right"}, 2, None, 0),
        ({"window": (2, 3)}, 0, 2, 3),
        ({"window": (2, 3), "causal": True}, 0, 2, 0),
        ({"window": (None, 1), "align": "bottom-right"}, 2, None, 1),
    ],
)
def test_prepare_turns_causal_window_and_align_into_one_band(rng, options, offset, left, right):
    rules = rules_for(rng, **options)

    assert (rules.offset, rules.left, rules.right) == (offset, left, right)


def test_prepare_shapes_alibi_slopes_and_sinks_to_broadcast_on_the_scores(rng):
    slopes, sinks = to_torch(rng.random(4)), to_torch(rng.standard_normal(4))
    batch_slopes = to_torch(rng.random((2, 4)))

    rules = rules_for(rng, alibi_slopes=slopes, sinks=sinks)
    batched = rules_for(rng, alibi_slopes=batch_slopes)

    assert torch.equal(rules.slopes, slopes[:, None, None])
    assert torch.equal(rules.sinks, sinks[:, None, None])
    assert torch.equal(batched.slopes, batch_slopes[:, :, None, None])


def test_padding_rows_of_k_and_v_are_zeroed_before_any_product(rng):
    q, k, _ = qkv(rng)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[0, 5:] = True
    k[0, 5:] = NAN

    prepared_k = prepare(q, k, k, key_padding_mask=padding).k

    assert torch.equal(prepared_k[0, 5:], torch.zeros(2, 4, dtype=torch.float64))
    assert torch.equal(prepared_k[:, :5], k[:, :5]) and torch.equal(prepared_k[1], k[1])
