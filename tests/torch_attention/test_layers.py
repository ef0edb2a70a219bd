"""torch_attention.layers: Linear and Dropout against their NumPy twins, and the same errors.

Tests: Linear's dtype check, Dropout with an explicit keep-mask, the identity in eval mode, and
the keep-mask checks of ``dropout_keep_mask`` that every layer with dropout shares.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention
import torch_attention
from torch_attention.layers import dropout_keep_mask

from ..conftest import assert_close, to_torch


def test_linear_matches_numpy(rng):
    x = rng.standard_normal((2, 5, 4))
    source = numpy_attention.Linear(4, 3, rng=1).astype(np.float64)
    layer = torch_attention.from_numpy(torch_attention.Linear(4, 3).double(), source)

    assert_close(layer(to_torch(x)), source(x), name="linear")


def test_linear_refuses_another_dtype_like_numpy(rng):
    x = rng.standard_normal((2, 5))
    match = "x has dtype (torch.)?float64 but Linear's parameters are (torch.)?float32"

    with pytest.raises(TypeError, match=match):
        numpy_attention.Linear(5, 3)(x)
    with pytest.raises(TypeError, match=match):
        torch_attention.Linear(5, 3)(to_torch(x))


@pytest.mark.parametrize(
    ("shape", "match"),
    [((2, 4), r"x has last axis 4 \(shape \(2, 4\)\), expected 5"), ((), "at least one axis")],
)
def test_linear_refuses_another_width_like_numpy(shape, match):
    with pytest.raises(ValueError, match=match):
        numpy_attention.Linear(5, 3)(np.zeros(shape, np.float32))
    with pytest.raises(ValueError, match=match):
        torch_attention.Linear(5, 3)(torch.zeros(shape))


def test_dropout_layer_matches_numpy(rng):
    x = rng.standard_normal((2, 7, 12))
    keep = rng.random(x.shape) > 0.3

    out = torch_attention.Dropout(0.3)(to_torch(x), mask=to_torch(keep))

    assert_close(out, numpy_attention.Dropout(0.3)(x, mask=keep))


def test_dropout_layer_is_the_identity_in_eval_mode(rng):
    x = to_torch(rng.standard_normal((2, 7, 12)))

    assert torch.equal(torch_attention.Dropout(0.3).eval()(x), x)


def test_dropout_probability_one_is_refused_like_numpy():
    with pytest.raises(ValueError, match="p must be in"):
        numpy_attention.Dropout(1.0)
    with pytest.raises(ValueError, match="p must be in"):
        torch_attention.Dropout(1.0)


# name -> (keyword arguments of dropout_keep_mask, error, message regex)
BAD_KEEP_MASKS = {
    "eval mode": ({"training": False}, ValueError, "eval mode"),
    "p = 0": ({"p": 0.0}, ValueError, "probability is 0"),
    "float mask": ({"mask": np.ones((2, 3))}, TypeError, "must be a bool"),
    "broadcasting mask": ({"mask": np.ones((1, 3), dtype=bool)}, ValueError, r"shape \(2, 3\)"),
}


@pytest.mark.parametrize("bad", BAD_KEEP_MASKS)
def test_a_bad_keep_mask_is_refused(bad):
    change, error, match = BAD_KEEP_MASKS[bad]
    call = {"p": 0.3, "shape": (2, 3), "training": True, "mask": np.ones((2, 3), dtype=bool)}
    call.update(change)

    with pytest.raises(error, match=match):
        dropout_keep_mask("mask", device=torch.device("cpu"), **call)


def test_no_keep_mask_means_torch_draws_its_own():
    assert dropout_keep_mask("mask", 0.3, (2, 3), True, None, torch.device("cpu")) is None
