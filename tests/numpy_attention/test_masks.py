"""Masks (numpy_attention.masks): causal masks and buffers, key padding, SDPA-style attn_mask."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import masks


@pytest.mark.parametrize(("n", "m"), [(3, 3), (3, 5), (5, 3), (1, 4), (0, 2)])
def test_causal_mask_is_top_left(n, m):
    expected = np.array([[j <= i for j in range(m)] for i in range(n)], dtype=bool).reshape(n, m)

    np.testing.assert_array_equal(masks.causal_mask(n, m), expected)


def test_causal_mask_keeps_nothing_between_calls():
    """A cache of (N, N) masks would pin every size ever asked for (forced dense runs)."""
    first, second = masks.causal_mask(64, 64), masks.causal_mask(64, 64)

    assert first is not second and not np.shares_memory(first, second)
    assert not hasattr(masks.causal_mask, "cache_info")


def test_causal_buffer_is_the_books():
    expected = np.array([[0, 1, 1], [0, 0, 1], [0, 0, 0]], dtype=np.float32)

    buffer = masks.causal_buffer(3)

    np.testing.assert_array_equal(buffer, expected)
    assert buffer.dtype == np.float32
    masks.check_causal_buffer("mask", buffer)


@pytest.mark.parametrize(
    ("buffer", "match"),
    [
        (np.zeros((3, 3)), "not the causal buffer"),  # sees the future
        (np.ones((3, 3)), "not the causal buffer"),  # sees nothing, not even itself
        (np.triu(np.ones((3, 3)), 2), "not the causal buffer"),  # one future key visible
        (np.triu(np.ones((3, 4)), 1), "square"),
        (np.ones(3), "square"),
    ],
)
def test_check_causal_buffer_refuses_anything_else(buffer, match):
    with pytest.raises(ValueError, match=match):
        masks.check_causal_buffer("mask", buffer)


def test_key_padding_applies_along_the_first_axis_of_q():
    padding = np.array([[False, True, False], [True, True, False]])

    allowed = masks.key_padding_allowed(padding, (2, 4, 5, 8), 3)

    assert allowed.shape == (2, 1, 1, 3)
    np.testing.assert_array_equal(allowed[:, 0, 0], ~padding)


@pytest.mark.parametrize(
    ("padding", "q_shape", "error", "match"),
    [
        (np.zeros((2, 3), bool), (5, 8), ValueError, "needs a batched q"),
        (np.zeros((2, 4), bool), (2, 5, 8), ValueError, r"\(B, M\) = \(2, 3\)"),
        (np.zeros((2, 3), int), (2, 5, 8), TypeError, "must be a bool array"),
    ],
)
def test_key_padding_bad_input(padding, q_shape, error, match):
    with pytest.raises(error, match=match):
        masks.key_padding_allowed(padding, q_shape, 3)


def test_split_attn_mask_bool_and_float():
    allowed, bias = masks.split_attn_mask(np.ones((4, 5), bool), (2, 4, 5), np.dtype(np.float32))
    assert bias is None and allowed.dtype == bool

    allowed, bias = masks.split_attn_mask(np.ones((4, 5)), (2, 4, 5), np.dtype(np.float32))
    assert allowed is None and bias.dtype == np.float32  # a float64 mask never promotes


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        (np.ones((4, 5), np.int64), TypeError, "bool .* or float"),
        (np.ones((3, 5), bool), ValueError, "does not broadcast"),
        ((np.ones((4, 5), bool), np.zeros((4, 5))), TypeError, "one array"),
        ([np.ones((4, 5), bool), np.zeros((4, 5))], TypeError, "np.where"),
    ],
)
def test_split_attn_mask_bad_input(mask, error, match):
    with pytest.raises(error, match=match):
        masks.split_attn_mask(mask, (2, 4, 5), np.dtype(np.float64))
