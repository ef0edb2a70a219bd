"""One kernel call, made and judged (``checker.running.calls``, through ``check_kernel``): every way
a kernel can be wrong named as a verdict (a NaN, a dtype, an input changed in place in the forward
or the backward, a raise, a refusal, a skip, a wrong shape, sys.exit, dropout from a generator the
checker cannot seed, a result that a second call on the same inputs does not repeat bit for bit:
the backward's too for a kernel that claims "deterministic"), the forward judged when only the
backward raises, each distinct exception kept once with its traceback, the golden untouched by
what the kernel does to its copies, and Ctrl-C still stopping the run."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity_tests import SPEC_FEATURES, KernelLimits, KernelUnsupported, check_kernel
from parity_tests.checker import specs
from parity_tests.checker.battery.attention.quick import pick
from parity_tests.checker.pitfalls.races import one_ulp_every_other_launch


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale
    )


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


def _asserts(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    assert query.shape[-2] % 64 == 0, "N must be a multiple of 64"


def _not_implemented(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None):  # fmt: skip
    raise NotImplementedError("causal is not implemented")


def _no_scale_argument(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False):
    return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, None)


@pytest.mark.parametrize(
    ("kernel", "verdict", "detail"),
    [
        (_raises, "error", "RuntimeError: kernel exploded"),
        (_refuses, "skip", "not my kind of case"),
        (_wrong_shape, "error", "expected a tensor of shape"),
        (_exits, "error", "SystemExit: 0 (the kernel called sys.exit)"),
        (_asserts, "refused", "AssertionError: N must be a multiple of 64"),
        (_not_implemented, "refused", "NotImplementedError: causal is not implemented"),
        (_no_scale_argument, "refused", "TypeError: _no_scale_argument() got an unexpected"),
    ],
)
def test_a_kernel_that_raises_gets_a_verdict_not_a_crash(kernel, verdict, detail):
    report = check_kernel(kernel, dtypes=["float32"], cases=["plain", "causal-n<m"])

    assert [row.verdict for row in report.rows] == [verdict, verdict]
    assert all(detail in row.detail for row in report.rows)
    assert not report.passed


class _RefusingBackward(torch.autograd.Function):
    """The identity forward, a backward that refuses (as a kernel without a backward for some
    option raises)."""

    @staticmethod
    def forward(ctx, out):
        return out.clone()

    @staticmethod
    def backward(ctx, dout):
        raise ValueError("no backward for this case")


def _forward_only_kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                         scale=None):  # fmt: skip
    return _RefusingBackward.apply(_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale))


def _wrong_then_refusing(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                         scale=None):  # fmt: skip
    return _forward_only_kernel(query, key, value, attn_mask, dropout_p, is_causal, scale) * 1.01


def test_when_the_backward_raises_the_forward_is_still_judged():
    good = check_kernel(_forward_only_kernel, dtypes=["float32"], cases=["plain"])
    wrong = check_kernel(_wrong_then_refusing, dtypes=["float32"], cases=["plain"])

    assert [(row.tensor, row.verdict) for row in good.rows] == [("out", "pass"), ("-", "refused")]
    assert good.rows[1].detail == "the backward: ValueError: no backward for this case"
    assert good.groups == {("plain", "float32"): "refused"} and not good.passed
    assert [(row.tensor, row.verdict) for row in wrong.rows] == [("out", "fail"), ("-", "refused")]
    assert wrong.groups == {("plain", "float32"): "fail"}  # wrong numbers, said first
    assert wrong.errors[0].kind == "ValueError" and wrong.rows[1].exception == 1


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


# The second call (``calls.repeated``): the same inputs must give the same bits.


def _racy_forward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    out = _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)
    return one_ulp_every_other_launch(out)


def test_a_forward_that_changes_from_call_to_call_is_flagged_nondeterministic():
    report = check_kernel(_racy_forward, dtypes=["float32"], cases=["plain"])

    (row,) = report.failures
    assert (row.tensor, row.verdict, row.bound) == ("out", "nondeterministic", 0.0)
    assert 0.0 < row.error < 1e-6 and "max|difference|" in row.detail
    assert [r.verdict for r in report.rows if r is not row] == ["pass"] * 4  # within the bound
    assert report.groups == {("plain", "float32"): "fail"} and not report.passed


def test_a_kernel_declared_nondeterministic_is_called_once_and_says_so():
    limits = KernelLimits(nondeterministic=True)

    report = check_kernel(_racy_forward, dtypes=["float32"], cases=["plain"], limits=limits)

    assert report.passed and report.limits == {"nondeterministic": True}


class _RacyGradient(torch.autograd.Function):
    """The identity, whose backward adds its blocks in the order they finish."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return one_ulp_every_other_launch(grad)


def _racy_backward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return _sdpa(_RacyGradient.apply(query), key, value, attn_mask, dropout_p, is_causal, scale)


@pytest.mark.parametrize(("claims", "flagged"), [(False, []), (True, ["dq"])])
def test_the_backward_runs_twice_only_for_a_kernel_that_claims_deterministic(claims, flagged):
    features = SPEC_FEATURES["sdpa"] | ({"deterministic"} if claims else set())

    report = check_kernel(_racy_backward, dtypes=["float32"], cases=["plain"], features=features)

    assert [row.tensor for row in report.failures] == flagged
    assert {row.verdict for row in report.failures} <= {"nondeterministic"}


def test_the_second_call_draws_the_same_dropout_mask():
    case, claimed = pick(specs.get("sdpa"), "dropout"), SPEC_FEATURES["sdpa"] | {"deterministic"}

    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases=[case],
                          features=claimed)  # fmt: skip

    assert report.passed, report.failures


def _fails_the_second_time(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                           scale=None):  # fmt: skip
    if not query.requires_grad:  # the second call, forward only
        raise RuntimeError("launch failed")
    return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)


def test_a_second_call_that_raises_is_an_error_beside_the_first_calls_rows():
    report = check_kernel(_fails_the_second_time, dtypes=["float32"], cases=["plain"])

    assert [row.verdict for row in report.rows] == ["pass"] * 4 + ["error"]
    assert report.rows[-1].detail == "the second call: RuntimeError: launch failed"
    assert report.errors[0].kind == "RuntimeError" and not report.passed


def test_an_input_changed_in_place_by_both_calls_has_one_row():
    report = check_kernel(_zeroes_q_then_nans_k, dtypes=["float32"], cases=["plain"])

    changed = [row.tensor for row in report.rows if row.verdict == "inplace"]
    assert sorted(changed) == ["k", "q"]
