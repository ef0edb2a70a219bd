"""``check_kernel``: a row for every case, dtype and tensor, reproducible verdicts, seeds and
arguments refused, the "module:function" form, float64 as a dtype like any other, forward-only,
and a kernel that refuses most of the battery (each call made and judged: test_calls.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parity_tests import KernelUnsupported, check_kernel
from parity_tests.checker.battery.catalog import select as battery_for
from parity_tests.checker.pipeline import SEED_LIMIT
from parity_tests.checker.specs import get


def test_rows_cover_every_case_dtype_and_tensor():
    report = check_kernel(
        F.scaled_dot_product_attention, dtypes=["float32", "bfloat16"], cases="quick"
    )

    keys = {(row.case, row.dtype, row.tensor) for row in report.rows}
    quick = battery_for("sdpa", "quick")
    assert keys == {
        (case.name, dtype, tensor)
        for case in quick
        for dtype in ("float32", "bfloat16")
        for tensor in ("out", "dq", "dk", "dv") + (("keep",) if case.dropout_p else ())
    }
    assert report.cases == {case.name: case for case in quick}


def test_same_seed_same_verdict_other_seed_other_inputs():
    first = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"])
    again = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"])
    other = check_kernel(
        F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"], seed=7
    )

    assert first.rows == again.rows
    assert [r.error for r in first.rows] != [r.error for r in other.rows]


def _refuses_options(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):  # fmt: skip
    if attn_mask is not None or is_causal or scale is not None or dropout_p or enable_gqa:
        raise KernelUnsupported("plain attention only")
    return F.scaled_dot_product_attention(query, key, value)


def test_a_kernel_that_refuses_most_of_the_battery_has_not_passed():
    report = check_kernel(_refuses_options, dtypes=["float32"])

    statuses = list(report.groups.values())
    assert "fail" not in statuses and statuses.count("skip") > statuses.count("pass")
    assert not report.passed
    assert report.coverage == statuses.count("pass") / len(statuses)
    assert "skips outnumber passes" in report.summary


def test_stress_battery_runs_and_names_every_case():
    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases="stress")

    assert {row.case for row in report.rows} == {
        case.name for case in battery_for("sdpa", "stress")
    }


def test_the_ring_spec_has_no_stress_battery():
    # The stress cases do not split over the ranks; the ring spec's battery is its own.
    with pytest.raises(ValueError, match="the ring spec has no stress battery"):
        battery_for("ring", "stress")
    assert (
        battery_for("ring", "quick") == battery_for("ring", None) == get("ring").default_battery()
    )


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"dtypes": ["float8"]}, ValueError),
        ({"forward_only": "yes"}, TypeError),
        ({"dtypes": []}, ValueError),
        ({"cases": ["no-such-case"]}, ValueError),
        ({"cases": "everything"}, ValueError),
        ({"cases": []}, ValueError),
        ({"seed": 1.5}, TypeError),
        ({"seed": True}, TypeError),
    ],
)
def test_bad_arguments_are_refused(kwargs, error):
    with pytest.raises(error):
        check_kernel(F.scaled_dot_product_attention, **kwargs)


@pytest.mark.parametrize("seed", [-1, SEED_LIMIT])
def test_a_seed_that_torch_or_numpy_would_refuse_is_refused_first(seed):
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\)"):
        check_kernel(F.scaled_dot_product_attention, seed=seed)


def test_the_largest_seed_is_accepted():
    report = check_kernel(
        F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"], seed=SEED_LIMIT - 1
    )

    assert report.passed


def test_a_kernel_must_be_callable():
    with pytest.raises(TypeError, match="callable"):
        check_kernel("F.scaled_dot_product_attention")


def test_a_kernel_may_be_named_module_colon_function():
    named = check_kernel("torch.nn.functional:scaled_dot_product_attention", dtypes=["float32"],
                         cases=["plain"])  # fmt: skip

    assert named.passed and named.kernel == "scaled_dot_product_attention"


def test_float64_is_a_dtype_like_any_other():
    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float64"], cases="quick")

    assert report.passed, report.failures


def _float32_inside(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):  # fmt: skip
    """Right math in float32, returned in the inputs' dtype (Llama's eager softmax does this)."""
    out = F.scaled_dot_product_attention(query.float(), key.float(), value.float(), attn_mask,
                                         dropout_p, is_causal, scale=scale)  # fmt: skip
    return out.to(query.dtype)


def test_float32_rounding_in_a_float64_kernel_is_caught():
    report = check_kernel(_float32_inside, dtypes=["float32", "float64"], cases=["plain"])

    assert report.groups == {("plain", "float32"): "pass", ("plain", "float64"): "fail"}


def _scale_by_d_in_float64(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                           scale=None, enable_gqa=False):  # fmt: skip
    if query.dtype == torch.float64 and scale is None:
        scale = 1.0 / query.shape[-1]
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                          scale=scale, enable_gqa=enable_gqa)  # fmt: skip


def test_a_mistake_only_in_float64_is_caught_in_float64():
    report = check_kernel(_scale_by_d_in_float64, dtypes=["float32", "float64"], cases=["plain"])

    assert report.groups == {("plain", "float32"): "pass", ("plain", "float64"): "fail"}


def _forward_only(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """An inference kernel: refuses inputs that require grad (as FlexAttention on CPU does)."""
    if query.requires_grad:
        raise RuntimeError("this kernel has no backward")
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                          scale=scale)  # fmt: skip


def test_forward_only_judges_out_with_inputs_that_do_not_require_grad():
    cases = ["plain", "causal-n<m", "dead-rows-bool"]

    forward = check_kernel(_forward_only, dtypes=["float32"], cases=cases, forward_only=True)
    both = check_kernel(_forward_only, dtypes=["float32"], cases=cases)

    assert forward.passed and {row.tensor for row in forward.rows} == {"out"}
    assert {row.verdict for row in both.rows} == {"error"}


def test_forward_only_still_catches_a_wrong_output():
    report = check_kernel(_scale_by_d_in_float64, dtypes=["float64"], cases=["plain"],
                          forward_only=True)  # fmt: skip

    assert [row.verdict for row in report.rows] == ["fail"]


def _skips_gqa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):  # fmt: skip
    if enable_gqa:
        raise KernelUnsupported("no GQA here")
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                          scale=scale)  # fmt: skip


def test_a_claimed_feature_that_no_judged_case_exercised_is_not_covered_and_fails():
    report = check_kernel(_skips_gqa, dtypes=["float32"], cases="quick",
                          features={"causal", "gqa"})  # fmt: skip

    statuses = list(report.groups.values())
    assert "fail" not in statuses and statuses.count("skip") < statuses.count("pass")
    assert report.not_covered == ["gqa"] and not report.passed
    assert report.summary.startswith("fail: not covered: gqa (claimed, no judged case);")


def test_cases_named_one_by_one_report_what_they_leave_uncovered_without_failing():
    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"])

    assert report.passed and "gqa" in report.not_covered


def test_every_group_plan_groups_lists_is_judged_alone_even_one_the_limits_added():
    from parity_tests import KernelLimits, plan_groups

    limits = KernelLimits(head_dims=(64, 128))
    groups = plan_groups("sdpa", dtypes=["float32"], cases="quick", limits=limits)
    instead = {g.detail.rpartition("judged instead: ")[2] for g in groups if not g.runs}
    added = next(g for g in groups if g.runs and g.case in instead)

    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"],
                          cases=[added.case], limits=limits)  # fmt: skip

    assert report.groups == {(added.case, "float32"): "pass"}
