"""``torch_attention`` behind flash-attn's signatures: a correct kernel of the "flash" and
"flash_varlen" specs, lse and dropout (judged by draws) included."""

from __future__ import annotations

import pytest
import torch

from parity_tests import check_kernel
from parity_tests.checker import adapters
from torch_attention import flash_api


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


def test_a_max_seqlen_below_a_sequence_is_refused_as_flash_attn_would_read_past_it():
    q = torch.zeros(7, 2, 16)
    offsets = torch.tensor([0, 3, 7], dtype=torch.int32)

    with pytest.raises(ValueError, match="max_seqlen_k = 3 is below the longest sequence, 4"):
        adapters.flash_attn_varlen_func(q, q, q, offsets, offsets, 4, 3)
    out = adapters.flash_attn_varlen_func(q, q, q, offsets, offsets, 4, 4)
    assert out.shape == (7, 2, 16)


def test_the_checker_and_the_triton_entries_share_one_translation():
    # flash-attn's keywords are translated in one place, torch_attention.flash_api: the
    # checker's adapters are its entries, the Triton kernel's call them with backend "triton".
    assert adapters.flash_attn_func is flash_api.flash_attn_func
    assert adapters.flash_attn_varlen_func is flash_api.flash_attn_varlen_func
