"""What each Hugging Face decoder family's attention reads from its config, as transformers 5.23's
modeling code reads it: one ``Family`` row per ``model_type``, and the layer options (RoPE aside,
``rope.py``) it gives ``GroupedQueryAttention``. NumPy only; transformers is never imported.

A family row says where the biases come from, which layers slide (and the rule a config without
``layer_types`` gets from the model's own config class), the QK-norm (its kind, its shape, Gemma's
(1 + w)), the score scale, softcap and sinks, the RoPE layout (interleaved pairs, partial rotary,
per-layer-type parameters, NoPE layers) and the projections' layout (separate, or fused: Phi-3's
``qkv_proj``, Falcon's ``query_key_value``). docs/hugging-face.md walks through every family.

Tests: tests/numpy_attention/hf/test_families.py, test_grouped.py; against transformers in
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .. import validation
from . import rules
from .family import Family, as_mapping, check_kind, kv_source, options
from .refused import REFUSED

FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(bias=None, out_bias=None, sliding="every_layer"),
    "qwen2": Family(
        bias="<state>", out_bias=None, sliding="layer_types", fallback=rules._qwen_sliding
    ),
    "qwen3": Family(
        sliding="layer_types", fallback=rules._qwen_sliding, qk_norm=("rms", "head", 0.0)
    ),
    "qwen2_moe": Family(
        bias="qkv_bias",
        bias_default=True,
        out_bias=None,
        sliding="layer_types",
        fallback=rules._qwen2_moe_sliding,
    ),
    "qwen3_moe": Family(sliding="use_sliding_window", qk_norm=("rms", "head", 0.0)),
    "gemma2": Family(
        sliding="layer_types",
        fallback=rules._even_layers,
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
    "gpt_oss": Family(
        bias_default=True, sliding="layer_types", fallback=rules._even_layers, sinks=True
    ),
    "phi3": Family(
        bias=None,
        out_bias=None,
        sliding="every_layer",
        partial_rotary=True,
        rope_renames=(("su", "longrope"), ("yarn", "longrope")),
        layout="qkv_proj",
    ),
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
        rotates=rules._cohere2_rotates,
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
    # Falcon: the rotary layers (alibi is refused); dropout is never applied on them
    "falcon": Family(
        bias="bias",
        out_bias="bias",
        layout="falcon",
        head_dim_from_config=False,
        attention_dropout=False,
    ),
    # Mixtral: Mistral's attention (no biases, one window on every layer); the experts are the MLP
    "mixtral": Family(bias=None, out_bias=None, sliding="every_layer"),
    "ministral": Family(
        bias=None,
        out_bias=None,
        sliding="layer_types",
        fallback=rules._every_layer_if_window,
        head_dim_required=True,
    ),
    "gemma": Family(
        head_dim_required=True, config_defaults=(("head_dim", 256),), bidirectional_flag=True
    ),
    "arcee": Family(),  # Llama's attention; its ReLU^2 MLP is outside it
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
        fallback=rules._cwm_sliding,
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
    "jais2": Family(bias_default=True),  # Llama's attention, biases on by default
    # Solar Open: Llama's attention with o_proj always bias-free; GLM-4-MoE's experts outside
    "solar_open": Family(out_bias=None, config_defaults=(("head_dim", 128),)),
    # PhiMoE: Mixtral's attention, attention_bias on all four projections, and
    # its own scaled RoPE (rope_mscale)
    "phimoe": Family(sliding="every_layer", rope_mscale=True),
    # OLMo: Llama's attention; clip_qkv (OLMo-7B-0424's 8) clamps q, k and v
    "olmo": Family(clip_qkv="clip_qkv"),
    # OLMoE: OLMo 2's QK-norm over the whole projection, sized C and (C // H) * H_kv; clip_qkv
    # clamps q and k after it
    "olmoe": Family(
        qk_norm=("rms", "all", 0.0),
        heads_span_hidden=True,
        clip_qkv="clip_qkv",
        clip_after_norm=True,
    ),
    # Granite's MoE variants: Granite's attention (scores scaled by attention_multiplier itself)
    "granitemoe": Family(scaling="attention_multiplier"),
    "granitemoeshared": Family(scaling="attention_multiplier"),
    # Granite SWA: Granite's scale, GPT-OSS's sinks (applied as sigmoid(lse - sink) on the
    # output: the same extra softmax logit), sliding layers and a RoPE base per layer
    **{
        name: Family(
            sliding="layer_types",
            fallback=rules._granite_swa_sliding,
            scaling="attention_multiplier",
            sinks=True,
            rotates=rules._granite_swa_rotates,
            rope_theta_per_layer="layer_rope_theta",
        )
        for name in ("granite_swa", "granitemoe_swa")
    },
    # OLMo 3: OLMo 2's attention (QK-norm over the whole projection) with sliding layers and
    # RoPE per layer type; a transformers 4 config's rope_theta and rope_scaling reach only the
    # full layers, the sliding ones rotate at the class default 5e5 whatever rope_theta says
    "olmo3": Family(
        sliding="layer_types",
        fallback=rules._olmo3_sliding,
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
            fallback=rules._exaone4_sliding,
            qk_norm=("rms", "head", 0.0),
            rotates=rules._exaone4_rotates,
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
    "dots1": Family(
        sliding="layer_types", fallback=rules._dots1_sliding, qk_norm=("rms", "head", 0.0)
    ),
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
        fallback=rules._cohere2_moe_sliding,
        interleaved=True,
        rotates=rules._cohere2_moe_rotates,
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
        fallback=rules._flint_sliding,
        qk_norm=("rms", "head", 0.0),
        sinks=True,
        rotates=rules._flint_rotates,
        config_defaults=(("head_dim", 128), ("sliding_window", 513)),
    ),
    # Kolibri 1: no biases, per-head QK-norm, every fifth layer full and NoPE
    "kolibri1": Family(
        bias=None,
        out_bias=None,
        sliding="layer_types",
        fallback=rules._kolibri1_sliding,
        qk_norm=("rms", "head", 0.0),
        rotates=rules._kolibri1_rotates,
        config_defaults=(("head_dim", 128), ("sliding_window", 513)),
        refuse=rules._kolibri1_refuse,
    ),
    # MiniMax(-Text-01): Lightning (linear) attention layers beside softmax layers with Mistral's
    # attention (no biases, one window on every softmax layer when sliding_window is set)
    "minimax": Family(
        bias=None, out_bias=None, sliding="every_layer", mixers=rules._minimax_mixers
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
        refuse=rules._phi_refuse,
    ),
    "nemotron": Family(partial_rotary=True, partial_rotary_default=0.5),
    # LFM2: never dropout on the weights; its attention is out_proj, its QK-norm q_layernorm
    "lfm2": Family(
        bias=None,
        out_bias=None,
        qk_norm=("rms", "head", 0.0),
        norm_eps="norm_eps",
        attention_dropout=False,
        mixers=rules._lfm2_mixers,
        renames=(("out_proj", "o_proj"), ("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")),
    ),
    "lfm2_moe": Family(
        bias=None,
        out_bias=None,
        qk_norm=("rms", "head", 0.0),
        norm_eps="norm_eps",
        attention_dropout=False,
        mixers=rules._lfm2_mixers,
        renames=(("out_proj", "o_proj"), ("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")),
    ),
    "jamba": Family(bias=None, out_bias=None, rotates=rules._never, mixers=rules._jamba_mixers),
    "bamba": Family(
        partial_rotary=True,
        mixers=rules._bamba_mixers,
        partial_rotary_default=0.5,
        partial_rotary_top_level=False,
    ),
    # Nemotron-H: its attention has no biases whatever attention_bias says
    "nemotron_h": Family(
        bias=None,
        out_bias=None,
        rotates=rules._never,
        mixers=rules._nemotron_h_mixers,
        refuse=rules._nemotron_h_refuse,
    ),
    # Falcon-H1: attention on every layer, beside Mamba-2 (attention_in_multiplier and
    # attention_out_multiplier act outside the attention module)
    "falcon_h1": Family(key_multiplier="key_multiplier"),
    "granitemoehybrid": Family(
        scaling="attention_multiplier",
        rotates=rules._granitemoehybrid_rotates,
        mixers=rules._granitemoehybrid_mixers,
    ),
    "olmo_hybrid": Family(
        qk_norm=("rms", "all", 0.0),
        rotates=rules._olmo_hybrid_rotates,
        mixers=rules._olmo_hybrid_mixers,
    ),
    # RecurrentGemma: local attention blocks beside RG-LRU ones; half of each head rotates (by
    # default), o_proj always biased, a window of attention_window_size on every one
    "recurrent_gemma": Family(
        out_bias="<always>",
        sliding="every_layer",
        partial_rotary=True,
        key_aliases=(("attention_window_size", "sliding_window"),),
        config_defaults=(("sliding_window", 2048),),
        mixers=rules._recurrent_gemma_mixers,
        partial_rotary_default=0.5,
        refuse=rules._recurrent_gemma_refuse,
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
    # Emu3's text model: Llama's attention, attention_dropout 0.1 in training by default
    "emu3_text_model": Family(config_defaults=(("attention_dropout", 0.1),)),
    # Mllama's text model: Llama's attention, no biases, heads C // H wide, on the layers that
    # are not cross_attention_layers; its dropout key is ``dropout``
    "mllama_text_model": Family(
        bias=None,
        out_bias=None,
        head_dim_from_config=False,
        key_aliases=(("dropout", "attention_dropout"),),
        mixers=rules._mllama_text_mixers,
        refuse=rules._stablelm_refuse,  # its rotary embedding reads head_dim, its heads C // H
    ),
    # ModernBERT decoder: multi-head (no grouping), heads C // H wide, Wo its o_proj, sliding
    # layers with a window of local_attention // 2 and RoPE per layer type; Wo's output is dropped
    # at attention_dropout in training
    "modernbert-decoder": Family(
        sliding="layer_types",
        fallback=rules._modernbert_decoder_sliding,
        rope_per_layer_type=True,
        head_dim_from_config=False,
        heads_span_hidden=True,
        config_defaults=(("local_attention", 128),),
        renames=(("Wo", "o_proj"),),
        refuse=rules._modernbert_decoder_refuse,
        derived=rules._modernbert_decoder_window,
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
        refuse=rules._dbrx_refuse,
    ),
    # BitNet: Llama's attention with an RMSNorm over the merged heads (attn_sub_norm, width C, so
    # H * D must be C) before o_proj; its quantized linears (quantization_config) are refused
    "bitnet": Family(
        heads_span_hidden=True,
        output_norm=True,
        renames=(("attn_sub_norm", "o_norm"),),
        refused_keys=(("quantization_config", rules._BITNET_QUANTIZED),),
    ),
    # -- the gated families: an output gate before o_proj (GroupedQueryAttention's g_proj) --
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
            mixers=rules._qwen3_next_mixers,
            gate=rules._qwen3_next_gate,
        )
        for name, kv_heads in (("qwen3_next", 2), ("qwen3_5_text", 4), ("qwen3_5_moe_text", 2))
    },
    # LFM3: LFM2's hybrid with sliding layers, per-head RMSNorm QK-norm, a sigmoid gate per head;
    # its full layers rotate with proportional RoPE, its sliding ones with whole-head RoPE
    "lfm3": Family(
        sliding="layer_types",
        fallback=rules._lfm3_sliding,
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
        mixers=rules._lfm3_mixers,
        gate=rules._lfm3_gate,
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
        gate=rules._laguna_gate,
        heads_per_layer="num_attention_heads_per_layer",
    ),
    # AFMoE: per-head RMSNorm QK-norm, sliding layers that rotate and full ones that do not
    # (NoPE), a sigmoid gate per element (gate_proj)
    "afmoe": Family(
        sliding="layer_types",
        fallback=rules._afmoe_sliding,
        qk_norm=("rms", "head", 0.0),
        rotates=rules._afmoe_rotates,
        config_defaults=(("head_dim", 128), ("sliding_window", 1024), ("rms_norm_eps", 1e-5)),
        renames=(("gate_proj", "g_proj"),),
        gate=rules._afmoe_gate,
    ),
    # HRM-Text: Llama's multi-head attention with a sigmoid gate per element (gate_proj); the
    # model runs its two stacks of layers over cycles, outside the attention
    "hrm_text": Family(
        config_defaults=(("head_dim", 128), ("rms_norm_eps", 1e-6)),
        renames=(("gate_proj", "g_proj"),),
        refuse=rules._hrm_text_refuse,
        gate=rules._hrm_text_gate,
    ),
    # -- QK-norm after RoPE, query temperature (issue 28) --
    # Hunyuan (dense and MoE): Llama's attention, an RMSNorm per head (weight (D,)) on the rotated
    # q and k, NTK-alpha RoPE; head_dim read with no C // H fallback
    **{
        name: Family(
            qk_norm=("rms", "head", 0.0),
            head_dim_required=True,
            renames=(("query_layernorm", "q_norm"), ("key_layernorm", "k_norm")),
            qk_norm_after_rope=True,
            rope_ntk_alpha=True,
        )
        for name in ("hunyuan_v1_dense", "hunyuan_v1_moe")
    },
    # nanochat: a weightless RMSNorm per head on the rotated q and k, pairs turned by -angle
    "nanochat": Family(
        qk_norm=("rms_weightless", "head", 0.0), qk_norm_after_rope=True, rope_reversed=True
    ),
    # Ministral 3: Mistral's attention (no biases, a window on every layer when set), the queries
    # scaled after RoPE by Llama 4's temperature, its config class's YaRN by default
    "ministral3": Family(
        bias=None,
        out_bias=None,
        sliding="every_layer",
        config_defaults=(("head_dim", 128),),
        rope_default=(
            ("rope_type", "yarn"),
            ("rope_theta", 1e6),
            ("factor", 16.0),
            ("original_max_position_embeddings", 16384),
            ("beta_fast", 32.0),
            ("beta_slow", 1.0),
            ("mscale_all_dim", 1.0),
            ("mscale", 1.0),
            ("llama_4_scaling_beta", 0.1),
        ),
        query_temperature=rules._ministral3_temperature,
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
        mixers=rules._zamba_mixers,
        refuse=rules._zamba_refuse,
        input_size=rules._zamba_input_size,
    ),
    "zamba2": Family(
        bias=None,
        out_bias=None,
        scaling="half_head_dim",
        rotates=rules._zamba2_rotates,
        key_aliases=(("attention_head_dim", "head_dim"),),
        mixers=rules._zamba2_mixers,
        refuse=rules._zamba2_refuse,
        input_size=rules._zamba2_input_size,
        adapters="use_shared_attention_adapter",
    ),
    # -- Beam (issue 28) --
    # Beam: Qwen3's QK-norm, sliding layers that rotate and full ones that do not (a null
    # rope_parameters entry: NoPE, with a query temperature), a sigmoid gate per element
    # (gate_proj) whose bias is one per head (gate_bias, (H,))
    "beam": Family(
        sliding="layer_types",
        fallback=rules._beam_sliding,
        qk_norm=("rms", "head", 0.0),
        rope_per_layer_type=True,
        rotates=rules._beam_rotates,
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
        refuse=rules._beam_refuse,
        gate=rules._beam_gate,
        query_temperature=rules._beam_temperature,
        gate_bias_per_head="gate_bias",
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
        refuse=rules._mpt_refuse,
        alibi=rules._mpt_alibi,
    ),
    # Gemma 3n: Gemma 3's layer types and RoPE per type, but plain-weight RMSNorms on q and k,
    # a weightless one on v, scores unscaled (scaling 1), and its last num_kv_shared_layers
    # layers attending with the keys and values of the last earlier layer of their type
    "gemma3n_text": Family(
        sliding="layer_types",
        fallback=rules._pattern(5),
        qk_norm=("rms", "head", 0.0),
        scaling="unit",
        rope_per_layer_type=True,
        value_norm=True,
        kv_sharing="num_kv_shared_layers",
        config_defaults=(
            ("head_dim", 256),
            ("sliding_window", 512),
            ("num_kv_shared_layers", 15),
        ),
    ),
}
# VaultGemma: Gemma 2's scores (scalar, cap), alternating layers and defaults, always causal
FAMILIES["vaultgemma"] = dataclasses.replace(
    FAMILIES["gemma2"], bidirectional_flag=False, head_dim_required=True
)
# Phi-4-multimodal's text decoder: Phi-3's attention (fused qkv_proj, partial rotary, LongRoPE,
# a window on every layer when set); its LoRA adapters are PEFT's, outside the base weights
FAMILIES["phi4_multimodal"] = dataclasses.replace(
    FAMILIES["phi3"], refuse=rules._phi4_multimodal_refuse
)
SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))
# Multimodal wrappers whose language model is a row: the wrapper's config is read through its
# ``text_config`` (whose model_type must be one of the types named), and from a state dict that
# holds the vision tower (or image tokenizer) too, the entries under the language model's module.
WRAPPERS: dict[str, tuple[tuple[str, ...], str]] = {
    "gemma3": (("gemma3_text",), "language_model"),
    "emu3": (("emu3_text_model",), "text_model"),
    "mllama": (("mllama_text_model",), "language_model"),
    "qwen3_5": (("qwen3_5_text",), "language_model"),
    "qwen3_5_moe": (("qwen3_5_moe_text",), "language_model"),
}


def language_model(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A multimodal wrapper's language model config (its ``text_config``, checked); any other
    config as given."""
    name = config.get("model_type")
    if name not in WRAPPERS:
        return config
    if config.get("text_config") is None:
        raise ValueError(f"the {name} config has no text_config, which holds its language model")
    text = as_mapping(config["text_config"])
    if text.get("model_type") not in WRAPPERS[name][0]:
        raise ValueError(
            f"the {name} config's text_config has model_type {text.get('model_type')!r}; its "
            f"language model is {' or '.join(map(repr, WRAPPERS[name][0]))}"
        )
    return text


def language_model_entries(config: Mapping[str, Any], state_dict: Any) -> Any:
    """For a multimodal wrapper's config, the state dict's entries under its language model's
    module (``language_model.``, Emu3's ``text_model.``: the whole model's, beside its vision
    tower's), or all of it when none are there (the language model's own state dict); any other
    state dict as given."""
    name = config.get("model_type")
    if name not in WRAPPERS or not isinstance(state_dict, Mapping):
        return state_dict
    module = WRAPPERS[name][1] + "."
    inside = {
        key: value
        for key, value in state_dict.items()
        if key.startswith(module) or "." + module in key
    }
    return inside or state_dict


def model_type(config: Mapping[str, Any]) -> str:
    """The config's ``model_type``, one of SUPPORTED_MODEL_TYPES."""
    name = config.get("model_type")
    if name in REFUSED:
        raise ValueError(f"model_type {name!r} is not supported as such: {REFUSED[name]}")
    if name in WRAPPERS:  # the converters read them through language_model first
        raise ValueError(
            f"model_type {name!r} is a multimodal wrapper: its attention is its text_config's "
            f"({' or '.join(WRAPPERS[name][0])}), read through language_model(config)"
        )
    if name not in FAMILIES:
        raise ValueError(
            f"model_type {name!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}"
        )
    return str(name)


def check_layer(config: Mapping[str, Any], name: str, layer_idx: int) -> None:
    """``family.check_kind`` for the row of ``name``: a hybrid's layer that is not attention, or a
    config the family refuses, raises ValueError by name."""
    check_kind(config, FAMILIES[name], name, layer_idx)


def kv_source_layer(config: Mapping[str, Any], layer_idx: int) -> int | None:
    """The layer whose keys and values layer ``layer_idx`` attends with (Gemma 3n's last
    ``num_kv_shared_layers`` layers: the last earlier layer of their type), None where the
    layer computes its own: which layer's ``kv`` (or cache) to pass a converted KV-shared
    layer as ``shared_kv``. A multimodal wrapper's config is read through its language
    model's."""
    config = language_model(as_mapping(config))
    name = model_type(config)
    layer_idx = validation.non_negative_int("kv_source_layer: layer_idx", layer_idx)
    return kv_source(config, FAMILIES[name], layer_idx)


def layer_options(
    config: Mapping[str, Any], name: str, layer_idx: int, attention: Mapping[str, Any]
) -> dict[str, Any]:
    """``family.options`` for the row of ``name``: the layer's constructor keywords, RoPE's
    aside (``rope.rope_options``)."""
    return options(config, FAMILIES[name], name, layer_idx, attention)
