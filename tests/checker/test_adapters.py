"""``torch_attention`` behind flash-attn's signatures: a correct kernel of the "flash" and
"flash_varlen" specs, lse included, in float32 and bfloat16."""

from __future__ import annotations

import pytest

from parity_tests import check_kernel
from parity_tests.checker import adapters


@pytest.mark.parametrize(
    ("spec", "kernel"),
    [("flash", adapters.flash_attn_func), ("flash_varlen", adapters.flash_attn_varlen_func)],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_correct_flash_kernel_passes_its_spec(spec, kernel, dtype):
    report = check_kernel(kernel, spec=spec, dtypes=[dtype], cases="quick")

    assert report.passed, report.failures
    assert "lse" in {row.tensor for row in report.rows}
    assert report.coverage == 1.0
