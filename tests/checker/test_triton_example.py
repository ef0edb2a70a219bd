"""The project's small Triton kernel (tests/checker/triton_example.py) judged by the kernel
checker under Triton's interpreter, the way docs/triton-on-cpu.md tells a user to judge theirs:
it passes what it claims inside its limits, refuses what it does not take (a refusal, reported
apart), and the checker catches it when v is read with k's strides. Skipped, naming the extra,
where Triton is not installed (the test command installs it); tests/conftest.py sets
TRITON_INTERPRET=1 before Triton is imported where there is no GPU."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="needs the triton extra: pip install -e '.[triton]'")

from parity_tests import check_kernel  # noqa: E402
from tests.checker import triton_example  # noqa: E402

JUDGED = dict(spec="flash", features=triton_example.FEATURES, limits=triton_example.LIMITS,
              forward_only=True)  # fmt: skip


def test_the_example_passes_its_quick_battery_inside_its_limits():
    # float16, the loosest dtype the interpreter computes right (docs/triton-on-cpu.md runs
    # the default battery in float32 and float16 by hand)
    report = check_kernel(triton_example.attention, dtypes=["float16"], cases="quick", **JUDGED)

    assert report.passed, report.failures
    judged = {case for (case, _), status in report.groups.items() if status == "pass"}
    strided, two_row_tiles = "outliers-kvstrides-37x113-d64", "causal-br-257x37-d32"
    assert {"causal-br-129x1024-d16", strided, two_row_tiles} <= judged
    # The quick battery's width-256 case is a feature it does not claim; no case was left out
    # for its limits with nothing judged in its place.
    assert all(instead in report.cases for _, instead in report.excluded.values())


def test_a_feature_claimed_but_not_taken_is_a_refusal_reported_apart():
    claims_windows = {**JUDGED, "features": {"causal", "window"}}

    report = check_kernel(triton_example.attention, dtypes=["float32"],
                          cases=["window-br"], **claims_windows)  # fmt: skip

    assert not report.passed
    assert set(report.groups.values()) == {"refused"}
    assert "takes no window_size" in report.errors[0].message
    assert "(1 refused)" in report.summary


def test_v_read_with_k_strides_is_flagged_on_the_layout_that_separates_them():
    def v_with_k_strides(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        return triton_example.launch(q, k, v, scale, causal, k.stride())

    report = check_kernel(v_with_k_strides, dtypes=["float32"],
                          cases=["scale-128x129-d64", "outliers-kvstrides-37x113-d64"],
                          **JUDGED)  # fmt: skip

    assert report.groups == {
        ("scale-128x129-d64", "float32"): "pass",  # contiguous k and v: the same strides
        ("outliers-kvstrides-37x113-d64", "float32"): "fail",
    }
