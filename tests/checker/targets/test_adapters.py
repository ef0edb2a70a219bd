"""``torch_attention`` behind flash-attn's signatures: a correct kernel of the "flash" and
"flash_varlen" specs, lse and dropout (judged by draws) included."""

from __future__ import annotations

import pytest

from parity_tests import check_kernel
from parity_tests.checker.targets import adapters


@pytest.mark.parametrize(
    ("spec", "kernel"),
    [("flash", adapters.flash_attn_func), ("flash_varlen", adapters.flash_attn_varlen_func)],
)
def test_a_correct_flash_kernel_passes_its_spec(spec, kernel):
    # bfloat16, the loosest dtype; every dtype over 60 seeds: python -m parity_tests --calibrate
    report = check_kernel(kernel, spec=spec, dtypes=["bfloat16"], cases="quick")

    assert report.passed, report.failures
    assert {"lse", "keep"} <= {row.tensor for row in report.rows}
    assert report.coverage == 1.0
