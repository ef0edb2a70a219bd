"""A kernel's limits (``checker.battery.limits``): a case outside them is not run, the battery holds
its nearest case inside them instead, so that declaring limits never empties a feature's coverage
(every pair of values the limits allow still meets in a case); limits a spec cannot honour, and a
case named outside them, are refused before any work."""

from __future__ import annotations

import pytest
import torch.nn.functional as F

from parity_tests import check_kernel
from parity_tests.checker.battery import pairs
from parity_tests.checker.battery.attention.case import Case
from parity_tests.checker.battery.attention.limits import nearest, outside
from parity_tests.checker.battery.limits import KernelLimits, allowed_pairs
from parity_tests.checker.pipeline import within_limits
from parity_tests.checker.specs import get

GENERATED_SPECS = ("sdpa", "flash", "flash_varlen", "flex")

LIMITS = {
    "head widths": KernelLimits(head_dims=(16, 32, 64, 128)),
    "two head widths, multiples of 128": KernelLimits(head_dims=(64, 128), seqlen_multiple=128),
    "N = M, contiguous": KernelLimits(equal_lengths=True, contiguous_only=True),
}


@pytest.mark.parametrize("limits", LIMITS.values(), ids=LIMITS.keys())
@pytest.mark.parametrize("spec", GENERATED_SPECS)
def test_the_battery_within_the_limits_keeps_every_pair_they_allow(spec, limits):
    found = get(spec)
    battery, excluded = within_limits(found, None, found.features, limits)

    inside = [case for case in battery if case.name not in excluded]
    assert excluded and all(found.outside(limits, case) is None for case in inside)
    assert not allowed_pairs(found, limits) & pairs.uncovered(found, inside)
    assert {instead for _, instead in excluded.values()} <= {case.name for case in inside}


def test_the_nearest_case_inside_keeps_every_option_and_the_order_of_the_lengths():
    case = Case("x", 2, 4, 37, 113, 33, dv=16, heads_kv=2, causal=True, memory="fused",
                align="bottom-right", window=(5, None))  # fmt: skip
    limits = KernelLimits(head_dims=(16, 32, 64), seqlen_multiple=128, contiguous_only=True)

    found = nearest(limits, case)

    assert outside(limits, case) == (
        "D = 33 not in head_dims; lengths 37, 113 not multiples of 128; fused memory, not "
        "contiguous"
    )
    assert (found.n, found.m, found.d, found.value_width) == (128, 256, 32, 16)  # N < M, Dv < D
    assert (found.memory, found.causal, found.window, found.kv_heads) == (
        "contiguous", True, (5, None), 2
    )  # fmt: skip
    assert found.name == "causal-win-br-gqa-dv<-128x256-d32" and outside(limits, found) is None


def test_equal_lengths_take_the_longer_one():
    found = nearest(KernelLimits(equal_lengths=True, seqlen_multiple=16), Case("x", 1, 1, 37, 5, 8))

    assert (found.n, found.m) == (48, 48)


def _multiples_of_64_only(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                          scale=None):  # fmt: skip
    assert query.shape[-2] % 64 == 0 and key.shape[-2] % 64 == 0, "lengths must be multiples of 64"
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                          scale=scale)  # fmt: skip


def test_a_kernel_is_judged_only_inside_its_limits_and_the_report_says_what_they_excluded():
    limits = KernelLimits(seqlen_multiple=64)

    report = check_kernel(_multiples_of_64_only, dtypes=["float32"], cases="quick",
                          features={"causal"}, limits=limits)  # fmt: skip

    assert report.passed, report.failures
    assert report.limits == {"seqlen_multiple": 64} and report.outside_limits == len(
        report.excluded
    )
    name, (why, instead) = next(iter(report.excluded.items()))
    (row,) = [row for row in report.rows if row.case == name]
    assert row.verdict == "not-run" and row.detail == (
        f"outside the kernel's limits: {why}; judged instead: {instead}"
    )
    assert report.groups[instead, "float32"] == "pass"
    assert "outside the kernel's limits)" in report.summary


@pytest.mark.parametrize("cases", ["quick", None])
def test_limits_that_leave_a_claimed_feature_no_case_are_a_usage_error_naming_it(cases):
    # One head width leaves no case with Dv != D: "dv" would be claimed and never judged.
    with pytest.raises(ValueError, match=r"limits \{'head_dims': \[64\]\} leave no case of the "
                       r"claimed feature\(s\) dv: drop the claim"):  # fmt: skip
        check_kernel(F.scaled_dot_product_attention, cases=cases, features={"causal", "dv"},
                     limits=KernelLimits(head_dims=(64,)))  # fmt: skip

    within_limits(get("sdpa"), cases, frozenset({"causal"}), KernelLimits(head_dims=(64,)))


def test_a_case_named_outside_the_limits_is_refused_before_any_work():
    with pytest.raises(ValueError, match="case 'plain' is outside the kernel's limits: lengths 37"):
        check_kernel(F.scaled_dot_product_attention, cases=["plain"],
                     limits=KernelLimits(seqlen_multiple=64))  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "limits", "error"),
    [
        ("ring", KernelLimits(seqlen_multiple=16), "the ring spec takes no seqlen_multiple"),
        ("flash_kvcache", KernelLimits(equal_lengths=True), "takes no seqlen_multiple and no"),
        ("flash_mla", KernelLimits(head_dims=(64, 128)), r"head widths \[576, 512\], outside"),
        ("flash_mla", KernelLimits(page_sizes=(16,)), r"pages hold \[64\] tokens, none in"),
        ("sdpa", KernelLimits(page_sizes=(16,)), "takes no page_sizes"),
    ],
)
def test_limits_a_spec_cannot_honour_are_refused_by_name(spec, limits, error):
    with pytest.raises(ValueError, match=error):
        check_kernel(F.scaled_dot_product_attention, spec=spec, limits=limits)


def test_the_ring_takes_head_widths():
    limits = KernelLimits(head_dims=(32,), contiguous_only=True)

    claimed = get("ring").features - {"dv"}  # one width leaves no Dv != D (above)
    battery, excluded = within_limits("ring", None, claimed, limits)

    judged = [case for case in battery if case.name not in excluded and case.needs <= claimed]
    assert excluded and judged and all(case.d == 32 for case in judged)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"head_dims": ()}, ValueError),
        ({"head_dims": (16, 0)}, ValueError),
        ({"head_dims": (16.0,)}, TypeError),
        ({"seqlen_multiple": 0}, ValueError),
        ({"seqlen_multiple": 1025}, ValueError),  # nearest cases past any calibrated length
        ({"head_dims": (16, 2048)}, ValueError),
        ({"equal_lengths": 1}, TypeError),
        ({"page_sizes": ()}, ValueError),
        ({"page_sizes": (16.0,)}, TypeError),
        ({"nondeterministic": "yes"}, TypeError),
    ],
)
def test_bad_limits_are_refused(kwargs, error):
    with pytest.raises(error):
        KernelLimits(**kwargs)


DECODE_LIMITS = {
    "head widths": KernelLimits(head_dims=(64, 128)),
    "pages of 16 and 64": KernelLimits(page_sizes=(16, 64)),
    "both": KernelLimits(head_dims=(32, 128), page_sizes=(64,)),
}


@pytest.mark.parametrize("limits", DECODE_LIMITS.values(), ids=DECODE_LIMITS.keys())
def test_a_decode_battery_within_the_limits_keeps_every_pair_they_allow(limits):
    spec = get("flash_kvcache")
    battery, excluded = within_limits(spec, None, spec.features, limits)

    inside = [case for case in battery if case.name not in excluded]
    assert excluded and all(spec.outside(limits, case) is None for case in inside)
    assert not allowed_pairs(spec, limits) & pairs.uncovered(spec, inside)
    assert {instead for _, instead in excluded.values()} <= {case.name for case in inside}


def test_the_nearest_decode_case_keeps_its_options_and_its_lengths_at_the_page_edges():
    spec = get("flash_kvcache")
    case = next(c for c in spec.default_battery() if c.page_size == 256 and c.rotary != "none")
    limits = KernelLimits(head_dims=(64,), page_sizes=(16, 64))

    found = spec.nearest(limits, case)

    assert (found.page_size, found.d) == (64, 64)
    assert (found.rotary, found.window, found.alibi, found.s_q) == (
        case.rotary, case.window, case.alibi, case.s_q
    )  # fmt: skip
    assert found.length_labels == case.length_labels and spec.outside(limits, found) is None


def test_a_kernel_declared_nondeterministic_keeps_its_battery_and_cannot_claim_deterministic():
    limits = KernelLimits(nondeterministic=True)
    spec = get("sdpa")

    battery, excluded = within_limits(spec, None, spec.features, limits)

    assert limits.declared == {"nondeterministic": True}
    assert battery == within_limits(spec, None, spec.features, None)[0] and not excluded
    with pytest.raises(ValueError, match='claims "deterministic" and its limits declare it'):
        check_kernel(F.scaled_dot_product_attention, limits=limits,
                     features=spec.features | {"deterministic"})  # fmt: skip
