"""torch_attention.masks, the twin of numpy_attention.masks (the same masks, the same errors),
and ``to_sdpa``, the one translation of our masks into SDPA's single ``attn_mask``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import masks as numpy_masks
from torch_attention import masks

from ..conftest import to_numpy, to_torch

CPU = torch.device("cpu")


@pytest.mark.parametrize(("n", "m"), [(5, 5), (3, 7), (7, 3), (0, 4), (4, 0)])
def test_causal_mask_is_the_numpy_twins(n, m):
    assert np.array_equal(to_numpy(masks.causal_mask(n, m, CPU)), numpy_masks.causal_mask(n, m))


def test_causal_buffer_is_the_numpy_twins():
    buffer = masks.causal_buffer(6)

    assert buffer.dtype == torch.float32
    assert np.array_equal(to_numpy(buffer), numpy_masks.causal_buffer(6))


def test_check_causal_buffer_accepts_the_buffer_in_any_dtype():
    masks.check_causal_buffer("mask", masks.causal_buffer(5, torch.float64))
    masks.check_causal_buffer("mask", masks.causal_buffer(5, torch.bool))


def with_a_hole():
    buffer = torch.triu(torch.ones(5, 5), 1)
    buffer[1, 3] = 0.0  # query 1 would see key 3
    return buffer


# name -> a buffer that is not the causal triangle
BAD_BUFFERS = {
    "a hole": with_a_hole(),
    "lower triangle": torch.tril(torch.ones(5, 5), -1),
    "not square": torch.triu(torch.ones(5, 6), 1),
    "one axis": torch.zeros(5),
}


@pytest.mark.parametrize("bad", BAD_BUFFERS)
def test_check_causal_buffer_refuses_like_numpy(bad):
    buffer = BAD_BUFFERS[bad]
    with pytest.raises(ValueError) as expected:
        numpy_masks.check_causal_buffer("mask", to_numpy(buffer))

    with pytest.raises(ValueError) as actual:
        masks.check_causal_buffer("mask", buffer)

    assert str(actual.value) == str(expected.value)


@pytest.mark.parametrize("q_shape", [(2, 5, 4), (2, 3, 5, 4)])
def test_key_padding_allowed_is_the_numpy_twins(rng, q_shape):
    padding = rng.random((2, 7)) > 0.5

    allowed = masks.key_padding_allowed(to_torch(padding), q_shape, 7, CPU)

    expected = numpy_masks.key_padding_allowed(padding, q_shape, 7)
    assert tuple(allowed.shape) == expected.shape
    assert np.array_equal(to_numpy(allowed), expected)


@pytest.mark.parametrize("q_shape", [(5, 4), (2, 5, 4)])
def test_key_padding_allowed_refuses_like_numpy(q_shape):
    padding = np.zeros((3, 7), dtype=bool)  # B = 3 fits no q here
    with pytest.raises(ValueError) as expected:
        numpy_masks.key_padding_allowed(padding, q_shape, 7)

    with pytest.raises(ValueError) as actual:
        masks.key_padding_allowed(to_torch(padding), q_shape, 7, CPU)

    assert str(actual.value) == str(expected.value)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_split_attn_mask_is_the_numpy_twins(rng, kind):
    mask = rng.random((5, 7)) > 0.5 if kind == "bool" else rng.standard_normal((5, 7))

    allowed, bias = masks.split_attn_mask(to_torch(mask), (2, 5, 7), torch.float32, CPU)

    expected = numpy_masks.split_attn_mask(mask, (2, 5, 7), np.dtype(np.float32))
    for actual, twin in zip((allowed, bias), expected, strict=True):
        assert (actual is None) == (twin is None)
        if twin is not None:
            assert np.array_equal(to_numpy(actual), twin)
    assert bias is None or bias.dtype == torch.float32


def test_split_attn_mask_refuses_an_integer_mask():
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        masks.split_attn_mask(torch.ones(5, 7, dtype=torch.int64), (5, 7), torch.float32, CPU)


def test_combine_ands_the_masks_that_are_there(rng):
    a, b = to_torch(rng.random((5, 7)) > 0.5), to_torch(rng.random((2, 1, 7)) > 0.5)

    assert masks.combine(None, None) is None
    assert masks.combine(a, None) is a
    assert torch.equal(masks.combine(a, None, b), a & b)


# -- to_sdpa ----------------------------------------------------------------------------------


def test_to_sdpa_without_masks_passes_the_bias_through():
    bias = torch.ones(5, 7)

    assert masks.to_sdpa(None, None) == (None, None)
    assert masks.to_sdpa(None, bias)[0] is bias


def test_to_sdpa_opens_dead_rows_and_reports_them(rng):
    allowed = to_torch(rng.random((5, 7)) > 0.5)
    allowed[2] = False

    sdpa_mask, row_valid = masks.to_sdpa(allowed, None)

    assert torch.equal(row_valid[:, 0], torch.tensor([True, True, False, True, True]))
    assert torch.equal(sdpa_mask[2], torch.ones(7, dtype=torch.bool))
    assert torch.equal(sdpa_mask[row_valid[:, 0]], allowed[row_valid[:, 0]])


def test_to_sdpa_replaces_hidden_biases_with_minus_inf(rng):
    allowed = to_torch(rng.random((5, 7)) > 0.5)
    allowed[:, 0] = True
    bias = to_torch(rng.standard_normal((5, 7)))
    bias[~allowed] = float("nan")  # a NaN at a hidden position must not survive

    sdpa_mask, _ = masks.to_sdpa(allowed, bias)

    assert torch.equal(sdpa_mask[~allowed], torch.full_like(bias[~allowed], float("-inf")))
    assert torch.equal(sdpa_mask[allowed], bias[allowed])
