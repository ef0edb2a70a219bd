"""``check_kernel``: the bound, reproducible verdicts, float64, forward-only, the "module:function"
form, and every way a kernel can be wrong named as a verdict (a value, a NaN, a dtype, an input
changed in place, a raise, a refusal, sys.exit)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity_tests import KernelUnsupported, check_kernel
from parity_tests.checker.kernels import SEED_LIMIT, battery_for
from parity_tests.tolerances import FLOAT32_RTOL


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale
    )


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


def test_float32_baseline_tracks_the_golden_to_float32_rounding():
    # The bound scales with the baseline's error, so a harness bug that hits kernel and baseline
    # alike (a dropped scale, a flipped mask) would widen the bound and hide itself; in float32
    # the baseline must stay at float32 rounding of the golden.
    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"])

    for row in report.rows:
        if row.tensor != "keep":
            assert row.baseline <= FLOAT32_RTOL * row.golden_max, row


def test_same_seed_same_verdict_other_seed_other_inputs():
    first = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"])
    again = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"])
    other = check_kernel(
        F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"], seed=7
    )

    assert first.rows == again.rows
    assert [r.error for r in first.rows] != [r.error for r in other.rows]


def _with_nan_in_one_row(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None
):
    out = _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)
    poison = torch.zeros_like(out)
    poison[0, 0, 0, 0] = math.nan
    return out + poison


def test_nan_where_the_golden_is_finite_fails_at_once():
    report = check_kernel(_with_nan_in_one_row, dtypes=["float32"], cases=["plain"])

    verdicts = {row.tensor: row.verdict for row in report.rows}
    assert verdicts["out"] == "nonfinite"
    assert not report.passed


def _float64(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale).double()


def test_an_output_of_another_dtype_fails_even_when_its_values_are_right():
    report = check_kernel(_float64, dtypes=["float32"], cases=["plain"])

    (row,) = [row for row in report.rows if row.tensor == "out"]
    assert row.verdict == "dtype" and row.error <= row.bound
    assert row.detail == "out is float64, the inputs are float32"
    assert not report.passed


def _zeroes_q_then_nans_k(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None
):
    out = _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)
    with torch.no_grad():
        query.zero_()
        key.fill_(math.nan)
    return out


def _flips_mask_in_backward(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None
):
    out = _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)
    return _HookMask.apply(out, attn_mask)


class _HookMask(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, mask):
        ctx.mask = mask
        return out.clone()

    @staticmethod
    def backward(ctx, dout):
        ctx.mask.logical_not_()
        return dout, None


def test_inputs_changed_in_place_fail_and_are_named():
    report = check_kernel(_zeroes_q_then_nans_k, dtypes=["float32"], cases=["plain"])

    changed = {row.tensor: row for row in report.rows if row.verdict == "inplace"}
    assert set(changed) == {"q", "k"}
    assert changed["k"].error == math.inf and changed["q"].error > 0
    assert "forward" in changed["q"].detail
    assert not report.passed


def test_an_input_changed_in_the_backward_is_caught_too():
    report = check_kernel(_flips_mask_in_backward, dtypes=["float32"], cases=["bool-mask"])

    (row,) = [row for row in report.rows if row.verdict == "inplace"]
    assert row.tensor == "attn_mask" and "backward" in row.detail
    assert not report.passed


def test_the_golden_is_computed_from_copies_the_kernel_cannot_touch():
    check_kernel(_zeroes_q_then_nans_k, dtypes=["float32"], cases=["plain"])

    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"])

    assert report.passed


def _raises(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    raise RuntimeError("kernel exploded")


def _refuses(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    raise KernelUnsupported("not my kind of case")


def _wrong_shape(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)[..., :1, :]


def _exits(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    sys.exit(0)


@pytest.mark.parametrize(
    ("kernel", "verdict", "detail"),
    [
        (_raises, "error", "RuntimeError: kernel exploded"),
        (_refuses, "skip", "not my kind of case"),
        (_wrong_shape, "error", "expected a tensor of shape"),
        (_exits, "error", "SystemExit: 0 (the kernel called sys.exit)"),
    ],
)
def test_a_kernel_that_raises_gets_a_verdict_not_a_crash(kernel, verdict, detail):
    report = check_kernel(kernel, dtypes=["float32"], cases=["plain", "causal-n<m"])

    assert [row.verdict for row in report.rows] == [verdict, verdict]
    assert all(detail in row.detail for row in report.rows)
    assert not report.passed


def test_each_distinct_exception_is_kept_once_with_its_traceback():
    report = check_kernel(_raises, dtypes=["float32", "float16"], cases=["plain", "causal-n<m"])

    (error,) = report.errors
    assert (error.number, error.kind, error.message) == (1, "RuntimeError", "kernel exploded")
    assert error.traceback.startswith("Traceback")
    assert "in _raises" in error.traceback and "check_kernel" not in error.traceback
    assert len(error.where) == 4
    assert {row.exception for row in report.rows} == {1}


def _interrupted(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    raise KeyboardInterrupt


def test_ctrl_c_in_a_kernel_still_stops_the_run():
    with pytest.raises(KeyboardInterrupt):
        check_kernel(_interrupted, dtypes=["float32"], cases=["plain"])


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


def _ignores_dropout(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(query, key, value, attn_mask, 0.0, is_causal, scale=scale)


def _numpy_dropout(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """Correct dropout, but from a generator the checker cannot seed."""
    probs = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)
    keep = torch.from_numpy(np.random.default_rng().random(tuple(probs.shape)) >= dropout_p)
    return (probs * keep / (1.0 - dropout_p)) @ value


@pytest.mark.parametrize(
    ("kernel", "tensor"), [(_ignores_dropout, "keep"), (_numpy_dropout, "out")]
)
def test_dropout_is_checked_against_the_kernels_own_mask(kernel, tensor):
    report = check_kernel(kernel, dtypes=["float32"], cases=["dropout"])

    failed = {row.tensor for row in report.failures}
    assert tensor in failed


def test_stress_battery_runs_and_names_every_case():
    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases="stress")

    assert {row.case for row in report.rows} == {
        case.name for case in battery_for("sdpa", "stress")
    }


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
