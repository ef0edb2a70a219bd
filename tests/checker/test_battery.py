"""The batteries: what the default battery covers, what --quick keeps, and how inputs are drawn."""

from __future__ import annotations

import numpy as np
import pytest

from parity_tests.checker.battery import DEFAULT, QUICK, STRESS, Case, make_inputs, resolve

BY_NAME = {case.name: case for case in DEFAULT}


def test_default_battery_covers_what_the_policy_promises():
    cases = DEFAULT

    assert {c.batch for c in cases} >= {1, 2} and {c.heads for c in cases} >= {1, 2, 3}
    assert any(c.n != c.m and c.n % 2 and c.m % 2 for c in cases)
    assert min(c.d for c in cases) <= 16 and max(c.d for c in cases) >= 128
    assert any(c.d % 2 for c in cases)
    assert any(c.causal and c.n == c.m for c in cases)
    assert any(c.causal and c.n < c.m for c in cases) and any(c.causal and c.n > c.m for c in cases)
    assert {c.mask for c in cases} == {"none", "bool", "float", "dead-bool", "dead-float"}
    assert any(c.scale is not None for c in cases) and any(c.scale is None for c in cases)
    assert any(c.logits >= 10 for c in cases) and any(c.inputs == "heavy" for c in cases)
    assert any(c.dropout_p for c in cases)


def test_default_battery_has_dv_unlike_d_with_the_default_scale_both_ways():
    # A kernel that takes its default scale from v.shape[-1] is right whenever Dv == D.
    default_scale = [c for c in DEFAULT if c.scale is None]

    assert any(c.value_width > c.d for c in default_scale)
    assert any(c.value_width < c.d for c in default_scale)


def test_quick_battery_keeps_a_given_scale_and_dv_unlike_d():
    assert all(case in DEFAULT for case in QUICK)
    assert any(c.scale is not None for c in QUICK)
    assert any(c.scale is None and c.value_width != c.d for c in QUICK)


def test_shape_names_every_size_by_its_legend_letter():
    case = Case("c", 2, 3, 5, 7, 11, dv=13)

    assert case.shape == {"B": 2, "H": 3, "N": 5, "M": 7, "D": 11, "Dv": 13}
    assert Case("c", 1, 1, 1, 1, 4).shape["Dv"] == 4


def test_inputs_have_the_case_shapes():
    case = BY_NAME["dv<d"]

    inputs = make_inputs(case, seed=0)

    b, h, n, m, d, dv = case.shape.values()
    assert inputs.q.shape == (b, h, n, d) and inputs.k.shape == (b, h, m, d)
    assert inputs.v.shape == (b, h, m, dv) and inputs.dout.shape == (b, h, n, dv)


def test_same_seed_same_inputs_other_seed_other_inputs():
    case = BY_NAME["plain"]

    first, again, other = make_inputs(case, 0), make_inputs(case, 0), make_inputs(case, 1)

    assert all(np.array_equal(a, b) for a, b in zip(first[:3], again[:3], strict=True))
    assert not np.array_equal(first.q, other.q)


@pytest.mark.parametrize("name", ["dead-rows-bool", "dead-rows-float"])
def test_dead_row_cases_have_fully_masked_rows_and_no_accidental_ones(name):
    inputs = make_inputs(BY_NAME[name], seed=0)

    allowed = inputs.attn_mask if inputs.attn_mask.dtype == bool else inputs.attn_mask == 0
    rows_alive = allowed.any(axis=-1)  # (B, H, N)
    assert not rows_alive.all()
    assert rows_alive.any(axis=-1).all()


@pytest.mark.parametrize("name", ["bool-mask", "float-mask"])
def test_mask_cases_leave_every_row_something_to_attend(name):
    inputs = make_inputs(BY_NAME[name], seed=0)

    mask = inputs.attn_mask
    allowed = mask if mask.dtype == bool else np.isfinite(mask)
    assert allowed.any(axis=-1).all()


def test_resolve_names_batteries_and_cases():
    assert resolve(None) == DEFAULT and resolve("quick") == QUICK and resolve("stress") == STRESS
    assert resolve(["plain", STRESS[0]]) == (BY_NAME["plain"], STRESS[0])


@pytest.mark.parametrize("cases", [["no-such-case"], "everything", []])
def test_resolve_refuses_unknown_or_empty(cases):
    with pytest.raises(ValueError):
        resolve(cases)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mask": "striped"},
        {"inputs": "uniform"},
        {"causal": True, "mask": "bool"},
        {"dropout_p": 0.1, "causal": True},
    ],
)
def test_a_case_refuses_what_it_cannot_run(kwargs):
    with pytest.raises(ValueError, match="case bad"):
        Case("bad", 1, 1, 4, 4, 4, **kwargs)
