"""The fuzzer (``battery.fuzz``, every spec's draw but the ring's): random cases of a spec's space,
each re-created alone from its index and seed, expressible by the spec, inside the kernel's limits;
the specs without a fuzzer and a count below 1 refused. (``--fuzz`` and its rerun commands:
tests/parity/test_cli.py.)"""

from __future__ import annotations

import pytest

from parity_tests.checker.battery.attention.limits import outside
from parity_tests.checker.battery.fuzz import fuzz_case, fuzz_cases
from parity_tests.checker.battery.limits import KernelLimits
from parity_tests.checker.specs import get

FUZZED = (
    "sdpa", "flash", "flash_varlen", "flex", "flash_kvcache", "flash_mla", "sparse",
    "flash_mla_sparse", "fla_gdn", "fla_kda",
)  # fmt: skip


@pytest.mark.parametrize("spec", FUZZED)
def test_drawn_cases_are_cases_the_spec_expresses_each_named_by_its_index(spec):
    cases = fuzz_cases(spec, 40, seed=5)

    assert all(get(spec).cannot_express(case) is None for case in cases)
    assert [case.name.split("-")[0] for case in cases] == [f"fuzz{i}" for i in range(40)]
    assert len({case.name.split("-", 1)[1] for case in cases}) > 30  # not one case again


def test_a_drawn_case_is_the_same_alone_whatever_the_count_and_another_with_another_seed():
    drawn = fuzz_cases("flash", 12, seed=3)

    assert fuzz_case("flash", 11, seed=3) == drawn[11]
    assert fuzz_case("flash", 11, seed=4) != drawn[11]


def test_drawn_cases_hold_only_the_features_claimed_and_lie_inside_the_limits():
    limits = KernelLimits(head_dims=(16, 64), seqlen_multiple=16, contiguous_only=True)

    cases = fuzz_cases("flex", 30, seed=0, features={"causal", "mask"}, limits=limits)

    assert all(case.needs <= {"causal", "mask"} for case in cases)
    assert all(outside(limits, case) is None for case in cases)
    assert {case.mask for case in cases} > {"none"} and any(case.causal for case in cases)


@pytest.mark.parametrize(
    ("spec", "count", "error"),
    [("ring", 1, "the ring spec has no fuzzer"), ("sdpa", 0, "count must be an integer >= 1")],
)
def test_a_spec_without_a_fuzzer_and_no_cases_are_refused(spec, count, error):
    with pytest.raises(ValueError, match=error):
        fuzz_cases(spec, count, seed=0)


def test_no_drawn_case_has_one_key_where_dq_and_dk_are_exactly_zero():
    # The 2,000-case run of SDPA at seed 0 drew 13 cases with M = 1 before this rule: their
    # golden dq and dk are exactly 0, and SDPA's rounding (1e-7) failed a bound of 0.
    cases = fuzz_cases("sdpa", 2000, seed=0)

    assert min(case.m for case in cases) >= 2
    # One query is still drawn where it can be judged (bottom-right causal, as a decode step).
    assert min(case.n for case in fuzz_cases("flash", 2000, seed=0)) == 1


def test_drawn_decode_cases_hold_only_the_features_claimed_and_lie_inside_the_limits():
    spec = get("flash_kvcache")
    limits = KernelLimits(head_dims=(64, 128), page_sizes=(16,))
    claimed = {"paged", "append", "causal"}

    cases = fuzz_cases(spec, 30, seed=0, features=claimed, limits=limits)

    assert all(case.needs <= claimed and spec.outside(limits, case) is None for case in cases)
    assert {case.page_size for case in cases} == {None, 16} and any(c.s_new for c in cases)
