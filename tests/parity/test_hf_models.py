"""Hugging Face as the real client: every supported model's attention layer, converted by
``numpy_attention.convert.grouped_from_hf`` from the whole model's state dict, against
transformers' own attention module, in float64 within FLOAT64_RTOL; the torch twin the same way.

Each model is built from a tiny random config in code (no download): 2 layers, hidden 32, 4 query
heads over 2 key/value heads of width 8, a sliding window of 4 keys against sequences of 11
tokens, eager attention, float64 weights, the attention's parameters redrawn at a scale where
softmax is neither flat nor one-hot (the models' own init of std 0.02 would make it flat). Layer
0 and layer 1 of each model cover its full and sliding layers as its config assigns them. A case
may change those sizes: the "-shaped" / "-checkpoint" cases mirror a released checkpoint's
attention settings (its RoPE scaling, its ratio of query to key/value heads, its layer pattern)
in tiny sizes; a hybrid's case names one of its attention layers.

Hugging Face's side is the model's own code: ``model(inputs_embeds=..., attention_mask=...,
position_ids=...)`` runs, and hooks on ``model.layers[i].self_attn`` record the attention's input,
the 4-D mask and the (cos, sin) the model built for it (its mask functions, its rotary embedding,
its choice of sliding layers); the attention module is then called on a fresh input with those,
and differentiated. Decoding runs the model with a ``DynamicCache``, prefill then one token at a
time, and compares each step's attention output with the converted layer fed the same input and a
``KVCache``.

How Hugging Face's math is kept in float64: its eager path upcasts to float32 in places (the
rotary embedding computes ``position_ids.float() * inv_freq.float()``, cos and sin in float32;
softmax runs with ``dtype=torch.float32``; RMSNorm casts with ``.to(torch.float32)``), which
would put float32 rounding (~1e-7) into a float64 comparison. ``Float64Math`` below is a
``torch.overrides.TorchFunctionMode`` active while Hugging Face's code runs: every torch call
that asks for float32 (``Tensor.float()``, ``dtype=torch.float32``, ``.to(torch.float32)``) is
given float64 instead, so the same operations run in float64. The rotary embedding's
``inv_freq`` buffer, computed in float32 when the model was built (outside the mode), keeps
its float32 values (upcast exactly): that is the model's own frequencies, and the converter gets
the same buffer through ``inv_freq=`` (it uses it as given). The converter's own frequencies,
computed from the config without the buffer, are compared with the buffer separately, per
element to float32 rounding (``test_frequencies_and_attention_factor_match_the_models``).

Left padding, as ``generate`` makes it: Hugging Face's ``attention_mask`` is 1 = keep and its
``position_ids`` are ``cumsum(mask) - 1`` (1 on the padding); the layer gets
``numpy_attention.hf.padding_from_hf(attention_mask)``, its ``key_padding_mask`` (True = padding)
and its positions. A left-padded query row sees no key; Hugging Face's eager softmax spreads it
uniformly over its masked scores (a value nobody reads), the layer's edge rule gives 0: the outputs
are compared on the real tokens, and the upstream gradient is 0 on the padded rows.

What it proves: the conversion (numpy_attention/hf/) and the layers (numpy_attention/grouped.py,
torch_attention/grouped.py) as Hugging Face's models use them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import torch_attention
from numpy_attention import convert
from numpy_attention.decode.cache import KVCache
from numpy_attention.functional import attention_forward
from numpy_attention.hf import (
    hf_attention_state_from_grouped,
    hf_inv_freq,
    hf_rope_attention_factor,
    kv_source_layer,
    padding_from_hf,
)

from ..conftest import assert_close, to_numpy, to_torch

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import Cache, DynamicCache, KVSharingDict  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

B, N, PREFILL, PAD = 2, 11, 6, 3  # batch, tokens, prefill length, left padding of element 1
ABSENT = object()  # a SIZES key a model's config must not be given
WINDOW = 4  # Hugging Face's sliding_window: 4 keys, the query included
SIZES = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_hidden_layers": 2,
    "intermediate_size": 16,
    "vocab_size": 11,
    "pad_token_id": None,  # some configs' default is past this vocabulary
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}


_DIVISIONS = (torch.Tensor.__truediv__, torch.Tensor.div, torch.div, torch.true_divide)


class Float64Math(TorchFunctionMode):
    """Every float32 request of the torch calls made inside becomes float64 (module docstring),
    and so does the float32 that torch gives an integer tensor divided (Ministral 3's
    ``position_ids / original_max_position_embeddings``): its integers are divided in float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            return args[0].to(torch.float64)
        if (
            func in _DIVISIONS
            and isinstance(args[0], torch.Tensor)
            and not args[0].is_floating_point()
        ):
            args = (args[0].to(torch.float64), *args[1:])
        args = tuple(torch.float64 if arg is torch.float32 else arg for arg in args)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


@dataclass(frozen=True)
class ModelCase:
    """One layer of one model: its config class, base model class, config keywords, the layer.

    ``config`` is merged over SIZES; the value ABSENT leaves that SIZES key out (Falcon's
    head_dim is a property, its kv heads ``num_kv_heads``)."""

    name: str
    model: str  # the transformers class prefix: "Llama", "Qwen2", ...
    layer_idx: int
    sliding: bool  # what the model's code makes of this layer (checked against its module)
    config: dict[str, Any] = field(default_factory=dict)
    unpadded: bool = False  # also a batch without padding (Hugging Face may skip its mask)
    wrapper: dict[str, Any] | None = None  # a multimodal wrapper's keywords; config: its text's

    def build(self) -> tuple[Any, Any]:
        """The config and the base model in float64, eager, attention weights redrawn."""
        torch.manual_seed(sum(map(ord, self.name)))
        merged = {key: value for key, value in (SIZES | self.config).items() if value is not ABSENT}
        config_class = getattr(transformers, f"{self.model}Config")
        if self.wrapper is None:
            config = config_class(**merged)
        else:  # the converter is given the wrapper's config and whole state dict
            config = config_class(text_config=merged, **self.wrapper)
        config._attn_implementation = "eager"
        config._experts_implementation = "eager"  # the MoE's grouped_mm has no float64
        model_class = getattr(transformers, f"{self.model}Model", None)  # InternLM3: LlamaModel
        model = model_class(config) if model_class else transformers.AutoModel.from_config(config)
        model = model.double().eval()
        with torch.no_grad():
            for layer_idx in range(len(decoder_layers(language(model)))):
                attention = attention_of(model, layer_idx)  # None on a Mamba layer
                for param in () if attention is None else attention.parameters():
                    scale = 1.5 / param.shape[-1] ** 0.5 if param.ndim == 2 else 0.5
                    param.normal_(0.0, scale)
        return config, model


def language(model):
    """A multimodal wrapper's language model (Emu3's ``text_model``; Llama 4's, a causal LM, its
    ``model``); any other model itself."""
    inner = getattr(model, "language_model", getattr(model, "text_model", model))
    if inner is not model and not hasattr(inner, "layers") and hasattr(inner, "model"):
        inner = inner.model
    return inner


def decoder_layers(model):
    """The model's decoder layers (Falcon's and GPT-BigCode's ``h``, DBRX's ``blocks``; HRM-Text's
    H stack, which its forward loops over cycles beside the L stack)."""
    if hasattr(model, "H_module"):
        return model.H_module.layers
    for name in ("h", "blocks", "layers"):
        if hasattr(model, name):
            return getattr(model, name)
    raise AttributeError(f"{type(model).__name__} has no decoder layers the tests know")


def attention_of(model, layer_idx):
    """The attention module of a decoder layer (Falcon's, GPT-BigCode's and DBRX's names differ;
    Nemotron-H's is its ``mixer``, RecurrentGemma's its ``temporal_block``, ModernBERT
    decoder's its ``attn``; Zamba's and Zamba2's is the shared block's of a hybrid layer; a
    multimodal wrapper's is its language model's), None on a hybrid's layer without attention
    (Mamba, convolution, recurrent, cross-attention, ...)."""
    model = language(model)
    if hasattr(model, "h"):
        block = model.h[layer_idx]
        return block.self_attention if hasattr(block, "self_attention") else block.attn
    if hasattr(model, "blocks"):  # DBRX's norm_attn_norm.attn, MPT's attn
        block = model.blocks[layer_idx]
        return block.norm_attn_norm.attn if hasattr(block, "norm_attn_norm") else block.attn
    layer = decoder_layers(model)[layer_idx]
    if getattr(layer, "block_type", None) is not None and hasattr(layer, "mixer"):
        return layer.mixer if layer.block_type == "full_attention" else None
    if hasattr(layer, "temporal_block"):  # RecurrentGemma: an RG-LRU block or attention
        return layer.temporal_block if hasattr(layer.temporal_block, "q_proj") else None
    shared = getattr(layer, "shared_transf", None) or getattr(layer, "shared_transformer", None)
    if shared is not None:  # Zamba (shared_transf), Zamba2 (shared_transformer)
        return shared.self_attn
    return getattr(layer, "self_attn", getattr(layer, "attn", None))


HUNYUAN_NTK_ALPHA = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}
MINISTRAL3_YARN = {  # its config class's default RoPE, the original length cut to 4 positions
    "rope_type": "yarn",
    "rope_theta": 1e6,
    "factor": 16.0,
    "original_max_position_embeddings": 4,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
    "llama_4_scaling_beta": 0.1,
}
MINISTRAL3_STEEP = {"llama_4_scaling_beta": 0.5, "original_max_position_embeddings": 3}
ARIA_MOE = {"moe_num_experts": 2, "moe_topk": 1, "moe_num_shared_experts": 1}
FLINT_MOE = {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8}
FLINT_MOE |= {"shared_expert_intermediate_size": 8}
KOLIBRI1_MOE = FLINT_MOE
MINIMAX_MOE = {"num_local_experts": 2, "num_experts_per_tok": 1}
QWEN3_NEXT_MOE = {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8}
QWEN3_NEXT_MOE |= {"shared_expert_intermediate_size": 8}
QWEN3_5 = {"linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2}
QWEN3_5 |= {"linear_num_value_heads": 4}
QWEN3_NEXT = QWEN3_5 | QWEN3_NEXT_MOE
QWEN3_5_VISION = {"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2}
QWEN3_5_VISION |= {"out_hidden_size": 32, "num_position_embeddings": 16, "patch_size": 4}
MROPE = {"mrope_section": [1, 1, 0], "mrope_interleaved": True}  # 2 frequencies: 4 of 16 turn
LAGUNA_MOE = FLINT_MOE
LAGUNA_YARN = {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0, "partial_rotary_factor": 0.5}
LAGUNA_YARN |= {"original_max_position_embeddings": 8}
LAGUNA_LOCAL = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0}
AFMOE_MOE = {"num_experts": 2, "num_experts_per_tok": 1, "num_shared_experts": 1}
AFMOE_MOE |= {"moe_intermediate_size": 8, "num_dense_layers": 1}
QWEN_SLIDING = {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}
PHI4_MM_ENCODERS = {  # Phi-4-multimodal's vision and audio encoders, tiny (embeddings are given)
    "vision_config": {"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1}
    | {"num_attention_heads": 2, "image_size": 28, "patch_size": 14, "crop_size": 28},
    "audio_config": {"hidden_size": 16, "intermediate_size": 16, "num_blocks": 1}
    | {"num_attention_heads": 2, "ext_pw_out_channel": 16, "nemo_conv_channels": 16}
    | {"depthwise_separable_out_channel": 16},
    "bos_token_id": None,
}
MODERNBERT_DECODER = {  # no key/value grouping; Hugging Face's window is local_attention // 2
    "num_key_value_heads": ABSENT,
    "head_dim": ABSENT,
    "local_attention": 2 * WINDOW,
    "norm_eps": 1e-5,
    "pad_token_id": 0,  # its config wants an int
}
BEAM = {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]} | {
    "mlp_layer_types": ["dense", "dense"],
    "num_experts": 2,
    "num_experts_per_tok": 1,
    "n_group": 1,
    "topk_group": 1,
    "moe_intermediate_size": 8,
    "rms_norm_eps": 1e-5,
}
BEAM_FULL_ROPE = {"rope_type": "default", "rope_theta": 1e6}
BEAM_SHAPED = BEAM | {"num_hidden_layers": 6, "layer_types": None, "mlp_layer_types": None}
BEAM_SHAPED |= {"num_attention_heads": 6, "num_key_value_heads": 1}
GEMMA3N = {  # its per-layer inputs, AltUp and LAuReL sized down (they never reach attention)
    "sliding_window": WINDOW,
    "num_kv_shared_layers": 2,
    "vocab_size_per_layer_input": 11,
    "hidden_size_per_layer_input": 8,
    "laurel_rank": 4,
    "rms_norm_eps": 1e-6,
}
GEMMA3N_TYPES = ["sliding_attention", "full_attention"]
CASES = [
    ModelCase("llama-bias", "Llama", 0, False, {"attention_bias": True}, unpadded=True),
    ModelCase("llama-llama3-rope", "Llama", 1, False, {"rope_parameters": LLAMA3_ROPE}, True),
    ModelCase("mistral-sliding", "Mistral", 1, True, {"sliding_window": WINDOW}, unpadded=True),
    *(
        ModelCase(
            f"{model.lower()}-{kind}",
            model,
            layer,
            layer == 1,
            QWEN_SLIDING | {"rms_norm_eps": 1e-5},  # Qwen3's QK-norm eps, not the layer's default
            unpadded=True,
        )
        for model in ("Qwen2", "Qwen3")
        for layer, kind in ((0, "full"), (1, "sliding"))
    ),
    *(
        ModelCase(
            f"gemma2-{kind}",
            "Gemma2",
            layer,
            layer == 0,
            {"sliding_window": WINDOW, "attn_logit_softcapping": 5.0, "query_pre_attn_scalar": 24},
            unpadded=True,
        )
        for layer, kind in ((0, "sliding"), (1, "full"))
    ),
    *(
        ModelCase(
            f"gpt_oss-{kind}",
            "GptOss",
            layer,
            layer == 0,
            {"sliding_window": WINDOW, "num_local_experts": 2, "num_experts_per_tok": 1},
            unpadded=True,
        )
        for layer, kind in ((0, "sliding"), (1, "full"))
    ),
    # -- the families of issue 20: a left-padded batch (its first element has no padding) -------
    *(
        ModelCase(
            f"gemma3-{kind}",
            "Gemma3Text",
            layer,
            layer == 0,
            {
                "sliding_window": WINDOW,
                "layer_types": ["sliding_attention", "full_attention"],
                "query_pre_attn_scalar": 24,
                "rms_norm_eps": 1e-5,
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                },
            },
        )
        for layer, kind in ((0, "sliding"), (1, "full"))
    ),
    *(  # google/gemma-3-4b-it: the multimodal model (a SigLIP tower beside the language model),
        # converted from its own config and whole state dict; its text: 8 heads over 4 kv heads,
        # 5 sliding layers to 1 full, full layers at theta 1e6 with linear RoPE x 8
        ModelCase(
            f"gemma3-multimodal-4b-shaped-{kind}",
            "Gemma3",
            layer,
            layer == 0,
            {
                "sliding_window": WINDOW,
                "layer_types": ["sliding_attention", "full_attention"],
                "query_pre_attn_scalar": 8,
                "rms_norm_eps": 1e-6,
                "vocab_size": 300,  # past the image token's id
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                },
            },
            wrapper={
                "vision_config": {"hidden_size": 16, "intermediate_size": 16}
                | {"num_attention_heads": 2, "num_hidden_layers": 1}
                | {"image_size": 28, "patch_size": 14},
                "mm_tokens_per_image": 4,
            },
        )
        for layer, kind in ((0, "sliding"), (1, "full"))
    ),
    ModelCase(  # LongRoPE past its original length of 8, on half of each head, sliding
        "phi3-longrope-partial-sliding",
        "Phi3",
        1,
        True,
        {
            "sliding_window": WINDOW,
            "max_position_embeddings": 32,
            "original_max_position_embeddings": 8,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.5],
                "long_factor": [3.0, 7.0],
            },
        },
    ),
    ModelCase("olmo2", "Olmo2", 0, False, {"rms_norm_eps": 1e-5}),
    ModelCase("cohere-qk-norm", "Cohere", 0, False, {"use_qk_norm": True, "layer_norm_eps": 0.1}),
    *(
        ModelCase(
            f"cohere2-{kind}",
            "Cohere2",
            layer,
            layer == 0,
            {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
        )
        for layer, kind in ((0, "sliding-rope"), (1, "full-nope"))
    ),
    ModelCase("starcoder2-bias-sliding", "Starcoder2", 0, True, {"sliding_window": WINDOW}),
    ModelCase("granite-multiplier", "Granite", 0, False, {"attention_multiplier": 0.3}),
    *(
        ModelCase(
            f"smollm3-{kind}",
            "SmolLM3",
            layer,
            layer == 1,
            {"no_rope_layers": [1, 0], "use_sliding_window": True, "sliding_window": WINDOW},
        )
        for layer, kind in ((0, "rope-full"), (1, "nope-sliding"))
    ),
    ModelCase(  # Qwen2-MoE's rule: even layers below max_window_layers slide
        "qwen2_moe-sliding",
        "Qwen2Moe",
        0,
        True,
        QWEN_SLIDING
        | {"max_window_layers": 2, "num_experts": 2, "num_experts_per_tok": 1}
        | {"moe_intermediate_size": 8, "shared_expert_intermediate_size": 8},
    ),
    ModelCase(  # every layer slides, layer 0 too (Qwen3's rule would not slide it)
        "qwen3_moe-sliding",
        "Qwen3Moe",
        0,
        True,
        QWEN_SLIDING
        | {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8}
        | {"rms_norm_eps": 1e-5},
    ),
    ModelCase("glm-partial", "Glm", 0, False),
    ModelCase("glm4-partial", "Glm4", 1, False),
    ModelCase(
        "falcon-new-decoder",
        "Falcon",
        0,
        False,
        {"new_decoder_architecture": True, "num_kv_heads": 2, "bias": True, "head_dim": ABSENT}
        | {"num_key_value_heads": ABSENT},
    ),
    ModelCase(
        "falcon-multi-query",
        "Falcon",
        1,
        False,
        {"multi_query": True, "head_dim": ABSENT, "num_key_value_heads": ABSENT},
    ),
    ModelCase(
        "mixtral-sliding",
        "Mixtral",
        1,
        True,
        {"sliding_window": WINDOW, "num_local_experts": 2, "num_experts_per_tok": 1},
        unpadded=True,
    ),
    ModelCase(  # mistralai/Mixtral-8x7B-v0.1: 32 heads over 8, theta 1e6, no window
        "mixtral-8x7b-shaped",
        "Mixtral",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 2, "sliding_window": None}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
        | {"num_local_experts": 2, "num_experts_per_tok": 1},
    ),
    ModelCase(  # no layer_types: its config class slides every layer under a window
        "ministral-sliding-every-layer", "Ministral", 0, True, {"sliding_window": WINDOW}, True
    ),
    *(  # mistralai/Ministral-8B-Instruct-2410: 32 heads over 8, theta 1e8, one full layer
        # then three sliding ones (here: full, sliding)
        ModelCase(
            f"ministral-8b-shaped-{kind}",
            "Ministral",
            layer,
            layer == 1,
            {"num_attention_heads": 8, "num_key_value_heads": 2, "sliding_window": WINDOW}
            | {"layer_types": ["full_attention", "sliding_attention"]}
            | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e8}},
        )
        for layer, kind in ((0, "full"), (1, "sliding"))
    ),
    ModelCase("gemma-bias", "Gemma", 1, False, {"attention_bias": True}, unpadded=True),
    ModelCase(  # google/gemma-7b: 16 heads of 256, multi-head, H * D = 4096 wider than C = 3072
        "gemma-7b-shaped",
        "Gemma",
        0,
        False,
        {"num_key_value_heads": 4, "head_dim": 16}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    ),
    ModelCase(  # google/gemma-2b: 8 heads of 256 over one key/value head (multi-query)
        "gemma-2b-shaped",
        "Gemma",
        1,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 4}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    ),
    ModelCase("arcee-bias", "Arcee", 0, False, {"attention_bias": True}, unpadded=True),
    ModelCase(  # arcee-ai/AFM-4.5B: 20 heads over 4, YaRN 20x over 4096 with mscale 1, 1
        # (5 over 1 here, at a width of 40: its config class wants C divisible by H)
        "arcee-afm-4.5b-shaped",
        "Arcee",
        1,
        False,
        {"hidden_size": 40, "num_attention_heads": 5, "num_key_value_heads": 1}
        | {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 20.0,
                "original_max_position_embeddings": 4096,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            }
        },
    ),
    ModelCase("helium-qkv-bias", "Helium", 1, False, {"attention_bias": True}, unpadded=True),
    ModelCase(  # kyutai/helium-1-preview-2b: 20 heads of 128 = C, multi-head, theta 1e5
        "helium-2b-shaped",
        "Helium",
        0,
        False,
        {"num_key_value_heads": 4, "rms_norm_eps": 1e-8}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}},
    ),
    *(
        ModelCase(
            f"vaultgemma-{kind}",
            "VaultGemma",
            layer,
            layer == 0,
            {"sliding_window": WINDOW, "attn_logit_softcapping": 5.0, "query_pre_attn_scalar": 24},
            unpadded=True,
        )
        for layer, kind in ((0, "sliding"), (1, "full"))
    ),
    ModelCase(  # google/vaultgemma-1b: full attention on every layer, 4 heads of 256 = the
        # scalar, softcap 50
        "vaultgemma-1b-shaped",
        "VaultGemma",
        1,
        False,
        {"num_key_value_heads": 4, "query_pre_attn_scalar": 8, "attn_logit_softcapping": 50.0}
        | {"layer_types": ["full_attention", "full_attention"], "sliding_window": 512},
    ),
    *(  # facebook/cwm: 48 heads over 8, every 4th layer full from the first, the others
        # sliding (8192), Llama 3's RoPE scaled 16x over 8192 positions at theta 1e6
        ModelCase(
            f"cwm-shaped-{kind}",
            "Cwm",
            layer,
            layer == 1,
            {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 1}
            | {"sliding_window": WINDOW, "rope_parameters": None},  # its config class's RoPE
            unpadded=True,
        )
        for layer, kind in ((0, "full"), (1, "sliding"))
    ),
    ModelCase(
        "seed_oss-out-bias",
        "SeedOss",
        1,
        False,
        {"attention_bias": False, "attention_out_bias": True},
        unpadded=True,
    ),
    ModelCase(  # ByteDance-Seed/Seed-OSS-36B-Base: 80 heads over 8 (8 over 1 here), q/k/v
        # biases and none on o_proj (its config class's defaults), theta 1e7
        "seed_oss-36b-shaped",
        "SeedOss",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 1}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7}},
    ),
    ModelCase(
        "apertus-qk-norm-bias",
        "Apertus",
        1,
        False,
        {"attention_bias": True, "rms_norm_eps": 1e-3},
        unpadded=True,
    ),
    ModelCase(  # swiss-ai/Apertus-8B-2509: 32 heads over 8, per-head QK-norm, no biases, its
        # config class's llama3 RoPE (theta 1.2e7, 8x over 8192)
        "apertus-8b-shaped",
        "Apertus",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 2, "rope_parameters": None},
    ),
    ModelCase(  # one bias setting: its config class refuses attention_bias != mlp_bias
        "internlm3-bias",
        "InternLM3",
        1,
        False,
        {"attention_bias": True, "mlp_bias": True},
        unpadded=True,
    ),
    ModelCase(  # internlm/internlm3-8b-instruct: 32 heads of 128 over 2, no biases, theta 5e7
        # (its rope_scaling is dynamic, 6x, which the converter refuses: default here)
        "internlm3-8b-shaped",
        "InternLM3",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 1}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 5e7}},
    ),
    ModelCase(
        "hyperclovax-multiplier-bias",
        "HyperCLOVAX",
        1,
        False,
        {"attention_multiplier": 0.3, "attention_bias": True},
        unpadded=True,
    ),
    ModelCase(  # naver-hyperclovax/HyperCLOVAX-SEED-Think-14B-like: GQA, MuP's scale of
        # 1 / head_dim rather than 1 / sqrt(head_dim), Peri-LN norms (outside the attention)
        "hyperclovax-think-14b-shaped",
        "HyperCLOVAX",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 2, "attention_multiplier": 1 / 8}
        | {"use_post_norm": True},
    ),
    ModelCase("iquestcoder-bias", "IQuestCoder", 1, False, {"attention_bias": True}, True),
    ModelCase(  # IQuestLab/IQuest-Coder-V1-40B-Instruct: 40 heads of 128 over 8 (5 over 1
        # here, at a width of 40: its config class wants C divisible by H), no biases
        "iquestcoder-40b-shaped",
        "IQuestCoder",
        0,
        False,
        {"hidden_size": 40, "num_attention_heads": 5, "num_key_value_heads": 1},
    ),
    *(  # JetBrains/Mellum2-12B-A2.5B-Base-like: 32 heads of 128 over 4 (8 over 1 here),
        # per-head QK-norm, sliding and full layers with their config class's RoPE per type
        # (theta 1e4 sliding, 5e5 full)
        ModelCase(
            f"mellum-shaped-{kind}",
            "Mellum",
            layer,
            layer == 0,
            {"num_attention_heads": 8, "num_key_value_heads": 1, "sliding_window": WINDOW}
            | {"layer_types": ["sliding_attention", "full_attention"], "rope_parameters": None}
            | {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8}
            | {"rms_norm_eps": 1e-5},
            unpadded=True,
        )
        for layer, kind in ((0, "sliding"), (1, "full"))
    ),
    ModelCase(  # a scaled RoPE on the full layers only
        "mellum-linear-full",
        "Mellum",
        1,
        False,
        {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": WINDOW}
        | {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8}
        | {
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            }
        },
    ),
    ModelCase("jais2-no-bias", "Jais2", 1, False, {"attention_bias": False}, unpadded=True),
    ModelCase(  # inceptionai/Jais-2-8B-Chat (its config class's defaults): 26 heads of 128, one
        # key/value head each (multi-head), biases on all four projections
        "jais2-shaped",
        "Jais2",
        0,
        False,
        {"num_key_value_heads": None},
    ),
    ModelCase(
        "solar_open-qkv-bias",
        "SolarOpen",
        1,
        False,
        {"attention_bias": True, "n_routed_experts": 2, "num_experts_per_tok": 1}
        | {"moe_intermediate_size": 8},
        unpadded=True,
    ),
    ModelCase(  # upstage/Solar-Open-100B (its config class's defaults): 64 heads of 128 over
        # 8, H * D = 8192 wider than C = 4096, theta 1e6, no biases
        "solar_open-100b-shaped",
        "SolarOpen",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 1, "n_routed_experts": 2}
        | {"num_experts_per_tok": 1, "moe_intermediate_size": 8}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    ),
    ModelCase(
        "phimoe-bias-sliding",
        "Phimoe",
        1,
        True,
        {"attention_bias": True, "sliding_window": WINDOW, "num_local_experts": 2}
        | {"num_experts_per_tok": 1},
        unpadded=True,
    ),
    ModelCase(  # LongRoPE past its original length of 8: PhiMoE keeps the short factors and
        # scales cos and sin by its mscale
        "phimoe-longrope-past-original",
        "Phimoe",
        0,
        False,
        {"num_local_experts": 2, "num_experts_per_tok": 1, "max_position_embeddings": 32}
        | {
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 8,
                "short_factor": [1.0, 1.5, 2.0, 3.0],
                "long_factor": [3.0, 7.0, 11.0, 13.0],
                "short_mscale": 1.2,
                "long_mscale": 1.2,
            }
        },
    ),
    ModelCase(  # microsoft/Phi-3.5-MoE-instruct: 32 heads of 128 over 8 (4 over 1 here), q, k, v
        # and o biased, a window on every layer (its 131072, past any length here: WINDOW),
        # LongRoPE from 4096 to 131072 with both mscales 1.243163121016122
        "phimoe-3.5-shaped",
        "Phimoe",
        1,
        True,
        {"num_key_value_heads": 1, "attention_bias": True, "sliding_window": WINDOW}
        | {"num_local_experts": 2, "num_experts_per_tok": 1, "max_position_embeddings": 131072}
        | {
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 4096,
                "short_factor": [1.0, 1.0399, 1.2396, 1.8004],
                "long_factor": [1.0, 1.3, 7.5, 41.3],
                "short_mscale": 1.243163121016122,
                "long_mscale": 1.243163121016122,
            }
        },
    ),
    ModelCase("olmo-bias", "Olmo", 1, False, {"attention_bias": True}, unpadded=True),
    ModelCase(  # allenai/OLMo-1B-hf: multi-head (16 over 16), theta 1e4, no biases, no clip
        "olmo-1b-shaped",
        "Olmo",
        0,
        False,
        {"num_key_value_heads": 4, "clip_qkv": None}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    ),
    ModelCase(
        "olmoe-bias-qk-norm",
        "Olmoe",
        1,
        False,
        {"attention_bias": True, "rms_norm_eps": 1e-3, "num_experts": 2}
        | {"num_experts_per_tok": 1},
        unpadded=True,
    ),
    ModelCase(  # allenai/OLMoE-1B-7B-0924: multi-head (16 over 16), theta 1e4, no biases,
        # QK-norm eps 1e-5, no clip
        "olmoe-1b-7b-shaped",
        "Olmoe",
        0,
        False,
        {"num_key_value_heads": 4, "rms_norm_eps": 1e-5, "num_experts": 2}
        | {"num_experts_per_tok": 1, "clip_qkv": None}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    ),
    ModelCase(
        "granitemoe-multiplier-bias",
        "GraniteMoe",
        1,
        False,
        {"attention_multiplier": 0.3, "attention_bias": True, "num_local_experts": 2}
        | {"num_experts_per_tok": 1},
    ),
    ModelCase(  # ibm-granite/granite-3.0-1b-a400m-base: 16 heads over 8, 1/64, theta 1e4
        "granitemoe-checkpoint",
        "GraniteMoe",
        0,
        False,
        {"attention_multiplier": 0.015625, "num_local_experts": 2, "num_experts_per_tok": 1}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    ),
    ModelCase(
        "granitemoeshared-multiplier-bias",
        "GraniteMoeShared",
        1,
        False,
        {"attention_multiplier": 0.3, "attention_bias": True, "shared_intermediate_size": 8}
        | {"num_local_experts": 2, "num_experts_per_tok": 1},
    ),
    ModelCase(  # Granite 3.0's MoE attention settings (above) with a shared expert
        "granitemoeshared-checkpoint",
        "GraniteMoeShared",
        0,
        False,
        {"attention_multiplier": 0.015625, "shared_intermediate_size": 8}
        | {"num_local_experts": 2, "num_experts_per_tok": 1}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    ),
    *(
        ModelCase(  # layer 0 full and NoPE, layer 1 sliding on its own base (not the global one)
            f"{name}-{kind}",
            model,
            layer,
            layer == 1,
            {"attention_multiplier": 0.3, "sliding_window": WINDOW, "layer_rope_theta": [0, 5e4]}
            | extra,
        )
        for name, model, extra in (
            ("granite_swa", "GraniteSWA", {"attention_bias": True}),
            ("granitemoe_swa", "GraniteMoeSWA", {"num_local_experts": 2, "num_experts_per_tok": 1}),
        )
        for layer, kind in ((0, "full-nope"), (1, "sliding-theta"))
    ),
    *(
        ModelCase(  # ibm-granite/granite-swash-2b: 20 heads over 4, 1/128, window 128 (here 4),
            # layers 0, 4, ... full (the config class's rule), theta 1e4 on every layer
            f"{name}-checkpoint",
            model,
            1,
            True,
            {"num_attention_heads": 5, "num_key_value_heads": 1, "sliding_window": WINDOW}
            | {"attention_multiplier": 0.0078125, "num_local_experts": 2, "num_experts_per_tok": 1}
            | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
        )
        for name, model in (("granite_swa", "GraniteSWA"), ("granitemoe_swa", "GraniteMoeSWA"))
    ),
    *(
        ModelCase(  # RoPE per layer type: the sliding layer's base and the full layer's scaling
            f"olmo3-{kind}",
            "Olmo3",
            layer,
            layer == 0,
            {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]}
            | {"attention_bias": True, "rms_norm_eps": 1e-3}
            | {
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                }
            },
        )
        for layer, kind in ((0, "sliding"), (1, "full"))
    ),
    ModelCase(  # allenai/Olmo-3-1025-7B: multi-head (32 over 32), window 4096 (here 4), three
        # sliding layers then a full one, theta 5e5, YaRN (factor 8 over 8192) on the full layers
        "olmo3-checkpoint",
        "Olmo3",
        1,
        False,
        {"num_key_value_heads": 4, "sliding_window": WINDOW, "rms_norm_eps": 1e-6}
        | {"layer_types": ["sliding_attention", "full_attention"]}
        | {"max_position_embeddings": 65536}
        | {
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 5e5},
                "full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0}
                | {"original_max_position_embeddings": 8192, "attention_factor": 1.2079441541679836}
                | {"beta_fast": 32.0, "beta_slow": 1.0},
            }
        },
    ),
    ModelCase(
        "flex_olmo-bias-qk-norm",
        "FlexOlmo",
        1,
        False,
        {"attention_bias": True, "rms_norm_eps": 1e-3, "num_experts": 2, "num_experts_per_tok": 1},
    ),
    ModelCase(  # allenai/FlexOlmo-7x7B-1T: multi-head (32 over 32), theta 5e5, no biases
        "flex_olmo-checkpoint",
        "FlexOlmo",
        0,
        False,
        {"num_key_value_heads": 4, "rms_norm_eps": 1e-6, "num_experts": 2}
        | {
            "num_experts_per_tok": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
        },
    ),
    *(
        ModelCase(  # with a window the sliding layer rotates and the full one is NoPE
            f"{name}-{kind}",
            model,
            layer,
            layer == 0,
            {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]}
            | {"rms_norm_eps": 1e-3}
            | extra,
        )
        for name, model, extra in (
            ("exaone4", "Exaone4", {}),
            ("exaone_moe", "ExaoneMoe", {"num_experts": 2, "num_experts_per_tok": 1}),
        )
        for layer, kind in ((0, "sliding-rope"), (1, "full-nope"))
    ),
    ModelCase(  # without a window (EXAONE MoE's config requires one) every layer rotates
        "exaone4-no-window-rope",
        "Exaone4",
        1,
        False,
        {"sliding_window": None, "layer_types": ["full_attention", "full_attention"]},
    ),
    *(
        ModelCase(  # LGAI-EXAONE/EXAONE-4.0-32B: 40 heads over 8, head_dim 128, window 4096
            # (here 4), "LLLG" layers, llama3 RoPE (factor 16 over 8192, theta 1e6)
            f"{name}-checkpoint",
            model,
            0,
            True,
            {"num_attention_heads": 5, "num_key_value_heads": 1, "sliding_window": WINDOW}
            | {"sliding_window_pattern": "LLLG", "rms_norm_eps": 1e-5}
            | {"layer_types": ["sliding_attention", "full_attention"]}
            | {
                "rope_parameters": LLAMA3_ROPE
                | {"factor": 16.0, "rope_theta": 1e6, "original_max_position_embeddings": 8192}
            }
            | {"max_position_embeddings": 131072}
            | extra,
        )
        for name, model, extra in (
            ("exaone4", "Exaone4", {}),
            ("exaone_moe", "ExaoneMoe", {"num_experts": 2, "num_experts_per_tok": 1}),
        )
    ),
    *(
        ModelCase(f"{name}-bias-interleaved", model, 1, False, {"use_bias": True} | extra)
        for name, model, extra in (
            ("ernie4_5", "Ernie4_5", {}),
            (
                "ernie4_5_moe",
                "Ernie4_5_Moe",
                {"moe_num_experts": 2, "moe_k": 1, "moe_intermediate_size": 8},
            ),
        )
    ),
    ModelCase(  # baidu/ERNIE-4.5-0.3B-PT: 16 heads over 2, head_dim 128 (C // H is 64),
        # theta 5e5, no biases
        "ernie4_5-checkpoint",
        "Ernie4_5",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
    ),
    ModelCase(  # baidu/ERNIE-4.5-21B-A3B-PT: 20 heads over 4, head_dim 128, theta 5e5
        "ernie4_5_moe-checkpoint",
        "Ernie4_5_Moe",
        1,
        False,
        {"num_attention_heads": 5, "num_key_value_heads": 1}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
        | {"moe_num_experts": 2, "moe_k": 1, "moe_intermediate_size": 8},
    ),
    *(
        ModelCase(  # the config class's rule: layers from max_window_layers on slide (no flag)
            f"dots1-{kind}",
            "Dots1",
            layer,
            layer == 1,
            {"sliding_window": WINDOW, "max_window_layers": 1, "attention_bias": True}
            | {"rms_norm_eps": 1e-3}
            | {
                "n_routed_experts": 2,
                "num_experts_per_tok": 1,
                "n_shared_experts": 1,
                "moe_intermediate_size": 8,
            },
        )
        for layer, kind in ((0, "full"), (1, "sliding"))
    ),
    ModelCase(  # rednote-hilab/dots.llm1.base: multi-head (32 over 32), theta 1e7, no biases,
        # sliding_window left at the class's 4096 under max_window_layers 62: nothing slides
        "dots1-checkpoint",
        "Dots1",
        1,
        False,
        {"num_key_value_heads": 4, "rms_norm_eps": 1e-5, "sliding_window": ABSENT}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7}}
        | {
            "n_routed_experts": 2,
            "num_experts_per_tok": 1,
            "n_shared_experts": 1,
            "moe_intermediate_size": 8,
        },
    ),
    ModelCase(  # a quarter of the head rotates, split in halves; biases on q, k, v only
        "glm4_moe-partial-qk-norm",
        "Glm4Moe",
        1,
        False,
        {"use_qk_norm": True, "attention_bias": True, "rms_norm_eps": 1e-3, "head_dim": 16}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
        | {"partial_rotary_factor": 0.25}  # 4 of 16 coordinates: two pairs tell the layouts apart
        | {"n_routed_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8},
    ),
    ModelCase(  # zai-org/GLM-4.5: 96 heads over 8 (here 8 over 1), head_dim 128, rotary half
        # (the class default), theta 1e6, q/k/v biases, QK-norm
        "glm4_moe-checkpoint",
        "Glm4Moe",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 1, "use_qk_norm": True}
        | {"attention_bias": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
        | {"n_routed_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8},
    ),
    ModelCase(  # a quarter of each head rotates (partial_rotary_factor wins over rotary_dim)
        "minimax_m2-partial-qk-norm",
        "MiniMaxM2",
        1,
        False,
        {"rotary_dim": 4, "partial_rotary_factor": 0.25, "head_dim": 16, "rms_norm_eps": 1e-3}
        | {"num_local_experts": 2, "num_experts_per_tok": 1},
    ),
    ModelCase(  # MiniMaxAI/MiniMax-M2: 48 heads over 8 (here 6 over 1), head_dim 128,
        # rotary_dim 64 (half the head), theta 5e6, QK-norm over the whole projection
        "minimax_m2-checkpoint",
        "MiniMaxM2",
        0,
        False,
        {"num_attention_heads": 6, "num_key_value_heads": 1, "rotary_dim": 4, "rope_theta": 5e6}
        | {"num_local_experts": 2, "num_experts_per_tok": 1},
    ),
    *(
        ModelCase(  # a dense prefix layer attends fully and rotates; the next full one is NoPE
            f"cohere2_moe-{kind}",
            "Cohere2Moe",
            layer,
            False,
            {"first_k_dense_replace": 1, "prefix_dense_sliding_window_pattern": 1}
            | {"sliding_window_pattern": 1, "sliding_window": WINDOW}
            # biases on the rotating layer only: on a NoPE layer k's bias adds the same q . b to
            # every score of a row, so its gradient is zero in exact arithmetic (rounding noise)
            | {"attention_bias": layer == 0}
            | {"prefix_dense_intermediate_size": 16}
            | {"num_experts": 2, "num_experts_per_tok": 1},
        )
        for layer, kind in ((0, "dense-full-rope"), (1, "full-nope"))
    ),
    ModelCase(  # the config class's defaults (64 heads, multi-head, head_dim 128, window 4096
        # (here 4), every fourth layer full, theta 1e4, no biases): layer 1 slides and rotates
        "cohere2_moe-checkpoint",
        "Cohere2Moe",
        1,
        True,
        {"num_key_value_heads": 4, "sliding_window": WINDOW, "rope_theta": 1e4}
        | {"num_experts": 2, "num_experts_per_tok": 1},
    ),
    ModelCase(
        "hy_v3-bias-qk-norm",
        "HYV3",
        1,
        False,
        {"attention_bias": True, "rms_norm_eps": 1e-3}
        | {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8},
    ),
    ModelCase(  # tencent/Hy3-preview (the config class's defaults): 64 heads over 8, head_dim
        # 128, theta 11158840, no biases, QK-norm, no window
        "hy_v3-checkpoint",
        "HYV3",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 1, "rms_norm_eps": 1e-5}
        | {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8},
    ),
    ModelCase(  # Aria's language model: Llama's attention, biases on all four projections
        "aria_text-bias",
        "AriaText",
        1,
        False,
        ARIA_MOE | {"attention_bias": True},
        unpadded=True,
    ),
    ModelCase(  # after rhymes-ai/Aria's text_config (from memory, not downloaded): one kv head
        # per query head, no biases, rope_theta 5e6
        "aria_text-checkpoint",
        "AriaText",
        0,
        False,
        ARIA_MOE
        | {
            "num_key_value_heads": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e6},
        },
    ),
    *(
        ModelCase(  # the sliding layer rotates; the full one is NoPE; sinks and QK-norm on both
            f"flint-{kind}",
            "Flint",
            layer,
            layer == 1,
            FLINT_MOE
            | {"sliding_window": WINDOW, "attention_bias": True}
            | {"layer_types": ["full_attention", "sliding_attention"]},
        )
        for layer, kind in ((0, "full-nope"), (1, "sliding-rope"))
    ),
    ModelCase(  # FlintConfig's own defaults (no released checkpoint to mirror): 32 query heads
        # over 4 (here 8 over 1), no biases, theta 1e4; layers 2 and 3 of its rule slide
        "flint-checkpoint",
        "Flint",
        0,
        True,
        FLINT_MOE
        | {"num_attention_heads": 8, "num_key_value_heads": 1, "sliding_window": WINDOW}
        | {"layer_types": ["sliding_attention", "sliding_attention"]},
    ),
    ModelCase(  # its config class's rule: layers 0-3 slide (and rotate)
        "kolibri1-sliding-rope", "Kolibri1", 1, True, KOLIBRI1_MOE | {"sliding_window": WINDOW}
    ),
    ModelCase(  # the full layers are NoPE
        "kolibri1-full-nope",
        "Kolibri1",
        1,
        False,
        KOLIBRI1_MOE
        | {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    ModelCase(  # Kolibri1Config's own defaults (no released checkpoint to mirror): 48 query
        # heads over 4 (here 8 over 1), window 513 (here 4), every fifth layer full
        "kolibri1-checkpoint",
        "Kolibri1",
        0,
        True,
        KOLIBRI1_MOE
        | {"num_attention_heads": 8, "num_key_value_heads": 1}
        | {
            "sliding_window": WINDOW,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
    ModelCase(  # layer 0 softmax (its class's rule), layer 1 Lightning attention; one window
        "minimax-sliding", "MiniMax", 0, True, MINIMAX_MOE | {"sliding_window": WINDOW}
    ),
    ModelCase(  # after MiniMaxAI/MiniMax-Text-01 (from memory): 64 query heads over 8 (here 8
        # over 1), no window, rope_theta 1e7 (its rotary_dim 64 of head_dim 128 is ignored by
        # transformers' MiniMax, which rotates whole heads)
        "minimax-checkpoint",
        "MiniMax",
        0,
        False,
        MINIMAX_MOE
        | {"num_attention_heads": 8, "num_key_value_heads": 1}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7}},
    ),
    ModelCase(  # the default partial_rotary_factor 0.25 (2 of 8), QK-norm: one LayerNorm per head
        "stablelm-qk-layernorm",
        "StableLm",
        1,
        False,
        {"qk_layernorm": True, "layer_norm_eps": 0.1},
    ),
    ModelCase(  # stabilityai/stablelm-2-1_6b: q/k/v biases, as many kv heads as heads, 1/4 rotary
        "stablelm-2-1_6b-shaped",
        "StableLm",
        0,
        False,
        {"use_qkv_bias": True, "num_key_value_heads": 4, "partial_rotary_factor": 0.25},
    ),
    ModelCase("phi-gqa", "Phi", 1, False),  # biases on all four, half the head rotates
    ModelCase(  # microsoft/phi-2: head_dim 80 (here 10), 40% rotary, multi-head, LayerNorm-free
        "phi-2-shaped",
        "Phi",
        0,
        False,
        {"head_dim": 10, "num_key_value_heads": 4, "partial_rotary_factor": 0.4},
    ),
    ModelCase("nemotron-bias", "Nemotron", 1, False, {"attention_bias": True}),
    ModelCase(  # nvidia/Minitron-4B-Base: 24 heads over 8 kv heads (here 6 over 2), half rotary
        "nemotron-minitron-shaped",
        "Nemotron",
        0,
        False,
        {"num_attention_heads": 6, "partial_rotary_factor": 0.5},
    ),
    ModelCase(  # LiquidAI/LFM2-350M: conv layers and attention ones, 16 over 8 kv heads, theta 1e6
        "lfm2-350m-shaped",
        "Lfm2",
        1,
        False,
        {"layer_types": ["conv", "full_attention"], "norm_eps": 1e-5}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    ),
    ModelCase(  # LiquidAI/LFM2-8B-A1B: as LFM2, with an MoE after the first dense layers
        "lfm2_moe-8b-a1b-shaped",
        "Lfm2Moe",
        0,
        False,
        {"layer_types": ["full_attention", "conv"], "norm_eps": 1e-5, "num_dense_layers": 1}
        | {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8},
    ),
    ModelCase(  # ai21labs/AI21-Jamba-Mini-1.5: NoPE attention every 8th layer from 4 (here 2, 1)
        "jamba-mini-shaped",
        "Jamba",
        1,
        False,
        {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2}
        | {"expert_layer_offset": 1, "num_experts": 2, "num_experts_per_tok": 1}
        | {"use_mamba_kernels": False, "mamba_d_state": 4, "head_dim": ABSENT},
    ),
    ModelCase(  # ibm-ai-platform/Bamba-9B: attention at attn_layer_indices, half rotary (fixed)
        "bamba-9b-shaped",
        "Bamba",
        1,
        False,
        {"attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_state": 8, "head_dim": ABSENT},
    ),
    ModelCase(  # nvidia/Nemotron-H-8B-Base-8K: Mamba-2, MLP and NoPE attention blocks ("M*")
        "nemotron_h-8b-shaped",
        "NemotronH",
        1,
        False,
        {"layers_block_type": ["linear_attention", "full_attention"], "mamba_num_heads": 8}
        | {"mamba_head_dim": 8, "ssm_state_size": 8, "n_groups": 1, "use_mamba_kernels": False},
    ),
    ModelCase(  # tiiuae/Falcon-H1-0.5B-Base: attention beside Mamba-2 on every layer, 8 over 2
        # kv heads (here 4 over 1), theta 1e11, a key multiplier folded into the scale
        "falcon_h1-0.5b-shaped",
        "FalconH1",
        1,
        False,
        {"num_key_value_heads": 1, "key_multiplier": 0.4, "attention_in_multiplier": 0.7}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e11}}
        | {"mamba_d_ssm": 64, "mamba_n_heads": 8, "mamba_d_state": 8},
    ),
    ModelCase(  # ibm-granite/granite-4.0-h-tiny: NoPE attention (no position_embedding_type),
        # 12 over 4 kv heads (here 6 over 2), attention_multiplier as the scale
        "granitemoehybrid-h-tiny-shaped",
        "GraniteMoeHybrid",
        1,
        False,
        {"num_attention_heads": 6, "attention_multiplier": 0.3}
        | {"layer_types": ["linear_attention", "full_attention"], "num_local_experts": 2}
        | {"num_experts_per_tok": 1, "mamba_n_heads": 8, "mamba_d_state": 8},
    ),
    ModelCase(  # position_embedding_type "rope": its attention rotates
        "granitemoehybrid-rope",
        "GraniteMoeHybrid",
        0,
        False,
        {"position_embedding_type": "rope", "attention_multiplier": 0.3}
        | {"layer_types": ["full_attention", "linear_attention"], "num_local_experts": 0}
        | {"mamba_n_heads": 8, "mamba_d_state": 8, "head_dim": ABSENT},
    ),
    ModelCase(  # OLMo Hybrid's released config: gated DeltaNet layers, NoPE attention (no theta)
        "olmo_hybrid-nope",
        "OlmoHybrid",
        1,
        False,
        {"layer_types": ["linear_attention", "full_attention"], "rms_norm_eps": 1e-5}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": None}, "head_dim": ABSENT},
    ),
    ModelCase(  # its config class's default: RoPE at theta 1e4
        "olmo_hybrid-rope",
        "OlmoHybrid",
        0,
        False,
        {"layer_types": ["full_attention", "linear_attention"], "rms_norm_eps": 1e-5}
        | {"head_dim": ABSENT},
    ),
    # -- rows that need no new layer option: RecurrentGemma, GPT-BigCode, Emu3's and Mllama's text
    # models, Phi-4-multimodal, ModernBERT decoder -------------------------------------------------
    ModelCase(  # an RG-LRU block then a local attention block; q/k/v biases, o_proj's always;
        # a head_dim given (16, not C // H) is kept by its config class
        "recurrent_gemma-local-bias",
        "RecurrentGemma",
        1,
        True,
        {"block_types": ["recurrent", "attention"], "attention_window_size": WINDOW}
        | {"attention_bias": True, "head_dim": 16},
        unpadded=True,
    ),
    ModelCase(  # google/recurrentgemma-2b: 10 heads of 256 over one (multi-query), C = 2560,
        # window 2048 (here 4), two recurrent blocks then one attention block, half of each head
        # rotates at theta 1e4 (its config class's defaults)
        "recurrent_gemma-2b-shaped",
        "RecurrentGemma",
        2,
        True,
        {"hidden_size": 40, "num_attention_heads": 5, "num_key_value_heads": 1}
        | {"num_hidden_layers": 3, "attention_window_size": WINDOW, "head_dim": ABSENT},
    ),
    ModelCase(  # per-head [q_h; k_h; v_h] rows, scores without 1/sqrt(D)
        "gpt_bigcode-multi-head-unscaled",
        "GPTBigCode",
        1,
        False,
        {"multi_query": False, "scale_attn_weights": False, "head_dim": ABSENT}
        | {"num_key_value_heads": ABSENT, "intermediate_size": ABSENT},
        unpadded=True,
    ),
    ModelCase(
        "gpt_bigcode-multi-query",
        "GPTBigCode",
        0,
        False,
        {"head_dim": ABSENT, "num_key_value_heads": ABSENT, "intermediate_size": ABSENT},
    ),
    ModelCase(  # bigcode/starcoder: 48 heads of 128 over one (multi-query), C = 6144, biases,
        # 1/sqrt(D), learned positions (here 8 heads of 4 over one)
        "gpt_bigcode-starcoder-shaped",
        "GPTBigCode",
        1,
        False,
        {"num_attention_heads": 8, "multi_query": True, "n_positions": 8192, "head_dim": ABSENT}
        | {"num_key_value_heads": ABSENT, "intermediate_size": ABSENT},
    ),
    ModelCase(
        "emu3_text-bias",
        "Emu3Text",
        1,
        False,
        {"attention_bias": True, "pad_token_id": 0},  # its config wants an int
        unpadded=True,
    ),
    ModelCase(  # BAAI/Emu3-Chat-hf's text model: 32 heads of 128 over 8, theta 1e6, no biases,
        # 9216 positions
        "emu3_text-chat-shaped",
        "Emu3Text",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 9216}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "pad_token_id": 0},
    ),
    ModelCase(  # a self-attention layer before a cross-attention one
        "mllama_text-self-attention",
        "MllamaText",
        0,
        False,
        {"cross_attention_layers": [1], "head_dim": ABSENT},
        unpadded=True,
    ),
    ModelCase(  # meta-llama/Llama-3.2-11B-Vision: 32 heads over 8, Llama 3's RoPE (8x over 8192,
        # theta 5e5), every fifth layer from the fourth cross-attends (here 8 over 2, layer 3)
        "mllama_text-11b-vision-shaped",
        "MllamaText",
        2,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 4}
        | {"cross_attention_layers": [3], "head_dim": ABSENT}
        | {"rope_parameters": LLAMA3_ROPE | {"original_max_position_embeddings": 8192}},
    ),
    ModelCase(  # BAAI/Emu3-Chat-hf whole: its VQ-VAE image tokenizer (whose own attention has
        # q_proj too) beside the text model, converted from the wrapper's config and state dict
        "emu3-wrapper-chat-shaped",
        "Emu3",
        1,
        False,
        {"num_key_value_heads": 1, "pad_token_id": 0}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
        wrapper={
            "vq_config": {"codebook_size": 16, "embed_dim": 4, "latent_channels": 4}
            | {"base_channels": 32, "channel_multiplier": [1], "num_res_blocks": 1},
            "vocabulary_map": {"<image>": 3},
        },
    ),
    ModelCase(  # meta-llama/Llama-3.2-11B-Vision whole: the vision model's layers numbered from 0
        # beside the language model's self-attention layer 0 (its layer 1 cross-attends)
        "mllama-wrapper-11b-vision-shaped",
        "Mllama",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 2, "cross_attention_layers": [1]}
        | {
            "head_dim": ABSENT,
            "rope_parameters": LLAMA3_ROPE | {"original_max_position_embeddings": 8192},
        },
        wrapper={
            "vision_config": {"hidden_size": 16, "attention_heads": 2, "num_hidden_layers": 1}
            | {"num_global_layers": 1, "intermediate_size": 16, "image_size": 28}
            | {"patch_size": 14, "vision_output_dim": 32, "intermediate_layers_indices": [0]},
        },
    ),
    ModelCase(  # LongRoPE past its original length of 8 on three quarters of each head, no window
        "phi4_multimodal-longrope-partial",
        "Phi4Multimodal",
        1,
        False,
        PHI4_MM_ENCODERS
        | {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 2}
        | {"head_dim": ABSENT, "sliding_window": None, "max_position_embeddings": 32}
        | {"original_max_position_embeddings": 8}
        | {
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75,
                "short_factor": [1.0, 1.5, 2.0],
                "long_factor": [3.0, 7.0, 11.0],
            }
        },
    ),
    ModelCase(  # microsoft/Phi-4-multimodal-instruct: 24 heads of 128 over 8 (here 6 of 8 over
        # 2), 3/4 of each head rotates, LongRoPE from 4096 to 131072, a window on every layer (its
        # 262144, past any length here: WINDOW)
        "phi4_multimodal-instruct-shaped",
        "Phi4Multimodal",
        0,
        True,
        PHI4_MM_ENCODERS
        | {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 2}
        | {"head_dim": ABSENT, "sliding_window": WINDOW, "max_position_embeddings": 131072}
        | {"original_max_position_embeddings": 4096}
        | {
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75,
                "short_factor": [1.0, 1.05, 1.6],
                "long_factor": [1.0, 3.9, 38.1],
            }
        },
    ),
    *(
        ModelCase(  # RoPE per layer type: the full layer's scaled, the sliding one's own base
            f"modernbert_decoder-{kind}",
            "ModernBertDecoder",
            layer,
            layer == 1,
            MODERNBERT_DECODER
            | {"layer_types": ["full_attention", "sliding_attention"], "attention_bias": True}
            | {
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                }
            },
        )
        for layer, kind in ((0, "full"), (1, "sliding"))
    ),
    ModelCase(  # jhu-clsp/ettin-decoder-150m-like (its config class's defaults): 12 heads of 64,
        # multi-head, every third layer full from the first, window 64, theta 1.6e5 full and
        # 1e4 sliding; here layer 2 of 3 (sliding)
        "modernbert_decoder-ettin-shaped",
        "ModernBertDecoder",
        2,
        True,
        MODERNBERT_DECODER | {"num_hidden_layers": 3},
    ),
]
# -- clip_qkv and the output norm: OLMo, OLMoE, DBRX, BitNet ----------------------------------
# The projections here have a std of about 1.5 (the redrawn weights): a clip of 1.5 clamps about
# a third of q, k and v; OLMoE's clamp acts after its QK-norm, whose outputs have a std of about
# 0.5 (its redrawn weight): 0.4 clamps about a third of them. The checkpoints' 8 rarely bites.
DBRX_SIZES = {name: ABSENT for name in ("hidden_size", "num_attention_heads", "head_dim")}
DBRX_SIZES |= {"num_key_value_heads": ABSENT, "num_hidden_layers": ABSENT}
DBRX_SIZES |= {"intermediate_size": ABSENT, "d_model": 32, "n_heads": 4, "n_layers": 2}
DBRX_SIZES |= {"ffn_config": {"ffn_hidden_size": 16, "moe_num_experts": 2, "moe_top_k": 1}}
CASES += [
    ModelCase("olmo-clip-bias", "Olmo", 0, False, {"clip_qkv": 1.5, "attention_bias": True}, True),
    ModelCase(  # allenai/OLMo-7B-0424-hf: multi-head (32 over 32), theta 1e4, clip_qkv 8
        "olmo-7b-0424-shaped",
        "Olmo",
        1,
        False,
        {"num_key_value_heads": 4, "clip_qkv": 8.0}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    ),
    ModelCase(
        "olmoe-clip-after-qk-norm",
        "Olmoe",
        0,
        False,
        {"clip_qkv": 0.4, "rms_norm_eps": 1e-5, "num_experts": 2, "num_experts_per_tok": 1},
        unpadded=True,
    ),
    ModelCase(  # OLMoE-1B-7B-0924's shape (multi-head, 16 over 16) with OLMo-0424's clip of 8
        "olmoe-1b-7b-clip-shaped",
        "Olmoe",
        1,
        False,
        {"num_key_value_heads": 4, "rms_norm_eps": 1e-5, "num_experts": 2}
        | {"num_experts_per_tok": 1, "clip_qkv": 8.0}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    ),
    ModelCase(
        "dbrx-clip-gqa",
        "Dbrx",
        0,
        False,
        DBRX_SIZES | {"attn_config": {"clip_qkv": 1.5, "kv_n_heads": 2, "rope_theta": 10000.0}},
        unpadded=True,
    ),
    ModelCase(  # databricks/dbrx-base: 48 heads over 8 (6 over 1 here), clip 8, theta 5e5
        # (set at the top level too: transformers' rotary embedding reads only that one)
        "dbrx-base-shaped",
        "Dbrx",
        1,
        False,
        DBRX_SIZES
        | {"d_model": 48, "n_heads": 6}
        | {"attn_config": {"clip_qkv": 8, "kv_n_heads": 1, "rope_theta": 500000}}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    ),
    ModelCase("bitnet-sub-norm", "BitNet", 0, False, {"rms_norm_eps": 1e-3}, unpadded=True),
    ModelCase(  # microsoft/bitnet-b1.58-2B-4T's attention: 20 heads over 5 (4 over 1 here),
        # theta 5e5, eps 1e-5 (its ternary quantized linears are refused by name)
        "bitnet-b1.58-2b-shaped",
        "BitNet",
        1,
        False,
        {"num_key_value_heads": 1, "rms_norm_eps": 1e-5}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    ),
    # -- the gated families: an output gate before o_proj --------------------------------------
    ModelCase(  # q_proj's per-head halves, query and gate, all four projections biased; a
        # quarter of each head rotates (the class default: 4 of 16, two pairs)
        "qwen3_next-gate-bias",
        "Qwen3Next",
        1,
        False,
        QWEN3_NEXT
        | {"layer_types": ["linear_attention", "full_attention"]}
        | {"attention_bias": True, "head_dim": 16, "rms_norm_eps": 1e-3},
    ),
    ModelCase(  # Qwen/Qwen3-Next-80B-A3B: 16 heads over 2 (here 8 over 1), head_dim 256 (here
        # 16), a quarter rotary, theta 1e7, every fourth layer full (full_attention_interval)
        "qwen3_next-80b-a3b-shaped",
        "Qwen3Next",
        3,
        False,
        QWEN3_NEXT
        | {"num_hidden_layers": 4, "full_attention_interval": 4, "head_dim": 16}
        | {"num_attention_heads": 8, "num_key_value_heads": 1, "rms_norm_eps": 1e-6}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7}},
    ),
    ModelCase(  # text positions: the three mrope axes read the same position
        "qwen3_5_text-gate-bias",
        "Qwen3_5Text",
        1,
        False,
        QWEN3_5
        | {"layer_types": ["linear_attention", "full_attention"]}
        | {"attention_bias": True, "head_dim": 16, "rms_norm_eps": 1e-3},
    ),
    ModelCase(  # Qwen3_5TextConfig's defaults (Qwen/Qwen3.5-27B): 16 heads over 4 (here 4 over
        # 1), head_dim 256 (here 16), a quarter rotary, mrope sections 11/11/10, theta 1e7
        "qwen3_5_text-checkpoint",
        "Qwen3_5Text",
        3,
        False,
        QWEN3_5
        | {"num_hidden_layers": 4, "head_dim": 16, "num_key_value_heads": 1}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7} | MROPE},
    ),
    ModelCase(  # Qwen/Qwen3.5-27B whole: its vision tower (qkv fused, another layout) beside the
        # language model, converted from the wrapper's config and state dict
        "qwen3_5-wrapper-27b-shaped",
        "Qwen3_5",
        3,
        False,
        QWEN3_5
        | {"num_hidden_layers": 4, "head_dim": 16, "num_key_value_heads": 1}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7} | MROPE},
        wrapper={"vision_config": QWEN3_5_VISION},
    ),
    ModelCase(
        "qwen3_5_moe-wrapper-checkpoint",
        "Qwen3_5Moe",
        3,
        False,
        QWEN3_5
        | QWEN3_NEXT_MOE
        | {"num_hidden_layers": 4, "head_dim": 16, "num_attention_heads": 8}
        | {"num_key_value_heads": 1, "rms_norm_eps": 1e-6}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7} | MROPE},
        wrapper={"vision_config": QWEN3_5_VISION},
    ),
    ModelCase(
        "qwen3_5_moe_text-gate",
        "Qwen3_5MoeText",
        1,
        False,
        QWEN3_5
        | QWEN3_NEXT_MOE
        | {"layer_types": ["linear_attention", "full_attention"]}
        | {"head_dim": 16, "num_attention_heads": 8, "num_key_value_heads": 1},
    ),
    ModelCase(  # Qwen3_5MoeTextConfig's defaults (the Qwen3.5 MoE checkpoints): 16 heads over
        # 2 (here 8 over 1), head_dim 256 (here 16), a quarter rotary, every fourth layer full;
        # mrope sections and theta 1e7 as the released configs have them
        "qwen3_5_moe_text-checkpoint",
        "Qwen3_5MoeText",
        3,
        False,
        QWEN3_5
        | QWEN3_NEXT_MOE
        | {"num_hidden_layers": 4, "head_dim": 16, "num_attention_heads": 8}
        | {"num_key_value_heads": 1, "rms_norm_eps": 1e-6}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e7} | MROPE},
    ),
    *(
        ModelCase(  # a sigmoid gate per head; the full layer's proportional RoPE turns 4 of its
            # 8 pairs, at base^(-2i/16), the other 4 at frequency 0
            f"lfm3-{kind}",
            "Lfm3",
            layer,
            layer == 0,
            {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": WINDOW}
            | {"head_dim": 16, "norm_eps": 1e-3, "attention_bias": True},
        )
        for layer, kind in ((0, "sliding-gate"), (1, "full-proportional-gate"))
    ),
    ModelCase(  # Lfm3Config's defaults (no released checkpoint to mirror): 16 heads over 4
        # (here 8 over 2), head_dim 128 (here 16), conv, conv, full, conv, sliding; its full
        # layers' proportional RoPE at 1e6 on half the pairs, the sliding ones' at 1e4
        "lfm3-checkpoint",
        "Lfm3",
        2,
        False,
        {"num_hidden_layers": 5, "num_attention_heads": 8, "head_dim": 16}
        | {"sliding_window": WINDOW, "conv_L_cache": 3},
    ),
    ModelCase(  # lfm3 without its gate: use_attention_gate false
        "lfm3-sliding-no-gate",
        "Lfm3",
        4,
        True,
        {"num_hidden_layers": 5, "head_dim": 16, "sliding_window": WINDOW}
        | {"use_attention_gate": False, "conv_L_cache": 3},
    ),
    ModelCase(  # a softplus gate per head, half of each head rotating on the full layer
        "laguna-full-per-head",
        "Laguna",
        0,
        False,
        LAGUNA_MOE
        | {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": WINDOW}
        | {"head_dim": 16, "gating": True, "attention_bias": True, "rms_norm_eps": 1e-3},
    ),
    ModelCase(  # a softplus gate per element on a sliding layer with twice the heads
        "laguna-sliding-per-element-heads-per-layer",
        "Laguna",
        1,
        True,
        LAGUNA_MOE
        | {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": WINDOW}
        | {"num_attention_heads_per_layer": [4, 8], "gating": "per-element", "head_dim": 16},
    ),
    ModelCase(  # YaRN on the full layer's rotated half (its factor multiplies cos and sin)
        "laguna-full-yarn-partial",
        "Laguna",
        0,
        False,
        LAGUNA_MOE
        | {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": WINDOW}
        | {"head_dim": 16, "max_position_embeddings": 32}
        | {"rope_parameters": {"full_attention": LAGUNA_YARN, "sliding_attention": LAGUNA_LOCAL}},
    ),
    ModelCase(  # LagunaConfig's defaults: 48 heads over 8 (here 6 over 1), head_dim 128 (here
        # 16), full layers at theta 5e5 rotating half of each head, a softplus gate per head
        "laguna-checkpoint",
        "Laguna",
        0,
        False,
        LAGUNA_MOE | {"num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 16},
    ),
    *(
        ModelCase(  # a sigmoid gate per element (gate_proj); the full layer is NoPE
            f"afmoe-{kind}",
            "Afmoe",
            layer,
            layer == 0,
            AFMOE_MOE
            | {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": WINDOW}
            | {"rms_norm_eps": 1e-3},
        )
        for layer, kind in ((0, "sliding-rope"), (1, "full-nope"))
    ),
    ModelCase(  # AfmoeConfig's defaults (arcee-ai's Trinity): multi-head, head_dim 128 (here
        # 8), every fourth layer full and NoPE, the others sliding
        "afmoe-checkpoint",
        "Afmoe",
        3,
        False,
        AFMOE_MOE
        | {"num_hidden_layers": 4, "num_key_value_heads": ABSENT, "sliding_window": WINDOW}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    ),
    ModelCase(  # the H stack's layer 1 (the model runs it over H_cycles), biased gate_proj
        "hrm_text-bias",
        "HrmText",
        1,
        False,
        {"attention_bias": True, "num_key_value_heads": ABSENT, "H_cycles": 2, "L_cycles": 1},
    ),
    ModelCase(  # HrmTextConfig's defaults: 12 heads (here 4) of 128 (here 8), multi-head,
        # H_cycles 2, L_cycles 3, no biases
        "hrm_text-checkpoint",
        "HrmText",
        0,
        False,
        {"num_key_value_heads": ABSENT},
    ),
    # -- QK-norm after RoPE and the query temperature (issue 28) ----------------------------------
    ModelCase(  # an RMSNorm per head, weight (D,), on the rotated q and k; biases on all four
        "hunyuan_v1_dense-qk-norm-after-rope",
        "HunYuanDenseV1",
        0,
        False,
        {"attention_bias": True, "rms_norm_eps": 0.1},
        unpadded=True,
    ),
    ModelCase(  # tencent/Hunyuan-7B-Instruct: 32 heads of 128 over 8, NTK-alpha RoPE (alpha 1000)
        "hunyuan_v1_dense-7b-shaped",
        "HunYuanDenseV1",
        1,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 2, "rms_norm_eps": 1e-5}
        | {"rope_parameters": HUNYUAN_NTK_ALPHA},
    ),
    ModelCase(  # tencent/Hunyuan-A13B-Instruct: Hunyuan's attention, 32 heads over 8, alpha 1000,
        # before an MoE of 64 experts (here 2, top 1)
        "hunyuan_v1_moe-a13b-shaped",
        "HunYuanMoEV1",
        1,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 2, "rms_norm_eps": 1e-5}
        | {"rope_parameters": HUNYUAN_NTK_ALPHA, "num_experts": 2, "moe_topk": 1},
    ),
    ModelCase(  # a weightless RMSNorm on the rotated heads, pairs turned by -angle, with biases
        "nanochat-reversed-rope", "NanoChat", 0, False, {"attention_bias": True}, unpadded=True
    ),
    ModelCase(  # karpathy/nanochat-d32: 16 heads of 128, as many kv heads, theta 1e4
        "nanochat-d32-shaped",
        "NanoChat",
        1,
        False,
        {"num_key_value_heads": 4, "rms_norm_eps": 1e-6}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    ),
    ModelCase(  # the temperature steps at p = 3, 6, 9 (beta 0.5 over 3 positions); sliding
        "ministral3-temperature-sliding",
        "Ministral3",
        1,
        True,
        {"sliding_window": WINDOW, "rope_parameters": MINISTRAL3_YARN | MINISTRAL3_STEEP},
        unpadded=True,
    ),
    ModelCase(  # mistralai/Ministral-3-8B-Base-2512: 32 heads of 128 over 8, YaRN 16x over 16384
        # positions with beta 0.1 (the length here 4, so that 11 tokens cross it twice), no window
        "ministral3-8b-shaped",
        "Ministral3",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 2, "sliding_window": None}
        | {"rope_parameters": MINISTRAL3_YARN},
    ),
    # Zamba and Zamba2: the shared attention block reads 2 * hidden_size (input_size)
    ModelCase(  # attention_head_dim = 2 * hidden_size / heads = 16, scores times (D / 2)^-0.5;
        # two attention layers (transformers' weight tying fails on a Zamba with one)
        "zamba-gqa",
        "Zamba",
        1,
        False,
        {"layers_block_type": ["linear_attention", "hybrid", "hybrid"], "num_hidden_layers": 3}
        | {"mamba_d_state": 4, "head_dim": ABSENT},
    ),
    ModelCase(  # Zyphra/Zamba-7B-v1: its config class's pattern (attention at 2, then every 6th
        # from 3 + 4), 16 = 16 kv heads (here 4 = 4); layer 7, the second use of the shared block
        "zamba-7b-shaped",
        "Zamba",
        7,
        False,
        {"num_hidden_layers": 9, "num_key_value_heads": 4, "attn_layer_period": 6}
        | {"attn_layer_offset": 4, "mamba_d_state": 4}
        | {"head_dim": ABSENT},
    ),
    ModelCase(  # no RoPE (use_mem_rope off), no adapters
        "zamba2-gqa",
        "Zamba2",
        1,
        False,
        {"layers_block_type": ["linear_attention", "hybrid"], "n_mamba_heads": 8}
        | {"mamba_d_state": 4, "head_dim": ABSENT},
    ),
    ModelCase(  # Zyphra/Zamba2-2.7B: two shared blocks alternating over the attention layers,
        # per-layer LoRA adapters (rank 128, here 4) folded on load, RoPE, 32 = 32 kv heads (here
        # 4); layer 4 is the third attention layer: block 0 again, adapter slot 2
        "zamba2-2.7b-shaped",
        "Zamba2",
        4,
        False,
        {
            "layers_block_type": ["linear_attention", "hybrid", "hybrid", "linear_attention"]
            + ["hybrid"],
            "num_hidden_layers": 5,
            "num_key_value_heads": 4,
            "num_mem_blocks": 2,
        }
        | {"use_shared_attention_adapter": True, "adapter_rank": 4, "use_mem_rope": True}
        | {"n_mamba_heads": 8, "mamba_d_state": 4, "head_dim": ABSENT},
    ),
    # -- Beam (issue 28): Qwen3's QK-norm, a sigmoid gate per element with a bias per head
    # (gate_bias (H,), repeated over each head's D on load, summed back for its gradient), and on
    # a layer type whose rope_parameters entry is null, NoPE and the query temperature
    # (1 + (p + 1) / 2048) ** 0.1; small dense MLPs (the MoE is outside the attention)
    ModelCase("beam-sliding-rope", "Beam", 0, True, BEAM),
    ModelCase("beam-full-nope-temperature", "Beam", 1, False, BEAM | {"attention_bias": True}),
    ModelCase(  # the other way round: sliding layers without RoPE (so with the temperature),
        # full ones rotating at their own base
        "beam-sliding-nope-full-rope",
        "Beam",
        0,
        True,
        BEAM | {"rope_parameters": {"sliding_attention": None, "full_attention": BEAM_FULL_ROPE}},
    ),
    ModelCase(
        "beam-full-rope",
        "Beam",
        1,
        False,
        BEAM | {"rope_parameters": {"sliding_attention": None, "full_attention": BEAM_FULL_ROPE}},
    ),  # fmt: skip
    ModelCase(  # reflection/Beam-1.0-501B-A23B: 48 query heads over 8 key/value heads (here 6
        # over 1), its config class's layer pattern (every sixth layer and the last full, NoPE
        # with the temperature; the others sliding with RoPE at base 10000): layers 4 and 5
        "beam-1.0-501b-shaped-sliding",
        "Beam",
        4,
        True,
        BEAM_SHAPED,
    ),
    ModelCase("beam-1.0-501b-shaped-full", "Beam", 5, False, BEAM_SHAPED),
]
# -- a QK-norm with a bias: Persimmon ------------------------------------------------------------
# Persimmon's attention reads no key/value head count and no head_dim (hidden_size // heads): the
# SIZES keys are left out. Its fused query_key_value is per head [q_h; k_h; v_h].
PERSIMMON_SIZES = {"num_key_value_heads": ABSENT, "head_dim": ABSENT}
CASES += [
    ModelCase(  # the config class's defaults: qk_layernorm on, half the head (4 of 8) rotated
        "persimmon-qk-layernorm",
        "Persimmon",
        1,
        False,
        PERSIMMON_SIZES | {"layer_norm_eps": 0.1},
        unpadded=True,
    ),
    ModelCase(  # no QK-norm, a quarter of the head rotated
        "persimmon-no-qk-layernorm",
        "Persimmon",
        0,
        False,
        PERSIMMON_SIZES | {"qk_layernorm": False, "partial_rotary_factor": 0.25},
    ),
    ModelCase(  # adept/persimmon-8b-base: 64 heads of 64 (here 8 of 4), multi-head, half rotary,
        # rope_theta 25000, qk_layernorm with eps 1e-5, as its config.json gives them
        "persimmon-8b-shaped",
        "Persimmon",
        1,
        False,
        PERSIMMON_SIZES
        | {"num_attention_heads": 8, "rope_theta": 25000.0, "partial_rotary_factor": 0.5}
        | {"qk_layernorm": True, "layer_norm_eps": 1e-5},
    ),
    ModelCase(  # Phi's qk_layernorm, the same nn.LayerNorm per head (no released Phi sets it)
        "phi-qk-layernorm",
        "Phi",
        1,
        False,
        {"qk_layernorm": True, "layer_norm_eps": 0.1},
    ),
]
# -- ALiBi: MPT ------------------------------------------------------------------------------------
# MPT names its sizes d_model, n_heads, n_layers (multi-head, head width d_model // n_heads) and
# builds its ALiBi bias over max_seq_len keys on every forward; no RoPE, no position ids read.
MPT_SIZES = {name: ABSENT for name in ("hidden_size", "num_attention_heads", "head_dim")}
MPT_SIZES |= {"num_key_value_heads": ABSENT, "num_hidden_layers": ABSENT}
MPT_SIZES |= {"intermediate_size": ABSENT, "d_model": 32, "n_heads": 4, "n_layers": 2}
MPT_SIZES |= {"max_seq_len": 32, "expansion_ratio": 1}
CASES += [
    ModelCase("mpt-alibi", "Mpt", 1, False, MPT_SIZES, unpadded=True),
    ModelCase(  # 6 heads, not a power of 2: the slopes of 8 heads, odd ones first, the first 6
        "mpt-6-heads-clip-scale",
        "Mpt",
        0,
        False,
        MPT_SIZES
        | {"d_model": 48, "n_heads": 6}
        | {"attn_config": {"clip_qkv": 0.5, "softmax_scale": 0.3}},
    ),
    ModelCase(  # mosaicml/mpt-7b: 32 heads of 128 (here of 2), max_seq_len 2048, slopes
        # 2^-(k / 4), no clip, default scale
        "mpt-7b-shaped",
        "Mpt",
        1,
        False,
        MPT_SIZES | {"d_model": 64, "n_heads": 32, "max_seq_len": 2048},
    ),
    # -- value norm and KV sharing: Gemma 3n. Layers 0 and 1 compute their keys and values (and
    # store them: the value norm, plain-weight QK-norm, scale 1); layers 2 and 3 reuse those of
    # layers 0 and 1 (the forward test feeds them keys and values of their own, whose gradients
    # it compares; decoding reads the source layer's cache)
    *(
        ModelCase(
            f"gemma3n-{role}-{kind}",
            "Gemma3nText",
            layer,
            kind == "sliding",
            GEMMA3N | {"num_hidden_layers": 4, "layer_types": GEMMA3N_TYPES * 2},
            unpadded=True,
        )
        for role, offset in (("store", 0), ("shared", 2))
        for kind, layer in (("sliding", offset), ("full", offset + 1))
    ),
    # google/gemma-3n-E4B: 8 heads over 2 kv heads, 4 sliding layers to 1 full (the config
    # class's default pattern), the last 15 of 35 layers shared (here 5 of 10: layer 9, full,
    # reads layer 4's keys and values, layer 7, sliding, layer 3's), thetas 1e6 and 1e4
    *(
        ModelCase(
            f"gemma3n-e4b-shaped-{layer}",
            "Gemma3nText",
            layer,
            layer not in (4, 9),
            GEMMA3N
            | {"num_hidden_layers": 10, "num_kv_shared_layers": 5}
            | {"num_attention_heads": 8, "num_key_value_heads": 2},
        )
        for layer in (4, 7, 9)
    ),
]
# -- values narrower than the keys, scaled: MiMo-V2-Flash -----------------------------------------
# Values v_head_dim wide times attention_value_scale before the cache; sliding layers with twice
# the key/value heads and sinks; one default RoPE per layer type, int(head_dim * 0.334) rotated
# where an entry gives no factor.
MIMO = {"v_head_dim": 4, "attention_value_scale": 0.5, "attention_bias": True}
MIMO |= {"sliding_window": WINDOW, "layer_types": ["full_attention", "sliding_attention"]}
MIMO |= {"mlp_layer_types": ["dense", "dense"]}
MIMO |= {  # half of each full head turning, int(8 * 0.334) = 2 of each sliding one
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
}
# XiaomiMiMo/MiMo-V2-Flash: 64 heads of 192 over 4 (full) or 8 (sliding) key/value heads, values
# of 128 times 0.707, 64 of 192 coordinates turning (theta 5e6 full, 1e4 sliding), the first
# layer and every sixth full, sliding_window_size 128 (here: 16 heads of 12 over 1 or 2, values
# of 8, 4 of 12 turning, a window of WINDOW keys); the config class's defaults otherwise
MIMO_SHAPED = {"num_attention_heads": 16, "num_key_value_heads": 1, "head_dim": 12}
MIMO_SHAPED |= {"v_head_dim": 8, "num_hidden_layers": 6, "sliding_window_size": WINDOW - 1}
MIMO_SHAPED |= {"n_routed_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8}
CASES += [
    *(
        ModelCase(f"mimo_v2_flash-{kind}", "MiMoV2Flash", layer, layer == 1, MIMO, layer == 1)
        for layer, kind in ((0, "full"), (1, "sliding-sinks"))
    ),
    *(
        ModelCase(
            f"mimo_v2_flash-309b-shaped-{kind}", "MiMoV2Flash", layer, layer == 1, MIMO_SHAPED
        )
        for layer, kind in ((1, "sliding"), (5, "full"))
    ),
]
# -- differential attention: DiffLlama -----------------------------------------------------------
# lambda_init is the layer's depth's (0.2 at layer 0, 0.8 - 0.6 exp(-0.3 i) after); the lambda
# vectors are redrawn with the other parameters (std 0.5). The values' halves are the key/value
# heads cut in two, so the cases cover one pair (4 over 2), two pairs read by groups of two query
# heads (8 over 4) and multi-head (8 over 8).
CASES += [
    ModelCase("diffllama-gqa", "DiffLlama", 1, False, {"rms_norm_eps": 1e-3}, unpadded=True),
    ModelCase(  # two value pairs, each read by two query heads; biases on all four; llama3 RoPE
        "diffllama-8-over-4-bias-llama3",
        "DiffLlama",
        0,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 4, "attention_bias": True}
        | {"rope_parameters": LLAMA3_ROPE},
    ),
    ModelCase(  # DiffLlamaConfig's defaults (its docstring's kajuma/DiffLlama-0.3B-handcut): 32
        # heads of 64, multi-head (here 8 of 4), 16 layers (the last: lambda_init 0.79), no
        # biases, rms_norm_eps 1e-5, RoPE theta 1e4
        "diffllama-0.3b-shaped",
        "DiffLlama",
        15,
        False,
        {"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 4}
        | {"num_hidden_layers": 16, "rms_norm_eps": 1e-5},
    ),
]
# -- chunked attention: Llama 4 ------------------------------------------------------------------
# Llama 4's RoPE layers attend in chunks of attention_chunk_size (here 4: the 11 tokens cross two
# chunk edges, the left-padded element's chunks start at its first real token) with the L2 norm
# after RoPE; its NoPE layers (no_rope_layers 0) attend fully and scale their queries by
# 1 + attn_scale * log(1 + floor((p + 1) / floor_scale)), p counted on the cache. Every layer's
# feed-forward is a mixture of experts (2 here), which the attention never sees.
LLAMA4 = {"intermediate_size_mlp": 16, "num_local_experts": 2, "attention_chunk_size": 4}
LLAMA4_SCOUT = LLAMA4 | {  # meta-llama/Llama-4-Scout-17B-16E: 40 heads of 128 over 8, Llama 3's
    # RoPE 16x over 8192 positions with both freq factors 1 (here over 8), chunks of 8192 and a
    # NoPE layer every fourth with floor_scale 8192 (here 4 and 4), attn_scale 0.1, QK-norm
    "num_attention_heads": 10,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "rope_parameters": LLAMA3_ROPE
    | {"factor": 16.0, "low_freq_factor": 1.0}
    | {"high_freq_factor": 1.0},
    "floor_scale": 4,
    "attn_scale": 0.1,
}
LLAMA4_VISION = {  # the smallest vision tower its config takes
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 16,
    "image_size": 28,
    "patch_size": 14,
    "vision_output_dim": 16,
    "projector_input_dim": 16,
    "projector_output_dim": 32,
}
CASES += [
    ModelCase("llama4_text-chunked-qk-norm", "Llama4Text", 1, False, LLAMA4, unpadded=True),
    ModelCase(  # the temperature steps at p + 1 = 3, 6, 9 (attn_scale 0.5 over 3 positions)
        "llama4_text-nope-temperature",
        "Llama4Text",
        1,
        False,
        LLAMA4 | {"no_rope_layers": [1, 0], "floor_scale": 3, "attn_scale": 0.5},
        unpadded=True,
    ),
    ModelCase(  # chunks of 3, biases, no QK-norm, layer_types given apart from no_rope_layers
        "llama4_text-chunked-bias-no-qk-norm",
        "Llama4Text",
        0,
        False,
        LLAMA4
        | {"attention_chunk_size": 3, "attention_bias": True, "use_qk_norm": False}
        | {"layer_types": ["chunked_attention", "full_attention"]},
    ),
    ModelCase("llama4_text-scout-shaped-chunked", "Llama4Text", 2, False, LLAMA4_SCOUT),
    ModelCase("llama4_text-scout-shaped-nope", "Llama4Text", 3, False, LLAMA4_SCOUT),
    ModelCase(  # meta-llama/Llama-4-Maverick-17B-128E: 40 heads over 8, theta 5e5 unscaled, no
        # QK-norm, experts every second layer, chunks of 8192 (here 4), NoPE every fourth
        "llama4_text-maverick-shaped",
        "Llama4Text",
        1,
        False,
        LLAMA4
        | {"num_attention_heads": 10, "num_key_value_heads": 2, "num_hidden_layers": 4}
        | {"use_qk_norm": False, "interleave_moe_layer_step": 2}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    ),
    ModelCase(  # Llama-4-Scout whole: the vision tower (whose attention has q_proj too) beside
        # the language model, its NoPE layer 3, from the wrapper's config and state dict
        "llama4-wrapper-scout-shaped",
        "Llama4",
        3,
        False,
        LLAMA4_SCOUT,
        wrapper={"vision_config": LLAMA4_VISION},
    ),
]
# -- Gemma 4's text model: full layers of their own width (global_head_dim) under proportional RoPE
# over a quarter of each head, and under attention_k_eq_v their own key/value heads and values
# taken from k_proj. Layers 0 (sliding) and 1 (full, k = v) compute and store their keys and
# values; layers 2 and 3 reuse those of layers 0 and 1
GEMMA4 = {"sliding_window": WINDOW, "vocab_size_per_layer_input": 11}  # no per-layer inputs
GEMMA4 |= {"hidden_size_per_layer_input": 0, "rms_norm_eps": 1e-6, "attention_k_eq_v": True}
GEMMA4 |= {"global_head_dim": 16, "num_global_key_value_heads": 1}
# without per-layer inputs, its model's slicing before the KV-shared layers (for logits_to_keep)
# indexes them and fails; asking for the hidden states turns that slicing off
GEMMA4 |= {"output_hidden_states": True}
CASES += (
    [
        ModelCase(
            f"gemma4-{role}-{kind}",
            "Gemma4Text",
            layer,
            kind == "sliding",
            GEMMA4
            | {"num_hidden_layers": 4, "num_kv_shared_layers": 2}
            | {"layer_types": ["sliding_attention", "full_attention"] * 2},
            unpadded=True,
        )
        for role, offset in (("store", 0), ("shared", 2))
        for kind, layer in (("sliding", offset), ("full", offset + 1))
    ]
    + [
        # google/gemma-4-31B-like: 32 heads of 256 over 16 on the sliding layers, of 512 over 4
        # on the full ones (k = v), five sliding layers to one full, the config class's RoPE
        # (theta 1e4 sliding, proportional 1e6 over a quarter of the full heads), no KV sharing
        # (here 8 heads of 8 over 4, of 16 over 1)
        ModelCase(
            f"gemma4-31b-shaped-{layer}",
            "Gemma4Text",
            layer,
            layer != 5,
            GEMMA4
            | {"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4}
            | {"global_head_dim": 16, "num_global_key_value_heads": 1},
        )
        for layer in (4, 5)
    ]
    + [
        # google/gemma-4-E2B-like: no k = v (a v_proj on every layer, the full layers' kv heads the
        # config's), 8 heads over 1, head_dim 256 and 512 (here 8 and 16), the last 20 of 35 layers
        # KV-shared (here 4 of 12: layer 11, full, reads layer 5's keys and values)
        ModelCase(
            f"gemma4-e2b-shaped-{layer}",
            "Gemma4Text",
            layer,
            layer != 11 and layer != 5,
            GEMMA4
            | {"attention_k_eq_v": False, "num_global_key_value_heads": None}
            | {"num_hidden_layers": 12, "num_kv_shared_layers": 4}
            | {"num_attention_heads": 8, "num_key_value_heads": 1},
        )
        for layer in (5, 11)
    ]
)
# Gemma 4 Unified's text model: the same attention ("vision", its default, is causal on text; it
# has no per-layer inputs); the two multimodal wrappers, given their whole state dicts (vision
# towers included)
GEMMA4_UNIFIED = {
    key: value
    for key, value in GEMMA4.items()
    if key not in ("vocab_size_per_layer_input", "hidden_size_per_layer_input")
}
GEMMA4_VISION = {"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1}
GEMMA4_VISION |= {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8}
GEMMA4_VISION |= {"global_head_dim": 8}
GEMMA4_WRAPPER = {"vision_config": GEMMA4_VISION, "audio_config": None}
GEMMA4_WRAPPER |= {  # special tokens inside the tiny vocabulary (its model embeds them)
    f"{kind}_token_id": 3 + i
    for i, kind in enumerate(("boi", "eoi", "image", "video", "boa", "audio"))
}
GEMMA4_LAYERS = {"num_hidden_layers": 4, "num_kv_shared_layers": 2}
GEMMA4_LAYERS |= {"layer_types": ["sliding_attention", "full_attention"] * 2}
CASES += [
    *(
        ModelCase(
            f"gemma4-unified-{role}-full",
            "Gemma4UnifiedText",
            layer,
            False,
            GEMMA4_UNIFIED | GEMMA4_LAYERS,
            unpadded=True,
        )
        for role, layer in (("store", 1), ("shared", 3))
    ),
    ModelCase(
        "gemma4-unified-sliding", "Gemma4UnifiedText", 0, True, GEMMA4_UNIFIED | GEMMA4_LAYERS
    ),
    ModelCase(
        "gemma4-wrapper-full",
        "Gemma4",
        1,
        False,
        GEMMA4 | GEMMA4_LAYERS,
        wrapper=GEMMA4_WRAPPER,
    ),
    ModelCase(
        "gemma4-unified-wrapper-full",
        "Gemma4Unified",
        1,
        False,
        GEMMA4_UNIFIED | GEMMA4_LAYERS,
        wrapper=GEMMA4_WRAPPER,
    ),
]
IDS = [case.name for case in CASES]
CASES_BY_NAME = {case.name: case for case in CASES}
RUNS = [
    pytest.param(case, padded, id=f"{case.name}-{'left-padded' if padded else 'unpadded'}")
    for case in CASES
    for padded in ((False, True) if case.unpadded else (True,))
]


def inputs(rng, padded, hidden_size=SIZES["hidden_size"]):
    """inputs_embeds (B, N, C), Hugging Face's attention_mask (1 = keep) and position ids."""
    embeds = torch.from_numpy(rng.standard_normal((B, N, hidden_size)))
    attention_mask = torch.ones(B, N, dtype=torch.long)
    if padded:
        attention_mask[1, :PAD] = 0
    positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)  # generate's
    return embeds, attention_mask, positions


def record_attention_call(model, layer_idx, **model_kwargs):
    """Run the model; return the arguments (positional, keywords) and the output of layer
    ``layer_idx``'s attention call."""
    return record_attention_calls(model, (layer_idx,), **model_kwargs)[layer_idx]


def record_attention_calls(model, layer_idxs, **model_kwargs):
    """Run the model once; for each layer of ``layer_idxs``, the arguments (positional,
    keywords) and the output of its attention call (a KV-shared layer and its source, both)."""
    seen = {layer_idx: {} for layer_idx in layer_idxs}
    hooks = []
    for layer_idx in layer_idxs:
        attention = attention_of(model, layer_idx)

        def before(module, args, kwargs, record=seen[layer_idx]):
            record["args"], record["kwargs"] = tuple(args), dict(kwargs)

        def after(module, args, kwargs, output, record=seen[layer_idx]):
            record["out"] = output[0]

        hooks += [
            attention.register_forward_pre_hook(before, with_kwargs=True),
            attention.register_forward_hook(after, with_kwargs=True),
        ]
    try:
        with Float64Math(), torch.no_grad():
            model(**model_kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return {i: (record["args"], record["kwargs"], record["out"]) for i, record in seen.items()}


def input_width(config):
    """The width of the attention's input: 2 * hidden_size for Zamba's shared block."""
    text = config.get_text_config()
    return getattr(text, "attention_hidden_size", None) or text.hidden_size


def model_gradients(config, attention, layer_idx, grads):
    """The layer's gradients under the model's names (``hf_attention_state_from_grouped``).
    With Zamba2's adapters, which the converter folded into W_eff = W + B A and the way back
    refuses, by the chain rule here: dW = dW_eff, dA = B^T dW_eff, dB = dW_eff A^T for the
    layer's own slot (the module's ``layer_dic``); the block's other slots get none."""
    if not getattr(config, "use_shared_attention_adapter", False):
        return hf_attention_state_from_grouped(
            config.to_dict(), grads, layer_idx=layer_idx, grads=True
        )
    slot = attention.layer_dic[layer_idx]
    out = dict(grads)
    for proj in "qkv":
        down, up = getattr(attention, f"linear_{proj}_adapter_list")[slot]  # A (r, C), B (C, r)
        dweight = grads[f"{proj}_proj.weight"]
        out[f"linear_{proj}_adapter_list.{slot}.0.weight"] = to_numpy(up.weight).T @ dweight
        out[f"linear_{proj}_adapter_list.{slot}.1.weight"] = dweight @ to_numpy(down.weight).T
    return out


def attention_input(args, kwargs):
    """The hidden states an attention call got (Falcon's decoder layer passes them by position)."""
    return args[0] if args else kwargs["hidden_states"]


def call_attention(attention, args, kwargs, x):
    """The attention module called as the model called it, on x instead, without its cache."""
    kwargs = {
        name: None if isinstance(value, Cache) else value
        for name, value in kwargs.items()
        if name != "hidden_states"
    }
    with Float64Math():
        return attention(x, *args[1:], **kwargs)[0]


def model_frequencies(case, config, model):
    """The model's own frequencies for the layer: its rotary buffer (Gemma 3: the layer type's;
    float32 values, as computed when the model was built), and LongRoPE's long set as the model
    computes it on its first long call, here inside the float64 mode (and copied into its
    buffer, float64 since ``model.double()``); Granite SWA's: the rotary embedding of the
    layer's own base."""
    config, model = config.get_text_config(), language(model)
    rotary = getattr(model, "rotary_emb", None)
    if rotary is None:  # RecurrentGemma: one rotary embedding in each attention block
        rotary = getattr(attention_of(model, case.layer_idx), "rotary_emb", None)
    if rotary is None:  # no RoPE in the model (Jamba, Nemotron-H, a NoPE GraniteMoeHybrid)
        return {}
    thetas = getattr(config, "layer_rope_theta", None)
    if thetas and thetas[case.layer_idx]:  # Granite SWA: one rotary embedding per base
        theta = thetas[case.layer_idx]
        rotary = next(
            r for r in model.rotary_embs if r.config.rope_parameters["rope_theta"] == theta
        )
    if type(rotary).__name__ == "PhimoeRotaryEmbedding":  # recomputes them on every call, so
        with Float64Math():  # in float64 here (it never swaps in LongRoPE's long set)
            inv_freq, _ = rotary.rope_init_fn(config)
        return {"inv_freq": inv_freq}
    if hasattr(rotary, "layer_types"):  # one rotary embedding per layer type
        kind = config.layer_types[case.layer_idx]
        inv_freq = getattr(rotary, f"{kind}_original_inv_freq", None)  # Beam: none on NoPE
        return {} if inv_freq is None else {"inv_freq": inv_freq}
    frequencies = {"inv_freq": rotary.original_inv_freq}
    if rotary.rope_type == "longrope":
        original = config.rope_parameters["original_max_position_embeddings"]
        with Float64Math():
            long, _ = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=original + 1)
        frequencies["long_inv_freq"] = long
    return frequencies


def convert_layers(case, config, model):
    """The converted NumPy layer from the whole model's state dict, with the model's own
    frequencies, and its torch twin built from its arguments and state."""
    state = model.state_dict()
    if hasattr(model, "H_module"):  # HRM-Text: each stack numbers its layers from 0
        state = {key: value for key, value in state.items() if key.startswith("H_module.")}
    layer = convert.grouped_from_hf(
        config.to_dict(),
        state,
        layer_idx=case.layer_idx,
        **model_frequencies(case, config, model),
    )
    twin = torch_attention.GroupedQueryAttention(**layer.constructor_args()).double().eval()
    return {"numpy": layer, "torch": torch_attention.from_numpy(twin, layer)}


def forward_backward(layer, x, dout, positions, padding, shared_kv=None):
    """Output, input gradient, parameter gradients by name and, for a KV-shared layer given the
    keys and values ``shared_kv``, their gradients (else None), as NumPy arrays."""
    if isinstance(layer, torch.nn.Module):
        x_t = to_torch(x, requires_grad=True)
        kv = None if shared_kv is None else [to_torch(t, requires_grad=True) for t in shared_kv]
        shared = {} if kv is None else {"shared_kv": tuple(kv)}
        out = layer(
            x_t, positions=to_torch(positions), key_padding_mask=to_torch(padding), **shared
        )
        out.backward(to_torch(dout))
        grads = {name: to_numpy(param.grad) for name, param in layer.named_parameters()}
        dkv = None if kv is None else [to_numpy(t.grad) for t in kv]
        return to_numpy(out), to_numpy(x_t.grad), grads, dkv
    shared = {} if shared_kv is None else {"shared_kv": tuple(shared_kv)}
    out = layer(x, positions=positions, key_padding_mask=padding, **shared)
    dx = layer.backward(dout)
    return out, dx, layer.named_grads(), None if shared_kv is None else list(layer.dkv)


def decode_step(layer, x, positions, padding, cache):
    """One decode call: with the layer's own cache, or, for a KV-shared layer, reading its
    source layer's (``shared_kv``)."""
    keyword = "shared_kv" if layer.kv_shared else "cache"
    if isinstance(layer, torch.nn.Module):
        out = layer(
            to_torch(x),
            positions=to_torch(positions),
            key_padding_mask=to_torch(padding),
            **{keyword: cache},
        )
        return to_numpy(out)
    return layer(x, positions=positions, key_padding_mask=padding, **{keyword: cache})


def new_cache(layer):
    shape, dv = (B, layer.num_kv_heads, N, layer.head_dim), layer.v_head_dim
    if isinstance(layer, torch.nn.Module):
        return torch_attention.KVCache(*shape, torch.float64, v_head_dim=dv)
    return KVCache(*shape, np.float64, v_head_dim=dv)


@pytest.mark.parametrize(("case", "padded"), RUNS)
def test_forward_and_every_gradient_match_transformers(rng, case, padded):
    """Output, dx and every parameter's gradient, by the model's own names (fused projections
    joined back by ``hf_attention_state_from_grouped``), for the NumPy layer and its twin."""
    config, model = case.build()
    embeds, attention_mask, positions = inputs(rng, padded, config.get_text_config().hidden_size)
    args, kwargs, _ = record_attention_call(
        model,
        case.layer_idx,
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        position_ids=positions,
    )
    attention = attention_of(model, case.layer_idx)
    layers = convert_layers(case, config, model)
    padding, ours = padding_from_hf(attention_mask)  # key_padding_mask, positions (B, N)
    real = attention_mask.numpy() == 1  # (B, N)
    x = rng.standard_normal((B, N, input_width(config)))
    dout = rng.standard_normal((B, N, config.get_text_config().hidden_size)) * real[..., None]
    shared_kv = None
    if layers["numpy"].kv_shared:  # the source's keys and values as leaves: their gradients too
        shape = (2, B, layers["numpy"].num_kv_heads, N, layers["numpy"].head_dim)
        shared_kv = rng.standard_normal(shape)
        kv_t = [to_torch(t, requires_grad=True) for t in shared_kv]
        kind = config.get_text_config().layer_types[case.layer_idx]
        kwargs = kwargs | {"shared_kv_states": KVSharingDict({kind: tuple(kv_t)})}

    x_t = to_torch(x, requires_grad=True)
    expected = call_attention(attention, args, kwargs, x_t)
    expected.backward(to_torch(dout))

    hf_window = getattr(attention, "sliding_window", getattr(config, "sliding_window", None))
    if not getattr(attention, "is_sliding", True):  # EXAONE 4 keeps the window on full layers
        hf_window = None
    assert case.sliding == (hf_window is not None)  # the model's own reading of its config
    for package, layer in layers.items():
        out, dx, grads, dkv = forward_backward(layer, x, dout, ours, padding, shared_kv)
        grads = model_gradients(config, attention, case.layer_idx, grads)  # the model's names
        assert layer.window == ((WINDOW - 1, 0) if case.sliding else None), package
        assert_close(out[real], to_numpy(expected)[real], name=f"{package} out")
        assert_close(dx, x_t.grad, name=f"{package} dx")
        if shared_kv is not None:  # the gradient a model's backward adds to the source's
            assert_close(dkv[0], kv_t[0].grad, name=f"{package} shared keys")
            assert_close(dkv[1], kv_t[1].grad, name=f"{package} shared values")
        unused = {name for name, param in attention.named_parameters() if param.grad is None}
        assert all("_adapter_list." in name for name in unused), unused  # other layers' slots
        assert set(grads) == {name for name, _ in attention.named_parameters()} - unused, package
        for name, param in attention.named_parameters():
            if name not in unused:
                assert_close(grads[name], param.grad, name=f"{package} {name}")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_decoding_with_the_cache_matches_transformers_dynamic_cache(rng, case):
    """A left-padded batch: prefill 6 tokens, then one at a time, Hugging Face with its own
    DynamicCache, each layer (NumPy and torch) with a KVCache fed the very input Hugging Face's
    attention got. A KV-shared layer (Gemma 3n's last layers) has no cache: its source layer,
    converted too and fed its own input, fills one, which the shared layer reads."""
    config, model = case.build()
    embeds, attention_mask, positions = inputs(rng, True, config.get_text_config().hidden_size)
    layers = convert_layers(case, config, model)
    source_idx = kv_source_layer(config.to_dict(), case.layer_idx)
    recorded = (case.layer_idx,) if source_idx is None else (case.layer_idx, source_idx)
    sources = {}
    if source_idx is not None:
        sources = convert_layers(dataclasses.replace(case, layer_idx=source_idx), config, model)
    hf_cache = DynamicCache(config=config)
    if case.model == "MiniMax":  # its model refuses any cache but its own
        from transformers.models.minimax.modeling_minimax import MiniMaxCache

        hf_cache = MiniMaxCache()
    caches = {package: new_cache(layer) for package, layer in (sources or layers).items()}
    real = attention_mask.numpy() == 1

    for start, stop in [(0, PREFILL)] + [(i, i + 1) for i in range(PREFILL, N)]:
        calls = record_attention_calls(
            model,
            recorded,
            inputs_embeds=embeds[:, start:stop],
            attention_mask=attention_mask[:, :stop],
            position_ids=positions[:, start:stop],
            past_key_values=hf_cache,
            use_cache=True,
        )
        args, kwargs, expected = calls[case.layer_idx]
        padding, ours = padding_from_hf(attention_mask[:, :stop], stop - start)
        x = to_numpy(attention_input(args, kwargs))
        rows = real[:, start:stop]
        for package, layer in layers.items():
            if source_idx is not None:  # the source appends this step's keys and values first
                source_x = to_numpy(attention_input(*calls[source_idx][:2]))
                decode_step(sources[package], source_x, ours, padding, caches[package])
            out = decode_step(layer, x, ours, padding, caches[package])
            assert_close(out[rows], to_numpy(expected)[rows], name=f"{package} {start}:{stop}")
    assert all(cache.length == N for cache in caches.values())


# -- the frequencies and the attention factor the converter computes itself ---------------------

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "default-theta-1e6": {"rope_type": "default", "rope_theta": 1e6},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": LLAMA3_ROPE | {"original_max_position_embeddings": 8192},
    "llama3-equal-freq-factors": LLAMA3_ROPE  # Llama 4 Scout's: no blend band
    | {"factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0}
    | {"original_max_position_embeddings": 8192},
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 16.0,
        "original_max_position_embeddings": 2048,
    },
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "attention_factor": 0.8,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "original_max_position_embeddings": 8192,
    },
    "yarn-gpt-oss": {  # GPT-OSS's defaults: truncate false keeps the ramp's ends fractional
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 1024,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
        "original_max_position_embeddings": 4096,
    },
    "yarn-no-factor": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": None,
        "original_max_position_embeddings": 1024,
    },
    "proportional": {  # LFM3's full layers: every pair of the head, a quarter of them turning
        "rope_type": "proportional",
        "rope_theta": 1e6,
        "partial_rotary_factor": 0.25,
    },
    "proportional-factor": {"rope_type": "proportional", "rope_theta": 1e4, "factor": 2.0}
    | {"partial_rotary_factor": 0.5},
    "longrope": {  # factor None: max_position_embeddings / original, as Phi-3's configs have it
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "original_max_position_embeddings": 4096,
    },
}


def assert_same_frequencies(freqs, expected, name):
    """Each frequency within float32 rounding of the model's, per element (their ratio), and
    exactly 0 where the model's is (proportional RoPE's pairs that do not turn)."""
    assert freqs.shape == expected.shape, name
    assert np.array_equal(freqs == 0, expected == 0), name
    turned = expected != 0
    assert_close(freqs[turned] / expected[turned], np.ones(turned.sum(), np.float32), name=name)


@pytest.mark.parametrize("head_dim", [8, 256])  # at 256 torch's pow rounds some bits apart
@pytest.mark.parametrize("rope", ROPES.values(), ids=ROPES.keys())
def test_frequencies_and_attention_factor_match_the_models(rope, head_dim):
    """hf_inv_freq repeats Hugging Face's float32 arithmetic in NumPy: each frequency within
    float32 rounding of the model's buffer (torch's vectorized pow may round the last bit
    differently; pass the buffer as ``inv_freq=`` for exactly the model's), and the attention
    factor the model multiplies cos and sin by, which is Python float arithmetic on both sides."""
    if rope["rope_type"] == "longrope":  # LongRoPE's two sets of head_dim / 2 factors each
        factors = np.linspace(1.0, 9.0, head_dim // 2)
        rope = rope | {"short_factor": factors.tolist(), "long_factor": (2 * factors).tolist()}
    config = transformers.LlamaConfig(
        **(SIZES | {"head_dim": head_dim, "max_position_embeddings": 32768}),
        rope_parameters=rope,
    )
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    expected = to_numpy(rotary.inv_freq)

    freqs = hf_inv_freq(config.to_dict())

    assert freqs.dtype == np.float32 and expected.dtype == np.float32
    assert_same_frequencies(freqs, expected, "inv_freq / model's")
    assert_close(hf_rope_attention_factor(config.to_dict()), rotary.attention_scaling)
    if rope["rope_type"] == "longrope":  # the set the model swaps in past the original length
        original = rope["original_max_position_embeddings"]
        long, _ = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=original + 1)
        ratio = hf_inv_freq(config.to_dict(), long=True) / to_numpy(long)
        assert_close(ratio, np.ones_like(ratio), name="long inv_freq / model's")


def test_partial_and_per_layer_type_frequencies_match_the_models():
    """GLM rotates a part of each head (partial_rotary_factor 0.5: 64 of 128); Gemma 3 has one
    rotary embedding per layer type (local and global bases, the global one scaled)."""
    glm = transformers.GlmConfig(**(SIZES | {"head_dim": 128}))
    gemma = transformers.Gemma3TextConfig(**CASES_BY_NAME["gemma3-full"].config, **SIZES)
    glm_rotary = transformers.models.glm.modeling_glm.GlmRotaryEmbedding(glm)
    gemma_rotary = transformers.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding(gemma)

    glm_freqs = hf_inv_freq(glm.to_dict())
    gemma_freqs = [hf_inv_freq(gemma.to_dict(), layer_idx=i) for i in (0, 1)]

    assert glm_freqs.shape == (32,)
    assert_close(glm_freqs / to_numpy(glm_rotary.inv_freq), np.ones(32, np.float32), name="GLM's")
    for freqs, kind in zip(gemma_freqs, gemma.layer_types, strict=True):
        expected = to_numpy(getattr(gemma_rotary, f"{kind}_inv_freq"))
        assert_close(freqs / expected, np.ones_like(expected), name=f"Gemma 3's {kind}")


@pytest.mark.parametrize("form", ["to_dict", "config.json"])
def test_gemma4_frequencies_match_the_models(form):
    """Gemma 4 at its released widths (head_dim 256, global_head_dim 512): the sliding layers'
    whole-head RoPE at 1e4, the full layers' proportional RoPE at 1e6, a quarter of the 512
    wide head turning (64 of 256 pairs), its exponents over 512; from the config as to_dict
    writes it (per_layer_config) and as a released config.json has it (global_head_dim)."""
    keys = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 4}
    keys |= {"head_dim": 256, "global_head_dim": 512, "num_hidden_layers": 6}
    keys |= {"attention_k_eq_v": True, "num_global_key_value_heads": 1, "vocab_size": 11}
    config = transformers.Gemma4TextConfig(**keys)
    rotary = transformers.models.gemma4.modeling_gemma4.Gemma4TextRotaryEmbedding(config)
    given = config.to_dict()
    if form == "config.json":
        given = {key: value for key, value in given.items() if key != "per_layer_config"}
        given |= {"global_head_dim": 512, "num_global_key_value_heads": 1}
    for layer_idx, kind, turned in ((0, "sliding_attention", 128), (5, "full_attention", 64)):
        expected = to_numpy(getattr(rotary, f"{kind}_inv_freq"))
        freqs = hf_inv_freq(given, layer_idx=layer_idx)
        assert freqs.shape == expected.shape == (128 if kind == "sliding_attention" else 256,)
        assert np.count_nonzero(freqs) == turned
        assert_close(freqs, expected, name=f"Gemma 4's {kind}")


GATED_ROTARY = {  # model -> (its modeling module, the layer types its rotary embedding keeps)
    "Lfm3": ("lfm3", ["full_attention", "sliding_attention"]),
    "Laguna": ("laguna", ["full_attention", "sliding_attention"]),
    "Qwen3Next": ("qwen3_next", None),
}


@pytest.mark.parametrize("model", GATED_ROTARY)
def test_the_gated_families_frequencies_match_the_models(model):
    """The config classes' own RoPE (no rope_parameters given), at a 128-wide head: LFM3's
    proportional full layers (32 of the 64 pairs turning at base^(-2i/128), the rest at 0) and
    whole-head sliding ones, Laguna's half-rotary full layers and whole-head sliding ones,
    Qwen3-Next's quarter of the head."""
    name, types = GATED_ROTARY[model]
    keywords = {} if types is None else {"layer_types": types}
    config = getattr(transformers, f"{model}Config")(**(SIZES | {"head_dim": 128}), **keywords)
    modeling = getattr(transformers.models, name)
    rotary = getattr(getattr(modeling, f"modeling_{name}"), f"{model}RotaryEmbedding")(config)

    for layer_idx, kind in enumerate(types or ["full_attention"]):
        freqs = hf_inv_freq(config.to_dict(), layer_idx=layer_idx)
        expected = to_numpy(getattr(rotary, f"{kind}_inv_freq" if types else "inv_freq"))
        assert_same_frequencies(freqs, expected, kind)


@pytest.mark.parametrize("head_dim", [8, 128])
def test_hunyuan_ntk_alpha_frequencies_match_the_models(head_dim):
    """Hunyuan's "dynamic" RoPE with an alpha: fixed frequencies of base theta * alpha^(D/(D-2)),
    each within float32 rounding of its rotary buffer; a plain "dynamic" (no alpha, dynamic NTK,
    recomputed for long calls) is refused."""
    config = transformers.HunYuanDenseV1Config(
        **(SIZES | {"head_dim": head_dim}), rope_parameters=HUNYUAN_NTK_ALPHA
    )
    rotary = transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense
    expected = to_numpy(rotary.HunYuanDenseV1RotaryEmbedding(config).inv_freq)
    dynamic = config.to_dict() | {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}

    freqs = hf_inv_freq(config.to_dict())

    assert freqs.dtype == np.float32
    assert_close(freqs / expected, np.ones_like(expected), name="inv_freq / model's")
    assert hf_rope_attention_factor(config.to_dict()) == 1.0
    with pytest.raises(ValueError, match="rope_type 'dynamic' is not supported"):
        hf_inv_freq(dynamic | {"rope_parameters": dynamic["rope_parameters"] | {"rope_theta": 1e4}})


def test_gpt_oss_defaults_to_yarn_with_an_attention_factor():
    """GPT-OSS's config defaults to YaRN; its factor above 1 multiplies cos and sin."""
    config, model = next(case for case in CASES if case.model == "GptOss").build()

    layer = convert.grouped_from_hf(config.to_dict(), model.state_dict())

    assert layer.rope_attention_factor == model.rotary_emb.attention_scaling > 1.0


# -- the gated families: the way back through the gate ------------------------------------------

GATED = {  # model_type -> (modeling module, attention class, its config keywords, layer)
    "qwen3_next": ("qwen3_next", "Qwen3NextAttention", {"attention_bias": True}, 1),
    "qwen3_5_text": ("qwen3_5", "Qwen3_5Attention", {}, 1),
    "lfm3": ("lfm3", "Lfm3Attention", {"attention_bias": True}, 1),
    "laguna": ("laguna", "LagunaAttention", {"gating": "per-element"}, 1),
    "afmoe": ("afmoe", "AfmoeAttention", {}, 1),
    "hrm_text": ("hrm_text", "HrmTextAttention", {"attention_bias": True}, 0),
    "beam": ("beam", "BeamAttention", {"attention_bias": True}, 1),
}


@pytest.mark.parametrize("model", GATED)
def test_the_way_back_restores_a_gated_model_s_state_dict(rng, model):
    """The attention module's own state dict (transformers' class, random values): loaded and
    given back, the very arrays under the model's names (Qwen's q_proj rows, query and gate
    interleaved per head, joined back; gate_proj renamed back)."""
    module, name, keywords, layer_idx = GATED[model]
    sizes = {
        key: SIZES[key] for key in ("hidden_size", "num_attention_heads", "num_key_value_heads")
    }
    sizes |= {"head_dim": 8, "num_hidden_layers": 2}
    if model == "hrm_text":
        del sizes["num_key_value_heads"]
    if model in ("lfm3", "laguna", "afmoe"):
        sizes["layer_types"] = ["full_attention", "full_attention"]
    if model == "laguna":
        sizes["num_attention_heads_per_layer"] = [4, 8]
    if model.startswith("qwen"):
        sizes["layer_types"] = ["linear_attention", "full_attention"]
    hf_config = transformers.AutoConfig.for_model(model, **sizes, **keywords)
    attention_class = getattr(
        __import__(f"transformers.models.{module}.modeling_{module}", fromlist=[name]), name
    )
    extra = (hf_config.num_attention_heads_per_layer[layer_idx],) if model == "laguna" else ()
    shapes = attention_class(hf_config, layer_idx, *extra).state_dict()
    state = {key: rng.standard_normal(tuple(value.shape)) for key, value in shapes.items()}

    layer = convert.grouped_from_hf(hf_config.to_dict(), state, layer_idx=layer_idx)
    back = hf_attention_state_from_grouped(
        hf_config.to_dict(), layer.state_dict(), layer_idx=layer_idx
    )

    assert layer.output_gate is not None and "g_proj.weight" in layer.state_dict()
    assert set(back) == set(state)
    for key, value in back.items():
        assert np.array_equal(value, state[key]), key


# -- chunked attention: the core's rule against transformers' chunked mask ------------------------


@pytest.mark.parametrize("chunk", [1, 3, 4])
@pytest.mark.parametrize(("past", "n"), [(0, 11), (6, 1), (5, 3), (9, 2)])
def test_the_core_s_chunks_are_transformers_chunked_causal_mask(rng, chunk, past, n):
    """The keys a query sees under the core's chunk_size, bottom-right causal, with each
    sequence's left padding as chunk_start and as key_padding_mask, are those of transformers'
    ``chunked_causal_mask_function`` on cache positions (q_offset = the tokens already cached),
    with its left padding counted from the 2-D attention mask: prefill and decode steps alike."""
    from transformers.masking_utils import chunked_causal_mask_function, sdpa_mask

    pads = np.array([0, 2, 5])
    m = past + n
    attention_mask = torch.from_numpy((np.arange(m)[None, :] >= pads[:, None]).astype(np.int64))
    left_padding = (attention_mask.cumsum(-1) == 0).sum(-1)
    expected = sdpa_mask(
        batch_size=3,
        q_length=n,
        kv_length=m,
        q_offset=past,
        mask_function=chunked_causal_mask_function(chunk, left_padding),
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
    )  # (B, 1, N, M), True = attended
    q, k = rng.standard_normal((3, 1, n, 4)), rng.standard_normal((3, 1, m, 4))

    result = attention_forward(
        q, k, k, causal=True, align="bottom-right", chunk_size=chunk, chunk_start=pads,
        key_padding_mask=attention_mask.numpy() == 0, impl="dense",
    )  # fmt: skip

    np.testing.assert_array_equal(result.ctx.probs.reshape(3, 1, n, m) > 0, expected.numpy())
