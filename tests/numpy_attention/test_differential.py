"""Differential attention's pure pairs (numpy_attention.differential): finite differences and torch
autograd of the combination of paired heads (the four lambdas included) and of the values' halves
side by side, float32 kept, lambda_init as DiffLlama computes it, and the option rules. The layer
with differential attention (against DiffLlama's two attention calls, gradcheck, decoding, bad
options) is tests/numpy_attention/test_grouped.py's; against transformers,
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numpy_attention import gradcheck
from numpy_attention.differential import (
    check_differential,
    differential_backward,
    differential_forward,
    differential_values_backward,
    differential_values_forward,
    lambda_init_from_depth,
)

from ..conftest import assert_close, assert_gradcheck, to_torch

B, N, D = 2, 3, 4


def combine(heads, q1, k1, q2, k2, *, lambda_init, norm_eps):
    """``differential_forward`` with the lambdas as separate inputs (for gradcheck, whose own
    ``eps`` is its step)."""
    return differential_forward(heads, (q1, k1, q2, k2), lambda_init, norm_eps)


def combine_backward(dout, ctx):
    dheads, dlambdas = differential_backward(dout, ctx)
    return (dheads, *dlambdas)


def values_forward(v):
    return differential_values_forward(v), None


def values_backward(dout, ctx):
    return differential_values_backward(dout)


def draw(rng, heads, scale=0.5):
    """O (B, H, N, 2D) and four lambda vectors (D,) at a scale where lambda is neither 1 nor
    lambda_init alone."""
    return rng.standard_normal((B, heads, N, 2 * D)), *(
        scale * rng.standard_normal(D) for _ in range(4)
    )


def torch_combine(heads, q1, k1, q2, k2, lambda_init, eps):
    """DiffLlama's combination, its steps in torch: chunk the heads, subtract, nn.RMSNorm's
    functional form without a weight, scale."""
    first, second = heads.chunk(2, dim=1)
    lambda_full = torch.exp((q1 * k1).sum()) - torch.exp((q2 * k2).sum()) + lambda_init
    normed = F.rms_norm(first - lambda_full * second, (heads.shape[-1],), None, eps)
    return (1 - lambda_init) * normed


@pytest.mark.parametrize("heads", [2, 6])
@pytest.mark.parametrize(("lambda_init", "eps"), [(0.2, 1e-5), (0.75, 0.5)])
def test_combination_gradcheck(rng, heads, lambda_init, eps):
    report = gradcheck(
        combine,
        *draw(rng, heads),
        backward=combine_backward,
        lambda_init=lambda_init,
        norm_eps=eps,
    )

    assert_gradcheck(report)


@pytest.mark.parametrize("heads", [2, 6])
@pytest.mark.parametrize(("lambda_init", "eps"), [(0.2, 1e-5), (0.75, 0.5)])
def test_combination_matches_torch_autograd(rng, heads, lambda_init, eps):
    inputs = draw(rng, heads)
    dout = rng.standard_normal((B, heads // 2, N, 2 * D))
    tensors = [to_torch(array, requires_grad=True) for array in inputs]
    expected = torch_combine(*tensors, lambda_init, eps)
    expected.backward(to_torch(dout))

    out, ctx = combine(*inputs, lambda_init=lambda_init, norm_eps=eps)
    grads = combine_backward(dout, ctx)

    assert_close(out, expected, name="out")
    names = ("dheads", "dq1", "dk1", "dq2", "dk2")
    for name, grad, tensor in zip(names, grads, tensors, strict=True):
        assert_close(grad, tensor.grad, name=name)


@pytest.mark.parametrize("kv_heads", [2, 4, 6])
def test_values_gradcheck(rng, kv_heads):
    v = rng.standard_normal((B, kv_heads, N, D))

    assert_gradcheck(gradcheck(values_forward, v, backward=values_backward))


@pytest.mark.parametrize("kv_heads", [2, 4, 6])
def test_values_are_diffllamas_halves_each_repeated(rng, kv_heads):
    """Head j of the values read: DiffLlama's first call's value head j beside its second's, each
    half of the heads repeated to H_kv heads (``torch.chunk(v, 2, dim=1)``, ``.repeat``)."""
    v = rng.standard_normal((B, kv_heads, N, D))
    first, second = (half.repeat(1, 2, 1, 1) for half in to_torch(v).chunk(2, dim=1))

    out = differential_values_forward(v)

    assert_close(out, torch.cat([first, second], dim=-1), name="values")


def test_float32_stays_float32(rng):
    heads, *lambdas = (array.astype(np.float32) for array in draw(rng, 4))

    out, ctx = differential_forward(heads, tuple(lambdas), 0.2, 1e-5)
    dheads, dlambdas = differential_backward(out, ctx)
    values = differential_values_forward(heads)

    assert out.dtype == dheads.dtype == values.dtype == np.float32
    assert all(grad.dtype == np.float32 for grad in dlambdas)
    assert differential_values_backward(values).dtype == np.float32


@pytest.mark.parametrize("layer_idx", [0, 1, 7, 31])
def test_lambda_init_is_diffllamas(layer_idx):
    diffllama = pytest.importorskip("transformers.models.diffllama.modeling_diffllama")

    assert lambda_init_from_depth(layer_idx) == diffllama.lambda_init_fn(layer_idx)


def test_lambda_init_needs_a_layer_index():
    with pytest.raises(ValueError, match="layer_idx"):
        lambda_init_from_depth(-1)


def test_the_rules_return_lambda_init_or_none():
    layer = {"output_gate": None, "output_norm": False, "dropout": 0.0}

    assert check_differential(False, None, 1e-6, 1, **layer) is None
    assert check_differential(True, 0.25, 1e-5, 2, **layer) == 0.25
