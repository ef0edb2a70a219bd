"""numpy_attention.source_dicts: reading named arrays (a state dict) with clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import source_dicts


def test_a_group_is_all_present_or_all_absent():
    both = {"q_bias": np.zeros(2), "k_bias": np.zeros(2)}

    assert source_dicts.all_or_none(both, "f", ["q_bias", "k_bias"])
    assert not source_dicts.all_or_none({}, "f", ["q_bias", "k_bias"])
    with pytest.raises(KeyError, match=r"f: missing keys \['k_bias'\]"):
        source_dicts.all_or_none({"q_bias": np.zeros(2)}, "f", ["q_bias", "k_bias"])


def test_a_parameter_is_a_fresh_copy_of_exactly_its_shape():
    source = np.arange(6.0).reshape(2, 3)

    got = source_dicts.param({"w": source}, "f", "w", (2, 3))

    assert np.array_equal(got, source) and got is not source
    got[0, 0] = 99.0
    assert source[0, 0] == 0.0
    with pytest.raises(ValueError, match=r"f: w has shape \(2, 3\), expected \(3, 2\)"):
        source_dicts.param({"w": source}, "f", "w", (3, 2))


def test_a_matrix_must_be_two_dimensional():
    assert source_dicts.matrix({"w": np.ones((4, 2))}, "f", "w").shape == (4, 2)
    with pytest.raises(ValueError, match="f: w must be a matrix, got shape"):
        source_dicts.matrix({"w": np.ones(4)}, "f", "w")
