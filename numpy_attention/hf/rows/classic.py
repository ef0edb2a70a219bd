"""The rows of the dense decoders whose attention is the layer's as it stands: biases, sliding
layers and their rules, QK-norm, the score scale, softcap and sinks, partial or interleaved
RoPE, NoPE layers, RoPE per layer type.

The rules a row names sit beside it, each its config class's or its model's; the rules
several modules share are ``hf/rules.py``. ``families.FAMILIES`` joins the modules' ROWS.
NumPy only.

Tests: tests/numpy_attention/hf/rows/test_classic.py; against transformers in
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .. import rules
from ..family import ATTENTION, SLIDING, Family, flag, layer_kind, layer_rope_theta, required


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
    rules._stablelm_refuse(config)
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


ROWS: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(bias=None, out_bias=None, sliding="every_layer"),
    "qwen2": Family(bias="<state>", out_bias=None, sliding="layer_types", fallback=_qwen_sliding),
    "qwen3": Family(sliding="layer_types", fallback=_qwen_sliding, qk_norm=("rms", "head", 0.0)),
    "qwen2_moe": Family(
        bias="qkv_bias",
        bias_default=True,
        out_bias=None,
        sliding="layer_types",
        fallback=_qwen2_moe_sliding,
    ),
    "qwen3_moe": Family(sliding="use_sliding_window", qk_norm=("rms", "head", 0.0)),
    "gemma2": Family(
        sliding="layer_types",
        fallback=_even_layers,
        scaling="query_pre_attn_scalar",
        softcap="attn_logit_softcapping",
        bidirectional_flag=True,
        config_defaults=(
            ("head_dim", 256),
            ("query_pre_attn_scalar", 256),
            ("attn_logit_softcapping", 50.0),
            ("sliding_window", 4096),
        ),
    ),
    # Gemma 3 keeps attn_logit_softcapping in its config but its attention never applies it
    "gemma3_text": Family(
        sliding="layer_types",
        fallback=rules._pattern(6),
        qk_norm=("rms", "head", 1.0),
        scaling="query_pre_attn_scalar",
        rope_per_layer_type=True,
        bidirectional_flag=True,
        config_defaults=(
            ("head_dim", 256),
            ("query_pre_attn_scalar", 256),
            ("sliding_window", 4096),
        ),
    ),
    "gpt_oss": Family(bias_default=True, sliding="layer_types", fallback=_even_layers, sinks=True),
    "olmo2": Family(qk_norm=("rms", "all", 0.0)),
    "cohere": Family(
        qk_norm=("layer", "per_head", 0.0),
        qk_norm_flag="use_qk_norm",
        norm_eps="layer_norm_eps",
        interleaved=True,
    ),
    "cohere2": Family(
        sliding="layer_types",
        fallback=rules._pattern(4),
        interleaved=True,
        rotates=_cohere2_rotates,
        head_dim_from_config=False,
    ),
    "starcoder2": Family(
        bias="use_bias", bias_default=True, out_bias="use_bias", sliding="every_layer"
    ),
    "granite": Family(scaling="attention_multiplier"),
    "smollm3": Family(sliding="smollm3", rotates=rules._smollm3_rotates),
    "glm": Family(
        bias_default=True,
        out_bias=None,
        interleaved=True,
        partial_rotary=True,
        partial_rotary_default=0.5,
        config_defaults=(("head_dim", 128),),
    ),
    "glm4": Family(
        bias_default=True,
        out_bias=None,
        interleaved=True,
        partial_rotary=True,
        partial_rotary_default=0.5,
        config_defaults=(("head_dim", 128),),
    ),
    # Mixtral: Mistral's attention (no biases, one window on every layer); the experts are the MLP
    "mixtral": Family(bias=None, out_bias=None, sliding="every_layer"),
    "ministral": Family(
        bias=None,
        out_bias=None,
        sliding="layer_types",
        fallback=_every_layer_if_window,
        head_dim_required=True,
    ),
    "gemma": Family(
        head_dim_required=True, config_defaults=(("head_dim", 256),), bidirectional_flag=True
    ),
    "arcee": Family(),  # Llama's attention; its ReLU^2 MLP is outside it,
    # Helium: o_proj is (C, C) without bias, so H * D must be C; interleaved RoPE on whole heads
    "helium": Family(
        out_bias=None,
        interleaved=True,
        head_dim_required=True,
        config_defaults=(("head_dim", 128),),
        heads_span_hidden=True,
    ),
    "cwm": Family(
        bias=None,
        out_bias=None,
        sliding="layer_types",
        fallback=_cwm_sliding,
        config_defaults=(("head_dim", 128), ("sliding_window", 8192)),
        rope_default=(
            ("rope_type", "llama3"),
            ("rope_theta", 1e6),
            ("factor", 16.0),
            ("low_freq_factor", 1.0),
            ("high_freq_factor", 4.0),
            ("original_max_position_embeddings", 8192),
        ),
    ),
    # Seed-OSS: o_proj's bias has its own key; its residual dropout follows o_proj (training)
    "seed_oss": Family(
        out_bias="attention_out_bias",
        config_defaults=(
            ("attention_bias", True),
            ("attention_out_bias", False),
            ("head_dim", 128),
            ("attention_dropout", 0.1),
        ),
    ),
    # Apertus: Qwen3's QK-norm (RMSNorm per head, before RoPE); its xIELU MLP is outside
    "apertus": Family(
        qk_norm=("rms", "head", 0.0),
        rope_default=(
            ("rope_type", "llama3"),
            ("rope_theta", 12e6),
            ("factor", 8.0),
            ("low_freq_factor", 1.0),
            ("high_freq_factor", 4.0),
            ("original_max_position_embeddings", 8192),
        ),
    ),
    # InternLM3 runs on LlamaModel; one bias setting for all four projections and the MLP
    "internlm3": Family(
        config_defaults=(("head_dim", 128),),
        key_aliases=(("qkv_bias", "attention_bias"), ("bias", "mlp_bias")),
        equal_keys=(("attention_bias", "mlp_bias"),),
    ),
    # HyperCLOVA X: Granite's scale (attention_multiplier itself), 1/sqrt(D) when it is null
    "hyperclovax": Family(
        scaling="attention_multiplier", config_defaults=(("attention_multiplier", None),)
    ),
    # IQuest-Coder runs on LlamaModel; its config class refuses the original code's extras
    "iquestcoder": Family(
        config_defaults=(("head_dim", 128),),
        refused_keys=(
            (
                "clip_qkv",
                "iquestcoder's original code clamps q, k and v to [-c, c] after projection; "
                "transformers runs it as Llama, without the clip (and so has no layer here)",
            ),
            (
                "use_sliding_window",
                "iquestcoder's original code slides; transformers runs it as Llama, with full "
                "attention on every layer, and its config class refuses the flag",
            ),
        ),
    ),
    # Mellum: Qwen3's attention, sliding per layer_types (all full without them), one RoPE per
    # layer type (Gemma 3's rotary embedding)
    "mellum": Family(
        sliding="layer_types",
        qk_norm=("rms", "head", 0.0),
        rope_per_layer_type=True,
        config_defaults=(("head_dim", 128), ("sliding_window", 1024)),
        rope_default=(
            ("full_attention", (("rope_type", "default"), ("rope_theta", 5e5))),
            ("sliding_attention", (("rope_type", "default"), ("rope_theta", 1e4))),
        ),
    ),
    "jais2": Family(bias_default=True),  # Llama's attention, biases on by default,
    # Solar Open: Llama's attention with o_proj always bias-free; GLM-4-MoE's experts outside
    "solar_open": Family(out_bias=None, config_defaults=(("head_dim", 128),)),
    # PhiMoE: Mixtral's attention, attention_bias on all four projections, and
    # its own scaled RoPE (rope_mscale)
    "phimoe": Family(sliding="every_layer", rope_mscale=True),
    # Granite's MoE variants: Granite's attention (scores scaled by attention_multiplier itself)
    "granitemoe": Family(scaling="attention_multiplier"),
    "granitemoeshared": Family(scaling="attention_multiplier"),
    # Granite SWA: Granite's scale, GPT-OSS's sinks (applied as sigmoid(lse - sink) on the
    # output: the same extra softmax logit), sliding layers and a RoPE base per layer
    **{
        name: Family(
            sliding="layer_types",
            fallback=_granite_swa_sliding,
            scaling="attention_multiplier",
            sinks=True,
            rotates=_granite_swa_rotates,
            rope_theta_per_layer="layer_rope_theta",
        )
        for name in ("granite_swa", "granitemoe_swa")
    },
    # OLMo 3: OLMo 2's attention (QK-norm over the whole projection) with sliding layers and
    # RoPE per layer type; a transformers 4 config's rope_theta and rope_scaling reach only the
    # full layers, the sliding ones rotate at the class default 5e5 whatever rope_theta says
    "olmo3": Family(
        sliding="layer_types",
        fallback=_olmo3_sliding,
        qk_norm=("rms", "all", 0.0),
        rope_per_layer_type=True,
        rope_type_thetas=(5e5, None, 5e5),
    ),
    # FlexOLMo: OLMo 2's attention (its experts are outside it)
    "flex_olmo": Family(qk_norm=("rms", "all", 0.0)),
    # EXAONE 4 (and its MoE): no biases, Qwen3's per-head QK-norm, NoPE full layers
    **{
        name: Family(
            bias=None,
            out_bias=None,
            sliding="layer_types",
            fallback=_exaone4_sliding,
            qk_norm=("rms", "head", 0.0),
            rotates=_exaone4_rotates,
        )
        for name in ("exaone4", "exaone_moe")
    },
    # ERNIE 4.5 (and its MoE): use_bias on all four projections, interleaved RoPE as GLM's over
    # the whole head, no attention dropout (the code fixes it at 0)
    "ernie4_5": Family(
        bias="use_bias",
        out_bias="use_bias",
        interleaved=True,
        attention_dropout=False,
        config_defaults=(("head_dim", 128),),
    ),
    "ernie4_5_moe": Family(
        bias="use_bias", out_bias="use_bias", interleaved=True, attention_dropout=False
    ),
    # dots.llm1: Qwen3's attention (per-head QK-norm, attention_bias) with its own sliding rule
    "dots1": Family(sliding="layer_types", fallback=_dots1_sliding, qk_norm=("rms", "head", 0.0)),
    # GLM-4 MoE: partial rotary (0.5 by default) but split in halves, not GLM's interleaved
    # pairs; biases on q, k, v only; Qwen3's QK-norm under use_qk_norm
    "glm4_moe": Family(
        out_bias=None,
        qk_norm=("rms", "head", 0.0),
        qk_norm_flag="use_qk_norm",
        partial_rotary=True,
        partial_rotary_default=0.5,
    ),
    # MiniMax-M2: OLMo 2's QK-norm over the whole projection, no biases (no key), partial rotary
    # in halves, its width from the legacy rotary_dim where there is no factor
    "minimax_m2": Family(
        bias=None,
        out_bias=None,
        qk_norm=("rms", "all", 0.0),
        partial_rotary=True,
        config_defaults=(("head_dim", 128),),
        rotary_dim_key="rotary_dim",
    ),
    # Cohere 2 MoE: Cohere 2's interleaved RoPE and NoPE full layers, but its head_dim is read
    # (128 by default), attention_bias on all four projections, and its dense prefix rotates
    "cohere2_moe": Family(
        sliding="layer_types",
        fallback=_cohere2_moe_sliding,
        interleaved=True,
        rotates=_cohere2_moe_rotates,
        config_defaults=(("head_dim", 128),),
    ),
    # Hy3 (HY V3): Qwen3's attention (per-head QK-norm, attention_bias), head_dim 128 by default
    "hy_v3": Family(qk_norm=("rms", "head", 0.0), config_defaults=(("head_dim", 128),)),
    # Aria's language model: Llama's attention (its experts are outside it)
    "aria_text": Family(),
    # Flint: Qwen3's per-head QK-norm, GPT-OSS's sinks, sliding layers that rotate and full
    # layers that do not (NoPE)
    "flint": Family(
        sliding="layer_types",
        fallback=_flint_sliding,
        qk_norm=("rms", "head", 0.0),
        sinks=True,
        rotates=_flint_rotates,
        config_defaults=(("head_dim", 128), ("sliding_window", 513)),
    ),
    # Kolibri 1: no biases, per-head QK-norm, every fifth layer full and NoPE
    "kolibri1": Family(
        bias=None,
        out_bias=None,
        sliding="layer_types",
        fallback=_kolibri1_sliding,
        qk_norm=("rms", "head", 0.0),
        rotates=_kolibri1_rotates,
        config_defaults=(("head_dim", 128), ("sliding_window", 513)),
        refuse=_kolibri1_refuse,
    ),
    "stablelm": Family(
        bias="use_qkv_bias",
        out_bias=None,
        qk_norm=("layer", "per_head", 0.0),
        qk_norm_flag="qk_layernorm",
        norm_eps="layer_norm_eps",
        partial_rotary=True,
        head_dim_from_config=False,
        renames=(("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")),
        norms_per_head_modules=True,
        partial_rotary_default=0.25,
        refuse=rules._stablelm_refuse,
    ),
    "nemotron": Family(partial_rotary=True, partial_rotary_default=0.5),
    # Emu3's text model: Llama's attention, attention_dropout 0.1 in training by default
    "emu3_text_model": Family(config_defaults=(("attention_dropout", 0.1),)),
    # Mllama's text model: Llama's attention, no biases, heads C // H wide, on the layers that
    # are not cross_attention_layers; its dropout key is ``dropout``
    "mllama_text_model": Family(
        bias=None,
        out_bias=None,
        head_dim_from_config=False,
        key_aliases=(("dropout", "attention_dropout"),),
        mixers=_mllama_text_mixers,
        refuse=rules._stablelm_refuse,  # its rotary embedding reads head_dim, its heads C // H
    ),
    # ModernBERT decoder: multi-head (no grouping), heads C // H wide, Wo its o_proj, sliding
    # layers with a window of local_attention // 2 and RoPE per layer type; Wo's output is dropped
    # at attention_dropout in training
    "modernbert-decoder": Family(
        sliding="layer_types",
        fallback=_modernbert_decoder_sliding,
        rope_per_layer_type=True,
        head_dim_from_config=False,
        heads_span_hidden=True,
        config_defaults=(("local_attention", 128),),
        renames=(("Wo", "o_proj"),),
        refuse=_modernbert_decoder_refuse,
        derived=_modernbert_decoder_window,
    ),
}
# VaultGemma: Gemma 2's scores (scalar, cap), alternating layers and defaults, always causal
ROWS["vaultgemma"] = dataclasses.replace(
    ROWS["gemma2"], bidirectional_flag=False, head_dim_required=True
)
