"""numpy_attention.grouped_options: the pure-Python checks both GroupedQueryAttention twins import.
Through the layers (every option, both packages, word for word): test_grouped.py in
tests/numpy_attention and tests/torch_attention."""

from __future__ import annotations

import pytest

from numpy_attention import grouped as numpy_grouped
from numpy_attention import grouped_options as options


def test_the_layer_reads_the_one_module() -> None:
    assert numpy_grouped.grouped_options is options


@pytest.mark.parametrize(
    ("rotary_dim", "head_dim", "expected"), [(None, 8, 8), (0, 8, 0), (4, 8, 4), (8, 8, 8)]
)
def test_rotary_dim(rotary_dim, head_dim, expected) -> None:
    assert options.check_rotary_dim(rotary_dim, head_dim) == expected


@pytest.mark.parametrize(
    ("rotary_dim", "head_dim", "match"),
    [(None, 7, "head_dim must be even"), (3, 8, "rotary_dim must be even"), (10, 8, "at most")],
)
def test_rotary_dim_refused(rotary_dim, head_dim, match) -> None:
    with pytest.raises(ValueError, match=match):
        options.check_rotary_dim(rotary_dim, head_dim)


def test_qk_norm_defaults_pass_and_options_without_the_norm_are_refused() -> None:
    assert options.check_qk_norm(False, "rms", "head", 0.0) == "head"
    assert options.check_qk_norm(True, "layer", "all", 0.0, "after_rope") == "all"
    for args in [("rms", "all", 0.0), ("rms", "head", 1.0), ("layer", "head", 0.0)]:
        with pytest.raises(ValueError, match="but qk_norm is False"):
            options.check_qk_norm(False, *args)
    with pytest.raises(ValueError, match="qk_norm_position must be one of"):
        options.check_qk_norm(True, "rms", "head", 0.0, "between")
    with pytest.raises(ValueError, match="has no weight"):
        options.check_qk_norm(True, "rms_weightless", "per_head", 0.0)


def test_output_norm() -> None:
    assert options.check_output_norm(True, 1e-5, None) is True
    assert options.check_output_norm(False, 1e-6, "element") is False
    with pytest.raises(ValueError, match="output_norm_eps must be > 0"):
        options.check_output_norm(True, 0.0, None)
    with pytest.raises(ValueError, match="but output_norm is False"):
        options.check_output_norm(False, 1e-5, None)
    with pytest.raises(ValueError, match="no model has both"):
        options.check_output_norm(True, 1e-6, "head")


@pytest.mark.parametrize(
    ("shape", "dim", "width"), [("head", 8, 8), ("per_head", (3, 8), 8), ("all", 24, 24)]
)
def test_norm_shapes(shape, dim, width) -> None:
    assert options.norm_dim(shape, 3, 8) == dim
    assert options.norm_width(shape, 3, 8) == width
