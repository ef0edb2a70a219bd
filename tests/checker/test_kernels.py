"""The kernel checker: correct kernels pass, broken behaviour is named, verdicts reproduce."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity_tests import KernelReport, check_kernel
from parity_tests.checker.battery import DEFAULT, STRESS, make_inputs, resolve
from parity_tests.checker.kernels import FLOOR, GRAD_FACTOR, OUTPUT_FACTOR, KernelUnsupported
from parity_tests.checker.targets import EXPECTED_FAILURES, builtin_targets, expected_failure
from parity_tests.tolerances import FLOAT32_RTOL

DTYPES = ("float32", "float16", "bfloat16")
BY_NAME = {case.name: case for case in DEFAULT}


@pytest.mark.parametrize("name", [target.name for target in builtin_targets("cpu", DTYPES)])
def test_builtin_targets_fail_only_where_documented(name):
    target = next(t for t in builtin_targets("cpu", DTYPES) if t.name == name)

    report = check_kernel(target.kernel, dtypes=target.dtypes)

    unexpected = [
        row for row in report.failures if not expected_failure(name, row.case, row.dtype, "cpu")
    ]
    assert not unexpected
    assert any(row.verdict == "pass" for row in report.rows)


@pytest.mark.parametrize("entry", EXPECTED_FAILURES, ids=lambda e: f"{e.target}-{e.case}")
def test_expected_failures_really_fail(entry):
    target = next(t for t in builtin_targets("cpu", DTYPES) if t.name == entry.target)

    report = check_kernel(target.kernel, dtypes=entry.dtypes or DTYPES, cases=[entry.case])

    assert {row.verdict for row in report.rows} == {"nonfinite"}


def test_rows_cover_every_case_dtype_and_tensor():
    report = check_kernel(
        F.scaled_dot_product_attention, dtypes=["float32", "bfloat16"], cases="quick"
    )

    keys = {(row.case, row.dtype, row.tensor) for row in report.rows}
    assert keys == {
        (case.name, dtype, tensor)
        for case in resolve("quick")
        for dtype in ("float32", "bfloat16")
        for tensor in ("out", "dq", "dk", "dv") + (("keep",) if case.dropout_p else ())
    }


def test_float32_baseline_tracks_the_golden_to_float32_rounding():
    # The bound scales with the baseline's error, so a harness bug that hits kernel and baseline
    # alike (a dropped scale, a flipped mask) would widen the bound and hide itself; in float32
    # the baseline must stay at float32 rounding of the golden.
    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"])

    for row in report.rows:
        if row.tensor != "keep":
            assert row.baseline <= FLOAT32_RTOL * row.golden_max, row


def test_bound_is_factor_times_baseline_plus_floor():
    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float16"], cases=["plain"])

    for row in report.rows:
        factor = OUTPUT_FACTOR if row.tensor == "out" else GRAD_FACTOR
        assert row.bound == factor * row.baseline + FLOOR["float16"] * row.golden_max


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
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale
    )
    poison = torch.zeros_like(out)
    poison[0, 0, 0, 0] = math.nan
    return out + poison


def test_nan_where_the_golden_is_finite_fails_at_once():
    report = check_kernel(_with_nan_in_one_row, dtypes=["float32"], cases=["plain"])

    verdicts = {row.tensor: row.verdict for row in report.rows}
    assert verdicts["out"] == "nonfinite"
    assert not report.passed


def _raises(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    raise RuntimeError("kernel exploded")


def _refuses(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    raise KernelUnsupported("not my kind of case")


def _wrong_shape(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale
    )[..., :1, :]


@pytest.mark.parametrize(
    ("kernel", "verdict", "detail"),
    [
        (_raises, "error", "kernel exploded"),
        (_refuses, "skip", "not my kind of case"),
        (_wrong_shape, "error", "expected a tensor of shape"),
    ],
)
def test_a_kernel_that_raises_gets_a_verdict_not_a_crash(kernel, verdict, detail):
    report = check_kernel(kernel, dtypes=["float32"], cases=["plain", "causal-n<m"])

    assert [row.verdict for row in report.rows] == [verdict, verdict]
    assert all(detail in row.detail for row in report.rows)
    assert not report.passed


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

    assert {row.case for row in report.rows} == {case.name for case in STRESS}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"dtypes": ["float64"]}, ValueError),
        ({"dtypes": []}, ValueError),
        ({"cases": ["no-such-case"]}, ValueError),
        ({"cases": "everything"}, ValueError),
        ({"cases": []}, ValueError),
    ],
)
def test_bad_arguments_are_refused(kwargs, error):
    with pytest.raises(error):
        check_kernel(F.scaled_dot_product_attention, **kwargs)


def test_a_kernel_must_be_callable():
    with pytest.raises(TypeError, match="callable"):
        check_kernel("F.scaled_dot_product_attention")


def test_an_empty_report_has_not_passed():
    assert not KernelReport("nothing", "cpu").passed


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
