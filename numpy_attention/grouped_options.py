"""The options of ``GroupedQueryAttention`` that are pure Python, checked once for both twins
(numpy_attention/grouped.py and torch_attention/grouped.py import them, as decode/arguments.py
is shared): RoPE's rotated width, the QK-norm's type, shape, offset and position, the output
norm against the output gate, the QK-norm weight's shape and width, and a cache's value width
against the layer's. Every check raises ``ValueError`` naming the argument. NumPy only (it needs
nothing but ``validation``).

Tests: tests/numpy_attention/test_grouped_options.py; through both layers in
tests/numpy_attention/test_grouped.py and tests/torch_attention/test_grouped.py.
"""

from __future__ import annotations

from typing import Any

from . import validation

QK_NORM_TYPES = ("rms", "layer", "layer_bias", "rms_weightless")
QK_NORM_SHAPES = ("head", "per_head", "all")
QK_NORM_POSITIONS = ("before_rope", "after_rope")


def check_rotary_dim(rotary_dim: Any, head_dim: int) -> int:
    """R: even, at most D; D when None (which must then be even)."""
    if rotary_dim is None:
        if head_dim % 2:
            raise ValueError(
                f"RoPE rotates pairs of coordinates: head_dim must be even, got {head_dim} "
                "(or give an even rotary_dim below it)"
            )
        return head_dim
    rotary = validation.non_negative_int("rotary_dim", rotary_dim)
    if rotary % 2 or rotary > head_dim:
        raise ValueError(
            f"rotary_dim must be even (RoPE rotates pairs) and at most head_dim = {head_dim}, "
            f"got {rotary}"
        )
    return rotary


def check_qk_norm(
    qk_norm: bool, norm_type: Any, shape: Any, offset: Any, position: Any = "before_rope"
) -> str:
    """The QK-norm's options checked; its shape returned. Options given without qk_norm are
    refused (they would do nothing), and so are a weight's shape or offset for a weightless
    norm (it has no weight)."""
    if norm_type not in QK_NORM_TYPES:
        raise ValueError(f"qk_norm_type must be one of {list(QK_NORM_TYPES)}, got {norm_type!r}")
    if shape not in QK_NORM_SHAPES:
        raise ValueError(f"qk_norm_shape must be one of {list(QK_NORM_SHAPES)}, got {shape!r}")
    if position not in QK_NORM_POSITIONS:
        raise ValueError(
            f"qk_norm_position must be one of {list(QK_NORM_POSITIONS)}, got {position!r}"
        )
    offset = validation.finite_real("norm_weight_offset", offset)
    if not qk_norm and (norm_type, shape, offset, position) != ("rms", "head", 0.0, "before_rope"):
        raise ValueError(
            f"qk_norm_type={norm_type!r}, qk_norm_shape={shape!r}, norm_weight_offset="
            f"{offset} and qk_norm_position={position!r} describe a QK-norm, but qk_norm is False"
        )
    if norm_type == "rms_weightless" and (shape == "per_head" or offset != 0.0):
        raise ValueError(
            f"qk_norm_type='rms_weightless' has no weight: qk_norm_shape must be 'head' or "
            f"'all' (got {shape!r}) and norm_weight_offset 0 (got {offset})"
        )
    return str(shape)


def check_output_norm(output_norm: Any, eps: Any, output_gate: str | None) -> bool:
    """``output_norm`` checked against its eps (> 0; a non-default eps needs the norm) and the
    output gate (refused together: no model has both, so their order would be a guess)."""
    output_norm = validation.flag("output_norm", output_norm)
    eps = validation.finite_real("output_norm_eps", eps)
    if eps <= 0:
        raise ValueError(f"output_norm_eps must be > 0, got {eps}")
    if not output_norm and eps != 1e-6:
        raise ValueError(
            f"output_norm_eps={eps} describes an output norm, but output_norm is False"
        )
    if output_norm and output_gate is not None:
        raise ValueError(
            f"output_norm and output_gate={output_gate!r} together: no model has both, and "
            "whether the norm comes before or after the gate would be a guess"
        )
    return output_norm


def norm_dim(shape: str, heads: int, head_dim: int) -> int | tuple[int, int]:
    """The QK-norm weight's shape for a projection of ``heads`` heads."""
    if shape == "per_head":
        return (heads, head_dim)
    return norm_width(shape, heads, head_dim)


def norm_width(shape: str, heads: int, head_dim: int) -> int:
    """The width a QK-norm normalizes: one head's D, or the whole projection's heads*D."""
    return heads * head_dim if shape == "all" else head_dim


def check_cache_values(width: int, v_head_dim: int) -> None:
    """The cache's value width must be the layer's Dv (its keys are checked by the cache)."""
    if width != v_head_dim:
        raise ValueError(
            f"the cache holds values of width {width}, but this layer's v_head_dim is "
            f"{v_head_dim}: build the cache with v_head_dim={v_head_dim}"
        )


def check_differential_width(differential: bool, v_head_dim: int, head_dim: int) -> None:
    """Differential attention with values of their own width: no model has both, and where the
    lambdas (D,) would meet a value width Dv != D is a guess; refused."""
    if differential and v_head_dim != head_dim:
        raise ValueError(
            f"differential with v_head_dim={v_head_dim} != head_dim={head_dim}: no model has "
            "both (DiffLlama's values are head_dim wide)"
        )


def check_value_options(
    *,
    value_norm: bool,
    kv_shared: bool,
    values_from_keys: bool,
    v_head_dim: int,
    head_dim: int,
    value_scale: float,
    differential: bool,
) -> None:
    """The value options that no model combines, refused rather than given a guessed order: a
    value norm or another layer's (or the keys') values with MiMo-V2-Flash's value width or
    scale, or with DiffLlama's differential attention."""
    gemma = [
        name
        for name, on in (
            ("value_norm", value_norm),
            ("kv_shared", kv_shared),
            ("values_from_keys", values_from_keys),
        )
        if on
    ]
    other = [
        name
        for name, on in (
            (f"v_head_dim={v_head_dim}", v_head_dim != head_dim),
            (f"value_scale={value_scale}", value_scale != 1.0),
            ("differential", differential),
        )
        if on
    ]
    if gemma and other:
        raise ValueError(
            f"{' and '.join(gemma)} with {' and '.join(other)}: no model has both, and the "
            "order of the value transforms would be a guess"
        )
