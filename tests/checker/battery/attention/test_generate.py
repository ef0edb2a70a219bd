"""The attention batteries built by code (``battery.attention``): each spec's default battery meets
its size requirements (block edges, split-KV paths, head widths), names each case by what it holds,
keeps the quick battery as its cheapest cases that still hold every value and what every pitfall
needs, grows a narrower battery for fewer features from the full one, and finds named cases. (Pair
coverage: test_pairs.py.)"""

from __future__ import annotations

import pytest

from parity_tests.checker.battery import pairs
from parity_tests.checker.battery.attention import generate, quick, sizes
from parity_tests.checker.battery.attention.case import Case
from parity_tests.checker.battery.attention.generate import name_of
from parity_tests.checker.battery.attention.space import NA
from parity_tests.checker.battery.catalog import select, size_coverage
from parity_tests.checker.specs import get


def default_battery(spec, features=None):
    return get(spec).default_battery(None if features is None else frozenset(features))


def quick_battery(spec):
    return select(spec, "quick")


SPECS = ("sdpa", "flash", "flash_varlen", "flex")


@pytest.mark.parametrize("spec", SPECS)
def test_every_size_requirement_is_met_by_the_cases(spec):
    met = size_coverage(spec, default_battery(spec))

    assert len(met) > 40 and all(met.values()), [label for label, ok in met.items() if not ok]


def test_the_size_requirements_name_the_block_edges_split_paths_and_head_widths():
    labels = [r.label for r in sizes.requirements()]

    assert {f"N = {n}" for n in sizes.EDGES} <= set(labels)
    assert {f"M = {m}, causal" for m in sizes.EDGES} <= set(labels)
    assert "non-causal, N a multiple of 128 and M not (zero-padded keys)" in labels
    assert any(label.startswith("split-KV, causal") for label in labels)
    assert {f"D = {d}, N > M" for d in sizes.WIDTHS} <= set(labels)
    assert "an odd D" in labels
    assert not any(", causal" in r.label for r in sizes.requirements({"dv"}))


def test_the_split_kv_cases_have_many_keys_and_few_rows():
    split = [c for c in default_battery("flash") if c.m >= sizes.SPLIT_KEYS]

    assert {c.causal for c in split} == {False, True}
    assert all(c.batch * c.heads <= 4 for c in split)


@pytest.mark.parametrize("spec", SPECS)
def test_each_generated_case_is_named_by_what_it_holds(spec):
    cases = default_battery(spec)

    assert all(case.name == name_of(case) for case in cases)
    assert len({case.name for case in cases}) == len(cases)


def test_a_name_says_the_mask_first_then_the_options_and_the_sizes():
    case = Case("x", 1, 4, 127, 257, 64, heads_kv=2, mask="dead-bool", dv=32,
                        memory="kv-strides")  # fmt: skip

    assert name_of(case) == "dead-bool-gqa-dv<-kvstrides-127x257-d64"


def test_no_top_left_causal_case_has_a_single_query():
    # Query 0 would see key 0 alone: dq and dk exactly 0, nothing to judge.
    for spec in ("sdpa", "flex"):
        assert not any(
            c.causal and c.align == "top-left" and c.n == 1 for c in default_battery(spec)
        )


@pytest.mark.parametrize("spec", SPECS)
def test_the_quick_battery_is_cheap_cases_of_the_default_holding_every_value(spec):
    fast, default = quick_battery(spec), default_battery(spec)

    assert set(fast) < set(default)
    held = {item for case in fast for item in get(spec).values_of(case).items()}
    wanted = {(f, v) for f, values in pairs.space(get(spec)).items() for v in values if v != NA}
    assert wanted <= held


def test_the_quick_battery_holds_the_case_of_each_teeth_the_spec_has():
    names = {case.name for case in quick_battery("flash")}

    for teeth in ("alibi under gqa", "kv strides", "padded keys", "split causal", "dropout"):
        assert quick.pick(get("flash"), teeth) in names


def test_a_narrower_battery_keeps_the_full_ones_cases_it_can_run():
    full = default_battery("sdpa")
    narrow = default_battery("sdpa", {"mask", "causal", "dropout"})

    runnable = [case for case in full if case.needs <= {"mask", "causal", "dropout"}]
    assert runnable and set(runnable) <= set(narrow)
    assert all(case.needs <= {"mask", "causal", "dropout"} for case in narrow)


def test_the_batteries_are_the_same_in_every_process():
    assert default_battery("flex") == generate._default.__wrapped__(get("flex"), None)


@pytest.mark.parametrize(
    ("spec", "features"),
    [(spec, None) for spec in SPECS]
    + [("sdpa", {"mask", "causal", "dropout"}), ("sdpa", {"mask", "causal", "gqa"})],
)
def test_no_case_of_one_query_where_it_cannot_be_judged_or_hold_its_mask(spec, features):
    # N = 1 never meets top-left causal, sharp logits, heavy tails, a float mask (dq a
    # near-total cancellation) or a dead-rows mask (never every row dead: with B * H = 1 it
    # held none, and nn.MultiheadAttention's documented NaN on dead rows passed as an xpass).
    # A shifted mask is one constant along each row, which the softmax does not see: no
    # cancellation, so one query with it is judged like one query with no mask.
    cases = default_battery(spec, features)

    one_query = [case for case in cases if case.n == 1 and not case.packed]
    assert one_query  # the decode step is still there
    assert not [c.name for c in one_query if c.mask not in ("none", "bool", "shifted")]
    assert not [c.name for c in one_query if c.causal and c.align == "top-left"]
    assert not [c.name for c in one_query if c.inputs == "heavy" or c.logits > 1]
