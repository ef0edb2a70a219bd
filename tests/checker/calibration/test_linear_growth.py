"""parity_tests/checker/calibration/linear_growth.py on lengths small enough for the suite: the
cases it builds, that both forms of a correct twin measure at their dtype's rounding, that a wrong
kernel measures as wrong, and the tables' layout. The measurement itself is an opt-in command
(docs/pitfalls.md, "Linear attention: error against T")."""

from __future__ import annotations

import numpy as np
import pytest

from parity_tests.checker.calibration import linear_growth


@pytest.mark.parametrize("gate", linear_growth.GATES)
def test_inputs_are_unit_keys_and_the_gate_asked_for(gate):
    case = linear_growth.inputs(20, gate)

    np.testing.assert_allclose(np.linalg.norm(case["k"], axis=-1), 1.0, rtol=1e-12)
    assert case["g"].shape == (1, 20, linear_growth.HEADS)
    assert (case["g"] < 0).all()
    assert (case["g"] > -1e-3).all() == (gate == "near_zero")


@pytest.mark.parametrize(("dtype", "largest"), [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_a_correct_twin_measures_at_its_dtypes_rounding(dtype, largest):
    found = linear_growth.errors(linear_growth.inputs(24, "typical"), dtype)

    for form in linear_growth.FORMS:
        assert set(found[form]) == set(linear_growth.TENSORS)
        assert all(0 < error < largest for error in found[form].values()), found


def test_a_wrong_kernel_measures_as_wrong(monkeypatch):
    right = linear_growth.gated_delta_rule

    def forgets_nothing(q, k, v, g, beta, **kwargs):  # g read as 0: a = 1 on every token
        return right(q, k, v, g * 0, beta, **kwargs)

    monkeypatch.setattr(linear_growth, "gated_delta_rule", forgets_nothing)

    found = linear_growth.errors(linear_growth.inputs(24, "typical"), "float32")

    assert min(found["chunk"].values()) > 1e-2


def test_table_has_a_row_per_length_and_dtype():
    lines = linear_growth.table((8, 16), "near_zero")

    assert lines[0] == "Gates near zero:"
    rows = [line for line in lines if line.startswith("| 8 |") or line.startswith("| 16 |")]
    assert [row.split(" | ")[1] for row in rows] == list(linear_growth.DTYPES) * 2
    assert all(row.count("|") == 2 + 2 * 3 + 1 for row in rows)
