"""The rows of the families whose projections are fused (Falcon's query_key_value, Phi-3's
qkv_proj, GPT-BigCode's c_attn, DBRX's and MPT's Wqkv, Persimmon's per-head layout;
``layouts.py`` splits them) or that carry Phi's biased LayerNorm QK-norm.

The rules a row names sit beside it, each its config class's or its model's; the rules
several modules share are ``hf/rules.py``. ``families.FAMILIES`` joins the modules' ROWS.
NumPy only.

Tests: tests/numpy_attention/hf/test_families.py; against transformers in
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .. import rules
from ..family import Family, required


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


# Phi-4-multimodal's config class: RoPE 'default' or 'longrope' ('su' and 'yarn' its old names)
def _phi4_multimodal_refuse(config: Mapping[str, Any]) -> None:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "longrope", "su", "yarn"):
        raise ValueError(
            f"rope_parameters' rope_type is {rope_type!r}: phi4_multimodal's config class takes "
            "only 'default' and 'longrope'"
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


ROWS: dict[str, Family] = {
    "phi3": Family(
        bias=None,
        out_bias=None,
        sliding="every_layer",
        partial_rotary=True,
        rope_renames=(("su", "longrope"), ("yarn", "longrope")),
        layout="qkv_proj",
    ),
    # Falcon: the rotary layers (alibi is refused); dropout is never applied on them
    "falcon": Family(
        bias="bias",
        out_bias="bias",
        layout="falcon",
        head_dim_from_config=False,
        attention_dropout=False,
    ),
    # Phi: q, k, v and dense (its o_proj) always carry a bias, whatever the config says; under
    # qk_layernorm an nn.LayerNorm with a bias over each head of q and k, before RoPE
    "phi": Family(
        bias="<always>",
        out_bias="<always>",
        qk_norm=("layer_bias", "head", 0.0),
        qk_norm_flag="qk_layernorm",
        norm_eps="layer_norm_eps",
        partial_rotary=True,
        renames=(("dense", "o_proj"), ("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")),
        partial_rotary_default=0.5,
        config_defaults=(("layer_norm_eps", 1e-5),),
        refuse=_phi_refuse,
    ),
    # GPT-BigCode (StarCoder, SantaCoder): one fused c_attn, biased, multi-query by default, no
    # RoPE (learned positions outside the attention), 1/sqrt(D) only under scale_attn_weights;
    # c_proj's output is dropped at resid_pdrop in training
    "gpt_bigcode": Family(
        bias="<always>",
        out_bias="<always>",
        rotates=rules._never,
        layout="gpt_bigcode",
        head_dim_from_config=False,
        heads_span_hidden=True,
        scaling="scale_attn_weights",
        config_defaults=(("attention_dropout", 0.1),),
        key_aliases=(
            ("n_embd", "hidden_size"),
            ("n_head", "num_attention_heads"),
            ("n_layer", "num_hidden_layers"),
            ("attn_pdrop", "attention_dropout"),
        ),
        refused_keys=(
            (
                "add_cross_attention",
                "gpt_bigcode's blocks then carry a second attention (crossattention) reading an "
                "encoder's states, under the same c_attn names; its self-attention layer is not "
                "told apart from it here",
            ),
        ),
        multi_query=True,
    ),
    # DBRX: one fused Wqkv [q; k; v] clamped to [-clip_qkv, clip_qkv], heads of d_model //
    # n_heads spanning d_model, its key/value heads, clip and dropout in the nested attn_config
    "dbrx": Family(
        bias=None,
        out_bias=None,
        layout="dbrx",
        head_dim_from_config=False,
        heads_span_hidden=True,
        key_aliases=(
            ("d_model", "hidden_size"),
            ("n_heads", "num_attention_heads"),
            ("n_layers", "num_hidden_layers"),
        ),
        config_defaults=(("num_key_value_heads", 1), ("rope_theta", 10000.0)),
        nested_keys=(
            ("attn_config", "kv_n_heads", "num_key_value_heads"),
            ("attn_config", "clip_qkv", "clip_qkv"),
            ("attn_config", "attn_pdrop", "attention_dropout"),
        ),
        clip_qkv="clip_qkv",
        refuse=_dbrx_refuse,
    ),
    # Persimmon: one fused query_key_value viewed as (H, 3, D), per head [q_h; k_h; v_h] (the
    # falcon layout with g = 1: no key/value head count is read), biases on it and on dense,
    # an nn.LayerNorm with a bias over each head of q and k (qk_layernorm, on by default),
    # half the head rotated by default, head_dim = hidden_size // num_attention_heads
    "persimmon": Family(
        bias="<always>",
        out_bias="<always>",
        qk_norm=("layer_bias", "head", 0.0),
        qk_norm_flag="qk_layernorm",
        norm_eps="layer_norm_eps",
        partial_rotary=True,
        partial_rotary_default=0.5,
        layout="falcon",
        head_dim_from_config=False,
        renames=(("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")),
        config_defaults=(("qk_layernorm", True), ("layer_norm_eps", 1e-5), ("rope_theta", 1e4)),
        refuse=rules._stablelm_refuse,
        all_kv_heads=True,
    ),
    # MPT: DBRX's fused Wqkv [q; k; v] (one key/value head per query head) and out_proj, no
    # biases, no RoPE: ALiBi's slopes as MptModel builds them, the clip, scale and dropout in the
    # nested attn_config
    "mpt": Family(
        bias=None,
        out_bias=None,
        layout="dbrx",
        head_dim_from_config=False,
        heads_span_hidden=True,
        all_kv_heads=True,
        rotates=lambda config, family, layer_idx: False,
        key_aliases=(
            ("d_model", "hidden_size"),
            ("n_heads", "num_attention_heads"),
            ("n_layers", "num_hidden_layers"),
        ),
        nested_keys=(
            ("attn_config", "clip_qkv", "clip_qkv"),
            ("attn_config", "attn_pdrop", "attention_dropout"),
            ("attn_config", "softmax_scale", "softmax_scale"),
        ),
        clip_qkv="clip_qkv",
        scaling="softmax_scale",
        refuse=_mpt_refuse,
        alibi=_mpt_alibi,
    ),
}
# Phi-4-multimodal's text decoder: Phi-3's attention (fused qkv_proj, partial rotary, LongRoPE,
# a window on every layer when set); its LoRA adapters are PEFT's, outside the base weights
ROWS["phi4_multimodal"] = dataclasses.replace(ROWS["phi3"], refuse=_phi4_multimodal_refuse)
