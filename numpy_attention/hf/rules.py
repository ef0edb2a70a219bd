"""The rules the rows of ``families.FAMILIES`` name, each its config class's or its model's: which
layers slide when a config has no ``layer_types``, which rotate, which are attention in a hybrid,
and which configs a family refuses. Each rule takes the config mapping (and the layer; a
``rotates`` rule also its family). NumPy only.

Tests: tests/numpy_attention/hf/test_families.py; against transformers in
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from .family import ATTENTION, FULL, SLIDING, Family, flag, layer_kind, layer_rope_theta, required

# -- which layers slide, which rotate, when the config has no list ------------------------------


def _qwen_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Qwen2/3's config class: from ``max_window_layers`` on, under ``use_sliding_window``."""
    return (
        flag(config, "use_sliding_window")
        and config.get("sliding_window") is not None
        and layer_idx >= config.get("max_window_layers", 0)
    )


def _qwen2_moe_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Qwen2-MoE's config class: even layers below ``max_window_layers``, under
    ``use_sliding_window`` (the opposite end from Qwen2's)."""
    below = layer_idx < config.get("max_window_layers", 28)
    return flag(config, "use_sliding_window") and layer_idx % 2 == 0 and below


def _even_layers(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Gemma 2's and GPT-OSS's: every other layer, from the first."""
    return layer_idx % 2 == 0


def _pattern(default: int) -> Callable[[Mapping[str, Any], int], bool]:
    """Gemma 3's and Cohere 2's: every layer but each ``sliding_window_pattern``-th slides."""

    def sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
        return bool((layer_idx + 1) % (config.get("sliding_window_pattern") or default))

    return sliding


def _smollm3_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """SmolLM 3: ``no_rope_layers[i]`` is 1 where layer i uses RoPE; without the list, every
    ``no_rope_layer_interval``-th layer (4 by default) is a NoPE layer."""
    flags = config.get("no_rope_layers")
    if flags is None:
        return bool((layer_idx + 1) % (config.get("no_rope_layer_interval") or 4))
    if layer_idx >= len(flags):
        raise ValueError(
            f"layer_idx is {layer_idx} but the config's no_rope_layers has {len(flags)} entries"
        )
    return bool(flags[layer_idx])


def _cohere2_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """Cohere 2 rotates only on its sliding layers; the full layers are NoPE."""
    return layer_kind(config, family, layer_idx) == SLIDING


# Granite SWA, Granite MoE SWA: layer 0 and every fourth layer after it attend fully, the others
# slide; ``layer_rope_theta`` gives each layer its own RoPE base, 0 for none


def _granite_swa_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Granite SWA's config class: every layer slides but layers 0, 4, 8, ..."""
    return layer_idx % 4 != 0


def _granite_swa_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """Granite SWA: a layer whose ``layer_rope_theta`` is 0 gets no position embeddings."""
    return layer_rope_theta(config, family, layer_idx) != 0


# OLMo 3: every fourth layer attends fully, the others slide


def _olmo3_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """OLMo 3's config class: layers 3, 7, 11, ... full, the others sliding."""
    return (layer_idx + 1) % 4 != 0


# EXAONE 4, EXAONE MoE: every layer slides but each sliding_window_pattern-th; with a window, the
# full layers are NoPE


def _exaone4_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """EXAONE 4's config class without ``layer_types``: every layer but each
    ``sliding_window_pattern``-th (4) slides; without a window or with a pattern string
    (``"LLLG"``) the class fails (a modulo by 0, by a string), so that config is refused."""
    pattern = config.get("sliding_window_pattern", 4)
    if config.get("sliding_window") is None or not isinstance(pattern, int) or pattern <= 0:
        raise ValueError(
            f"the config has no layer_types, and sliding_window {config.get('sliding_window')!r} "
            f"with sliding_window_pattern {pattern!r} gives none: EXAONE 4's config class fails "
            "on them; give layer_types"
        )
    return (layer_idx + 1) % pattern != 0


def _exaone4_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """EXAONE 4 rotates on every layer without a window, else on its sliding layers only."""
    if config.get("sliding_window") is None:
        return True
    return layer_kind(config, family, layer_idx) == SLIDING


# dots.llm1: from max_window_layers on, the layers slide when there is a window (no flag)


def _dots1_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """dots.llm1's config class: layers ``i >= max_window_layers`` (62) slide when
    ``sliding_window`` is set (4096 by default); Qwen2's ``use_sliding_window`` is not read."""
    below = layer_idx < config.get("max_window_layers", 62)
    return config.get("sliding_window") is not None and not below


# Cohere 2 MoE: its first first_k_dense_replace layers (dense MLPs) follow their own pattern and,
# with that pattern 1, rotate although they attend fully; the others rotate where they slide


def _cohere2_moe_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Cohere 2 MoE's config class: the first ``first_k_dense_replace`` layers slide but each
    ``prefix_dense_sliding_window_pattern``-th (1: none), the rest, counted afresh, but each
    ``sliding_window_pattern``-th (4)."""
    prefix = config.get("first_k_dense_replace") or 0
    if layer_idx < prefix:
        return bool((layer_idx + 1) % (config.get("prefix_dense_sliding_window_pattern") or 1))
    return bool((layer_idx - prefix + 1) % (config.get("sliding_window_pattern") or 4))


def _cohere2_moe_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """Cohere 2 MoE rotates on its sliding layers, and on its dense-MLP layers when their
    pattern is 1 (``force_rope``); its other full layers are NoPE."""
    if layer_kind(config, family, layer_idx) == SLIDING:
        return True
    mlp_types = config.get("mlp_layer_types")
    if mlp_types is None:
        dense = layer_idx < (config.get("first_k_dense_replace") or 0)
    elif layer_idx >= len(mlp_types):
        raise ValueError(
            f"layer_idx is {layer_idx} but the config's mlp_layer_types has {len(mlp_types)} "
            "entries"
        )
    else:
        dense = mlp_types[layer_idx] == "dense"
    return dense and config.get("prefix_dense_sliding_window_pattern", 1) == 1


# -- hybrids: which layers are attention; and the configs some families refuse --


def _kinds(types: Any, key: str, names: Mapping[str, str]) -> list[str]:
    """A list of layer types (read from ``key``) in words (``names``); a type the model's code
    has no layer for is refused by name."""
    kinds = []
    for i, kind in enumerate(types):
        if kind not in names:
            raise ValueError(f"{key}[{i}] is {kind!r}; this model knows {sorted(names)}")
        kinds.append(names[kind])
    return kinds


# LFM2: "conv" layers and "full_attention" ones; without layer_types its config class reads
# full_attn_idxs (every layer by default); LFM2-MoE's has no rule (the model needs the list)
def _lfm2_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {FULL: ATTENTION, "conv": "a short-convolution layer"}
    if config.get("layer_types") is None and config.get("model_type") == "lfm2":
        indices = config.get("full_attn_idxs")
        layers = range(required(config, "num_hidden_layers"))
        full = layers if indices is None else indices
        return [names[FULL] if i in full else names["conv"] for i in layers]
    return _kinds(required(config, "layer_types"), "layer_types", names)


# Jamba: layer i is attention when i % attn_layer_period == attn_layer_offset (8 and 4)
def _jamba_mixers(config: Mapping[str, Any]) -> list[str]:
    period = config.get("attn_layer_period")
    offset = config.get("attn_layer_offset")
    period, offset = (8 if period is None else period), (4 if offset is None else offset)
    layers = range(required(config, "num_hidden_layers"))
    return [ATTENTION if i % period == offset else "a Mamba layer" for i in layers]


# Bamba: the layers listed in attn_layer_indices (none without it)
def _bamba_mixers(config: Mapping[str, Any]) -> list[str]:
    indices = config.get("attn_layer_indices") or ()
    layers = range(required(config, "num_hidden_layers"))
    return [ATTENTION if i in indices else "a Mamba-2 layer" for i in layers]


# Nemotron-H: layers_block_type, else a config.json's hybrid_override_pattern ("M*-E": Mamba-2,
# attention, MLP, mixture of experts), else its config class's four layers
_NEMOTRON_H = {
    "linear_attention": "a Mamba-2 layer",
    FULL: ATTENTION,
    "mlp": "an MLP layer",
    "moe": "a mixture-of-experts layer",
}


def _nemotron_h_mixers(config: Mapping[str, Any]) -> list[str]:
    if config.get("layers_block_type") is not None:
        return _kinds(config["layers_block_type"], "layers_block_type", _NEMOTRON_H)
    pattern = config.get("hybrid_override_pattern")
    if pattern is None:
        return [_NEMOTRON_H[kind] for kind in ("linear_attention", "moe", FULL, "mlp")]
    letters = dict(zip("M*-E", _NEMOTRON_H.values(), strict=True))
    return _kinds(pattern, "hybrid_override_pattern", letters)


def _nemotron_h_refuse(config: Mapping[str, Any]) -> None:
    if config.get("sliding_window") is not None:
        raise ValueError(
            "sliding_window is set, but nemotron_h's attention never slides (its code ignores "
            "the key): a config that means a window is not this model's"
        )


# GraniteMoeHybrid: "linear_attention" (Mamba-2) and "full_attention" layers, all Mamba-2
# without the list; RoPE only where position_embedding_type is "rope" (its default is none)
def _granitemoehybrid_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {"linear_attention": "a Mamba-2 layer", FULL: ATTENTION}
    if config.get("layer_types") is None:
        return [names["linear_attention"]] * required(config, "num_hidden_layers")
    return _kinds(required(config, "layer_types"), "layer_types", names)


def _granitemoehybrid_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    return config.get("position_embedding_type") == "rope"


# OLMo Hybrid: "linear_attention" (gated DeltaNet) and "full_attention" layers, without the list
# every fourth layer is attention (the last one at least); RoPE only when rope_theta is set
def _olmo_hybrid_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {"linear_attention": "a gated DeltaNet (linear attention) layer", FULL: ATTENTION}
    if config.get("layer_types") is None:
        count = required(config, "num_hidden_layers")
        kinds = [names[FULL] if i % 4 == 3 else names["linear_attention"] for i in range(count)]
        if ATTENTION not in kinds:
            kinds[-1] = ATTENTION
        return kinds
    return _kinds(required(config, "layer_types"), "layer_types", names)


def _olmo_hybrid_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    params = config.get("rope_parameters")
    if isinstance(params, Mapping):
        return params.get("rope_theta") is not None
    return config.get("rope_theta", 10000.0) is not None  # the config class's default theta


def _never(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """Jamba's and Nemotron-H's attention: no RoPE at all (the Mamba layers carry position);
    GPT-BigCode's (its learned position embeddings are added to the input, outside it)."""
    return False


# StableLM (and Mllama's text model, ModernBERT decoder, Persimmon): its attention's head width is
# hidden_size // num_attention_heads whatever head_dim says, and its rotary embedding reads
# head_dim: the two must agree
def _stablelm_refuse(config: Mapping[str, Any]) -> None:
    head_dim = config.get("head_dim")
    width = required(config, "hidden_size") // required(config, "num_attention_heads")
    if head_dim is not None and head_dim != width:
        raise ValueError(
            f"head_dim is {head_dim}, but {config.get('model_type', 'stablelm')}'s attention "
            f"heads are hidden_size // num_attention_heads = {width} wide (its rotary embedding "
            f"would read {head_dim})"
        )


# Phi: qk_layernorm is an nn.LayerNorm of width hidden_size // num_attention_heads (the layer's
# qk_norm_type "layer_bias"), applied to heads of head_dim: the two must agree
def _phi_refuse(config: Mapping[str, Any]) -> None:
    if not config.get("qk_layernorm"):
        return
    head_dim = config.get("head_dim")
    width = required(config, "hidden_size") // required(config, "num_attention_heads")
    if head_dim is not None and head_dim != width:
        raise ValueError(
            f"qk_layernorm is set with head_dim {head_dim}: phi's QK-norm is a LayerNorm of "
            f"width hidden_size // num_attention_heads = {width}, which heads of {head_dim} "
            "cannot pass through (the model fails)"
        )


# Ministral's config class: every layer slides when the config has a window
def _every_layer_if_window(config: Mapping[str, Any], layer_idx: int) -> bool:
    return config.get("sliding_window") is not None


# CWM's config class: every 4th layer from the first is full, the others slide
def _cwm_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    return layer_idx % 4 != 0


# Flint's config class: layers 0, 1, the last and each i % 4 == 1 attend fully, the others slide;
# only the sliding layers rotate
def _flint_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    last = required(config, "num_hidden_layers") - 1
    return not (layer_idx < 2 or layer_idx % 4 == 1 or layer_idx == last)


def _flint_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    return layer_kind(config, family, layer_idx) == SLIDING


# Kolibri 1's config class: every fifth layer attends fully, and only the sliding layers rotate;
# without a window its model fails (it builds the sliding mask on every call)
def _kolibri1_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    return (layer_idx + 1) % 5 != 0


def _kolibri1_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    return layer_kind(config, family, layer_idx) == SLIDING


def _kolibri1_refuse(config: Mapping[str, Any]) -> None:
    if "sliding_window" in config and config["sliding_window"] is None:
        raise ValueError(
            "sliding_window is null: kolibri1's model builds its sliding mask on every call and "
            "fails without a window (its code would rotate every layer then, a model that "
            "never runs)"
        )


# MiniMax: "full_attention" (softmax) and "linear_attention" (Lightning attention) layers; its
# config class makes the even layers softmax
def _minimax_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {FULL: ATTENTION, "linear_attention": "a Lightning (linear) attention layer"}
    if config.get("layer_types") is None:
        count = required(config, "num_hidden_layers")
        return [ATTENTION if i % 2 == 0 else names["linear_attention"] for i in range(count)]
    return _kinds(config["layer_types"], "layer_types", names)


# Ministral 3: after RoPE, q times 1 + beta * log(1 + floor(p / L)), beta and L read from
# rope_parameters by its attention itself (its config class's default where a config has none)
def _ministral3_temperature(
    config: Mapping[str, Any], family: Family, layer_idx: int
) -> dict[str, Any]:
    params = config.get("rope_parameters") or config.get("rope_scaling")
    params = params or dict(family.rope_default)
    temperature = {"kind": "log_floor", "offset": 0.0}
    for name, key in (
        ("beta", "llama_4_scaling_beta"),
        ("length", "original_max_position_embeddings"),
    ):
        if params.get(key) is None:
            raise ValueError(
                f"rope_parameters has no {key!r}: a {config.get('model_type')} layer multiplies "
                "its queries by 1 + llama_4_scaling_beta * log(1 + floor(p / "
                "original_max_position_embeddings)) and fails without it"
            )
        temperature[name] = float(params[key])
    return temperature


# DBRX: what transformers' DbrxAttention does with its nested attn_config
def _dbrx_refuse(config: Mapping[str, Any]) -> None:
    attn = config.get("attn_config") or {}
    if attn.get("clip_qkv") is None:
        raise ValueError(
            "attn_config.clip_qkv is null: transformers' DBRX then calls clamp(min=None, "
            "max=None), which torch refuses, so that model never runs"
        )
    for key in ("alibi", "qk_ln"):
        if attn.get(key):
            raise ValueError(
                f"attn_config.{key} is set: the original DBRX code applies it, transformers' "
                "DBRX ignores it; neither reading would be a guess worth making"
            )
    nested = attn.get("rope_theta")
    if nested is None:
        raise ValueError(
            "attn_config has no rope_theta: transformers' DbrxAttention reads it when built and "
            "fails without it (then rotates with the top-level rope_theta)"
        )
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    if float(nested) != float(theta):
        raise ValueError(
            f"attn_config.rope_theta is {nested} but transformers' DBRX rotates with the "
            f"top-level rope_theta {theta} (its rotary embedding never reads attn_config); "
            "set rope_parameters' rope_theta to the one meant"
        )


# BitNet: the released checkpoints' linears are AutoBitLinear (quantization_config)
_BITNET_QUANTIZED = (
    "bitnet's quantized linears (AutoBitLinear) round the weights to {-1, 0, 1} times their "
    "mean magnitude and each token's activations to 8 bits before every projection; the layer's "
    "projections are plain (load unquantized weights with a config without it)"
)


# RecurrentGemma: block_types repeated over the layers, "recurrent" an RG-LRU block, "attention"
# a local attention block; its rotary embedding takes no RoPE type but the default
def _recurrent_gemma_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {"recurrent": "an RG-LRU recurrent block", "attention": ATTENTION}
    types = list(config.get("block_types") or ("recurrent", "recurrent", "attention"))
    count = required(config, "num_hidden_layers")
    return _kinds((types * count)[:count], "block_types", names)


def _recurrent_gemma_refuse(config: Mapping[str, Any]) -> None:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(
            f"rope_parameters' rope_type is {rope_type!r}: recurrent_gemma's rotary embedding "
            "takes only 'default' (its model raises on any other)"
        )


# Phi-4-multimodal's config class: RoPE 'default' or 'longrope' ('su' and 'yarn' its old names)
def _phi4_multimodal_refuse(config: Mapping[str, Any]) -> None:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "longrope", "su", "yarn"):
        raise ValueError(
            f"rope_parameters' rope_type is {rope_type!r}: phi4_multimodal's config class takes "
            "only 'default' and 'longrope'"
        )


# Mllama's text model: the layers in cross_attention_layers attend to the vision encoder's states
# (MllamaTextCrossAttention); the others are Llama's self-attention
def _mllama_text_mixers(config: Mapping[str, Any]) -> list[str]:
    cross = config.get("cross_attention_layers")
    cross = [3, 8, 13, 18, 23, 28, 33, 38] if cross is None else cross  # its config class's
    kind = (
        "a cross-attention layer (keys and values from the vision encoder's states, "
        "MllamaTextCrossAttention)"
    )
    layers = range(required(config, "num_hidden_layers"))
    return [kind if i in cross else ATTENTION for i in layers]


# ModernBERT decoder's config class: without layer_types, every global_attn_every_n_layers-th
# layer (3) from the first attends fully, the others slide; its window is half local_attention
def _modernbert_decoder_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    return layer_idx % (config.get("global_attn_every_n_layers") or 3) != 0


def _modernbert_decoder_window(config: Mapping[str, Any]) -> dict[str, Any]:
    local = config.get("local_attention")
    return {"sliding_window": local // 2 if local else None}


def _modernbert_decoder_refuse(config: Mapping[str, Any]) -> None:
    _stablelm_refuse(config)
    if "local_attention" in config and not config["local_attention"]:
        raise ValueError(
            f"local_attention is {config['local_attention']!r}: modernbert-decoder's config class "
            "then sets sliding_window to -1, a window its sliding layers cannot mean"
        )
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        raise ValueError(
            f"num_key_value_heads is {kv_heads}, but modernbert-decoder's attention has no "
            f"key/value grouping: it projects keys and values for all {heads} heads"
        )
    if config.get("rope_parameters") is None:
        raise ValueError(
            "the config has no rope_parameters: modernbert-decoder's config class builds them "
            "per layer type from global_rope_theta, local_rope_theta and rope_scaling (applied to "
            "both); pass its config.to_dict()"
        )


# -- the output gates: (kind, activation, bias) as each model's code builds its gate -----------


# Qwen3-Next, Qwen3.5: "linear_attention" (gated DeltaNet) and "full_attention" layers, without
# the list every full_attention_interval-th (4) layer is attention; q_proj carries a sigmoid gate
# per element, biased with the projections under attention_bias
def _qwen3_next_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {"linear_attention": "a gated DeltaNet layer (step 20)", FULL: ATTENTION}
    if config.get("layer_types") is None:
        interval = config.get("full_attention_interval") or 4
        count = required(config, "num_hidden_layers")
        return [
            ATTENTION if (i + 1) % interval == 0 else names["linear_attention"]
            for i in range(count)
        ]
    return _kinds(config["layer_types"], "layer_types", names)


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
    return _kinds(config["layer_types"], "layer_types", names)


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


# Zamba and Zamba2: layers_block_type ("hybrid": the shared attention block, then a Mamba layer;
# "linear_attention", legacy "mamba": a Mamba layer), else the config class's own pattern
_ZAMBA_KINDS = {"hybrid": ATTENTION, "linear_attention": "a Mamba layer", "mamba": "a Mamba layer"}
_ZAMBA2_KINDS = {key: value.replace("Mamba", "Mamba-2") for key, value in _ZAMBA_KINDS.items()}


def _zamba_mixers(config: Mapping[str, Any]) -> list[str]:
    types = config.get("layers_block_type")
    if types is None:  # ZambaConfig: two Mamba layers, attention, then every period from offset
        period = config.get("attn_layer_period")
        offset = config.get("attn_layer_offset")
        period, offset = (6 if period is None else period), (4 if offset is None else offset)
        rest = range(required(config, "num_hidden_layers") - 3)
        types = ["linear_attention"] * 2 + ["hybrid"]
        types += ["hybrid" if i % period == offset else "linear_attention" for i in rest]
    return _kinds(types, "layers_block_type", _ZAMBA_KINDS)


def _zamba2_mixers(config: Mapping[str, Any]) -> list[str]:
    types = config.get("layers_block_type")
    if types is None:  # Zamba2Config's 54 layers, whatever num_hidden_layers says
        mamba, hybrid = "linear_attention", "hybrid"
        types = [mamba] + ([mamba] * 5 + [hybrid]) * 7 + [mamba] * 4 + [hybrid]
        types += [mamba] * 3 + [hybrid] + [mamba] * 2
    return _kinds(types, "layers_block_type", _ZAMBA2_KINDS)


def _zamba_input_size(config: Mapping[str, Any]) -> int:
    """attention_hidden_size (2 * hidden_size when missing, as ZambaConfig fills it in)."""
    return int(config.get("attention_hidden_size") or 2 * required(config, "hidden_size"))


def _zamba2_input_size(config: Mapping[str, Any]) -> int:
    """2 * hidden_size: Zamba2Config sets attention_hidden_size so whatever a config.json says."""
    return 2 * int(required(config, "hidden_size"))


def _zamba_refuse(config: Mapping[str, Any]) -> None:
    width = config.get("attention_hidden_size")
    if width is None:
        return
    hidden = required(config, "hidden_size")
    if width != 2 * hidden:
        raise ValueError(
            f"attention_hidden_size is {width}, but zamba's shared block reads its hidden states "
            f"concatenated with the embeddings, 2 * hidden_size = {2 * hidden} (its input norm "
            "and projections of another width fail on them)"
        )


def _zamba2_refuse(config: Mapping[str, Any]) -> None:
    if not config.get("use_shared_attention_adapter"):
        return
    heads = required(config, "num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    if kv_heads != heads:
        raise ValueError(
            f"use_shared_attention_adapter is set with num_key_value_heads = {kv_heads} below "
            f"num_attention_heads = {heads}: zamba2's k and v adapters write "
            "attention_hidden_size = num_attention_heads * head_dim features onto k_proj's "
            "num_key_value_heads * head_dim, which fails"
        )


def _zamba2_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """Zamba2's shared attention rotates q and k only under use_mem_rope."""
    return flag(config, "use_mem_rope")


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


# MPT: what transformers' MptModel and MptAttention do with the nested attn_config
_MPT_ALIBI_BIAS_MAX = 8  # MptModel builds its slopes with the default, never the config's
_MPT_IGNORED = (  # attn_config entries transformers' MPT never reads (the original code does)
    ("qk_ln", False, "a LayerNorm of q and k"),
    ("prefix_lm", False, "a bidirectional prefix"),
    ("attn_uses_sequence_id", False, "a mask between packed sequences"),
    ("attn_type", "multihead_attention", "its multi-query attention"),
)


def _mpt_refuse(config: Mapping[str, Any]) -> None:
    attn = config.get("attn_config") or {}
    if attn.get("alibi", True) is not True:
        raise ValueError(
            f"attn_config.alibi is {attn.get('alibi')!r}: transformers' MPT adds ALiBi whatever "
            "it says (and has no other positions), the original code would then have none; "
            "neither reading is worth a guess"
        )
    bias_max = attn.get("alibi_bias_max", _MPT_ALIBI_BIAS_MAX)
    if bias_max != _MPT_ALIBI_BIAS_MAX:
        raise ValueError(
            f"attn_config.alibi_bias_max is {bias_max!r}: transformers' MptModel builds its "
            f"slopes with {_MPT_ALIBI_BIAS_MAX} whatever it says, the original code with it"
        )
    for key, default, what in _MPT_IGNORED:
        if attn.get(key, default) != default:
            raise ValueError(
                f"attn_config.{key} is {attn.get(key)!r}: the original MPT code applies {what}, "
                "transformers' MPT ignores it; neither reading would be a guess worth making"
            )
    if config.get("no_bias", True) is not True:
        raise ValueError(
            f"no_bias is {config.get('no_bias')!r}: transformers' MptAttention has no biases on "
            "Wqkv and out_proj whatever it says, the original code would add them"
        )


def _mpt_alibi(config: Mapping[str, Any]) -> list[float]:
    """MPT's slopes, as ``build_mpt_alibi_tensor`` builds them (in float64): for H heads and
    P = H rounded up to a power of 2, 1 / 2^(k * (8 / P)) for k = 1..P; when P > H the odd
    ks' slopes come first, then the even ones', and the first H are kept."""
    heads = int(config["num_attention_heads"])
    power = 2 ** math.ceil(math.log2(heads))
    slopes = [1.0 / 2.0 ** (k * (_MPT_ALIBI_BIAS_MAX / power)) for k in range(1, power + 1)]
    if power != heads:
        slopes = (slopes[1::2] + slopes[::2])[:heads]
    return slopes


# Llama 4: RoPE layers (no_rope_layers[i] = 1) attend in chunks and carry the L2 QK-norm; NoPE
# layers attend fully and scale their queries by a temperature of the cache's positions
LLAMA4_MASKS = ("full_attention", "chunked_attention")


def _llama4_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """``no_rope_layers[i]`` (1: RoPE); an empty or missing list is its config class's default,
    a NoPE layer every ``no_rope_layer_interval``-th layer."""
    flags = config.get("no_rope_layers") or None
    return _smollm3_rotates({**config, "no_rope_layers": flags}, family, layer_idx)


def _llama4_chunk(config: Mapping[str, Any], family: Family, layer_idx: int) -> int | None:
    """``attention_chunk_size`` on a ``chunked_attention`` layer (``layer_types``, by default
    the RoPE layers, as its config class fills it in), None on a full one."""
    kinds = config.get("layer_types")
    if kinds is None:
        rotating = _llama4_rotates(config, family, layer_idx)
        return _llama4_chunk_size(config) if rotating else None
    if layer_idx >= len(kinds):
        raise ValueError(
            f"layer_idx is {layer_idx} but the config's layer_types has {len(kinds)} entries"
        )
    chunked = _llama4_mask(kinds[layer_idx], layer_idx) == "chunked_attention"
    return _llama4_chunk_size(config) if chunked else None


def _llama4_mask(kind: Any, layer_idx: int) -> str:
    if kind not in LLAMA4_MASKS:
        raise ValueError(
            f"layer_types[{layer_idx}] is {kind!r}: a llama4_text model builds only the masks "
            f"{list(LLAMA4_MASKS)} and fails on any other layer type"
        )
    return str(kind)


def _llama4_chunk_size(config: Mapping[str, Any]) -> int:
    size = config.get("attention_chunk_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(
            f"attention_chunk_size is {size!r}: a llama4_text model builds its chunked mask on "
            "every forward and needs a positive int (transformers raises without one)"
        )
    return size


def _llama4_temperature(
    config: Mapping[str, Any], family: Family, layer_idx: int
) -> dict[str, Any] | None:
    """On a NoPE layer under ``attn_temperature_tuning``: 1 + attn_scale * log(1 + floor((p +
    1) / floor_scale)), p counted on the cache (past_key_values.get_seq_length() + i)."""
    if not flag(config, "attn_temperature_tuning") or _llama4_rotates(config, family, layer_idx):
        return None
    return {
        "kind": "log_floor",
        "beta": float(required(config, "attn_scale")),
        "length": float(required(config, "floor_scale")),
        "offset": 1.0,
        "positions": "cache",
    }


def _llama4_refuse(config: Mapping[str, Any]) -> None:
    """Every llama4_text forward builds the chunked mask, whatever its layers are, and hands
    each layer the mask its layer type names (there are two)."""
    _llama4_chunk_size(config)
    for layer_idx, kind in enumerate(config.get("layer_types") or ()):
        _llama4_mask(kind, layer_idx)
