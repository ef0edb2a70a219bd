"""The shared checks (numpy_attention.validation), directly and as every public function of the
core meets them: a clear error naming the argument and the shapes, before any work."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import validation
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
        ({"dropout_mask": np.ones((5, 7), bool)}, ValueError, "dropout probability is 0"),
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


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_flag_takes_bools(value):
    assert validation.flag("causal", value) is bool(value)


@pytest.mark.parametrize("value", ["no", 1, 0, None, 1.0])
def test_flag_refuses_what_is_only_truthy(value):
    with pytest.raises(TypeError, match="causal must be a bool"):
        validation.flag("causal", value)


@pytest.mark.parametrize(
    ("check", "value", "error", "match"),
    [
        (validation.positive_int, 0, ValueError, "n must be a positive int, got 0"),
        (validation.positive_int, True, TypeError, "n must be an int"),
        (validation.positive_int, 2.0, TypeError, "n must be an int"),
        (validation.non_negative_int, -1, ValueError, "n must be a non-negative int"),
        (validation.finite_real, np.nan, ValueError, "n must be finite"),
        (validation.finite_real, -np.inf, ValueError, "n must be finite"),
        (validation.finite_real, "1", TypeError, "n must be a real number"),
        (validation.finite_real, np.bool_(True), TypeError, "n must be a real number"),
        (validation.dropout_p, 1.0, ValueError, r"n must be in \[0, 1\)"),
    ],
)
def test_number_checks(check, value, error, match):
    with pytest.raises(error, match=match):
        check("n", value) if check is not validation.dropout_p else check(value, "n")


def test_number_checks_return_plain_python_numbers():
    assert (
        validation.positive_int("n", np.int32(3)) == 3
        and type(validation.positive_int("n", np.int32(3))) is int
    )
    assert validation.finite_real("s", np.float32(0.5)) == 0.5
    assert validation.non_negative_int("w", 0) == 0


def test_keep_mask_checks_kind_probability_and_shape():
    mask = np.ones((3, 4), bool)

    assert validation.keep_mask("m", mask, 0.5, (2, 3, 4)) is mask
    with pytest.raises(ValueError, match="dropout probability is 0"):
        validation.keep_mask("m", mask, 0.0, (2, 3, 4))
    with pytest.raises(ValueError, match=r"m must have shape \(2, 3, 4\)"):
        validation.keep_mask("m", mask, 0.5, (2, 3, 4), exact=True)
    with pytest.raises(TypeError, match="m must be a bool"):
        validation.keep_mask("m", mask.astype(int), 0.5, (3, 4))


def test_grad_output_checks_shape_and_kind_and_casts():
    dout = validation.grad_output(np.ones((2, 3)), (2, 3), np.dtype(np.float32))

    assert dout.dtype == np.float32
    with pytest.raises(
        ValueError, match=r"dout must have the output's shape \(2, 3\), got \(3, 2\)"
    ):
        validation.grad_output(np.ones((3, 2)), (2, 3))
    with pytest.raises(TypeError, match="dlse must be a floating"):
        validation.grad_output(np.ones((2, 3), int), (2, 3), name="dlse")
