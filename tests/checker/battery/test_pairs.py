"""Pair coverage, computed from the cases: every spec's battery holds every pair of its factors'
values that one case can hold (the pairs where kernels break among them), also for a kernel
that claims fewer features; the rules of what one case cannot hold; a deterministic builder.
Pure Python over case definitions: no kernel runs here."""

from __future__ import annotations

import dataclasses

import pytest

from parity_tests.checker.battery import pairs
from parity_tests.checker.battery.attention.handwritten import NAMED
from parity_tests.checker.battery.attention.space import NA
from parity_tests.checker.specs import get


def default_battery(spec, features=None):
    return get(spec).default_battery(None if features is None else frozenset(features))


SPECS = ("sdpa", "flash", "flash_varlen", "flex", "ring")
BY_NAME = {case.name: case for case in NAMED}


@pytest.mark.parametrize("spec", SPECS)
def test_every_pair_of_each_specs_factors_meets_in_its_default_battery(spec):
    cases = default_battery(spec)

    missing = pairs.uncovered(get(spec), cases)

    assert pairs.required_pairs(get(spec)) and not missing, sorted(missing)


@pytest.mark.parametrize(
    ("spec", "features"),
    [
        ("sdpa", {"mask", "causal", "dropout"}),  # nn.MultiheadAttention: no GQA, Dv == D
        ("sdpa", {"mask", "causal", "gqa"}),  # SDPA's CPU flash kernel: no dropout, Dv == D
        ("flash", {"causal", "lse"}),
    ],
)
def test_a_kernel_claiming_fewer_features_gets_every_pair_of_those(spec, features):
    cases = [case for case in default_battery(spec, features) if case.needs <= features]

    assert not pairs.uncovered(get(spec), cases, features)
    assert pairs.required_pairs(get(spec), features) < pairs.required_pairs(get(spec))


@pytest.mark.parametrize(
    ("spec", "first", "second"),
    [
        ("flash", ("alibi", "per-head"), ("gqa", "gqa")),  # a slope indexed by the kv head
        ("flash", ("alibi", "per-batch"), ("gqa", "mqa")),
        ("flash", ("window", "left"), ("softcap", "on")),  # softcap with a window
        ("flash", ("gqa", "gqa"), ("dv", "smaller")),  # Dv != D under GQA
        ("flex", ("align", "bottom-right"), ("window", "two-sided")),  # a window bottom-right
        ("flex", ("causal", "on"), ("mask", "dead-bool")),
        ("flash_varlen", ("dropout", "on"), ("sequences", "packed")),  # varlen with every option
        ("flash_varlen", ("alibi", "per-batch"), ("sequences", "packed")),
        ("sdpa", ("dropout", "on"), ("mask", "float")),
        ("sdpa", ("memory", "kv-strides"), ("dv", "larger")),
    ],
)
def test_the_pairs_where_kernels_break_are_required(spec, first, second):
    assert _pair(spec, first, second) in pairs.required_pairs(get(spec))


def _pair(spec: str, first: tuple[str, str], second: tuple[str, str]) -> pairs.Pair:
    """The pair as ``pairs`` orders it: by the factors' order in the spec's space."""
    order = list(get(spec).factors)
    return (first, second) if order.index(first[0]) < order.index(second[0]) else (second, first)


@pytest.mark.parametrize(
    ("spec", "row"),
    [
        ("sdpa", {"causal": "on", "mask": "bool"}),  # SDPA takes a mask or is_causal
        ("flash", {"softcap": "on", "logits": "normal"}),  # a cap that bends nothing
        ("flash", {"window": "two-sided", "causal": "on"}),  # the right side is moot
        ("flex", {"align": "bottom-right", "lengths": "n=m"}),  # no positions to align
    ],
)
def test_what_one_case_cannot_hold_is_never_required(spec, row):
    assert not get(spec).allowed(row)
    first, second = row.items()
    assert _pair(spec, first, second) not in pairs.required_pairs(get(spec))


def test_a_case_whose_positions_matter_has_an_alignment():
    assert not get("flex").allowed({"align": NA, "causal": "on", "lengths": "n<m"})
    assert get("flex").allowed({"align": NA, "causal": "on", "lengths": "n=m"})


def test_flex_holds_causal_with_a_mask_and_sdpa_does_not():
    flex = _pair("flex", ("causal", "on"), ("mask", "bool"))
    sdpa = _pair("sdpa", ("causal", "on"), ("mask", "bool"))

    assert flex in pairs.required_pairs(get("flex"))
    assert sdpa not in pairs.required_pairs(get("sdpa"))


def test_a_battery_without_its_fused_layout_misses_every_pair_of_it():
    cases = [case for case in default_battery("flash") if case.memory != "fused"]

    missing = pairs.uncovered(get("flash"), cases)

    fused = {pair for pair in pairs.required_pairs(get("flash")) if ("memory", "fused") in pair}
    assert fused and fused <= missing


def test_the_covering_array_is_deterministic_and_near_the_lower_bound():
    first, again = pairs.covering_rows(get("flex")), pairs.covering_rows(get("flex"))

    assert first == again
    assert 5 * 4 <= len(first) <= 2 * 5 * 4  # mask (5 values) x memory (4) pairs at least


def test_a_covering_array_grows_from_seed_rows():
    rows = pairs.covering_rows(get("ring"))
    half = rows[: len(rows) // 2]

    rest = pairs.covering_rows(get("ring"), None, half)

    held = set().union(*(pairs.pairs_of(get("ring"), row) for row in half + rest))
    assert pairs.required_pairs(get("ring")) <= held


def test_case_values_are_read_from_the_cases_fields():
    case = BY_NAME["alibi-bh-causal"]

    values = get("flash").values_of(case)

    assert values["alibi"] == "per-batch" and values["causal"] == "on"
    assert values["lengths"] == "n<m" and values["gqa"] == "mha"
    assert values["memory"] == "contiguous"
    moved = dataclasses.replace(case, memory="offset", heads_kv=1)
    assert get("flash").values_of(moved)["memory"] == "offset"
    assert get("flash").values_of(moved)["gqa"] == "mqa"


def test_an_alignment_counts_only_where_positions_matter():
    square = BY_NAME["causal-square"]  # N = M: top-left and bottom-right are one case
    shifted = BY_NAME["causal-br-n<m"]

    assert get("flex").values_of(square)["align"] == NA
    assert get("flex").values_of(shifted)["align"] == "bottom-right"


def test_coverage_counts_the_cases_holding_each_value():
    cases = default_battery("sdpa")

    found = pairs.coverage(get("sdpa"), cases)

    assert found.fraction == 1.0 and found.required == len(pairs.required_pairs(get("sdpa")))
    assert sum(found.counts["mask"].values()) == len(cases)
    assert all(count > 0 for counts in found.counts.values() for count in counts.values())
