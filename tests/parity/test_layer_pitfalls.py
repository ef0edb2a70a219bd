"""The source tutorials' layer-level mistakes, each rebuilt as a broken torch layer, and the parity
suite flagging it against the NumPy reference (docs/pitfalls.md, "Mistakes that live in layers").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention as na
import torch_attention as ta
from parity_tests.tolerances import FLOAT64_RTOL, rel_error

from ..conftest import to_torch


def parity_error(np_layer, torch_layer, x) -> float:
    """Load the NumPy layer's state into the torch layer and compare their outputs."""
    ta.from_numpy(torch_layer, np_layer)
    expected = np_layer(x)
    actual = torch_layer(to_torch(x)).detach().numpy()
    return rel_error(actual, expected)


class GlobalWeightsV1(ta.SelfAttentionV1):
    """Reads weight matrices from outside instead of its own (as one tutorial's class did)."""

    def __init__(self, d_in, d_out, global_weights):
        super().__init__(d_in, d_out)
        self.global_weights = global_weights

    def forward(self, x):
        w_query, w_key, w_value = self.global_weights
        q, k, v = x @ w_query, x @ w_key, x @ w_value
        probs = torch.softmax(q @ k.transpose(-1, -2) / k.shape[-1] ** 0.5, dim=-1)
        return probs @ v


class WrapperIgnoringBias(ta.MultiHeadAttentionWrapper):
    """Builds its heads without the qkv_bias it was given."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)


class UncutMaskCausal(ta.CausalAttention):
    """Applies the (context_length, context_length) mask buffer without cutting it to N."""

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        scores = (q @ k.transpose(1, 2)).masked_fill(self.mask.bool(), float("-inf"))
        return torch.softmax(scores / k.shape[-1] ** 0.5, dim=-1) @ v


class InitTypo(torch.nn.Module):
    """``_init_`` instead of ``__init__``: the constructor never runs."""

    def _init_(self, d_in, d_out):  # the typo under test
        super().__init__()
        self.W_query = torch.nn.Linear(d_in, d_out)


def test_a_layer_reading_global_weights_is_flagged(rng):
    reference = na.SelfAttentionV1(3, 4, rng=rng).astype(np.float64)
    stale = tuple(torch.rand(3, 4, dtype=torch.float64) for _ in range(3))
    broken = GlobalWeightsV1(3, 4, stale).double()

    assert parity_error(reference, broken, rng.standard_normal((2, 5, 3))) > 1e3 * FLOAT64_RTOL


def test_the_correct_v1_passes_the_same_check(rng):
    reference = na.SelfAttentionV1(3, 4, rng=rng).astype(np.float64)

    error = parity_error(
        reference, ta.SelfAttentionV1(3, 4).double(), rng.standard_normal((2, 5, 3))
    )

    assert error <= FLOAT64_RTOL


def test_a_wrapper_ignoring_qkv_bias_is_flagged(rng):
    reference = na.MultiHeadAttentionWrapper(3, 4, 8, 0.0, 2, qkv_bias=True, rng=rng)

    with pytest.raises(KeyError, match=r"heads\.0\.W_query\.bias"):
        ta.from_numpy(WrapperIgnoringBias(3, 4, 8, 0.0, 2, qkv_bias=True), reference)


@pytest.mark.parametrize("n", [5, 8])
def test_a_mask_not_cut_to_the_sequence_length_is_flagged(rng, n):
    reference = na.CausalAttention(3, 4, 8, 0.0, rng=rng).astype(np.float64).eval()
    broken = UncutMaskCausal(3, 4, 8, 0.0).double().eval()
    x = rng.standard_normal((2, n, 3))

    if n < 8:  # shorter than the context: the uncut mask does not even fit the scores
        with pytest.raises(RuntimeError, match="size"):
            parity_error(reference, broken, x)
    else:  # at full length the bug is invisible, which is why the registry runs N < context
        assert parity_error(reference, broken, x) <= FLOAT64_RTOL


def test_an_init_typo_is_flagged():
    with pytest.raises(TypeError):
        InitTypo(3, 4)
