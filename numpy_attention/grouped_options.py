"""The options of ``GroupedQueryAttention`` that are pure Python, checked once for both twins
(numpy_attention/grouped.py and torch_attention/grouped.py import them, as decode/arguments.py
is shared): ``GroupedOptions``, the base both layer classes inherit, checks every scalar option
of the constructor and sets it on the layer (the widths and head counts, RoPE's rotated width,
the QK-norm's type, shape, offset and position, the window, softcap, sinks, gate, clip, output
norm, value width and scale, differential attention, chunks, KV sharing); the options that
become arrays or tensors (RoPE's frequencies, ALiBi's slopes) stay in each twin. Also the
QK-norm weight's shape and width, and a cache's value width against the layer's. Every check
raises ``TypeError`` or ``ValueError`` naming the argument. NumPy only.

Tests: tests/numpy_attention/test_grouped_options.py; through both layers in
tests/numpy_attention/test_grouped.py and tests/torch_attention/test_grouped.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from . import validation
from .clip import check_clip
from .differential import check_differential
from .gate import check_gate
from .shared_kv import check_shared
from .temperature import check_temperature

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


class GroupedOptions:
    """The scalar options of ``GroupedQueryAttention`` as attributes, checked by
    ``check_options`` (called first in both twins' constructors, with the constructor's own
    arguments: ``self.check_options(**grouped_options.option_args(locals()))``)."""

    hidden_size: int
    input_size: int  # x's width: q, k, v (and the gate) read it, o_proj writes hidden_size
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    rope_attention_factor: float
    rope_interleaved: bool
    qk_norm: bool
    norm_eps: float
    qk_norm_shape: str
    qk_norm_position: str
    query_temperature: dict[str, Any] | None
    window: tuple[int | None, int | None] | None
    softcap: float
    has_sinks: bool
    output_gate: str | None
    gate_activation: str
    gate_bias: bool
    scaling: float | None
    dropout: float
    clip_qkv: float | None
    clip_after_norm: bool
    output_norm: bool
    v_head_dim: int
    value_scale: float
    lambda_init: float | None
    differential: bool
    differential_eps: float
    chunk_size: int | None
    value_norm: bool
    kv_shared: bool
    values_from_keys: bool

    def check_options(
        self,
        *,
        hidden_size: Any,
        input_size: Any,
        num_heads: Any,
        num_kv_heads: Any,
        head_dim: Any,
        rotary_dim: Any,
        rope_theta: Any,
        rope_attention_factor: Any,
        rope_interleaved: Any,
        qk_norm: Any,
        norm_eps: Any,
        qk_norm_type: Any,
        qk_norm_shape: Any,
        norm_weight_offset: Any,
        qk_norm_position: Any,
        query_temperature: Any,
        window: Any,
        softcap: Any,
        sinks: Any,
        output_gate: Any,
        gate_activation: Any,
        gate_bias: Any,
        scaling: Any,
        dropout: Any,
        clip_qkv: Any,
        clip_after_norm: Any,
        output_norm: Any,
        output_norm_eps: Any,
        v_head_dim: Any,
        value_scale: Any,
        differential: Any,
        lambda_init: Any,
        differential_eps: Any,
        chunk_size: Any,
        value_norm: Any,
        kv_shared: Any,
        values_from_keys: Any,
    ) -> None:
        """Every scalar option checked (against the others where they meet) and set."""
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.input_size = (
            self.hidden_size
            if input_size is None
            else validation.positive_int("input_size", input_size)
        )
        self.num_heads = validation.positive_int("num_heads", num_heads)
        self.num_kv_heads = validation.positive_int("num_kv_heads", num_kv_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        if head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}) "
                    "when head_dim is None"
                )
            head_dim = self.hidden_size // self.num_heads
        self.head_dim = validation.positive_int("head_dim", head_dim)
        self.rotary_dim = check_rotary_dim(rotary_dim, self.head_dim)
        self.rope_theta = validation.finite_real("rope_theta", rope_theta)
        self.rope_attention_factor = validation.finite_real(
            "rope_attention_factor", rope_attention_factor
        )
        self.rope_interleaved = validation.flag("rope_interleaved", rope_interleaved)
        self.qk_norm = validation.flag("qk_norm", qk_norm)
        self.norm_eps = validation.finite_real("norm_eps", norm_eps)
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps must be > 0, got {norm_eps}")
        self.qk_norm_shape = check_qk_norm(
            self.qk_norm, qk_norm_type, qk_norm_shape, norm_weight_offset, qk_norm_position
        )
        self.qk_norm_position = str(qk_norm_position)
        self.query_temperature = check_temperature(query_temperature)
        self.window = None if window is None else validation.window(window)
        self.softcap = validation.finite_real("softcap", softcap)
        if self.softcap < 0:
            raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
        self.has_sinks = validation.flag("sinks", sinks)
        self.gate_bias = validation.flag("gate_bias", gate_bias)
        self.output_gate = check_gate(output_gate, gate_activation, self.gate_bias)
        self.gate_activation = str(gate_activation)
        self.scaling = None if scaling is None else validation.finite_real("scaling", scaling)
        self.dropout = validation.dropout_p(dropout, "dropout")
        self.clip_qkv = check_clip(clip_qkv, clip_after_norm, self.qk_norm)
        self.clip_after_norm = bool(clip_after_norm)
        if self.clip_after_norm and self.qk_norm_position != "before_rope":
            raise ValueError(
                "clip_after_norm clamps q and k between the QK-norm and RoPE (OLMoE), but "
                f"qk_norm_position is {self.qk_norm_position!r}: no model clamps after a norm "
                "that follows RoPE"
            )
        self.output_norm = check_output_norm(output_norm, output_norm_eps, self.output_gate)
        self.v_head_dim = validation.positive_int(
            "v_head_dim", self.head_dim if v_head_dim is None else v_head_dim
        )
        self.value_scale = validation.finite_real("value_scale", value_scale)
        self.lambda_init = check_differential(
            differential,
            lambda_init,
            differential_eps,
            self.num_kv_heads,
            output_gate=self.output_gate,
            output_norm=self.output_norm,
            dropout=self.dropout,
        )
        self.differential = self.lambda_init is not None
        self.differential_eps = float(differential_eps)
        check_differential_width(self.differential, self.v_head_dim, self.head_dim)
        self.chunk_size = (
            None if chunk_size is None else validation.positive_int("chunk_size", chunk_size)
        )
        self.value_norm, self.kv_shared, self.values_from_keys = check_shared(
            value_norm, kv_shared, self.clip_qkv, values_from_keys
        )
        check_value_options(
            value_norm=self.value_norm,
            kv_shared=self.kv_shared,
            values_from_keys=self.values_from_keys,
            v_head_dim=self.v_head_dim,
            head_dim=self.head_dim,
            value_scale=self.value_scale,
            differential=self.differential,
        )


_OPTION_NAMES = tuple(inspect.signature(GroupedOptions.check_options).parameters)[1:]  # no self


def option_args(constructor_locals: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments ``GroupedOptions.check_options`` reads, taken from a constructor's
    ``locals()`` (a twin lacking one fails here, loudly, with a ``KeyError``)."""
    return {name: constructor_locals[name] for name in _OPTION_NAMES}
