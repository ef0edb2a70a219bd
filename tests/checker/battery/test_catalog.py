"""The batteries and cases by name (``battery.catalog``): ``select`` names a spec's batteries and
its cases (the cases of a narrower battery in its context, a decode case in its own spec only),
refuses unknown, empty and repeated names, and ``everything`` holds every attention case
addressable by name."""

from __future__ import annotations

import pytest

from parity_tests.checker.battery.attention.handwritten import NAMED, STRESS
from parity_tests.checker.battery.catalog import everything, lookup, select
from parity_tests.checker.specs import get


def default_battery(spec, features=None):
    return get(spec).default_battery(None if features is None else frozenset(features))


def quick_battery(spec):
    return select(spec, "quick")


SPECS = ("sdpa", "flash", "flash_varlen", "flex")


def test_every_named_case_and_every_specs_battery_is_addressable_by_name():
    names = {case.name for case in everything()}

    assert {case.name for case in NAMED} <= names
    for spec in SPECS:
        assert {case.name for case in default_battery(spec)} <= names
        assert {case.name for case in quick_battery(spec)} <= names


def test_the_ring_battery_grows_from_the_named_ring_cases_and_splits_over_ranks():
    ring = default_battery("ring")

    assert [case.name for case in ring[:6]] == [
        "ring-plain", "ring-causal", "ring-causal-zigzag", "ring-gqa", "ring-window",
        "ring-softcap",
    ]  # fmt: skip
    assert all(c.n == c.m and c.n % 8 == 0 for c in ring)
    assert {c.layout for c in ring} == {"contiguous", "zigzag"}


def test_select_names_batteries_and_cases():
    assert select("flex", None) == default_battery("flex")
    sdpa = get("sdpa")
    assert select(sdpa, "stress") == tuple(c for c in STRESS if sdpa.cannot_express(c) is None)
    assert select("ring", "ring") == default_battery("ring")
    some = default_battery("flash")[3]
    found = select("flash", ["causal-br-n<m", STRESS[0].name, some.name])
    assert [case.name for case in found] == ["causal-br-n<m", STRESS[0].name, some.name]


def test_a_name_of_a_narrower_battery_resolves_in_its_context():
    features = {"mask", "causal", "dropout"}
    own = [c for c in default_battery("sdpa", features) if c not in default_battery("sdpa")]

    assert select("sdpa", [own[0].name], features) == (own[0],)
    with pytest.raises(ValueError, match="unknown case"):
        select("sdpa", [own[0].name])


@pytest.mark.parametrize("cases", [["no-such-case"], "everything", [], ["plain", "plain"]])
def test_select_refuses_unknown_or_empty(cases):
    with pytest.raises(ValueError):
        select("sdpa", cases)


def test_a_name_is_looked_up_in_its_specs_cases_first_then_in_every_specs():
    decode = get("flash_kvcache").default_battery()[0]

    assert lookup(decode.name) == decode
    assert lookup("plain", "flash_kvcache") == NAMED[1]
    with pytest.raises(ValueError, match="cannot run case"):
        select("flash_kvcache", ["plain"])
