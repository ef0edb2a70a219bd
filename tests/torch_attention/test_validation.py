"""torch_attention.validation, the twin of numpy_attention.validation: the same checks, raising
the same errors with the same messages (dtypes spelled the torch way), on tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import functional as numpy_functional
from numpy_attention import validation as numpy_validation
from torch_attention import validation

CPU = torch.device("cpu")

# name -> (check, arguments): checks of Python/NumPy scalars, identical in both packages
BAD_SCALARS = {
    "flag 'no'": ("flag", ("causal", "no")),
    "flag 1": ("flag", ("causal", 1)),
    "flag None": ("flag", ("causal", None)),
    "integer 2.0": ("integer", ("n", 2.0)),
    "integer True": ("integer", ("n", True)),
    "positive_int 0": ("positive_int", ("num_heads", 0)),
    "positive_int '3'": ("positive_int", ("num_heads", "3")),
    "non_negative_int -1": ("non_negative_int", ("window[0]", -1)),
    "finite_real nan": ("finite_real", ("scale", float("nan"))),
    "finite_real -inf": ("finite_real", ("scale", -np.inf)),
    "finite_real '2'": ("finite_real", ("scale", "2")),
    "finite_real True": ("finite_real", ("scale", True)),
    "dropout_p 1": ("dropout_p", (1.0,)),
    "dropout_p -0.1": ("dropout_p", (-0.1,)),
    "dropout_p '0.1'": ("dropout_p", ("0.1",)),
    "dropout_p np.True_": ("dropout_p", (np.True_,)),
}


@pytest.mark.parametrize("bad", BAD_SCALARS)
def test_a_bad_scalar_raises_exactly_like_numpy(bad):
    check, args = BAD_SCALARS[bad]
    with pytest.raises((TypeError, ValueError)) as expected:
        getattr(numpy_validation, check)(*args)

    with pytest.raises(expected.type) as actual:
        getattr(validation, check)(*args)

    assert str(actual.value) == str(expected.value)


# name -> (check, arguments, the value returned)
GOOD_SCALARS = {
    "flag np.bool_": ("flag", ("causal", np.True_), True),
    "integer np.int64": ("integer", ("n", np.int64(3)), 3),
    "positive_int 1": ("positive_int", ("n", 1), 1),
    "non_negative_int 0": ("non_negative_int", ("n", 0), 0),
    "finite_real np.float32": ("finite_real", ("scale", np.float32(0.5)), 0.5),
    "finite_real int": ("finite_real", ("scale", 2), 2.0),
    "dropout_p 0": ("dropout_p", (0,), 0.0),
}


@pytest.mark.parametrize("good", GOOD_SCALARS)
def test_a_good_scalar_comes_back_as_a_python_value(good):
    check, args, value = GOOD_SCALARS[good]

    result = getattr(validation, check)(*args)

    assert result == value and type(result) is type(value)


def torch_message(error: Exception) -> str:
    return str(error).replace("torch.", "")


# name -> (NumPy call, torch call): the same bad tensor given to both twins
BAD_TENSORS = {
    "same_dtype": (
        lambda: numpy_validation.same_dtype(q=np.ones(2), k=np.ones(2, np.float32)),
        lambda: validation.same_dtype(q=torch.ones(2).double(), k=torch.ones(2)),
    ),
    "broadcasts_to": (
        lambda: numpy_validation.broadcasts_to("attn_mask", np.ones((3, 5)), (2, 1, 5)),
        lambda: validation.broadcasts_to("attn_mask", torch.ones(3, 5), (2, 1, 5)),
    ),
    "keep_mask with p = 0": (
        lambda: numpy_validation.keep_mask("m", np.ones((2, 3), bool), 0.0, (2, 3)),
        lambda: validation.keep_mask("m", torch.ones(2, 3).bool(), 0.0, (2, 3), CPU),
    ),
    "keep_mask not exact": (
        lambda: numpy_validation.keep_mask("m", np.ones((1, 3), bool), 0.2, (2, 3), exact=True),
        lambda: validation.keep_mask("m", torch.ones(1, 3).bool(), 0.2, (2, 3), CPU, exact=True),
    ),
    "keep_mask too big": (
        lambda: numpy_validation.keep_mask("m", np.ones((4, 3), bool), 0.2, (2, 3)),
        lambda: validation.keep_mask("m", torch.ones(4, 3).bool(), 0.2, (2, 3), CPU),
    ),
    "layer_input rank": (
        lambda: numpy_validation.layer_input("x", np.ones((2, 3)), 3, (3,), None),
        lambda: validation.layer_input("x", torch.ones(2, 3), 3, (3,), None),
    ),
    "layer_input width": (
        lambda: numpy_validation.layer_input("x", np.ones((1, 2, 4)), 3, (3,), None),
        lambda: validation.layer_input("x", torch.ones(1, 2, 4), 3, (3,), None),
    ),
}


@pytest.mark.parametrize("bad", BAD_TENSORS)
def test_a_bad_tensor_raises_like_numpy(bad):
    numpy_call, torch_call = BAD_TENSORS[bad]
    with pytest.raises((TypeError, ValueError)) as expected:
        numpy_call()

    with pytest.raises(expected.type) as actual:
        torch_call()

    assert torch_message(actual.value) == str(expected.value)


def test_layer_input_names_both_dtypes():
    with pytest.raises(TypeError, match="float64 but the layer's parameters are torch.float32"):
        validation.layer_input("x", torch.ones(1, 2, 3).double(), 3, (3,), torch.float32)


@pytest.mark.parametrize("value", [np.ones(3), [1.0, 2.0], torch.ones(3, dtype=torch.int64)])
def test_float_tensor_takes_float_tensors_only(value):
    with pytest.raises(TypeError, match="^x must be a"):
        validation.float_tensor("x", value)


def test_bool_tensor_converts_array_likes_and_refuses_other_dtypes():
    assert torch.equal(
        validation.bool_tensor("m", [[True, False]], CPU), torch.tensor([[True, False]])
    )
    with pytest.raises(TypeError, match="m must be a bool tensor, got dtype torch.float32"):
        validation.bool_tensor("m", torch.ones(2), CPU)


@pytest.mark.parametrize("window", [3, (1,), (1, 2, 3), (-1, None), (None, 1.5), ("2", 0)])
def test_a_bad_window_raises_like_numpys_check(window):
    x = np.ones((1, 2, 3))
    with pytest.raises((TypeError, ValueError)) as expected:
        numpy_functional.attention_forward(x, x, x, window=window)

    with pytest.raises(expected.type) as actual:
        validation.window(window)

    assert str(actual.value) == str(expected.value)


@pytest.mark.parametrize(
    ("window", "sides"), [(None, (None, None)), ((None, 0), (None, 0)), ([3, np.int64(2)], (3, 2))]
)
def test_a_window_comes_back_as_two_sides(window, sides):
    assert validation.window(window) == sides
