"""Hugging Face latent attention -> ``MultiHeadLatentAttention``: the config read as each model
reads it, the attention weights found in any state dict, NumPy only (transformers is never
imported).

Models (``config["model_type"]``), each read from its transformers 5.23 model file:

- ``deepseek_v3`` and the models whose attention is its code line for line: ``glm4_moe_lite``
  (GLM-4 MoE Lite), ``youtu``, ``axk1`` (a query LoRA always), ``kimi_k25`` (Kimi K2.5: its
  ``text_config`` is a DeepSeek-V3 config, model_type ``deepseek_v3`` or ``kimi_k2``; the
  weights sit under ``model.language_model.``). ``rope_interleave`` (default True) gathers
  DeepSeek's interleaved rope pairs into halves before ``rotate_half``'s rotation.
- ``deepseek_v2``: RoPE as complex pairs (``torch.view_as_complex`` of (x_2i, x_2i+1)), rotated in
  place. The same scores as V3's gathered layout (a dot product does not see a permutation applied
  to both sides), so it loads with ``rope_interleave=True``; only the cached k_pe's R coordinates
  come in V3's order, [x_0, x_2, ...; x_1, x_3, ...], where Hugging Face's V2 cache keeps pairs.
- ``minicpm3``: V2's module with ``rotate_half`` RoPE (``rope_interleave=False``); ``v_head_dim``
  None is ``hidden_size // num_attention_heads``.
- ``mistral4``: V3's attention, then every query scaled by Llama 4's
  ``1 + beta * log(1 + floor(position / original_max_position_embeddings))`` (``beta =
  rope_parameters["llama_4_scaling_beta"]``: the layer's ``query_temperature``); its config sets
  ``head_dim = P + R`` and ``partial_rotary_factor = R / (P + R)``, so RoPE rotates the R dims.
- ``longcat_flash``: two MLA sublayers per decoder layer, ``model.layers.{i}.self_attn.{j}``,
  numbered 2i + j as its cache numbers them (``layer_idx`` counts these); always a query LoRA and
  interleaved RoPE; q_nope and q_pe times ``(hidden_size / q_lora_rank) ** 0.5`` (folded into
  ``scaling``, since both halves of every score carry it once) and the normed latent times
  ``(hidden_size / kv_lora_rank) ** 0.5`` (``latent_scale``: it is cached so).
- ``kimi_linear``: its ``"full_attention"`` layers are MLA without RoPE (NoPE: q_pe and k_pe are
  used unrotated; the converter passes ``inv_freq`` zeros, a rotation by angle 0, the identity)
  and scaled by (P + R)^-0.5 alone; its ``"linear_attention"`` layers (Kimi Delta Attention) are
  refused (``hf/kimi_delta.py``'s ``kimi_delta_from_hf`` reads them).
- ``bailing_hybrid`` (Ling 3.0): V3's attention without a query LoRA (``q_proj`` always),
  interleaved RoPE always (``apply_rotary_pos_emb_interleave``, no ``rope_interleave`` key), then
  each head times ``sigmoid(g_proj(x))``, one gate per head, before o_proj
  (``output_gate="head"``, g_proj (H, C) without a bias). Its ``"full_attention"`` layers (by
  default every ``layer_group_size``-th) are MLA; its ``"linear_attention"`` layers (KDA) are
  refused naming the MLA ones.

Shared by all of them: ``q_a_layernorm`` and ``kv_a_layernorm`` keep RMSNorm's default eps 1e-6
(``rms_norm_eps`` is not passed to them); biases (``attention_bias``) on q_a_proj,
kv_a_proj_with_mqa and o_proj, never on q_proj, q_b_proj or kv_b_proj; ``num_key_value_heads``
is vestigial (the expanded keys have H heads whatever it says): below ``num_attention_heads`` the
model's ``repeat_kv`` repeats them and fails (refused), above it (DeepseekV3Config's default 128
with fewer heads) gives 0 groups, which SDPA skips and eager attention fails on; the scale is
(P + R)^-0.5, times mscale^2 with ``mscale = 0.1 * mscale_all_dim * log(factor) + 1`` whenever
the RoPE type is not ``default``, ``mscale_all_dim`` is set and ``factor`` > 1
(``yarn_apply_mscale``); RoPE's frequencies are computed over R dims, float32, as
``rope.hf_inv_freq`` does for the other models (pass the model's ``rotary_emb.inv_freq`` as
``inv_freq=`` for exactly its own), and YaRN's attention factor multiplies cos and sin.

Models whose attention builds on MLA but is not this layer's are refused by name with the reason
(``REFUSED``): DeepSeek-V3.2's, GLM-5's and others' sparse attention (a top-k indexer hides keys
per query), output gates beside those, a normed rope key, NoPE layers that widen the head.

Derivation: docs/derivations/latent.md. Tests: tests/numpy_attention/hf/test_latent.py;
against transformers in tests/parity/test_hf_latent.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import validation
from ..latent import MultiHeadLatentAttention
from .entries import checked_arrays, layer_entries, prefix_numbers
from .family import as_mapping
from .rope import hf_inv_freq, hf_rope_attention_factor, rope_parameters

SUPPORTED_MODEL_TYPES = (
    "axk1",
    "axk2",
    "bailing_hybrid",
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "glm4_moe_lite",
    "glm_moe_dsa",
    "hy_v4",
    "kimi_k25",
    "kimi_linear",
    "longcat_flash",
    "minicpm3",
    "mistral4",
    "youtu",
)
# transformers 5.23 models with MLA weights whose attention computes something else.
_SPARSE = "DeepSeek Sparse Attention: a top-k indexer hides keys per query"
REFUSED = {
    "glm5_next": _SPARSE + " over k-pools: its indexer scores gated, position-embedded pools "
    "of index_kpool keys (index_kpool_compress_gate, _ape), keeps whole pools and the "
    "unfinished tail pool, beside linear-attention layers; the layer's indexer scores keys "
    "one by one",
    "mistral_large4": _SPARSE + " with a learned query scale per head and position "
    "(scale_h log(position + 1) + bias_h, on the queries and the indexer's), no query LoRA (its "
    "indexer reads LayerNorm(x)), NoPE layers that widen the nope part, and KV sharing across "
    "layers (kv_sharing_modes store / reuse)",
    "dots3_note": "an output gate, a normed rope key, sliding and indexed layers",
}
# their language models' configs, passed alone (config.text_config), for the same reasons
REFUSED |= {f"{name}_text": REFUSED[name] for name in ("glm5_next", "mistral_large4", "dots3_note")}
_LATENT_KEY = "kv_a_proj_with_mqa.weight"
_EXPECTED_FORM = (
    "expected keys like 'model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight' or "
    "'kv_a_proj_with_mqa.weight'"
)
_INTERLEAVED = ("axk1", "deepseek_v2", "deepseek_v3", "glm4_moe_lite", "mistral4", "youtu")
_QUERY_LORA_ALWAYS = ("axk1", "axk2", "deepseek_v32", "glm_moe_dsa", "hy_v4", "longcat_flash")
_DSA = (
    "axk2",
    "deepseek_v32",
    "glm_moe_dsa",
    "hy_v4",
)  # MLA with DeepSeek Sparse Attention's indexer
_SHARED_TOP_K = ("glm_moe_dsa", "hy_v4")  # "shared" layers reuse the previous layer's top-k
# transformers' names that the layer calls otherwise
_RENAMED = {"hy_v4": {"gate_proj.weight": "g_proj.weight"}}
_HYBRID = ("kimi_linear", "bailing_hybrid")  # MLA "full_attention" layers among linear ones


def latent_from_hf(
    config: Mapping[str, Any] | Any,
    state_dict: Mapping[str, Any],
    *,
    layer_idx: int = 0,
    inv_freq: Any = None,
) -> MultiHeadLatentAttention:
    """The NumPy layer of one Hugging Face MLA layer, weights loaded, in eval mode.

    Everything is read from the config as the model reads it (module docstring); the layer's
    dtype is float64 when ``kv_a_proj_with_mqa.weight`` is float64 and float32 otherwise. Every
    check runs before the layer is built.

    Args:
        config: ``config.to_dict()`` of a supported model (a config object with ``to_dict`` is
            read through it), or the mapping of its ``config.json``.
        state_dict: the attention's state dict with any prefix: a whole model's, a decoder
            layer's or the attention module's own.
        layer_idx: which attention layer (LongCat-Flash: its MLA sublayer 2i + j).
        inv_freq: (qk_rope_head_dim / 2,) RoPE frequencies, used as given (the model's own
            float32 ``rotary_emb.inv_freq``); None computes them from the config.

    Returns:
        a ``MultiHeadLatentAttention`` holding the weights, in eval mode.

    Raises:
        ValueError: an unsupported ``model_type`` (naming the supported ones, and the reason
            for one whose attention is not this layer's), a config the layer or the model cannot
            run (naming the field), weights whose shapes disagree with the config (naming the
            key and the fields), a layer that is not MLA.
        KeyError: missing or unexpected attention keys, named with the prefix found.
    """
    fn = "latent_from_hf"
    config = as_mapping(config)
    model_type, config = _text_config(config)
    layer_idx = validation.non_negative_int(f"{fn}: layer_idx", layer_idx)
    _check_layer(config, model_type, layer_idx)
    options, rope_config = _layer_options(config, model_type)
    options |= _index_options(config, model_type, layer_idx)
    prefix, attention = layer_entries(
        fn,
        state_dict,
        _LATENT_KEY,
        layer_idx,
        layers="attention layers",
        hint=_EXPECTED_FORM,
        number=functools.partial(_layer_number, model_type=model_type),
    )
    renamed = _RENAMED.get(model_type, {})
    attention = {renamed.get(name, name): value for name, value in attention.items()}
    expected = _expected_shapes(options)
    arrays = checked_arrays(fn, prefix, attention, expected, "config's attention", _EXPECTED_FORM)
    if model_type == "kimi_linear":
        if inv_freq is not None:
            raise ValueError(f"{fn}: kimi_linear's MLA layers have no RoPE; inv_freq must be None")
        inv_freq = np.zeros(options["qk_rope_head_dim"] // 2)
    elif inv_freq is None:
        inv_freq = hf_inv_freq(rope_config)
    options["inv_freq"] = inv_freq

    dtype = np.float64 if arrays[_LATENT_KEY].dtype == np.float64 else np.float32
    layer = MultiHeadLatentAttention(**options, rng=0)
    layer.astype(dtype)
    layer.load_state_dict(arrays)
    layer.eval()
    return layer


# -- the config ---------------------------------------------------------------------------------


def _text_config(config: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The model_type checked, and the config the attention reads (Kimi K2.5's ``text_config``)."""
    model_type = config.get("model_type")
    if model_type in REFUSED:
        raise ValueError(
            f"model_type {model_type!r} is not supported: its attention is not "
            f"MultiHeadLatentAttention's ({REFUSED[model_type]}); supported: "
            f"{list(SUPPORTED_MODEL_TYPES)}"
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}"
        )
    if model_type != "kimi_k25":
        return str(model_type), config
    text = as_mapping(_required(config, "text_config", model_type))
    if text.get("model_type", "deepseek_v3") not in ("deepseek_v3", "kimi_k2"):
        raise ValueError(
            f"kimi_k25's text_config has model_type {text.get('model_type')!r}; its language "
            "model is 'deepseek_v3' (or 'kimi_k2', read as such)"
        )
    return "kimi_k25", text


def _required(config: Mapping[str, Any], key: str, model_type: str) -> Any:
    if config.get(key) is None:
        raise ValueError(f"the config has no {key!r}, which a {model_type} layer needs")
    return config[key]


def _check_layer(config: Mapping[str, Any], model_type: str, layer_idx: int) -> None:
    """layer_idx within the model's attention layers, and an MLA one (Kimi Linear)."""
    if model_type == "longcat_flash":  # two MLA sublayers per decoder layer
        layers = config.get("num_layers")
        count = None if layers is None else 2 * layers
    else:
        count = config.get("num_hidden_layers")
    if count is not None and layer_idx >= count:
        raise ValueError(
            f"latent_from_hf: layer_idx is {layer_idx} but the {model_type} config has {count} "
            "attention layers"
        )
    if model_type in _HYBRID:
        kinds = (
            _kimi_linear_layer_types(config)
            if model_type == "kimi_linear"
            else _bailing_hybrid_layer_types(config)
        )
        if kinds is not None and kinds[layer_idx] != "full_attention":
            hint = "; its KDA layers load with kimi_delta_from_hf" * (model_type == "kimi_linear")
            raise ValueError(
                f"{model_type} layer {layer_idx} is {kinds[layer_idx]!r} (Kimi Delta Attention, "
                "linear attention), not MLA; its 'full_attention' layers are: "
                f"{[i for i, kind in enumerate(kinds) if kind == 'full_attention']}"
                f"{hint}"
            )


def _kimi_linear_layer_types(config: Mapping[str, Any]) -> list[str] | None:
    """Kimi Linear's layer types as its config computes them: ``layer_types``, else the
    checkpoint's 1-indexed ``linear_attn_config`` lists, else every 4th layer from layer 4."""
    if config.get("layer_types") is not None:
        return list(config["layer_types"])
    count = config.get("num_hidden_layers")
    if count is None:
        return None
    linear = config.get("linear_attn_config") or {}
    if "full_attn_layers" in linear and "kda_layers" in linear:
        kinds = ["linear_attention"] * count
        for layer in linear["full_attn_layers"]:
            kinds[layer - 1] = "full_attention"
        return kinds
    return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(count)]


def _bailing_hybrid_layer_types(config: Mapping[str, Any]) -> list[str] | None:
    """Bailing-hybrid's layer types as its config computes them: ``layer_types``, else MLA on
    every ``layer_group_size``-th layer (default 6), KDA on the others."""
    if config.get("layer_types") is not None:
        return list(config["layer_types"])
    count = config.get("num_hidden_layers")
    if count is None:
        return None
    group = int(config.get("layer_group_size") or 6)
    return ["full_attention" if (i + 1) % group == 0 else "linear_attention" for i in range(count)]


def _layer_options(
    config: Mapping[str, Any], model_type: str
) -> tuple[dict[str, Any], Mapping[str, Any]]:
    """The constructor keywords of the layer (inv_freq aside), and the config whose RoPE
    ``hf_inv_freq`` reads (head_dim = R, no partial rotary factor)."""
    hidden_size = int(_required(config, "hidden_size", model_type))
    num_heads = int(_required(config, "num_attention_heads", model_type))
    kv_heads = config.get("num_key_value_heads")
    if kv_heads and num_heads // kv_heads > 1:
        raise ValueError(
            f"num_key_value_heads ({kv_heads}) is below num_attention_heads ({num_heads}): the "
            "expanded keys already have num_attention_heads heads, and transformers repeats them "
            "num_attention_heads // num_key_value_heads times, which fails"
        )
    sizes = {
        key: int(_required(config, key, model_type))
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim")
    }
    rope_dim = sizes["qk_rope_head_dim"]
    if rope_dim % 2:
        raise ValueError(
            f"qk_rope_head_dim is {rope_dim}; RoPE rotates pairs of coordinates, so it must be even"
        )
    v_head_dim = config.get("v_head_dim")
    if v_head_dim is None and model_type == "minicpm3":  # MiniCPM3's own default
        v_head_dim = hidden_size // num_heads
    q_lora_rank = config.get("q_lora_rank")
    if q_lora_rank is not None and model_type == "bailing_hybrid":
        raise ValueError(
            f"the config sets q_lora_rank ({q_lora_rank}), but a bailing_hybrid layer always "
            "projects its queries with one q_proj (its model reads no q_lora_rank)"
        )
    if q_lora_rank is None and model_type in _QUERY_LORA_ALWAYS:
        raise ValueError(f"the config has no 'q_lora_rank', which a {model_type} layer needs")
    if model_type == "longcat_flash":
        head = config.get("qk_head_dim")
        if head is not None and head != sizes["qk_nope_head_dim"] + rope_dim:
            raise ValueError(
                f"qk_head_dim ({head}) must be qk_nope_head_dim + qk_rope_head_dim "
                f"({sizes['qk_nope_head_dim']} + {rope_dim}): LongCat-Flash splits each query "
                "head into those two"
            )
    options: dict[str, Any] = {
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        **sizes,
        "v_head_dim": int(_required({"v_head_dim": v_head_dim}, "v_head_dim", model_type)),
        "q_lora_rank": None if q_lora_rank is None else int(q_lora_rank),
        "bias": bool(config.get("attention_bias", False)),
        "rope_interleave": _rope_interleave(config, model_type),
        "dropout": float(config.get("attention_dropout") or 0.0),
    }
    scaling = (sizes["qk_nope_head_dim"] + rope_dim) ** -0.5
    rope_config: Mapping[str, Any] = {}
    if model_type != "kimi_linear":  # NoPE: no RoPE, no YaRN
        rope_config = _rope_config(config, model_type, options)
        params = rope_parameters(rope_config)
        options["rope_theta"] = params["rope_theta"]
        options["rope_attention_factor"] = hf_rope_attention_factor(rope_config)
        scaling *= _mscale_squared(params)
    if model_type == "longcat_flash":  # q_nope and q_pe, hence every score, times this
        scaling *= (hidden_size / options["q_lora_rank"]) ** 0.5
        options["latent_scale"] = (hidden_size / sizes["kv_lora_rank"]) ** 0.5
    if model_type == "mistral4":
        params = rope_parameters(rope_config)
        beta = params.get("llama_4_scaling_beta")
        length = params.get("original_max_position_embeddings")
        if beta is None or length is None:
            raise ValueError(
                "mistral4 scales its queries by rope_parameters['llama_4_scaling_beta'] and "
                "['original_max_position_embeddings']; the config lacks "
                f"{'llama_4_scaling_beta' if beta is None else 'original_max_position_embeddings'}"
            )
        options["query_temperature"] = (float(beta), float(length))
    if model_type == "bailing_hybrid":  # each head times sigmoid(g_proj(x)), no bias
        options["output_gate"] = "head"
    options["scaling"] = scaling
    return options, rope_config


def _index_options(config: Mapping[str, Any], model_type: str, layer_idx: int) -> dict[str, Any]:
    """DSA's indexer options of layer ``layer_idx``: DeepSeek-V3.2's indexer (half-split RoPE)
    on every layer; GLM-5's (interleaved RoPE) on its ``indexer_types`` "full" layers, its
    "shared" layers reading the selection of the layer before (``index_shared``)."""
    if model_type not in _DSA:
        return {}
    options: dict[str, Any] = {}
    if model_type == "hy_v4":  # every layer: sinks, a sigmoid gate per element from x
        options |= {"sinks": True, "output_gate": "element"}
    if model_type == "axk2":  # q_gate_proj: the queries and a gate per element, one projection
        options["query_gate"] = True
    if model_type in _SHARED_TOP_K and _indexer_types(config, model_type)[layer_idx] == "shared":
        return options | {"index_shared": True}
    options |= {
        key: int(_required(config, key, model_type))
        for key in ("index_n_heads", "index_head_dim", "index_topk")
    }
    options["index_rope_interleave"] = model_type == "glm_moe_dsa"
    if model_type == "hy_v4":  # its indexer rotates the last R dims; its k_norm eps
        options["index_rope_position"] = "last"
        options["index_norm_eps"] = float(config.get("rms_norm_eps", 1e-5))
    return options


def _indexer_types(config: Mapping[str, Any], model_type: str) -> list[str]:
    """The per-layer indexer kinds as the config computes them: ``indexer_types``; else GLM-5's
    ``index_topk_pattern`` ("F"/"S"), else every ``index_topk_freq``-th layer from
    ``index_skip_topk_offset`` - 1 on "full"; HY-V4's layer 0 and every 4th from 1 "full"."""
    layers = int(_required(config, "num_hidden_layers", model_type))
    kinds = config.get("indexer_types")
    if kinds is None and model_type == "hy_v4":
        kinds = ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(layers)]
    if kinds is None and config.get("index_topk_pattern") is not None:
        pattern = config["index_topk_pattern"]
        kinds = (
            [{"F": "full", "S": "shared"}[c] for c in pattern]
            if isinstance(pattern, str)
            else list(pattern)
        )
    if kinds is None:
        freq = max(int(config.get("index_topk_freq", 1)), 1)
        offset = int(config.get("index_skip_topk_offset", 2))
        kinds = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    kinds = list(kinds)
    if len(kinds) != layers or not set(kinds) <= {"full", "shared"}:
        raise ValueError(
            f"indexer_types must hold 'full' or 'shared' for each of the {layers} layers, got "
            f"{kinds}"
        )
    if kinds and kinds[0] == "shared":
        raise ValueError(
            "indexer_types[0] is 'shared', but a shared layer reuses the selection of a full "
            "layer before it, and layer 0 has none"
        )
    return kinds


def _rope_interleave(config: Mapping[str, Any], model_type: str) -> bool:
    if model_type == "hy_v4":  # rotate_half on the main attention, always
        return False
    if model_type in ("deepseek_v2", "longcat_flash", "bailing_hybrid", *_DSA):
        return True
    if model_type in ("minicpm3", "kimi_linear"):  # rotate_half; no RoPE at all
        return False
    return bool(config.get("rope_interleave", True))  # kimi_k25 reads its text_config's


def _rope_config(
    config: Mapping[str, Any], model_type: str, options: Mapping[str, Any]
) -> dict[str, Any]:
    """The config with head_dim = R and no partial rotary factor, after checking that the
    model's rotary embedding rotates exactly the R rope dims (else its attention fails)."""
    rope_dim = options["qk_rope_head_dim"]
    params = config.get("rope_parameters")
    if params is None:  # a transformers 4 config.json: rope_theta and rope_scaling
        params = dict(config.get("rope_scaling") or {})
        params["rope_type"] = params.pop("type", params.get("rope_type", "default"))
        params["rope_theta"] = config.get("rope_theta")
    params = dict(params)
    partial = params.pop("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if model_type == "mistral4":  # head_dim = P + R, partial = R / (P + R)
        head_dim = options["qk_nope_head_dim"] + rope_dim
        # its default RoPE ignores the factor (the others apply it)
        width = head_dim if params.get("rope_type", "default") == "default" else head_dim * partial
    elif model_type == "longcat_flash":
        width = (config.get("head_dim") or 64) * partial
    elif model_type == "bailing_hybrid":  # its own default RoPE ignores the factor too
        width = rope_dim if params.get("rope_type", "default") == "default" else rope_dim * partial
    else:  # head_dim is set to qk_rope_head_dim by the config itself
        width = rope_dim * partial
    if int(width) != rope_dim:
        raise ValueError(
            f"{model_type}'s rotary embedding rotates {int(width)} dims (head_dim and "
            f"partial_rotary_factor {partial}) but qk_rope_head_dim is {rope_dim}; the model's "
            "attention cannot apply it either"
        )
    # The rotary embedding reads head_dim only; num_key_value_heads is vestigial in MLA configs
    # (often above num_attention_heads), so it is left out of the config the RoPE helpers read.
    dropped = ("partial_rotary_factor", "num_key_value_heads")
    rope_config = {key: value for key, value in config.items() if key not in dropped}
    return rope_config | {"head_dim": rope_dim, "rope_parameters": params}


def _mscale_squared(params: Mapping[str, Any]) -> float:
    """``yarn_apply_mscale``'s factor on the scale: mscale(factor, mscale_all_dim)^2 for any RoPE
    type but ``default`` when mscale_all_dim is set, else 1."""
    mscale_all_dim = params.get("mscale_all_dim")
    if params["rope_type"] == "default" or not mscale_all_dim:
        return 1.0
    factor = params.get("factor")
    if factor is None:
        raise ValueError(
            "rope_parameters has mscale_all_dim but no factor, which the attention's scale "
            "(yarn_apply_mscale) reads"
        )
    mscale = 1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0
    return mscale * mscale


# -- the weights --------------------------------------------------------------------------------


def _layer_number(prefix: str, model_type: str) -> int | None:
    """``model.layers.3.self_attn.`` -> 3; LongCat's ``model.layers.3.self_attn.1.`` -> 7."""
    numbers = prefix_numbers(prefix)
    if not numbers:
        return None
    if model_type == "longcat_flash" and len(numbers) >= 2:
        return 2 * numbers[-2] + numbers[-1]
    return numbers[-1]


def _expected_shapes(options: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """The attention module's state dict for these options: name -> (shape, the config fields
    that make it)."""
    c, h = options["hidden_size"], options["num_heads"]
    rank, rope = options["kv_lora_rank"], options["qk_rope_head_dim"]
    p, dv, q_rank = options["qk_nope_head_dim"], options["v_head_dim"], options["q_lora_rank"]
    query = "num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim)"
    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    if q_rank is None:
        shapes["q_proj.weight"] = ((h * (p + rope), c), f"{query}, hidden_size")
    else:
        shapes["q_a_proj.weight"] = ((q_rank, c), "q_lora_rank, hidden_size")
        if options["bias"]:
            shapes["q_a_proj.bias"] = ((q_rank,), "q_lora_rank")
        shapes["q_a_layernorm.weight"] = ((q_rank,), "q_lora_rank")
        if options.get("query_gate"):  # AXK2's fused query-and-gate projection
            shapes["q_gate_proj.weight"] = (
                (h * (p + rope + dv), 2 * q_rank),
                "num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim), "
                "2 * q_lora_rank",
            )
        else:
            shapes["q_b_proj.weight"] = ((h * (p + rope), q_rank), f"{query}, q_lora_rank")
    latent = "kv_lora_rank + qk_rope_head_dim"
    shapes[_LATENT_KEY] = ((rank + rope, c), f"{latent}, hidden_size")
    if options["bias"]:
        shapes["kv_a_proj_with_mqa.bias"] = ((rank + rope,), latent)
    shapes["kv_a_layernorm.weight"] = ((rank,), "kv_lora_rank")
    shapes["kv_b_proj.weight"] = (
        (h * (p + dv), rank),
        "num_attention_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank",
    )
    shapes["o_proj.weight"] = ((c, h * dv), "hidden_size, num_attention_heads * v_head_dim")
    if options["bias"]:
        shapes["o_proj.bias"] = ((c,), "hidden_size")
    if options.get("output_gate") == "head":
        shapes["g_proj.weight"] = ((h, c), "num_attention_heads, hidden_size")
    if options.get("output_gate") == "element":  # HY-V4's gate_proj
        shapes["g_proj.weight"] = ((h * dv, c), "num_attention_heads * v_head_dim, hidden_size")
    if options.get("sinks"):
        shapes["sinks"] = ((h,), "num_attention_heads")
    if options.get("index_topk") is not None:
        heads, width = options["index_n_heads"], options["index_head_dim"]
        shapes["indexer.wq_b.weight"] = (
            (heads * width, q_rank),
            "index_n_heads * index_head_dim, q_lora_rank",
        )
        shapes["indexer.wk.weight"] = ((width, c), "index_head_dim, hidden_size")
        shapes["indexer.k_norm.weight"] = ((width,), "index_head_dim")
        shapes["indexer.k_norm.bias"] = ((width,), "index_head_dim")
        shapes["indexer.weights_proj.weight"] = ((heads, c), "index_n_heads, hidden_size")
    return shapes
