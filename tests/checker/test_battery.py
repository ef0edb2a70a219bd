"""The batteries: what the default battery covers (today's options included), what --quick keeps,
what each case needs from a kernel, and how inputs are drawn."""

from __future__ import annotations

import numpy as np
import pytest

from parity_tests.checker.battery import (
    DEFAULT,
    QUICK,
    RING,
    STRESS,
    Case,
    make_inputs,
    resolve,
)

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


def test_default_battery_covers_todays_options():
    cases = DEFAULT
    br = [c for c in cases if c.causal and c.align == "bottom-right" and not c.packed]

    assert {c.kv_heads for c in cases if c.heads == 4} >= {1, 2, 4}
    assert any(c.n < c.m for c in br) and any(c.n > c.m for c in br)
    assert any(c.n == 1 and c.m > 100 for c in br)  # a decode step against a long cache
    windows = [c.window for c in cases if c.window is not None]
    assert any(right is None or right == 0 for _, right in windows)  # one-sided
    assert any(left and right for left, right in windows)  # two-sided
    assert {c.align for c in cases if c.window is not None and c.n != c.m} == {
        "top-left",
        "bottom-right",
    }
    assert any(c.softcap and c.logits >= 3 * c.softcap for c in cases)  # the cap bends
    assert {c.alibi for c in cases} == {"none", "H", "BH"}
    assert any(c.alibi != "none" and c.causal and c.n != c.m for c in cases)
    packed = [c for c in cases if c.packed]
    lengths = [n for c in packed for n, _ in c.seqlens]
    assert packed and 1 in lengths and len(set(lengths)) > 2


@pytest.mark.parametrize(
    ("name", "needs"),
    [
        ("plain", set()),
        ("dropout", {"dropout"}),
        ("gqa-1of4-causal", {"gqa", "causal"}),
        ("window-causal", {"window", "causal"}),
        ("alibi-bh-causal", {"alibi", "causal"}),
        ("dv<d", {"dv"}),
        ("float-mask", {"mask"}),
        ("softcap", {"softcap"}),
        ("varlen-causal-gqa", {"causal", "gqa"}),
    ],
)
def test_a_case_needs_the_features_its_options_use(name, needs):
    assert BY_NAME[name].needs == needs


def test_gqa_and_packed_inputs_have_their_shapes():
    gqa, packed = BY_NAME["gqa-2of4"], BY_NAME["varlen"]

    g, p = make_inputs(gqa, seed=0), make_inputs(packed, seed=0)

    assert g.q.shape == (2, 4, 37, 32) and g.k.shape == (2, 2, 113, 32) == g.v.shape
    assert p.q.shape == (122, 2, 32) and p.k.shape == (234, 2, 32) and p.dout.shape == (122, 2, 32)
    cu_q, cu_k = packed.cu_seqlens
    assert cu_q.tolist() == [0, 37, 38, 102, 122] and cu_k.tolist() == [0, 113, 177, 214, 234]


def test_alibi_slopes_per_head_and_per_batch_differ_between_batch_elements():
    per_head = make_inputs(BY_NAME["alibi-h"], seed=0).alibi_slopes
    per_batch = make_inputs(BY_NAME["alibi-bh-causal"], seed=0).alibi_slopes

    assert per_head.shape == (4,) and np.all(per_head > 0)
    assert per_batch.shape == (2, 2) and not np.array_equal(per_batch[0], per_batch[1])


def test_ring_cases_are_self_attention_that_two_to_four_ranks_can_split():
    assert all(c.n == c.m and c.n % 8 == 0 for c in RING)
    assert {c.layout for c in RING} == {"contiguous", "zigzag"}


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
    assert resolve("ring") == RING
    assert resolve(["plain", STRESS[0], "ring-gqa"]) == (BY_NAME["plain"], STRESS[0], RING[3])


@pytest.mark.parametrize("cases", [["no-such-case"], "everything", [], ["plain", "plain"]])
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
        {"heads_kv": 3},
        {"window": (-1, 2)},
        {"align": "centre"},
        {"alibi": "per-token"},
        {"layout": "striped"},
    ],
)
def test_a_case_refuses_what_it_cannot_run(kwargs):
    with pytest.raises(ValueError, match="case bad"):
        Case("bad", 1, 1, 4, 4, 4, **kwargs)
