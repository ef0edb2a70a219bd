"""torch_attention.ring_checks: the ring's argument checks, each a clear error naming the input."""

from __future__ import annotations

import pytest
import torch

from torch_attention import ring_checks


def test_the_layout_is_one_of_the_known_ones():
    for layout in ring_checks.LAYOUTS:
        ring_checks.check_layout(layout)
    with pytest.raises(ValueError, match="layout must be one of"):
        ring_checks.check_layout("striped")


def test_only_floating_dtypes_pass():
    ring_checks.check_dtype("q", torch.zeros(1, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="q must be float16, bfloat16, float32 or float64"):
        ring_checks.check_dtype("q", torch.zeros(1, dtype=torch.int32))


def test_zigzag_needs_an_even_shard():
    ring_checks.check_zigzag_length("zigzag", 24, "q", (1, 2, 24, 8))
    ring_checks.check_zigzag_length("contiguous", 23, "q", (1, 2, 23, 8))
    with pytest.raises(ValueError, match=r"got 23 \(q \(1, 2, 23, 8\)\)"):
        ring_checks.check_zigzag_length("zigzag", 23, "q", (1, 2, 23, 8))
