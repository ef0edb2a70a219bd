"""Every public function of the core rejects bad input with a clear error, before any work."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.functional import attention, attention_backward, attention_forward


@pytest.fixture
def qkv(rng):
    q = rng.standard_normal((2, 3, 5, 4))
    k = rng.standard_normal((2, 3, 7, 4))
    v = rng.standard_normal((2, 3, 7, 6))
    return q, k, v


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda q, k, v: (q.astype(int), k, v), TypeError, "q must be a floating"),
        (lambda q, k, v: (q, k.astype(bool), v), TypeError, "k must be a floating"),
        (lambda q, k, v: (q, k, v.astype(np.float32)), TypeError, "share one dtype"),
        (lambda q, k, v: (q, k[..., :6, :], v), ValueError, r"key length M.*\(2, 3, 6, 4\)"),
        (lambda q, k, v: (q, k[..., :3], v), ValueError, r"head width D.*\(2, 3, 7, 3\)"),
        (lambda q, k, v: (q[0], k, v), ValueError, "leading axes"),
        (lambda q, k, v: (q[0, 0, 0], k, v), ValueError, "at least 2 axes"),
    ],
)
def test_bad_qkv(qkv, change, error, match):
    with pytest.raises(error, match=match):
        attention(*change(*qkv))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"key_padding_mask": np.zeros((2, 5), bool)}, ValueError, r"\(B, M\) = \(2, 7\)"),
        ({"key_padding_mask": np.zeros((2, 7))}, TypeError, "key_padding_mask must be a bool"),
        ({"attn_mask": np.ones((5, 6), bool)}, ValueError, r"attn_mask of shape \(5, 6\)"),
        ({"attn_mask": np.ones((3, 2, 5, 7), bool)}, ValueError, "does not broadcast"),
        ({"attn_mask": np.ones((5, 7), np.int32)}, TypeError, "attn_mask must be bool"),
        ({"dropout_p": 1.0}, ValueError, r"dropout_p must be in \[0, 1\)"),
        ({"dropout_p": -0.1}, ValueError, r"dropout_p must be in \[0, 1\)"),
        ({"dropout_p": "0.1"}, TypeError, "dropout_p must be a number"),
        ({"dropout_mask": np.ones((5, 7), bool)}, ValueError, "dropout_p == 0"),
        (
            {"dropout_p": 0.1, "dropout_mask": np.ones((5, 7))},
            TypeError,
            "dropout_mask must be a bool",
        ),
        (
            {"dropout_p": 0.1, "dropout_mask": np.ones((5, 5), bool)},
            ValueError,
            "dropout_mask of shape",
        ),
        ({"scale": "big"}, TypeError, "scale must be a real number"),
    ],
)
def test_bad_options(qkv, kwargs, error, match):
    with pytest.raises(error, match=match):
        attention(*qkv, **kwargs)


def test_key_padding_mask_needs_a_batched_q(rng):
    q, k, v = (rng.standard_normal((4, 3)) for _ in range(3))

    with pytest.raises(ValueError, match=r"batched q.*\(4, 3\)"):
        attention(q, k, v, key_padding_mask=np.zeros((4, 4), bool))


def test_backward_checks_dout(qkv):
    ctx = attention_forward(*qkv).ctx

    with pytest.raises(ValueError, match=r"\(2, 3, 5, 6\)"):
        attention_backward(np.ones((2, 3, 5, 4)), ctx)
    with pytest.raises(TypeError, match="dout"):
        attention_backward(np.ones((2, 3, 5, 6), dtype=int), ctx)
