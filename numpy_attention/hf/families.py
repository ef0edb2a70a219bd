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
            dict has them, Qwen2; ``"<always>"``: always, whatever the config says, Phi), with
            ``bias_default`` where the key is missing.
        out_bias: config key of o_proj's bias (None: never; ``"<always>"``: always), default
            ``bias_default``.
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
    rope_mscale: bool = False
    """(issue 28, part D) PhiMoE's rotary embedding: a RoPE type other than ``default`` keeps
    its first frequencies (LongRoPE's short ones) at every length and multiplies cos and sin by
    ``short_mscale`` or ``long_mscale`` of ``rope_parameters``, chosen by each call's longest
    position; the two must be equal (a factor that changes between calls is refused)."""
    #
    # -- fields of issue 28, part B --
    rope_theta_per_layer: str | None = None
    """Config key of a list of RoPE bases, one per layer (Granite SWA's ``layer_rope_theta``),
    which replaces ``rope_theta`` for that layer; 0 makes the layer a NoPE layer."""
    rope_type_thetas: tuple[float, str | None, float] = (1e6, "rope_local_base_freq", 1e4)
    """With ``rope_per_layer_type``, how the config class reads a transformers 4 config (no
    ``rope_parameters``): the full layers' default ``rope_theta``, the config key of the sliding
    layers' base (None: none) and that base's default (Gemma 3's; OLMo 3's differ)."""
    rotary_dim_key: str | None = None
    """Config key of a rotated width that stands for ``partial_rotary_factor`` (as width /
    head_dim) where the config has no factor (MiniMax-M2's legacy ``rotary_dim``)."""
    #
    # -- fields of issue 28, part C --
    mixers: Callable[[Mapping[str, Any]], list[str]] | None = None
    """Hybrids: what each layer is, ``ATTENTION`` or its kind in words ("a Mamba layer"), from
    the config as the model's code decides it; None: every layer is attention."""
    renames: tuple[tuple[str, str], ...] = ()
    """(the model's module name, the layer's) where they differ: LFM2's ``out_proj``, Phi's
    ``dense``, the ``q_layernorm`` of LFM2 and StableLM."""
    norms_per_head_modules: bool = False
    """StableLM: the per-head QK-norm is one module per head, ``q_layernorm.norms.{h}.weight``
    (D,), stacked into the layer's (H, D) ``q_norm.weight``."""
    partial_rotary_default: float = 1.0
    """The config class's ``partial_rotary_factor`` where the config has none (StableLM 0.25,
    Phi, Nemotron, Bamba and GLM-4 MoE 0.5)."""
    partial_rotary_top_level: bool = True
    """A top-level ``partial_rotary_factor`` counts (Bamba's config class overwrites it)."""
    key_multiplier: str | None = None
    """Config key of a factor the model multiplies the keys by (Falcon-H1), folded into the
    score scale: ``multiplier / sqrt(D)``."""
    refuse: Callable[[Mapping[str, Any]], None] | None = None
    """Raises ValueError for a config the family's code cannot mean (a key it ignores, a twist
    only some configs switch on)."""


def _cohere2_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Cohere 2 rotates only on its sliding layers; the full layers are NoPE."""
    return layer_kind(config, FAMILIES["cohere2"], layer_idx) == SLIDING


# Granite SWA, Granite MoE SWA: layer 0 and every fourth layer after it attend fully, the others
# slide; ``layer_rope_theta`` gives each layer its own RoPE base, 0 for none


def _granite_swa_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Granite SWA's config class: every layer slides but layers 0, 4, 8, ..."""
    return layer_idx % 4 != 0


def layer_rope_theta(config: Mapping[str, Any], family: Family, layer_idx: int) -> float | None:
    """Layer i's RoPE base from the family's per-layer list (0: NoPE), None without a list."""
    key = family.rope_theta_per_layer
    thetas = None if key is None else config.get(key)
    if thetas is None:
        return None
    if layer_idx >= len(thetas):
        raise ValueError(
            f"layer_idx is {layer_idx} but the config's {key} has {len(thetas)} entries"
        )
    return float(thetas[layer_idx])


def _granite_swa_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Granite SWA: a layer whose ``layer_rope_theta`` is 0 gets no position embeddings."""
    return layer_rope_theta(config, FAMILIES["granite_swa"], layer_idx) != 0


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


def _exaone4_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
    """EXAONE 4 rotates on every layer without a window, else on its sliding layers only."""
    if config.get("sliding_window") is None:
        return True
    return layer_kind(config, FAMILIES["exaone4"], layer_idx) == SLIDING


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


def _cohere2_moe_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Cohere 2 MoE rotates on its sliding layers, and on its dense-MLP layers when their
    pattern is 1 (``force_rope``); its other full layers are NoPE."""
    if layer_kind(config, FAMILIES["cohere2_moe"], layer_idx) == SLIDING:
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


# -- helpers of issue 28, part C: which layers are attention, and their twists --

ATTENTION = "attention"  # a mixers entry: the layer is softmax attention


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


def _granitemoehybrid_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
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


def _olmo_hybrid_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
    params = config.get("rope_parameters")
    if isinstance(params, Mapping):
        return params.get("rope_theta") is not None
    return config.get("rope_theta", 10000.0) is not None  # the config class's default theta


def _never(config: Mapping[str, Any], layer_idx: int) -> bool:
    """Jamba's and Nemotron-H's attention: no RoPE at all (the Mamba layers carry position)."""
    return False


# StableLM: its attention's head width is hidden_size // num_attention_heads whatever head_dim
# says, and its rotary embedding reads head_dim: the two must agree
def _stablelm_refuse(config: Mapping[str, Any]) -> None:
    head_dim = config.get("head_dim")
    width = required(config, "hidden_size") // required(config, "num_attention_heads")
    if head_dim is not None and head_dim != width:
        raise ValueError(
            f"head_dim is {head_dim}, but stablelm's attention heads are hidden_size // "
            f"num_attention_heads = {width} wide (its rotary embedding would read {head_dim})"
        )


# Phi: qk_layernorm is a LayerNorm with a bias (nn.LayerNorm's default) on q and k
def _phi_refuse(config: Mapping[str, Any]) -> None:
    if config.get("qk_layernorm"):
        raise ValueError(
            "qk_layernorm is set: phi's QK-norm is a LayerNorm with a bias over each head of q "
            "and k; the layer's QK-norm has no bias"
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


def _flint_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
    return layer_kind(config, FAMILIES["flint"], layer_idx) == SLIDING


# Kolibri 1's config class: every fifth layer attends fully, and only the sliding layers rotate;
# without a window its model fails (it builds the sliding mask on every call)
def _kolibri1_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    return (layer_idx + 1) % 5 != 0


def _kolibri1_rotates(config: Mapping[str, Any], layer_idx: int) -> bool:
    return layer_kind(config, FAMILIES["kolibri1"], layer_idx) == SLIDING


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


# OLMo, OLMoE (issue 28, part D): a config's clip_qkv clamps the projections, which the layer cannot
_CLIP_QKV = (
    "{} clamps q, k and v to [-clip_qkv, clip_qkv] after projection; the layer has no clip "
    "(issue 28)"
)


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
        fallback=_pattern(6),
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
    # (issue 28, part D) PhiMoE: Mixtral's attention, attention_bias on all four projections, and
    # its own scaled RoPE (rope_mscale)
    "phimoe": Family(sliding="every_layer", rope_mscale=True),
    # OLMo: Llama's attention; clip_qkv (OLMo-7B-0424's 8) clamps q, k and v
    "olmo": Family(refused_keys=(("clip_qkv", _CLIP_QKV.format("olmo")),)),
    # OLMoE: OLMo 2's QK-norm over the whole projection, sized C and (C // H) * H_kv, and clip_qkv
    "olmoe": Family(
        qk_norm=("rms", "all", 0.0),
        heads_span_hidden=True,
        refused_keys=(("clip_qkv", _CLIP_QKV.format("olmoe")),),
    ),
    #
    # -- rows of issue 28, part B --
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
    #
    # (part E) Aria's language model: Llama's attention (its experts are outside it)
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
    # MiniMax(-Text-01): Lightning (linear) attention layers beside softmax layers with Mistral's
    # attention (no biases, one window on every softmax layer when sliding_window is set)
    "minimax": Family(bias=None, out_bias=None, sliding="every_layer", mixers=_minimax_mixers),
    #
    # -- rows of issue 28, part C --
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
        refuse=_stablelm_refuse,
    ),
    # Phi: q, k, v and dense (its o_proj) always carry a bias, whatever the config says
    "phi": Family(
        bias="<always>",
        out_bias="<always>",
        partial_rotary=True,
        renames=(("dense", "o_proj"),),
        partial_rotary_default=0.5,
        refuse=_phi_refuse,
    ),
    "nemotron": Family(partial_rotary=True, partial_rotary_default=0.5),
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
    "jamba": Family(bias=None, out_bias=None, rotates=_never, mixers=_jamba_mixers),
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
        rotates=_never,
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
}
SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))
# model types whose attention is one of the above, but whose config needs another reading first
REFUSED = {
    "gemma3": "the multimodal Gemma 3 config; its language model's attention is 'gemma3_text': "
    "pass config.text_config (and the language model's state dict)",
    # -- refusals of issue 28, part A --
    # (issue 28 part D: each reason names the module behaviour the layer has no option for)
    "afmoe": "afmoe: an output gate, sigmoid(x W_g) per element (gate_proj), multiplies the "
    "attention's output before o_proj; the layer has no output gate (issue 28)",
    "beam": "beam: an output gate, sigmoid(x W_g + b_h) per element with a bias per head "
    "(gate_proj, gate_bias), multiplies the attention's output before o_proj, and its NoPE layers "
    "multiply the queries by a position-dependent temperature (1 + (p + 1) / 2048) ** 0.1; the "
    "layer has neither (issue 28)",
    "bitnet": "bitnet: an RMSNorm over the concatenated heads (attn_sub_norm) sits between the "
    "attention and o_proj; the layer has no norm there (issue 28)",
    "dbrx": "dbrx: clip_qkv (8 in the released DBRX) clamps the fused Wqkv projection to "
    "[-c, c] before the split, and its heads and RoPE base are read from a nested attn_config; "
    "the layer has no clip and that nesting is not converted (issue 28)",
    "diffllama": "diffllama: differential attention, the difference of two softmax maps "
    "weighted by a learned lambda (lambda_q1, lambda_k1, ...), then a weightless RMSNorm "
    "(groupnorm) over each pair of heads; the layer computes one softmax (issue 28)",
    "doge": "doge: a dynamic mask, computed from the values (dt_proj, A) and kept to the top "
    "keep_window_size keys, is added to the scores; the layer has no such mask (issue 28)",
    "hrm_text": "hrm_text: an output gate, sigmoid(x W_g) per element (gate_proj), multiplies the "
    "attention's output before o_proj, and the model loops its layers over recurrent cycles; "
    "the layer has no output gate (issue 28)",
    "hunyuan_v1_dense": "hunyuan_v1_dense: its QK-norm (query_layernorm, key_layernorm, "
    "RMSNorm per head with a weight) runs after RoPE; the layer's QK-norm runs before RoPE "
    "(issue 28)",
    "hunyuan_v1_moe": "hunyuan_v1_moe: its QK-norm (query_layernorm, key_layernorm, RMSNorm per "
    "head with a weight) runs after RoPE; the layer's QK-norm runs before RoPE (issue 28)",
    "inkling_text": "inkling_text: short convolutions over time on the keys and values "
    "(k_sconv, v_sconv) and learned relative-position logits (r_proj) added to the scores, "
    "instead of RoPE; the layer has neither (issue 28)",
    "inkling2_text": "inkling2_text: an output gate, sigmoid(x W_g) per element (gate_proj), "
    "sinks computed from the input (sink_proj) and L2 clips of q and k; the layer has no output "
    "gate, and its sinks are learned constants (issue 28)",
    "jetmoe": "jetmoe: a mixture of attention heads, each token's queries (and outputs) come "
    "from its top-k routed experts (experts.map, experts.reduce); the layer has one q_proj and "
    "one o_proj (issue 28)",
    "laguna": "laguna: an output gate, softplus(x W_g) per head or per element (g_proj, always "
    "on), multiplies the attention's output before o_proj; the layer has no output gate "
    "(issue 28)",
    "lfm3": "lfm3: an output gate, sigmoid(x W_g) per head (g_proj, under use_attention_gate, on "
    "by default and in the released LFM3), multiplies each head's output before o_proj, and its "
    "full layers rotate with 'proportional' RoPE; the layer has no output gate (issue 28)",
    "llama4": "llama4: the multimodal Llama 4 config; its language model 'llama4_text' is "
    "itself refused: chunked attention, an L2 QK-norm after RoPE and a query temperature on its "
    "NoPE layers (issue 28)",
    "llama4_text": "llama4_text: its RoPE layers attend in chunks (attention_chunk_size) and "
    "L2-normalise q and k after RoPE (use_qk_norm), its NoPE layers scale the queries by a "
    "position-dependent temperature (attn_temperature_tuning); the layer has none of these "
    "(issue 28)",
    "mimo_v2_flash": "mimo_v2_flash: its values are v_head_dim wide (not head_dim) and multiplied "
    "by attention_value_scale, its sliding layers have twice the key/value heads and sinks; the "
    "layer has one head width and no value scale (issue 28)",
    "ministral3": "ministral3: the queries are multiplied by a position-dependent temperature, "
    "1 + llama_4_scaling_beta * log(1 + floor(p / original_max_position_embeddings)), after "
    "RoPE; the layer has no query temperature (issue 28)",
    "nanochat": "nanochat: its QK-norm (a weightless RMSNorm per head) runs after RoPE, and its "
    "rotate_half turns the pairs the other way (x2, -x1); the layer's QK-norm runs before RoPE "
    "and rotates as Llama (issue 28)",
    "mpt": "mpt: ALiBi, a linear bias per head added to the scores, instead of RoPE (and "
    "clip_qkv, qk_ln a LayerNorm with a bias); the layer rotates and has no ALiBi (issue 28)",
    "persimmon": "persimmon: its QK-norm (qk_layernorm, on by default and in Persimmon-8B) is a "
    "LayerNorm with a bias over each head of q and k, and its fused query_key_value interleaves "
    "q, k and v per head; the layer's QK-norm has no bias (issue 28)",
    "gemma3n": "gemma3n: the multimodal Gemma 3n config; its language model 'gemma3n_text' is "
    "itself refused: a weightless RMSNorm on the values and keys and values shared across "
    "layers (issue 28)",
    "gemma3n_text": "gemma3n_text: a weightless RMSNorm on the values (v_norm) before attention, "
    "and its last num_kv_shared_layers layers reuse an earlier layer's keys and values (KV "
    "sharing); the layer has neither (issue 28)",
    **{
        name: f"{name}: a weightless RMSNorm on the values (v_norm) before attention, KV sharing "
        "(its last num_kv_shared_layers layers reuse an earlier layer's keys and values) and, "
        "under attention_k_eq_v, values equal to the keys on the full layers; the layer has no "
        "value norm (issue 28)"
        for name in ("gemma4_text", "gemma4_unified_text")
    },
    **{
        name: f"{name}: the multimodal Gemma 4 config; its language model "
        f"'{text}' is itself refused: a weightless RMSNorm on the values and keys and values "
        "shared across layers (issue 28)"
        for name, text in (("gemma4", "gemma4_text"), ("gemma4_unified", "gemma4_unified_text"))
    },
    **{
        name: f"{name}: a drafter whose every layer reuses the target model's keys and values "
        "(KV sharing, num_kv_shared_layers = num_hidden_layers) under a bidirectional mask; the "
        "layer has no KV sharing (issue 28)"
        for name in ("gemma4_assistant", "gemma4_unified_assistant")
    },
    #
    # -- refusals of issue 28, part B --
    "deepseek_v4": "deepseek_v4: shared-KV multi-query attention (one kv_proj read as both key "
    "and value), a low-rank query with a weightless RMSNorm, RoPE applied again at position -i "
    "to the output's rotary slice, a grouped low-rank output projection, per-head sinks, and "
    "compressed sparse attention layers (CSA/HCA); neither the grouped nor the latent layer",
    # (part E) linear-attention hybrids whose softmax layers carry an output gate
    **{
        name: f"{name}: an output gate: q_proj gives each head 2 * head_dim outputs, the query "
        "and a gate g, and sigmoid(g) multiplies the attention's output per element before "
        "o_proj; the layer has no output gate (issue 28). Its linear_attention layers are gated "
        "DeltaNet (issue 28, step 20)"
        for name in (
            "qwen3_next",
            "qwen3_5_text",
            "qwen3_5_moe_text",
            "qwen4_exp_text",
        )
    },
    **{
        name: f"{name}: the multimodal wrapper; pass config.text_config (its language model "
        f"is {name}_text, refused by name: its softmax layers carry an output gate)"
        for name in ("qwen3_5", "qwen3_5_moe", "qwen4_exp")
    },
    "cohere_compass_text": "cohere_compass_text: multimodal RoPE (mrope_section): each "
    "frequency reads the temporal, height or width position from 3-D position_ids (text, H, W "
    "rows interleaved every third frequency), and a layer whose rope_parameters entry is null "
    "gets none; the layer rotates by one position per token",
    "zaya": "zaya: Compressed Convolutional Attention: q and k come from a causal 1-D "
    "convolution over the sequence (ZayaCCAProjection), v from a delayed recurrent state, then "
    "q and k are L2-normed to sqrt(head_dim) and k scaled by a learned per-kv-head temperature "
    "(ZayaQKNorm); the layer projects each token alone",
    "minimax_m3_vl_text": "minimax_m3_vl_text: its 'minimax_m3_sparse' layers attend only to "
    "the key blocks a Lightning Indexer picks per query (top-k blocks plus local ones, "
    "MiniMaxM3VLIndexer); the layer has no indexer. Its dense layers (Gemma QK-norm, partial "
    "RoPE) are not a row yet",
    "minimax_m3_vl": "minimax_m3_vl: the multimodal wrapper; its language model is "
    "minimax_m3_vl_text, whose sparse layers a Lightning Indexer selects (refused by name)",
    # DeepSeek Sparse Attention: the text configs of latent.py's REFUSED wrappers; their
    # attention is MLA, and its indexed layers a DSA indexer hides keys on
    "glm5_next_text": "glm5_next_text: DeepSeek Sparse Attention: a top-k indexer hides keys "
    "per query, shared across layers; and its attention is multi-head latent attention "
    "(latent_from_hf refuses it for the same reason)",
    "mistral_large4_text": "mistral_large4_text: DeepSeek Sparse Attention: a top-k indexer "
    "hides keys per query, with NoPE layers and KV sharing across layers; and its attention is "
    "multi-head latent attention (latent_from_hf refuses it for the same reason)",
    "dots3_note_text": "dots3_note_text: DeepSeek Sparse Attention on its 'indexed_attention' "
    "layers (a top-k indexer hides keys per query), an output gate sigmoid(g_proj(x)) per head "
    "before o_proj, and a normed rope key; its attention is multi-head latent attention "
    "(latent_from_hf refuses it for the same reason)",
    **{
        name: f"{name}: the multimodal wrapper of {name}_text, whose attention is DeepSeek Sparse "
        "Attention (a top-k indexer hides keys per query) over multi-head latent attention"
        for name in ("glm5_next", "mistral_large4", "dots3_note")
    },
    "gpt_bigcode": "gpt_bigcode: its attention (biased, no RoPE, multi-query by default) is "
    "one fused c_attn whose output splits into q, then one k and v shared by all heads; that "
    "layout is not read here (and scale_attn_weights false scores without 1/sqrt(D))",
    "zamba": "zamba: its shared attention block reads attention_hidden_size = 2 * hidden_size "
    "inputs (the hidden states concatenated with the original embeddings); the layer's input "
    "width is hidden_size. The other layers are Mamba layers",
    "zamba2": "zamba2: its shared attention blocks read 2 * hidden_size inputs (the hidden "
    "states concatenated with the original embeddings) and add per-layer LoRA adapters to q, "
    "k and v (use_shared_attention_adapter); the layer's input width is hidden_size. The other "
    "layers are Mamba-2 layers",
    "blt": "blt: the Byte Latent Transformer: a local byte encoder and decoder that "
    "cross-attend to patches, a global transformer over patches and an entropy patcher; no "
    "single decoder stack of self-attention layers to convert",
    "emu3": "emu3: the multimodal wrapper (a VQ-VAE image tokenizer and a text model, "
    "model_type 'emu3_text_model'); its text model is not a row yet",
    "mllama": "mllama: a vision-language model whose text model's cross_attention_layers take "
    "keys and values from the vision encoder's states (MllamaTextCrossAttention, gated by "
    "tanh on the residual); its self-attention layers are not a row yet",
    "modernbert-decoder": "modernbert-decoder: its attention applies attention_dropout a "
    "second time, to Wo's output (out_drop), in training, and its heads are hidden_size // "
    "num_attention_heads wide with no key/value grouping; not a row yet",
    "phi4_multimodal": "phi4_multimodal: the multimodal model (vision and audio encoders "
    "beside a Phi-3 text decoder whose LoRA adapters live outside the base weights); its "
    "attention is not a row yet",
    "recurrent_gemma": "recurrent_gemma: a hybrid of RG-LRU recurrent blocks and local "
    "attention blocks (block_types); its attention (partial RoPE, o_proj always biased) is "
    "not a row yet",
    "falcon_mamba": "falcon_mamba: a state-space model (Mamba with RMS-normed B, C and dt) "
    "with no softmax attention layer",
    "mamba": "mamba: a state-space model with no softmax attention layer",
    "mamba2": "mamba2: a state-space model (Mamba-2, structured state space duality) with no "
    "softmax attention layer",
    "rwkv": "rwkv: an RNN (RWKV time mixing, a decayed weighted key-value recurrence) with no "
    "softmax attention layer",
    "xlstm": "xlstm: a recurrent model (mLSTM matrix-memory blocks) with no softmax attention "
    "layer",
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


def check_layer(config: Mapping[str, Any], name: str, layer_idx: int) -> None:
    """Refuses, by name, a layer that is not softmax attention (a hybrid's Mamba, convolution
    or recurrent layer, naming the attention layers) and a config the family refuses."""
    family = FAMILIES[name]
    if family.refuse is not None:
        family.refuse(config)
    if family.mixers is None:
        return
    kinds = family.mixers(config)
    if layer_idx >= len(kinds):
        raise ValueError(f"layer_idx is {layer_idx} but this {name} model has {len(kinds)} layers")
    if kinds[layer_idx] != ATTENTION:
        attention = [i for i, kind in enumerate(kinds) if kind == ATTENTION]
        raise ValueError(
            f"layer {layer_idx} of this {name} model is {kinds[layer_idx]}, not attention; "
            f"its attention layers are {attention}"
        )


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
        options["bias"] = _bias(config, family.bias, family.bias_default)
    options["out_bias"] = _bias(config, family.out_bias, family.bias_default)
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
    if family.key_multiplier is not None:  # k * m scores as q k^T * (m / sqrt(D))
        multiplier = config.get(family.key_multiplier)
        multiplier = 1.0 if multiplier is None else float(multiplier)
        options["scaling"] = multiplier * options["head_dim"] ** -0.5
    if family.softcap is not None:
        options["softcap"] = float(config.get(family.softcap) or 0.0)
    if family.sinks:
        options["sinks"] = True
    return options


def _bias(config: Mapping[str, Any], key: str | None, default: bool) -> bool:
    """Whether a projection has a bias: never (None), always (``"<always>"``), or as the config
    key says (``default`` where it is missing)."""
    if key is None or key == "<always>":
        return key is not None
    return _flag(config, key, default)


def _window(config: Mapping[str, Any], family: Family, layer_idx: int) -> tuple[int, int] | None:
    """(W - 1, 0) on a sliding layer (Hugging Face's W counts the query itself), else None."""
    if layer_kind(config, family, layer_idx) == FULL:
        return None
    width = validation.positive_int("config['sliding_window']", required(config, "sliding_window"))
    return (width - 1, 0)
