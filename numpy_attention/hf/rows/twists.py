"""The rows of the families that need an option the classic decoder lacks, the output gates
aside (``gated.py``): clip_qkv (OLMo, OLMoE), the sub-norm before o_proj (BitNet), QK-norm after
RoPE (Hunyuan, nanochat), a query temperature (Ministral 3), values of their own width and scale
(MiMo-V2-Flash), differential attention (DiffLlama), chunked attention beside NoPE layers
(Llama 4), and a value norm with keys and values shared across layers (Gemma 3n, Gemma 4, whose
full layers have widths of their own).

The rules a row names sit beside it, each its config class's or its model's; the rules
several modules share are ``hf/rules.py``. ``families.FAMILIES`` joins the modules' ROWS.
NumPy only.

Tests: tests/numpy_attention/hf/rows/test_twists.py, tests/numpy_attention/hf/test_mimo.py,
tests/numpy_attention/hf/test_gemma4.py; against transformers in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import validation
from .. import rules
from ..family import FULL, SLIDING, Family, flag, layer_kind, required


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


# BitNet: the released checkpoints' linears are AutoBitLinear (quantization_config)
_BITNET_QUANTIZED = (
    "bitnet's quantized linears (AutoBitLinear) round the weights to {-1, 0, 1} times their "
    "mean magnitude and each token's activations to 8 bits before every projection; the layer's "
    "projections are plain (load unquantized weights with a config without it)"
)


# MiMo-V2-Flash: its config class's layer pattern (the first layer and every sixth full, the
# others sliding), twice the key/value heads on the sliding layers, and its RoPE: one default
# RoPE per layer type turning int(head_dim * 0.334) coordinates where an entry gives no factor
MIMO_ROPE_THETAS = {FULL: 5_000_000.0, SLIDING: 10_000.0}  # its config class's, per layer type
MIMO_PARTIAL_ROTARY = 0.334  # its rotary embedding's default, for rope_type "default" only
_MIMO_SWA_KEYS = (  # config.json keys its config class never reads: (key, the key it reads, x)
    ("swa_num_attention_heads", "num_attention_heads", 1),
    ("swa_num_key_value_heads", "num_key_value_heads", 2),
    ("swa_head_dim", "head_dim", 1),
    ("swa_v_head_dim", "v_head_dim", 1),
)
_MIMO_DEFAULTS = {"num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192} | {
    "v_head_dim": 128,
    "num_hidden_layers": 48,
}


def _mimo_sliding(config: Mapping[str, Any], layer_idx: int) -> bool:
    return not (layer_idx == 0 or (layer_idx + 1) % 6 == 0)


def _mimo_kv_heads(config: Mapping[str, Any], family: Family, layer_idx: int) -> int:
    """MiMo-V2-Flash's attention: twice ``num_key_value_heads`` on a sliding layer."""
    heads = int(required(config, "num_key_value_heads"))
    return 2 * heads if layer_kind(config, family, layer_idx) == SLIDING else heads


def _mimo_refuse(config: Mapping[str, Any]) -> None:
    """What transformers' MiMo-V2-Flash ignores and a config may say otherwise: the released
    config.json's own keys (``swa_*`` sizes, ``hybrid_layer_pattern``, the sink flags) and a
    RoPE its config class replaces with its own; a RoPE its rotary embedding cannot read."""
    value = {key: config.get(key, default) for key, default in _MIMO_DEFAULTS.items()}
    for key, read, factor in _MIMO_SWA_KEYS:
        if config.get(key) is not None and config[key] != factor * value[read]:
            raise ValueError(
                f"{key} is {config[key]!r}, but transformers' MiMo-V2-Flash ignores it: its "
                f"sliding layers take {'twice ' if factor == 2 else ''}{read} "
                f"({factor * value[read]})"
            )
    for key, expected in (("add_swa_attention_sink_bias", True), ("add_full_attention_sink_bias",
                                                                   False)):  # fmt: skip
        if config.get(key) is not None and bool(config[key]) != expected:
            raise ValueError(
                f"{key} is {config[key]!r}, but transformers' MiMo-V2-Flash ignores it: its "
                f"sliding layers always have sinks and its full layers never do"
            )
    pattern = config.get("hybrid_layer_pattern")
    if pattern is not None:
        count = value["num_hidden_layers"]
        types = config.get("layer_types") or [
            SLIDING if _mimo_sliding(config, i) else FULL for i in range(count)
        ]
        if [SLIDING if kind else FULL for kind in pattern] != list(types):
            raise ValueError(
                "hybrid_layer_pattern disagrees with the layer types transformers' MiMo-V2-Flash "
                "uses (layer_types, or its config class's pattern), which ignores it"
            )
    _mimo_refuse_rope(config)


def _mimo_refuse_rope(config: Mapping[str, Any]) -> None:
    params = config.get("rope_parameters")
    if params is None:  # its config class's RoPE, whatever a config.json says at the top level
        for key, expected in (
            ("rope_theta", MIMO_ROPE_THETAS[FULL]),
            ("swa_rope_theta", MIMO_ROPE_THETAS[SLIDING]),
            ("rope_scaling", None),
        ):
            if config.get(key) is not None and config[key] != expected:
                raise ValueError(
                    f"the config has {key} = {config[key]!r} but no rope_parameters: "
                    "MiMo-V2-Flash's config class then ignores it and uses its own RoPE (base "
                    f"{MIMO_ROPE_THETAS[FULL]:g} on full layers, {MIMO_ROPE_THETAS[SLIDING]:g} "
                    "on sliding ones); give rope_parameters"
                )
        entries = [{"partial_rotary_factor": MIMO_PARTIAL_ROTARY}]
    else:
        if FULL not in params and SLIDING not in params:
            raise ValueError(
                "rope_parameters must hold one entry per layer type ('full_attention', "
                "'sliding_attention'): MiMo-V2-Flash's rotary embedding reads "
                "rope_parameters[layer_type] and fails on a single dict"
            )
        entries = [dict(entry) for entry in params.values() if entry is not None]
    for entry in entries:
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"rope_type {rope_type!r} on MiMo-V2-Flash: its rotary embedding defaults "
                "partial_rotary_factor to 0.334 for 'default' only and lets its config's "
                "standardisation fill it in otherwise; only 'default' is read here"
            )
    top = config.get("partial_rotary_factor")
    factors = {entry.get("partial_rotary_factor", MIMO_PARTIAL_ROTARY) for entry in entries}
    if top is not None and factors != {top}:
        raise ValueError(
            f"partial_rotary_factor is {top!r} at the top level, which MiMo-V2-Flash's rotary "
            f"embedding ignores: it reads each layer type's entry ({sorted(factors)})"
        )


def _diffllama_refuse(config: Mapping[str, Any]) -> None:
    """DiffLlama's attention refuses attention dropout and an odd number of key/value heads
    (its value halves); so does the converter, naming the key."""
    dropout = config.get("attention_dropout") or 0.0
    if dropout > 0:
        raise ValueError(
            f"attention_dropout is {dropout!r}: DiffLlama's attention refuses it (its two "
            "softmax maps share no dropout mask)"
        )
    kv_heads = config.get("num_key_value_heads") or config.get("num_attention_heads")
    if kv_heads is not None and kv_heads % 2:
        raise ValueError(
            f"num_key_value_heads is {kv_heads}: differential attention splits the value heads "
            "in two halves, so DiffLlama needs an even count"
        )


# Llama 4: RoPE layers (no_rope_layers[i] = 1) attend in chunks and carry the L2 QK-norm; NoPE
# layers attend fully and scale their queries by a temperature of the cache's positions
LLAMA4_MASKS = ("full_attention", "chunked_attention")


def _llama4_rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """``no_rope_layers[i]`` (1: RoPE); an empty or missing list is its config class's default,
    a NoPE layer every ``no_rope_layer_interval``-th layer."""
    flags = config.get("no_rope_layers") or None
    return rules._smollm3_rotates({**config, "no_rope_layers": flags}, family, layer_idx)


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


ROWS: dict[str, Family] = {
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
    # BitNet: Llama's attention with an RMSNorm over the merged heads (attn_sub_norm, width C, so
    # H * D must be C) before o_proj; its quantized linears (quantization_config) are refused
    "bitnet": Family(
        heads_span_hidden=True,
        output_norm=True,
        renames=(("attn_sub_norm", "o_norm"),),
        refused_keys=(("quantization_config", _BITNET_QUANTIZED),),
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
        query_temperature=_ministral3_temperature,
    ),
    # MiMo-V2-Flash: values v_head_dim wide (not head_dim) times attention_value_scale before
    # the cache, sliding layers with twice the key/value heads and sinks, full ones with
    # neither; one default RoPE per layer type on int(head_dim * 0.334) coordinates; no bias on
    # o_proj; its config class's sliding_window_size W' means a window of W' + 1 keys
    "mimo_v2_flash": Family(
        out_bias=None,
        sliding="layer_types",
        fallback=_mimo_sliding,
        partial_rotary=True,
        partial_rotary_default=MIMO_PARTIAL_ROTARY,
        partial_rotary_top_level=False,
        rope_per_layer_type=True,
        rope_type_thetas=(
            MIMO_ROPE_THETAS[FULL],
            "swa_rope_theta",
            MIMO_ROPE_THETAS[SLIDING],
        ),
        config_defaults=(
            ("head_dim", 192),
            ("v_head_dim", 128),
            ("num_key_value_heads", 4),
            ("sliding_window", 129),
            ("attention_value_scale", 0.707),
        ),
        derived=lambda config: (
            {}
            if config.get("sliding_window_size") is None
            else {"sliding_window": config["sliding_window_size"] + 1}
        ),
        refuse=_mimo_refuse,
        v_head_dim="v_head_dim",
        value_scale="attention_value_scale",
        layer_kv_heads=_mimo_kv_heads,
        sliding_sinks=True,
    ),
    # DiffLlama: Llama's projections and RoPE, differential attention (the value halves side by
    # side, head h minus lambda times head h + H/2, a weightless RMSNorm of rms_norm_eps over
    # each 2 * head_dim, times 1 - lambda_init) before o_proj; attention_bias on all four
    "diffllama": Family(differential=True, refuse=_diffllama_refuse),
    # -- chunked attention: Llama 4 --
    # Llama 4: RoPE as complex pairs (interleaved) on the layers no_rope_layers marks, which
    # attend in chunks of attention_chunk_size (layer_types' chunked_attention) and carry a
    # weightless L2 norm (an RMSNorm) after RoPE under use_qk_norm; the NoPE layers attend fully
    # and scale their queries by a temperature of the cache's positions
    "llama4_text": Family(
        interleaved=True,
        qk_norm=("rms_weightless", "head", 0.0),
        qk_norm_flag="use_qk_norm",
        qk_norm_after_rope=True,
        qk_norm_rotating_only=True,
        rotates=_llama4_rotates,
        query_temperature=_llama4_temperature,
        chunk=_llama4_chunk,
        refuse=_llama4_refuse,
        config_defaults=(
            ("head_dim", 128),
            ("num_key_value_heads", 8),
            ("use_qk_norm", True),
            ("attention_chunk_size", 8192),
            ("attn_temperature_tuning", True),
            ("floor_scale", 8192),
            ("attn_scale", 0.1),
            ("rms_norm_eps", 1e-5),
        ),
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


# -- Gemma 4: its full layers' own widths ----------------------------------------------------------
# Its config class gives each full layer an entry of per_layer_config: head_dim global_head_dim
# (512 by default) and, under attention_k_eq_v, num_global_key_value_heads key/value heads (where
# set); a config.json holds either that dict (keys the layer indices, as strings) or the two keys
_GEMMA4_LAYER_KEYS = ("head_dim", "num_key_value_heads")


def _gemma4_layer_types(config: Mapping[str, Any]) -> dict[str, Any]:
    """Its config class's layer_types: five sliding layers to one full without a list, and the
    last layer full whatever the list says (it forces it, with a warning)."""
    types = config.get("layer_types")
    if types is None:
        layers = int(required(config, "num_hidden_layers"))
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(layers)]
    types = list(types)
    if types and types[-1] != FULL:
        types[-1] = FULL
    return {"layer_types": types}


def _gemma4_entry(config: Mapping[str, Any], family: Family, layer_idx: int) -> dict[str, Any]:
    """Layer i's overrides, as its config class builds ``per_layer_config``."""
    entries = config.get("per_layer_config")
    if entries is None:  # a config.json of the released form: global_head_dim and the kv heads
        if layer_kind(config, family, layer_idx) != FULL:
            return {}
        entry = {"head_dim": required(config, "global_head_dim")}
        if flag(config, "attention_k_eq_v") and config.get("num_global_key_value_heads"):
            entry["num_key_value_heads"] = config["num_global_key_value_heads"]
        return entry
    if not isinstance(entries, Mapping):
        raise ValueError(
            f"per_layer_config is {type(entries).__name__}; Gemma 4's is a dict from layer "
            "index to that layer's head_dim and num_key_value_heads"
        )
    by_layer = {}
    for key, value in entries.items():  # to_dict writes the indices as padded strings: "05"
        try:
            by_layer[int(key)] = value
        except ValueError:
            raise ValueError(
                f"per_layer_config has the key {key!r}; Gemma 4's keys are layer indices"
            ) from None
    entry = dict(by_layer.get(layer_idx) or {})
    unknown = sorted(set(entry) - set(_GEMMA4_LAYER_KEYS))
    if unknown:
        raise ValueError(
            f"per_layer_config[{layer_idx}] sets {unknown}: a Gemma 4 layer reads only "
            f"{list(_GEMMA4_LAYER_KEYS)} from its entry"
        )
    return entry


def _gemma4_head_dim(config: Mapping[str, Any], family: Family, layer_idx: int) -> int:
    """Layer i's head width; its rotary embedding reads one width per layer type (its first
    layer's), so every layer of the type must have it."""
    layers = int(required(config, "num_hidden_layers"))
    kind = layer_kind(config, family, layer_idx)
    widths = {
        i: int(_gemma4_entry(config, family, i).get("head_dim") or required(config, "head_dim"))
        for i in range(layers)
        if layer_kind(config, family, i) == kind
    }
    if len(set(widths.values())) > 1:
        raise ValueError(
            f"per_layer_config gives the {kind} layers head_dim {widths}: Gemma 4's rotary "
            "embedding builds one set of frequencies per layer type, so its layers of one type "
            "need one head_dim"
        )
    return validation.positive_int(f"layer {layer_idx}'s head_dim", widths[layer_idx])


def _gemma4_kv_heads(config: Mapping[str, Any], family: Family, layer_idx: int) -> int:
    entry = _gemma4_entry(config, family, layer_idx)
    heads = entry.get("num_key_value_heads") or required(config, "num_key_value_heads")
    return validation.positive_int(f"layer {layer_idx}'s num_key_value_heads", heads)


def _gemma4_values_from_keys(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """attention_k_eq_v: its full layers have no v_proj, their values are k_proj's output."""
    return flag(config, "attention_k_eq_v") and layer_kind(config, family, layer_idx) == FULL


def _gemma4_refuse(config: Mapping[str, Any]) -> None:
    """use_bidirectional_attention "all": every layer non-causal (and its config class halves the
    window), which the layer cannot be. "vision" leaves the text model causal (only the
    multimodal model's mask lets an image's tokens see each other)."""
    if config.get("use_bidirectional_attention") == "all":
        raise ValueError(
            "use_bidirectional_attention is 'all': every Gemma 4 layer then attends both ways "
            "(is_causal False, the window halved), and GroupedQueryAttention is causal"
        )


# Gemma 4: Gemma 3n's attention (plain-weight QK-norm, weightless v_norm, scale 1, KV sharing of
# the last num_kv_shared_layers layers), full layers global_head_dim wide with proportional RoPE
# over a quarter of each head and, under attention_k_eq_v, their own key/value heads and values
# from k_proj; use_bidirectional_attention "all" is refused by key ("vision" is causal on text);
# Gemma 4 Unified's text model is the same attention (its config class: a window of 1024,
# "vision" by default)
ROWS |= {
    name: Family(
        sliding="layer_types",
        qk_norm=("rms", "head", 0.0),
        scaling="unit",
        rope_per_layer_type=True,
        value_norm=True,
        kv_sharing="num_kv_shared_layers",
        refuse=_gemma4_refuse,
        config_defaults=(
            ("num_hidden_layers", 30),
            ("num_key_value_heads", 4),
            ("head_dim", 256),
            ("global_head_dim", 512),
            ("sliding_window", window),
            ("num_kv_shared_layers", 0),
            ("rms_norm_eps", 1e-6),
        ),
        rope_default=(
            (
                FULL,
                (
                    ("rope_type", "proportional"),
                    ("partial_rotary_factor", 0.25),
                    ("rope_theta", 1e6),
                ),
            ),
            (SLIDING, (("rope_type", "default"), ("rope_theta", 1e4))),
        ),
        derived=_gemma4_layer_types,
        layer_kv_heads=_gemma4_kv_heads,
        layer_head_dim=_gemma4_head_dim,
        values_from_keys=_gemma4_values_from_keys,
    )
    for name, window in (("gemma4_text", 512), ("gemma4_unified_text", 1024))
}
