"""``torch_attention.flash_api``: flash-attn's two entries over any backend, the one translation of
flash-attn's keywords (the checker's adapters are its entries; the Triton entries call it with
backend "triton"). Judged against the checker's flash specs: tests/checker/targets/test_adapters.py,
tests/torch_attention/triton/test_flash.py."""

from __future__ import annotations

import pytest
import torch

from parity_tests.checker.targets import adapters
from torch_attention import flash_api


def test_a_max_seqlen_below_a_sequence_is_refused_as_flash_attn_would_read_past_it():
    q = torch.zeros(7, 2, 16)
    offsets = torch.tensor([0, 3, 7], dtype=torch.int32)

    with pytest.raises(ValueError, match="max_seqlen_k = 3 is below the longest sequence, 4"):
        flash_api.flash_attn_varlen_func(q, q, q, offsets, offsets, 4, 3)
    out = flash_api.flash_attn_varlen_func(q, q, q, offsets, offsets, 4, 4)
    assert out.shape == (7, 2, 16)


def test_the_checker_and_the_triton_entries_share_one_translation():
    # flash-attn's keywords are translated in one place, torch_attention.flash_api: the
    # checker's adapters are its entries, the Triton kernel's call them with backend "triton".
    assert adapters.flash_attn_func is flash_api.flash_attn_func
    assert adapters.flash_attn_varlen_func is flash_api.flash_attn_varlen_func
