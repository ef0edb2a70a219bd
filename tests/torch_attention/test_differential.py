"""torch_attention.differential, differential attention's torch twin, against the NumPy pairs it
mirrors (numpy_attention.differential): the combination of paired heads and its autograd
gradients (the four lambdas too), the values' halves side by side, the dtype kept, and the rules
shared. The twin inside the layer is tests/torch_attention/test_grouped.py's.
"""

from __future__ import annotations

import pytest
import torch

from numpy_attention import differential as np_differential
from torch_attention import differential as torch_differential

from ..conftest import assert_close, to_numpy, to_torch

B, N, D = 2, 3, 4


@pytest.mark.parametrize("heads", [2, 6])
@pytest.mark.parametrize(("lambda_init", "eps"), [(0.2, 1e-5), (0.75, 0.5)])
def test_combination_and_gradients_match_the_numpy_pair(rng, heads, lambda_init, eps):
    o = rng.standard_normal((B, heads, N, 2 * D))
    lambdas = tuple(0.5 * rng.standard_normal(D) for _ in range(4))
    dout = rng.standard_normal((B, heads // 2, N, 2 * D))
    o_t = to_torch(o, requires_grad=True)
    lambdas_t = tuple(to_torch(array, requires_grad=True) for array in lambdas)

    out_t = torch_differential.differential(o_t, lambdas_t, lambda_init, eps)
    out_t.backward(to_torch(dout))
    out, ctx = np_differential.differential_forward(o, lambdas, lambda_init, eps)
    do, dlambdas = np_differential.differential_backward(dout, ctx)

    assert_close(to_numpy(out_t), out, name="out")
    assert_close(to_numpy(o_t.grad), do, name="dheads")
    for name, tensor, grad in zip(np_differential.LAMBDA_NAMES, lambdas_t, dlambdas, strict=True):
        assert_close(to_numpy(tensor.grad), grad, name=name)


@pytest.mark.parametrize("kv_heads", [2, 4, 6])
def test_values_match_the_numpy_pair(rng, kv_heads):
    v = rng.standard_normal((B, kv_heads, N, D))

    out = torch_differential.differential_values(to_torch(v))

    assert_close(to_numpy(out), np_differential.differential_values_forward(v), name="values")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keeps_the_dtype(rng, dtype):
    o = torch.from_numpy(rng.standard_normal((B, 4, N, 2 * D))).to(dtype)
    lambdas = tuple(torch.from_numpy(rng.standard_normal(D)).to(dtype) for _ in range(4))

    assert torch_differential.differential(o, lambdas, 0.2, 1e-5).dtype == dtype
    assert torch_differential.differential_values(o).dtype == dtype


def test_the_rules_are_the_numpy_twins():
    assert torch_differential.check_differential is np_differential.check_differential
    assert torch_differential.lambda_init_from_depth is np_differential.lambda_init_from_depth
