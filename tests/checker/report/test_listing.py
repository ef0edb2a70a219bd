"""``--list-cases`` for every spec alike (``report.listing``): each case with its shape (a decode
case's cache columns too), what it needs and why a kernel would not run it, then the pair and
size coverage of the cases the kernel runs."""

from __future__ import annotations

from parity_tests.checker.battery.catalog import select
from parity_tests.checker.battery.limits import KernelLimits
from parity_tests.checker.pipeline import within_limits
from parity_tests.checker.report.listing import list_cases
from parity_tests.checker.specs import get


def _listed(spec_name, features=None, limits=None, coverage=True):
    spec = get(spec_name)
    claimed = spec.features if features is None else frozenset(features)
    cases, excluded = within_limits(spec, None, claimed, limits)
    lines: list[str] = []
    list_cases(spec, cases, "battery", lines.append, features=features, limits=limits,
               excluded=excluded, coverage=coverage)  # fmt: skip
    return cases, lines


def test_a_decode_battery_lists_its_cache_columns_and_its_full_coverage():
    cases, lines = _listed("flash_kvcache", {"causal", "paged", "append", "lse"})

    assert lines[0] == f"battery: {len(cases)} cases"
    assert lines[1].split()[:10] == ["case", "B", "H", "N", "M", "D", "Dv", "s_new", "H_kv", "P"]
    assert any("(not run: needs features not declared)" in line for line in lines)
    (pairs_line,) = [line for line in lines if line.startswith("pair coverage:")]
    assert "(100%)" in pairs_line
    (sizes_line,) = [line for line in lines if line.startswith("size requirements:")]
    met, _, total = sizes_line.split(": ")[1].split()[:3]
    assert met == total
    assert any("pages of 16: new tokens crossing a page: p16-" in line for line in lines)


def test_a_case_outside_the_limits_says_which_case_is_judged_instead():
    _, lines = _listed("flash_kvcache", limits=KernelLimits(page_sizes=(16,)))

    outside = [line for line in lines if "outside the kernel's limits" in line]
    assert outside and all("judged instead: p16-" in line for line in outside)


def test_named_cases_are_listed_without_coverage():
    spec = get("sdpa")
    lines: list[str] = []

    list_cases(spec, select(spec, ["plain"]), "named", lines.append, coverage=False)

    assert lines[0] == "named: 1 cases" and len(lines) == 3
