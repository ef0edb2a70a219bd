"""The rows of the families with an output gate before o_proj (GroupedQueryAttention's
``g_proj``): Qwen3-Next and Qwen3.5 (a sigmoid gate per element that their checkpoints fuse into
q_proj), LFM3 (a sigmoid gate per head), Laguna (a softplus gate, per head or per element),
AFMoE, HRM-Text and Beam (a sigmoid gate per element, ``gate_proj``), with the layer patterns
their config classes build (the hybrids' linear-attention and convolution layers, sliding and
NoPE layers) and Beam's query temperature on its NoPE layers.

The rules a row names sit beside it, each its config class's or its model's; the rules
several modules share are ``hf/rules.py``. ``families.FAMILIES`` joins the modules' ROWS.
NumPy only.

Tests: tests/numpy_attention/hf/rows/test_gated.py, tests/numpy_attention/hf/test_beam.py;
against transformers in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import rules
from ..family import ATTENTION, FULL, SLIDING, Family, flag, layer_kind, required


# Qwen3-Next, Qwen3.5: "linear_attention" (gated DeltaNet) and "full_attention" layers, without
# the list every full_attention_interval-th (4) layer is attention; q_proj carries a sigmoid gate
# per element, biased with the projections under attention_bias
def _qwen3_next_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {
        "linear_attention": "a gated DeltaNet layer (gated_deltanet_from_hf reads it)",
        FULL: ATTENTION,
    }
    if config.get("layer_types") is None:
        interval = config.get("full_attention_interval") or 4
        count = required(config, "num_hidden_layers")
        return [
            ATTENTION if (i + 1) % interval == 0 else names["linear_attention"]
            for i in range(count)
        ]
    return rules._kinds(config["layer_types"], "layer_types", names)


def _qwen3_next_gate(config: Mapping[str, Any]) -> tuple[str, str, bool]:
    return ("element", "sigmoid", flag(config, "attention_bias"))


# LFM3: "conv", "sliding_attention" and "full_attention" layers, without the list its config
# class's pattern (layer i % 4 == 2 full, i % 4 == 0 past the first sliding, the rest conv); a
# sigmoid gate per head under use_attention_gate (on by default)
def _lfm3_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {FULL: ATTENTION, SLIDING: ATTENTION, "conv": "a short-convolution layer"}
    if config.get("layer_types") is None:
        count = required(config, "num_hidden_layers")
        return [ATTENTION if _lfm3_kind(i) != "conv" else names["conv"] for i in range(count)]
    return rules._kinds(config["layer_types"], "layer_types", names)


def _lfm3_kind(layer_idx: int) -> str:
    if layer_idx % 4 == 2:
        return FULL
    return SLIDING if layer_idx % 4 == 0 and layer_idx > 0 else "conv"


def _lfm3_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    return _lfm3_kind(layer_idx) == SLIDING


def _lfm3_gate(config: Mapping[str, Any]) -> tuple[str, str, bool] | None:
    return ("head", "sigmoid", False) if flag(config, "use_attention_gate", True) else None


# Laguna: a softplus gate, always on: per head for gating True or "per-head", per element for
# "per-element" (its code also gates per element for any other value, which its config class
# does not document: refused by the key)
def _laguna_gate(config: Mapping[str, Any]) -> tuple[str, str, bool]:
    gating = config.get("gating", True)
    if gating is True or gating == "per-head":
        return ("head", "softplus", False)
    if gating == "per-element":
        return ("element", "softplus", False)
    raise ValueError(
        f"gating is {gating!r}; laguna's config class knows True, 'per-head' and 'per-element' "
        "(its gate is always on: its code would gate per element)"
    )


# AFMoE: every global_attn_every_n_layers-th (4) layer full, the others slide; only the sliding
# layers rotate; a sigmoid gate per element (gate_proj), bias-free
def _afmoe_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    return (layer_idx + 1) % (config.get("global_attn_every_n_layers") or 4) != 0


def _afmoe_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    return layer_kind(config, family, layer_idx) == SLIDING


def _afmoe_gate(config: Mapping[str, Any]) -> tuple[str, str, bool]:
    return ("element", "sigmoid", False)


# HRM-Text: multi-head attention (num_key_value_heads is never read) with a sigmoid gate per
# element (gate_proj), biased under attention_bias like the projections
def _hrm_text_gate(config: Mapping[str, Any]) -> tuple[str, str, bool]:
    return ("element", "sigmoid", flag(config, "attention_bias"))


def _hrm_text_refuse(config: Mapping[str, Any]) -> None:
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        raise ValueError(
            f"num_key_value_heads is {kv_heads}, but hrm_text's attention is multi-head: its code "
            f"builds k_proj and v_proj with all {heads} heads whatever the key says"
        )


# Beam: its config class's pattern (every sixth layer and the last full, the others sliding); a
# layer type whose rope_parameters entry is null runs without RoPE (NoPE) and scales its queries
# by (1 + (p + 1) / 2048) ** 0.1; a sigmoid gate per element with a bias per head
BEAM_TEMPERATURE = {"kind": "power", "exponent": 0.1, "length": 2048.0, "offset": 1.0}


def _beam_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    last = required(config, "num_hidden_layers") - 1
    return bool((layer_idx + 1) % 6) and layer_idx != last


def _beam_rope(config: Mapping[str, Any], family: Family) -> Mapping[str, Any]:
    """Beam's rope_parameters, one entry per layer type (null: NoPE), its config class's where a
    config has none; a flat dict, or one without an entry for a layer type the model has,
    refused (its rotary embedding reads ``rope_parameters[layer_type]`` and fails)."""
    params = config.get("rope_parameters")
    if params is None:
        return {kind: None if value is None else dict(value) for kind, value in family.rope_default}
    count = required(config, "num_hidden_layers")
    kinds = {layer_kind(config, family, i) for i in range(count)}
    missing = sorted(kind for kind in kinds if kind not in params)
    if missing:
        raise ValueError(
            f"rope_parameters has no {missing[0]!r} entry: Beam's model reads "
            "rope_parameters[layer_type] for each of its layer types (null: a NoPE layer) and "
            "fails without it"
        )
    return params


def _beam_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    return _beam_rope(config, family)[layer_kind(config, family, layer_idx)] is not None


def _beam_temperature(
    config: Mapping[str, Any], family: Family, layer_idx: int
) -> dict[str, Any] | None:
    return None if _beam_rotates(config, family, layer_idx) else dict(BEAM_TEMPERATURE)


def _beam_gate(config: Mapping[str, Any]) -> tuple[str, str, bool]:
    return ("element", "sigmoid", True)


def _beam_refuse(config: Mapping[str, Any]) -> None:
    """A config.json without rope_parameters: its config class ignores rope_theta and makes a
    rope_scaling the one dict that its model cannot read per layer type."""
    if config.get("rope_parameters") is not None:
        return
    for key, why in (
        ("rope_scaling", "makes it a single rope_parameters dict, which the model cannot read "
         "per layer type ('sliding_attention', 'full_attention') and fails on"),
        ("rope_theta", "ignores it and gives the sliding layers its own RoPE (base 10000)"),
    ):  # fmt: skip
        if config.get(key) is not None:
            raise ValueError(
                f"the config has {key} but no rope_parameters: Beam's config class {why}; give "
                "rope_parameters, one entry per layer type"
            )


ROWS: dict[str, Family] = {
    # Qwen3-Next, Qwen3.5 (dense and MoE): Gemma's (1 + w) QK-norm per head, a quarter of each
    # head rotating (the config class's default), q_proj carrying a sigmoid gate per element
    # (the "q_gate" layout), gated DeltaNet layers between the softmax ones
    **{
        name: Family(
            qk_norm=("rms", "head", 1.0),
            partial_rotary=True,
            partial_rotary_default=0.25,
            layout="q_gate",
            config_defaults=(
                ("head_dim", 256),
                ("num_key_value_heads", kv_heads),
                ("rms_norm_eps", 1e-6),
            ),
            mixers=_qwen3_next_mixers,
            gate=_qwen3_next_gate,
        )
        for name, kv_heads in (("qwen3_next", 2), ("qwen3_5_text", 4), ("qwen3_5_moe_text", 2))
    },
    # LFM3: LFM2's hybrid with sliding layers, per-head RMSNorm QK-norm, a sigmoid gate per head;
    # its full layers rotate with proportional RoPE, its sliding ones with whole-head RoPE
    "lfm3": Family(
        sliding="layer_types",
        fallback=_lfm3_sliding,
        qk_norm=("rms", "head", 0.0),
        norm_eps="norm_eps",
        rope_per_layer_type=True,
        config_defaults=(
            ("head_dim", 128),
            ("num_key_value_heads", 4),
            ("sliding_window", 256),
            ("norm_eps", 1e-5),
        ),
        key_aliases=(("rms_norm_eps", "norm_eps"),),
        rope_default=(
            (
                "full_attention",
                (
                    ("rope_type", "proportional"),
                    ("rope_theta", 1e6),
                    ("partial_rotary_factor", 0.5),
                ),
            ),
            ("sliding_attention", (("rope_type", "default"), ("rope_theta", 1e4))),
        ),
        mixers=_lfm3_mixers,
        gate=_lfm3_gate,
    ),
    # Laguna: per-head RMSNorm QK-norm, RoPE per layer type (half of each head on the full
    # layers by default), a softplus gate per head or per element, query heads per layer
    "laguna": Family(
        sliding="layer_types",
        qk_norm=("rms", "head", 0.0),
        rope_per_layer_type=True,
        partial_rotary=True,
        partial_rotary_top_level=False,
        config_defaults=(
            ("head_dim", 128),
            ("num_key_value_heads", 8),
            ("sliding_window", 512),
            ("rms_norm_eps", 1e-6),
        ),
        rope_default=(
            (
                "full_attention",
                (("rope_type", "default"), ("rope_theta", 5e5), ("partial_rotary_factor", 0.5)),
            ),
            (
                "sliding_attention",
                (("rope_type", "default"), ("rope_theta", 1e4), ("partial_rotary_factor", 1.0)),
            ),
        ),
        gate=_laguna_gate,
        heads_per_layer="num_attention_heads_per_layer",
    ),
    # AFMoE: per-head RMSNorm QK-norm, sliding layers that rotate and full ones that do not
    # (NoPE), a sigmoid gate per element (gate_proj)
    "afmoe": Family(
        sliding="layer_types",
        fallback=_afmoe_sliding,
        qk_norm=("rms", "head", 0.0),
        rotates=_afmoe_rotates,
        config_defaults=(("head_dim", 128), ("sliding_window", 1024), ("rms_norm_eps", 1e-5)),
        renames=(("gate_proj", "g_proj"),),
        gate=_afmoe_gate,
    ),
    # HRM-Text: Llama's multi-head attention with a sigmoid gate per element (gate_proj); the
    # model runs its two stacks of layers over cycles, outside the attention
    "hrm_text": Family(
        config_defaults=(("head_dim", 128), ("rms_norm_eps", 1e-6)),
        renames=(("gate_proj", "g_proj"),),
        refuse=_hrm_text_refuse,
        gate=_hrm_text_gate,
    ),
    # Beam: Qwen3's QK-norm, sliding layers that rotate and full ones that do not (a null
    # rope_parameters entry: NoPE, with a query temperature), a sigmoid gate per element
    # (gate_proj) whose bias is one per head (gate_bias, (H,))
    "beam": Family(
        sliding="layer_types",
        fallback=_beam_sliding,
        qk_norm=("rms", "head", 0.0),
        rope_per_layer_type=True,
        rotates=_beam_rotates,
        config_defaults=(
            ("head_dim", 128),
            ("num_key_value_heads", 8),
            ("num_hidden_layers", 52),
            ("sliding_window", 512),
            ("rms_norm_eps", 1e-6),
        ),
        rope_default=(
            ("sliding_attention", (("rope_type", "default"), ("rope_theta", 10000.0))),
            ("full_attention", None),
        ),
        renames=(("gate_proj", "g_proj"),),
        refuse=_beam_refuse,
        gate=_beam_gate,
        query_temperature=_beam_temperature,
        gate_bias_per_head="gate_bias",
    ),
}
