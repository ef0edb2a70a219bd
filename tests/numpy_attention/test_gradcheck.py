"""The finite-difference check (numpy_attention.gradcheck): its verdict, judged at the suite's
GRADCHECK_RTOL, flags a deliberately wrong backward; its report and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import Linear
from numpy_attention.functional import SoftmaxCtx, softmax_backward, softmax_forward
from numpy_attention.gradcheck import GRADCHECK_RTOL, GradcheckReport, GradcheckRow, gradcheck
from parity_tests import tolerances


def softmax_backward_without_rowsum(dprobs, ctx: SoftmaxCtx):
    """A classic mistake: dS = P * dP, the rowsum(dP * P) term forgotten."""
    return ctx.probs * dprobs


def report_with(max_rel):
    return GradcheckReport([GradcheckRow("input0", (2,), max_rel, max_rel)])


def test_a_correct_backward_passes(rng):
    report = gradcheck(softmax_forward, rng.standard_normal((3, 5)), backward=softmax_backward)

    assert report.passed is True
    assert report.max_rel <= GRADCHECK_RTOL


def test_a_wrong_backward_fails(rng):
    report = gradcheck(
        softmax_forward, rng.standard_normal((3, 5)), backward=softmax_backward_without_rowsum
    )

    assert report.passed is False
    assert report["input0"].max_rel > GRADCHECK_RTOL


def test_passed_is_judged_at_the_suites_tolerance_and_within_at_any_other():
    just_above = report_with(2 * GRADCHECK_RTOL)

    assert report_with(GRADCHECK_RTOL).passed is True
    assert just_above.passed is False
    assert just_above.within(4 * GRADCHECK_RTOL) is True
    assert just_above.within(GRADCHECK_RTOL) is False
    assert GradcheckReport().passed is False  # nothing checked proves nothing


def test_a_module_report_names_inputs_and_parameters_and_leaves_the_module_alone(rng):
    layer = Linear(3, 2, rng=rng)
    before = layer.state_dict()

    report = gradcheck(layer, rng.standard_normal((4, 3)))

    assert [row.name for row in report.rows] == ["input0", "weight", "bias"]
    assert report["weight"].shape == (2, 3)
    assert report.passed
    assert layer.dtype == np.float32
    for name, value in before.items():
        np.testing.assert_array_equal(layer.state_dict()[name], value)


def test_a_forward_that_draws_its_own_dropout_mask_is_refused(rng):
    from numpy_attention import Dropout

    with pytest.raises(ValueError, match="not deterministic"):
        gradcheck(Dropout(0.5, rng=1), rng.standard_normal((4, 3)))


def test_a_function_needs_its_backward(rng):
    with pytest.raises(ValueError, match="backward"):
        gradcheck(softmax_forward, rng.standard_normal((3, 5)))


def test_the_suite_judges_finite_differences_at_the_same_tolerance():
    assert tolerances.GRADCHECK_RTOL == GRADCHECK_RTOL
