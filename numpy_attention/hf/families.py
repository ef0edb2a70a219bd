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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import validation

FULL, SLIDING = "full_attention", "sliding_attention"

# -- reading a config ---------------------------------------------------------------------------


def as_mapping(config: Any) -> Mapping[str, Any]:
    """``config.to_dict()`` for a config object, the mapping itself otherwise."""
    if hasattr(config, "to_dict") and not isinstance(config, Mapping):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (config.to_dict()), got {type(config).__name__}")
    return config


def required(config: Mapping[str, Any], key: str) -> Any:
    """``config[key]``, which must be there and not None."""
    if config.get(key) is None:
        model = config.get("model_type", "this")
        raise ValueError(f"the config has no {key!r}, which a {model} layer needs")
    return config[key]


def _flag(config: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = config.get(key)
    return default if value is None else bool(value)


# -- which layers slide, which rotate, when the config has no list ------------------------------


def _qwen_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Qwen2/3's config class: from ``max_window_layers`` on, under ``use_sliding_window``."""
    return (
        _flag(config, "use_sliding_window")
        and config.get("sliding_window") is not None
        and layer_idx >= config.get("max_window_layers", 0)
    )


def _qwen2_moe_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Qwen2-MoE's config class: even layers below ``max_window_layers``, under
    ``use_sliding_window`` (the opposite end from Qwen2's)."""
    below = layer_idx < config.get("max_window_layers", 28)
    return _flag(config, "use_sliding_window") and layer_idx % 2 == 0 and below


def _even_layers(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Gemma 2's and GPT-OSS's: every other layer, from the first."""
    return layer_idx % 2 == 0


def _pattern(default: int) -> Callable[[Mapping[str, Any], int], bool]:
    """Gemma 3's and Cohere 2's: every layer but each ``sliding_window_pattern``-th slides."""

    def sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
        return bool((layer_idx + 1) % (config.get("sliding_window_pattern") or default))

    return sliding


def _smollm3_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
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


# -- the families -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """How one model_type's attention reads its config. The defaults are Llama's.

    Attributes:
        bias: config key of the q/k/v biases (None: never; ``"<state>"``: whether the state
            dict has them, Qwen2), with ``bias_default`` where the key is missing.
        out_bias: config key of o_proj's bias (None: never), default ``bias_default``.
        sliding: which layers slide: ``"never"``, ``"every_layer"`` (when ``sliding_window``
            is set), ``"use_sliding_window"`` (every layer when that flag and the window are
            set), ``"layer_types"`` (``layer_types[i]``, else ``fallback``), ``"smollm3"``.
        fallback: for ``"layer_types"``, the config class's rule when the list is missing.
        qk_norm: (type, shape, weight offset) of the QK-norm, or None;
            ``qk_norm_flag`` the config key that switches it on (None: always);
            ``norm_eps`` the config key of its eps.
        scaling: None (1/sqrt(D)), ``"query_pre_attn_scalar"`` (its ** -0.5) or
            ``"attention_multiplier"`` (the scale itself).
        softcap: config key of the score cap, or None.
        sinks: one learned sink per head.
        interleaved: RoPE pairs (x_2i, x_2i+1).
        partial_rotary: the model honours ``partial_rotary_factor`` (else it must be 1).
        rope_per_layer_type: ``rope_parameters`` may hold one dict per layer type.
        rope_renames: rope types the config class renames (Phi-3: ``su`` and ``yarn`` are its
            old names of ``longrope``).
        rotates: whether layer i uses RoPE (None: every layer).
        layout: ``"separate"``, ``"qkv_proj"`` (Phi-3) or ``"falcon"``.
        head_dim_from_config: ``head_dim`` read from the config when there (else C // H).
        attention_dropout: the model applies ``attention_dropout`` to the weights in training.
        bidirectional_flag: ``use_bidirectional_attention`` may make the layer non-causal.
        head_dim_required: ``head_dim`` must be set (the model has no C // H fallback and
            fails without it; ``config_defaults`` may give it).
        config_defaults: (key, value) pairs the config class fills in where a config.json
            leaves the key out, read as the model reads them (Gemma: ``head_dim`` 256).
        heads_span_hidden: o_proj is built (C, C), so ``num_attention_heads * head_dim`` must
            be ``hidden_size`` (Helium; the model fails otherwise).
        rope_default: the RoPE parameters the config class sets when a config.json has
            neither ``rope_parameters`` nor ``rope_scaling`` (CWM: llama3; it then ignores a
            top-level ``rope_theta``, which is refused).
        key_aliases: (config.json name, the model's name) pairs, the config class's
            ``attribute_map`` (InternLM3: ``qkv_bias`` is ``attention_bias``).
        equal_keys: pairs of keys the config class refuses to see differ (InternLM3:
            ``attention_bias`` and ``mlp_bias``); a ValueError naming both.
        refused_keys: (key, reason) pairs: a config that sets the key (not null, not false)
            is refused with the reason (IQuest-Coder's ``clip_qkv``).
    """

    bias: str | None = "attention_bias"
    bias_default: bool = False
    out_bias: str | None = "attention_bias"
    sliding: str = "never"
    fallback: Callable[[Mapping[str, Any], int], bool] | None = None
    qk_norm: tuple[str, str, float] | None = None
    qk_norm_flag: str | None = None
    norm_eps: str = "rms_norm_eps"
    scaling: str | None = None
    softcap: str | None = None
    sinks: bool = False
    interleaved: bool = False
    partial_rotary: bool = False
    rope_per_layer_type: bool = False
    rope_renames: tuple[tuple[str, str], ...] = ()
    rotates: Callable[[Mapping[str, Any], int], bool] | None = None
    layout: str = "separate"
    head_dim_from_config: bool = True
    attention_dropout: bool = True
    bidirectional_flag: bool = False
    # -- fields of issue 28, part A --
    head_dim_required: bool = False  # the model reads head_dim with no fallback (Ministral)
    config_defaults: tuple[tuple[str, Any], ...] = ()  # its config class's, for missing keys
    heads_span_hidden: bool = False  # o_proj is (C, C): H * D must be C (Helium)
    rope_default: tuple[tuple[str, Any], ...] = ()  # its config class's RoPE (CWM's llama3)
    key_aliases: tuple[tuple[str, str], ...] = ()  # config.json name -> the model's name
    equal_keys: tuple[tuple[str, str], ...] = ()  # keys its config class requires equal
    refused_keys: tuple[tuple[str, str], ...] = ()  # (key, why): set, the config is refused
    #
    # -- fields of issue 28, part B --
    #
    # -- fields of issue 28, part C --


def _cohere2_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Cohere 2 rotates only on its sliding layers; the full layers are NoPE."""
    return layer_kind(config, FAMILIES["cohere2"], layer_idx) == SLIDING


# Ministral's config class: every layer slides when the config has a window
def _every_layer_if_window(config: Mapping[str, Any], layer_idx: int) -> bool:
    return config.get("sliding_window") is not None


# CWM's config class: every 4th layer from the first is full, the others slide
def _cwm_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    return layer_idx % 4 != 0


FAMILIES: dict[str, Family] = {
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
    ),
    # Gemma 3 keeps attn_logit_softcapping in its config but its attention never applies it
    "gemma3_text": Family(
        sliding="layer_types",
        fallback=_pattern(6),
        qk_norm=("rms", "head", 1.0),
        scaling="query_pre_attn_scalar",
        rope_per_layer_type=True,
        bidirectional_flag=True,
    ),
    "gpt_oss": Family(bias_default=True, sliding="layer_types", fallback=_even_layers, sinks=True),
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
        fallback=_pattern(4),
        interleaved=True,
        rotates=_cohere2_rotates,
        head_dim_from_config=False,
    ),
    "starcoder2": Family(
        bias="use_bias", bias_default=True, out_bias="use_bias", sliding="every_layer"
    ),
    "granite": Family(scaling="attention_multiplier"),
    "smollm3": Family(sliding="smollm3", rotates=_smollm3_rotates),
    "glm": Family(bias_default=True, out_bias=None, interleaved=True, partial_rotary=True),
    "glm4": Family(bias_default=True, out_bias=None, interleaved=True, partial_rotary=True),
    # Falcon: the rotary layers (alibi is refused); dropout is never applied on them
    "falcon": Family(
        bias="bias",
        out_bias="bias",
        layout="falcon",
        head_dim_from_config=False,
        attention_dropout=False,
    ),
    # -- rows of issue 28, part A --
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
    "arcee": Family(),  # Llama's attention; its ReLU^2 MLP is outside it
    # Helium: o_proj is (C, C) without bias, so H * D must be C; interleaved RoPE on whole heads
    "helium": Family(
        out_bias=None,
        interleaved=True,
        head_dim_required=True,
        config_defaults=(("head_dim", 128),),
        heads_span_hidden=True,
    ),
    # VaultGemma: Gemma 2's scores (scalar, cap) and alternating layers, always causal
    "vaultgemma": Family(
        sliding="layer_types",
        fallback=_even_layers,
        scaling="query_pre_attn_scalar",
        softcap="attn_logit_softcapping",
        head_dim_required=True,
        config_defaults=(
            ("head_dim", 256),
            ("query_pre_attn_scalar", 256),
            ("attn_logit_softcapping", 50.0),
            ("sliding_window", 4096),
        ),
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
    "jais2": Family(bias_default=True),  # Llama's attention, biases on by default
    # Solar Open: Llama's attention with o_proj always bias-free; GLM-4-MoE's experts outside
    "solar_open": Family(out_bias=None, config_defaults=(("head_dim", 128),)),
    #
    # -- rows of issue 28, part B --
    #
    # -- rows of issue 28, part C --
}
SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))
# model types whose attention is one of the above, but whose config needs another reading first
REFUSED = {
    "gemma3": "the multimodal Gemma 3 config; its language model's attention is 'gemma3_text': "
    "pass config.text_config (and the language model's state dict)",
    # -- refusals of issue 28, part A --
    #
    # -- refusals of issue 28, part B --
    #
    # -- refusals of issue 28, part C --
}


def model_type(config: Mapping[str, Any]) -> str:
    """The config's ``model_type``, one of SUPPORTED_MODEL_TYPES."""
    name = config.get("model_type")
    if name in REFUSED:
        raise ValueError(f"model_type {name!r} is not supported as such: {REFUSED[name]}")
    if name not in FAMILIES:
        raise ValueError(
            f"model_type {name!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}"
        )
    return str(name)


def layer_kind(config: Mapping[str, Any], family: Family, layer_idx: int) -> str:
    """``"sliding_attention"`` or ``"full_attention"``: the mask the model gives layer i."""
    if family.sliding == "never":
        return FULL
    if family.sliding == "every_layer":
        return SLIDING if config.get("sliding_window") is not None else FULL
    if family.sliding == "use_sliding_window":  # Qwen3-MoE: the flag, on every layer
        window = config.get("sliding_window") is not None
        return SLIDING if _flag(config, "use_sliding_window") and window else FULL
    layer_types = config.get("layer_types")
    if layer_types is None:
        if family.sliding == "smollm3":  # its config class: sliding NoPE layers under the flag
            window = (
                _flag(config, "use_sliding_window") and config.get("sliding_window") is not None
            )
            return SLIDING if window and not _smollm3_rotates(config, layer_idx) else FULL
        fallback = family.fallback or (lambda config, layer_idx: False)
        return SLIDING if fallback(config, layer_idx) else FULL
    if layer_idx >= len(layer_types):
        raise ValueError(
            f"layer_idx is {layer_idx} but the config's layer_types has {len(layer_types)} entries"
        )
    kind = layer_types[layer_idx]
    if kind not in (FULL, SLIDING):
        raise ValueError(f"layer_types[{layer_idx}] is {kind!r}; supported: {FULL!r}, {SLIDING!r}")
    if family.sliding == "smollm3" and kind == SLIDING and not _flag(config, "use_sliding_window"):
        raise ValueError(
            f"layer_types[{layer_idx}] is 'sliding_attention' but use_sliding_window is false: "
            "SmolLM 3's eager attention would slide (its mask follows layer_types) and its flash "
            "attention would not (its window follows the flag)"
        )
    return str(kind)


def class_view(config: Mapping[str, Any], family: Family) -> Mapping[str, Any]:
    """The config as the family's config class reads it: ``key_aliases`` under the model's
    names, ``config_defaults`` where it leaves a key out, ``equal_keys`` and ``refused_keys``
    checked."""
    for key, reason in family.refused_keys:
        if config.get(key) not in (None, False):
            raise ValueError(f"{key} is set: {reason}")
    if not (family.config_defaults or family.key_aliases or family.equal_keys):
        return config
    renamed = {new: config[old] for old, new in family.key_aliases if old in config}
    config = {**dict(family.config_defaults), **renamed, **config}
    for first, second in family.equal_keys:
        if config.get(first) != config.get(second):
            raise ValueError(
                f"{first} is {config.get(first)!r} but {second} is {config.get(second)!r}: the "
                f"{config.get('model_type')} model needs them equal"
            )
    return config


def rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """Whether layer i applies RoPE (False: a NoPE layer)."""
    return True if family.rotates is None else family.rotates(config, layer_idx)


# -- the options --------------------------------------------------------------------------------


def sizes(config: Mapping[str, Any], family: Family) -> dict[str, int]:
    """hidden_size, num_heads, num_kv_heads and head_dim as the attention module takes them."""
    config = class_view(config, family)
    hidden_size = required(config, "hidden_size")
    num_heads = required(config, "num_attention_heads")
    if family.layout == "falcon":  # new decoder: num_kv_heads; old: one (multi-query) or all
        if _flag(config, "new_decoder_architecture"):
            num_kv_heads = config.get("num_kv_heads") or num_heads
        else:
            num_kv_heads = 1 if _flag(config, "multi_query", True) else num_heads
    else:
        num_kv_heads = config.get("num_key_value_heads") or num_heads
    if num_heads % num_kv_heads:
        raise ValueError(
            f"the config's {num_heads} attention heads are not a multiple of its "
            f"{num_kv_heads} key/value heads"
        )
    head_dim = config.get("head_dim") if family.head_dim_from_config else None
    if family.head_dim_required:  # no C // H in the model
        head_dim = required(config, "head_dim")
    head_dim = head_dim or hidden_size // num_heads
    if family.heads_span_hidden and num_heads * head_dim != hidden_size:
        raise ValueError(
            f"num_attention_heads * head_dim is {num_heads} * {head_dim}, but a "
            f"{config.get('model_type')} o_proj takes hidden_size = {hidden_size} inputs"
        )
    return {
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
    }


def layer_options(
    config: Mapping[str, Any], name: str, layer_idx: int, attention: Mapping[str, Any]
) -> dict[str, Any]:
    """The constructor keywords of the layer, RoPE's aside (``rope.rope_options``).

    Args:
        config: the config mapping.
        name: its model_type (``model_type(config)``).
        layer_idx: the layer.
        attention: the layer's attention entries in the layer's names (Qwen2's biases are read
            from them).
    """
    family = FAMILIES[name]
    config = class_view(config, family)
    if family.bidirectional_flag and config.get("use_bidirectional_attention"):
        raise ValueError(
            f"use_bidirectional_attention is set: that {name} layer is not causal, and "
            "GroupedQueryAttention always is"
        )
    if family.layout == "falcon" and config.get("alibi"):
        raise ValueError(
            "alibi is set: this Falcon adds ALiBi to its scores instead of rotating q and k "
            "(and scales after the bias); GroupedQueryAttention rotates"
        )
    options: dict[str, Any] = sizes(config, family)
    if family.bias == "<state>":  # q, k and v always carry a bias in Qwen2's code; no config key
        options["bias"] = "q_proj.bias" in attention
    else:
        options["bias"] = family.bias is not None and _flag(
            config, family.bias, family.bias_default
        )
    options["out_bias"] = family.out_bias is not None and _flag(
        config, family.out_bias, family.bias_default
    )
    options["window"] = _window(config, family, layer_idx)
    if family.attention_dropout:
        options["dropout"] = float(config.get("attention_dropout") or 0.0)
    if family.qk_norm is not None and (
        family.qk_norm_flag is None or _flag(config, family.qk_norm_flag)
    ):
        norm_type, shape, offset = family.qk_norm
        options |= {"qk_norm": True, "qk_norm_type": norm_type, "qk_norm_shape": shape}
        options |= {
            "norm_weight_offset": offset,
            "norm_eps": float(required(config, family.norm_eps)),
        }
    if family.scaling == "query_pre_attn_scalar":
        options["scaling"] = float(required(config, family.scaling)) ** -0.5
    elif family.scaling == "attention_multiplier":  # None: 1/sqrt(D) (HyperCLOVA X's default)
        multiplier = config.get(family.scaling, 1.0)
        options["scaling"] = None if multiplier is None else float(multiplier)
    if family.softcap is not None:
        options["softcap"] = float(config.get(family.softcap) or 0.0)
    if family.sinks:
        options["sinks"] = True
    return options


def _window(config: Mapping[str, Any], family: Family, layer_idx: int) -> tuple[int, int] | None:
    """(W - 1, 0) on a sliding layer (Hugging Face's W counts the query itself), else None."""
    if layer_kind(config, family, layer_idx) == FULL:
        return None
    width = validation.positive_int("config['sliding_window']", required(config, "sliding_window"))
    return (width - 1, 0)
