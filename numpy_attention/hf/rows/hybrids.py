"""The rows of the hybrids: the softmax-attention layers beside Mamba, RG-LRU, convolution or
linear attention layers (each row's ``mixers`` rule says which layer is which; the others are
refused by name), and the shared attention block of Zamba/Zamba2.

The rules a row names sit beside it, each its config class's or its model's; the rules
several modules share are ``hf/rules.py``. ``families.FAMILIES`` joins the modules' ROWS.
NumPy only.

Tests: tests/numpy_attention/hf/rows/test_hybrids.py; against transformers in
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import rules
from ..family import ATTENTION, FULL, Family, flag, required


# LFM2: "conv" layers and "full_attention" ones; without layer_types its config class reads
# full_attn_idxs (every layer by default); LFM2-MoE's has no rule (the model needs the list)
def _lfm2_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {FULL: ATTENTION, "conv": "a short-convolution layer"}
    if config.get("layer_types") is None and config.get("model_type") == "lfm2":
        indices = config.get("full_attn_idxs")
        layers = range(required(config, "num_hidden_layers"))
        full = layers if indices is None else indices
        return [names[FULL] if i in full else names["conv"] for i in layers]
    return rules._kinds(required(config, "layer_types"), "layer_types", names)


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
        return rules._kinds(config["layers_block_type"], "layers_block_type", _NEMOTRON_H)
    pattern = config.get("hybrid_override_pattern")
    if pattern is None:
        return [_NEMOTRON_H[kind] for kind in ("linear_attention", "moe", FULL, "mlp")]
    letters = dict(zip("M*-E", _NEMOTRON_H.values(), strict=True))
    return rules._kinds(pattern, "hybrid_override_pattern", letters)


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
    return rules._kinds(required(config, "layer_types"), "layer_types", names)


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
    return rules._kinds(required(config, "layer_types"), "layer_types", names)


def _olmo_hybrid_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    params = config.get("rope_parameters")
    if isinstance(params, Mapping):
        return params.get("rope_theta") is not None
    return config.get("rope_theta", 10000.0) is not None  # the config class's default theta


# MiniMax: "full_attention" (softmax) and "linear_attention" (Lightning attention) layers; its
# config class makes the even layers softmax
def _minimax_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {
        FULL: ATTENTION,
        "linear_attention": "a Lightning (linear) attention layer (read it with lightning_from_hf)",
    }
    if config.get("layer_types") is None:
        count = required(config, "num_hidden_layers")
        return [ATTENTION if i % 2 == 0 else names["linear_attention"] for i in range(count)]
    return rules._kinds(config["layer_types"], "layer_types", names)


# RecurrentGemma: block_types repeated over the layers, "recurrent" an RG-LRU block, "attention"
# a local attention block; its rotary embedding takes no RoPE type but the default
def _recurrent_gemma_mixers(config: Mapping[str, Any]) -> list[str]:
    names = {"recurrent": "an RG-LRU recurrent block", "attention": ATTENTION}
    types = list(config.get("block_types") or ("recurrent", "recurrent", "attention"))
    count = required(config, "num_hidden_layers")
    return rules._kinds((types * count)[:count], "block_types", names)


def _recurrent_gemma_refuse(config: Mapping[str, Any]) -> None:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(
            f"rope_parameters' rope_type is {rope_type!r}: recurrent_gemma's rotary embedding "
            "takes only 'default' (its model raises on any other)"
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
    return rules._kinds(types, "layers_block_type", _ZAMBA_KINDS)


def _zamba2_mixers(config: Mapping[str, Any]) -> list[str]:
    types = config.get("layers_block_type")
    if types is None:  # Zamba2Config's 54 layers, whatever num_hidden_layers says
        mamba, hybrid = "linear_attention", "hybrid"
        types = [mamba] + ([mamba] * 5 + [hybrid]) * 7 + [mamba] * 4 + [hybrid]
        types += [mamba] * 3 + [hybrid] + [mamba] * 2
    return rules._kinds(types, "layers_block_type", _ZAMBA2_KINDS)


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


ROWS: dict[str, Family] = {
    # MiniMax(-Text-01): Lightning (linear) attention layers beside softmax layers with Mistral's
    # attention (no biases, one window on every softmax layer when sliding_window is set)
    "minimax": Family(bias=None, out_bias=None, sliding="every_layer", mixers=_minimax_mixers),
    # LFM2: never dropout on the weights; its attention is out_proj, its QK-norm q_layernorm
    "lfm2": Family(
        bias=None,
        out_bias=None,
        qk_norm=("rms", "head", 0.0),
        norm_eps="norm_eps",
        attention_dropout=False,
        mixers=_lfm2_mixers,
        renames=(("out_proj", "o_proj"), ("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")),
    ),
    "lfm2_moe": Family(
        bias=None,
        out_bias=None,
        qk_norm=("rms", "head", 0.0),
        norm_eps="norm_eps",
        attention_dropout=False,
        mixers=_lfm2_mixers,
        renames=(("out_proj", "o_proj"), ("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")),
    ),
    "jamba": Family(bias=None, out_bias=None, rotates=rules._never, mixers=_jamba_mixers),
    "bamba": Family(
        partial_rotary=True,
        mixers=_bamba_mixers,
        partial_rotary_default=0.5,
        partial_rotary_top_level=False,
    ),
    # Nemotron-H: its attention has no biases whatever attention_bias says
    "nemotron_h": Family(
        bias=None,
        out_bias=None,
        rotates=rules._never,
        mixers=_nemotron_h_mixers,
        refuse=_nemotron_h_refuse,
    ),
    # Falcon-H1: attention on every layer, beside Mamba-2 (attention_in_multiplier and
    # attention_out_multiplier act outside the attention module)
    "falcon_h1": Family(key_multiplier="key_multiplier"),
    "granitemoehybrid": Family(
        scaling="attention_multiplier",
        rotates=_granitemoehybrid_rotates,
        mixers=_granitemoehybrid_mixers,
    ),
    "olmo_hybrid": Family(
        qk_norm=("rms", "all", 0.0),
        rotates=_olmo_hybrid_rotates,
        mixers=_olmo_hybrid_mixers,
    ),
    # RecurrentGemma: local attention blocks beside RG-LRU ones; half of each head rotates (by
    # default), o_proj always biased, a window of attention_window_size on every one
    "recurrent_gemma": Family(
        out_bias="<always>",
        sliding="every_layer",
        partial_rotary=True,
        key_aliases=(("attention_window_size", "sliding_window"),),
        config_defaults=(("sliding_window", 2048),),
        mixers=_recurrent_gemma_mixers,
        partial_rotary_default=0.5,
        refuse=_recurrent_gemma_refuse,
    ),
    # Zamba, Zamba2: one shared attention block (tied across layers) reading the hidden states
    # concatenated with the embeddings (2 * hidden_size), scores times (D / 2)^-0.5; Zamba2 adds
    # RoPE under use_mem_rope and per-layer LoRA adapters on q, k, v (folded on load)
    "zamba": Family(
        bias=None,
        out_bias=None,
        scaling="half_head_dim",
        rotates=rules._never,
        key_aliases=(("attention_head_dim", "head_dim"),),
        mixers=_zamba_mixers,
        refuse=_zamba_refuse,
        input_size=_zamba_input_size,
    ),
    "zamba2": Family(
        bias=None,
        out_bias=None,
        scaling="half_head_dim",
        rotates=_zamba2_rotates,
        key_aliases=(("attention_head_dim", "head_dim"),),
        mixers=_zamba2_mixers,
        refuse=_zamba2_refuse,
        input_size=_zamba2_input_size,
        adapters="use_shared_attention_adapter",
    ),
}
