"""How a Hugging Face decoder family's attention reads its config, the machinery every row of
``families.FAMILIES`` shares: the ``Family`` dataclass (what a row can say), the config as its
config class reads it (``class_view``), which layers slide and rotate (``layer_kind``,
``rotates``), which layers are attention at all (``check_kind``), the sizes and the layer
options (RoPE aside, ``rope.py``) a row gives ``GroupedQueryAttention``. NumPy only; transformers
is never imported. The rows are ``rows/*.py`` (joined in ``families.py``), each beside the rules
it names.

Tests: tests/numpy_attention/hf/test_family.py, and through each row in
tests/numpy_attention/hf/rows/; against transformers in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import validation
from ..differential import lambda_init_from_depth

FULL, SLIDING = "full_attention", "sliding_attention"
ATTENTION = "attention"  # a mixers entry: the layer is softmax attention

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


def flag(config: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = config.get(key)
    return default if value is None else bool(value)


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
        scaling: None (1/sqrt(D)), ``"unit"`` (1: Gemma 3n, Gemma 4),
            ``"query_pre_attn_scalar"`` (its ** -0.5),
            ``"attention_multiplier"`` (the scale itself), ``"scale_attn_weights"`` (1/sqrt(D)
            under that flag, true by default, else 1: GPT-BigCode) or ``"half_head_dim"``
            ((D / 2)^-0.5, Zamba's).
        softcap: config key of the score cap, or None.
        sinks: one learned sink per head.
        interleaved: RoPE pairs (x_2i, x_2i+1).
        partial_rotary: the model honours ``partial_rotary_factor`` (else it must be 1).
        rope_per_layer_type: ``rope_parameters`` may hold one dict per layer type.
        rope_renames: rope types the config class renames (Phi-3: ``su`` and ``yarn`` are its
            old names of ``longrope``).
        rotates: whether layer i uses RoPE, called with the config, the family and i
            (None: every layer).
        layout: ``"separate"``, ``"qkv_proj"`` (Phi-3), ``"falcon"`` or ``"dbrx"``.
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
    rotates: Callable[[Mapping[str, Any], Family, int], bool] | None = None
    layout: str = "separate"
    head_dim_from_config: bool = True
    attention_dropout: bool = True
    bidirectional_flag: bool = False
    head_dim_required: bool = False  # the model reads head_dim with no fallback (Ministral)
    config_defaults: tuple[tuple[str, Any], ...] = ()  # its config class's, for missing keys
    heads_span_hidden: bool = False  # o_proj is (C, C): H * D must be C (Helium)
    rope_default: tuple[tuple[str, Any], ...] = ()  # its config class's RoPE (CWM's llama3)
    key_aliases: tuple[tuple[str, str], ...] = ()  # config.json name -> the model's name
    equal_keys: tuple[tuple[str, str], ...] = ()  # keys its config class requires equal
    refused_keys: tuple[tuple[str, str], ...] = ()  # (key, why): set, the config is refused
    rope_mscale: bool = False
    """PhiMoE's rotary embedding: a RoPE type other than ``default`` keeps
    its first frequencies (LongRoPE's short ones) at every length and multiplies cos and sin by
    ``short_mscale`` or ``long_mscale`` of ``rope_parameters``, chosen by each call's longest
    position; the two must be equal (a factor that changes between calls is refused)."""
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
    multi_query: bool = False
    """The key/value heads are one under ``multi_query`` (true by default), else one per query
    head, whatever ``num_key_value_heads`` says (GPT-BigCode's attention)."""
    derived: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    """Keys the config class computes from others, as it computes them, over the config's own
    (ModernBERT decoder: ``sliding_window = local_attention // 2``)."""
    clip_qkv: str | None = None
    """Config key of the clamp of q, k and v to [-c, c] (OLMo, OLMoE, DBRX's ``attn_config``
    entry lifted by ``nested_keys``); null: no clamp."""
    clip_after_norm: bool = False
    """The clamp acts on q and k after the QK-norm (OLMoE), not on the projections."""
    nested_keys: tuple[tuple[str, str, str], ...] = ()
    """(sub-config key, its entry, the model's name): entries of a nested config read as
    top-level keys by ``class_view``, over a top-level key of that name (DBRX's ``attn_config``
    holds its key/value heads and its clip; its config class copies ``kv_n_heads`` up)."""
    output_norm: bool = False
    """An RMSNorm over the merged heads before o_proj, its eps the ``norm_eps`` key (BitNet's
    ``attn_sub_norm``, renamed ``o_norm`` by ``renames``)."""
    gate: Callable[[Mapping[str, Any]], tuple[str, str, bool] | None] | None = None
    """The output gate from the config, as the model's code builds it: (kind, activation,
    bias), ``GroupedQueryAttention``'s ``output_gate`` (``"element"`` or ``"head"``),
    ``gate_activation`` and ``gate_bias``; None: no gate on this config. The module is
    ``g_proj`` (``renames`` where the model says ``gate_proj``; the ``"q_gate"`` layout where
    q_proj carries it, Qwen3-Next)."""
    heads_per_layer: str | None = None
    """Config key of a list of query-head counts, one per layer, that replaces
    ``num_attention_heads`` for that layer (Laguna's ``num_attention_heads_per_layer``;
    ``head_dim`` still defaults to ``hidden_size // num_attention_heads``)."""
    qk_norm_after_rope: bool = False
    """The QK-norm runs on the rotated heads, after RoPE (Hunyuan, nanochat): the layer's
    ``qk_norm_position="after_rope"``."""
    rope_reversed: bool = False
    """nanochat: its ``rotate_half`` is (x2, -x1), Llama's (-x2, x1), so each pair turns by
    -angle: the layer gets the frequencies negated (``rope.rope_options``)."""
    rope_ntk_alpha: bool = False
    """Hunyuan: rope_type ``dynamic`` with an ``alpha`` is its NTK-alpha RoPE, fixed frequencies
    of base rope_theta * alpha ** (D / (D - 2)) (``rope.hf_inv_freq``); without alpha, dynamic
    NTK stays refused."""
    query_temperature: Callable[[Mapping[str, Any], Family, int], dict[str, Any] | None] | None = (
        None
    )
    """The temperature of layer i's queries after RoPE (the layer's ``query_temperature``) as the
    model reads it from its config (Ministral 3's ``llama_4_scaling_beta``); None: none."""
    input_size: Callable[[Mapping[str, Any]], int] | None = None
    """The width of x the attention reads, from the config, where it is not hidden_size
    (Zamba's shared attention reads its hidden states concatenated with the embeddings, 2 *
    hidden_size); q, k and v read it, o_proj writes hidden_size, and head_dim defaults to it
    // num_attention_heads."""
    adapters: str | None = None
    """Config key that gives every attention layer its own LoRA adapters on q, k and v (Zamba2's
    ``use_shared_attention_adapter``): the k-th attention layer of ``mixers`` uses slot k,
    folded into the projections on load (``adapters.py``); the way back refuses such a config
    (the fold cannot be split)."""
    gate_bias_per_head: str | None = None
    """The model's key of a per-element gate's bias given once per head, (H,) (Beam's
    ``gate_bias``): the layer's ``g_proj.bias`` (H*D,) holds each head's entry repeated over its D
    coordinates (``grouped.py`` repeats it on load; on the way back the D copies of a weight must
    agree, and a gradient's are summed, ``grads=True``)."""
    all_kv_heads: bool = False
    """Every query head has its own key/value head, whatever the config says (Persimmon's
    attention reads no key/value head count; its fused ``query_key_value`` is the ``"falcon"``
    layout with g = 1)."""
    alibi: Callable[[Mapping[str, Any]], list[float] | None] | None = None
    """ALiBi's slopes (H,) from the config, as the model's code builds them (MPT's
    ``build_mpt_alibi_tensor``): the layer's ``alibi_slopes``; None: no ALiBi on this config."""
    v_head_dim: str | None = None
    """Config key of the values' head width Dv where it is not head_dim (MiMo-V2-Flash's
    ``v_head_dim``): the layer's ``v_head_dim``; v_proj gives H_kv*Dv, o_proj reads H*Dv."""
    value_scale: str | None = None
    """Config key of a constant the values are multiplied by before attention and the cache
    (MiMo-V2-Flash's ``attention_value_scale``; null: 1): the layer's ``value_scale``."""
    layer_kv_heads: Callable[[Mapping[str, Any], Family, int], int] | None = None
    """Layer i's key/value head count where the model's code gives it per layer (MiMo-V2-Flash:
    twice ``num_key_value_heads`` on its sliding layers); None: the config's count."""
    sliding_sinks: bool = False
    """Sinks on the sliding layers only (MiMo-V2-Flash), where ``sinks`` puts them on every
    layer."""
    differential: bool = False
    """Differential attention (DiffLlama): the layer's ``differential``, its lambda_init from
    the layer's depth (``lambda_init_from_depth(layer_idx)``), its weightless norm's eps the
    ``norm_eps`` key; parameters ``lambda_q1``, ``lambda_k1``, ``lambda_q2``, ``lambda_k2``."""
    chunk: Callable[[Mapping[str, Any], Family, int], int | None] | None = None
    """The chunk size of layer i's chunked attention (the layer's ``chunk_size``) as the model
    reads it from its config (Llama 4's ``attention_chunk_size`` on its ``chunked_attention``
    layers); None: no chunks on that layer."""
    qk_norm_rotating_only: bool = False
    """The QK-norm exists on the layers that rotate only (Llama 4: ``use_qk_norm and
    use_rope``); its NoPE layers have none."""
    value_norm: bool = False
    """A weightless RMSNorm over each head of v before attention, its eps the ``norm_eps`` key
    (Gemma 3n's and Gemma 4's ``v_norm``): the layer's ``value_norm``, on every layer that
    computes its own values."""
    kv_sharing: str | None = None
    """Config key of the count n of last layers that compute no keys or values (Gemma 3n's and
    Gemma 4's ``num_kv_shared_layers``): layer i >= num_hidden_layers - n attends with those of
    the last earlier layer of its own type (``kv_source``), and is the layer's ``kv_shared``;
    None: every layer computes its own."""
    layer_head_dim: Callable[[Mapping[str, Any], Family, int], int] | None = None
    """Layer i's head width where the model's code gives it per layer (Gemma 4's full layers:
    ``global_head_dim``, through its config's ``per_layer_config``); None: the config's
    ``head_dim``. The layer's RoPE reads it too (its rotated width, its frequencies)."""
    values_from_keys: Callable[[Mapping[str, Any], Family, int], bool] | None = None
    """Whether layer i has no v_proj and takes its values from k_proj's output (Gemma 4's full
    layers under ``attention_k_eq_v``): the layer's ``values_from_keys``; a KV-shared layer
    reads its source's values instead. None: never."""


# -- reading a row -------------------------------------------------------------------------------


def kv_source(config: Mapping[str, Any], family: Family, layer_idx: int) -> int | None:
    """The layer whose keys and values layer i attends with, under ``family.kv_sharing`` (as
    transformers' ``kv_sharing_modes`` decides it: the last layer of i's type before the n
    shared ones), or None when layer i computes its own."""
    config = class_view(config, family)
    key = family.kv_sharing
    count = 0 if key is None else config.get(key) or 0
    if count == 0:
        return None
    layers = validation.positive_int(
        "config['num_hidden_layers']", required(config, "num_hidden_layers")
    )
    count = validation.positive_int(f"config['{key}']", count)
    if count >= layers:
        raise ValueError(
            f"{key} is {count} but the model has {layers} layers: the shared layers need an "
            "earlier layer of each of their types to read the keys and values of"
        )
    first = layers - count
    kinds = [layer_kind(config, family, i) for i in range(layers)]
    if set(kinds[:first]) != set(kinds):
        raise ValueError(
            f"{key} is {count}: the shared layers {first}..{layers - 1} have types "
            f"{sorted(set(kinds[first:]))} but the layers before them {sorted(set(kinds[:first]))}"
            ": every shared layer needs an earlier layer of its type (as transformers requires)"
        )
    if layer_idx < first:
        return None
    return first - 1 - kinds[:first][::-1].index(kinds[layer_idx])


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


def check_kind(config: Mapping[str, Any], family: Family, name: str, layer_idx: int) -> None:
    """Refuses, by name, a layer that is not softmax attention (a hybrid's Mamba, convolution
    or recurrent layer, naming the attention layers) and a config the family refuses."""
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
        return SLIDING if flag(config, "use_sliding_window") and window else FULL
    layer_types = config.get("layer_types")
    if layer_types is None:
        if family.sliding == "smollm3":  # its config class: sliding NoPE layers under the flag
            window = flag(config, "use_sliding_window") and config.get("sliding_window") is not None
            return SLIDING if window and not rotates(config, family, layer_idx) else FULL
        fallback = family.fallback or (lambda config, layer_idx: False)
        return SLIDING if fallback(config, layer_idx) else FULL
    if layer_idx >= len(layer_types):
        raise ValueError(
            f"layer_idx is {layer_idx} but the config's layer_types has {len(layer_types)} entries"
        )
    kind = layer_types[layer_idx]
    if kind not in (FULL, SLIDING):
        raise ValueError(f"layer_types[{layer_idx}] is {kind!r}; supported: {FULL!r}, {SLIDING!r}")
    if family.sliding == "smollm3" and kind == SLIDING and not flag(config, "use_sliding_window"):
        raise ValueError(
            f"layer_types[{layer_idx}] is 'sliding_attention' but use_sliding_window is false: "
            "SmolLM 3's eager attention would slide (its mask follows layer_types) and its flash "
            "attention would not (its window follows the flag)"
        )
    return str(kind)


def class_view(config: Mapping[str, Any], family: Family) -> Mapping[str, Any]:
    """The config as the family's config class reads it: ``key_aliases`` under the model's
    names, ``config_defaults`` where it leaves a key out, ``derived`` keys computed,
    ``equal_keys`` and ``refused_keys`` checked."""
    for key, reason in family.refused_keys:
        if config.get(key) not in (None, False):
            raise ValueError(f"{key} is set: {reason}")
    if not (
        family.config_defaults
        or family.key_aliases
        or family.equal_keys
        or family.nested_keys
        or family.derived
    ):
        return config
    renamed = {new: config[old] for old, new in family.key_aliases if old in config}
    nested = {
        name: (config.get(outer) or {})[key]
        for outer, key, name in family.nested_keys
        if key in (config.get(outer) or {})
    }
    config = {**dict(family.config_defaults), **renamed, **config, **nested}
    if family.derived is not None:
        config = {**config, **family.derived(config)}
    for first, second in family.equal_keys:
        if config.get(first) != config.get(second):
            raise ValueError(
                f"{first} is {config.get(first)!r} but {second} is {config.get(second)!r}: the "
                f"{config.get('model_type')} model needs them equal"
            )
    return config


def rotates(config: Mapping[str, Any], family: Family, layer_idx: int) -> bool:
    """Whether layer i applies RoPE (False: a NoPE layer)."""
    return True if family.rotates is None else family.rotates(config, family, layer_idx)


# -- the options --------------------------------------------------------------------------------


def sizes(
    config: Mapping[str, Any], family: Family, layer_idx: int | None = None
) -> dict[str, int]:
    """hidden_size, num_heads, num_kv_heads and head_dim as the attention module takes them
    (and input_size where the family's attention reads another width, v_head_dim where its
    values are another width): layer ``layer_idx``'s query and key/value heads where the family
    has a count per layer (None: the config's ``num_attention_heads`` and
    ``num_key_value_heads``, all the RoPE code reads)."""
    config = class_view(config, family)
    hidden_size = required(config, "hidden_size")
    num_heads = required(config, "num_attention_heads")
    head_dim_heads = num_heads  # the width C // H reads the config's global count
    counts = None if family.heads_per_layer is None else config.get(family.heads_per_layer)
    if counts is not None and layer_idx is not None:
        num_heads = _layer_heads(counts, family.heads_per_layer, layer_idx)
    if family.layer_kv_heads is not None and layer_idx is not None:  # MiMo-V2-Flash
        num_kv_heads = family.layer_kv_heads(config, family, layer_idx)
    elif family.all_kv_heads:  # Persimmon: multi-head, no key/value head count read
        num_kv_heads = num_heads
    elif family.layout == "falcon":  # new decoder: num_kv_heads; old: one (multi-query) or all
        if flag(config, "new_decoder_architecture"):
            num_kv_heads = config.get("num_kv_heads") or num_heads
        else:
            num_kv_heads = 1 if flag(config, "multi_query", True) else num_heads
    elif family.multi_query:  # GPT-BigCode: its config class ignores num_key_value_heads
        num_kv_heads = 1 if flag(config, "multi_query", True) else num_heads
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
    input_size = hidden_size if family.input_size is None else family.input_size(config)
    head_dim = head_dim or input_size // head_dim_heads
    if family.layer_head_dim is not None and layer_idx is not None:  # Gemma 4's full layers
        head_dim = family.layer_head_dim(config, family, layer_idx)
    if family.heads_span_hidden and num_heads * head_dim != hidden_size:
        raise ValueError(
            f"num_attention_heads * head_dim is {num_heads} * {head_dim}, but a "
            f"{config.get('model_type')} o_proj takes hidden_size = {hidden_size} inputs"
        )
    shape = {
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
    }
    if family.input_size is not None:
        shape["input_size"] = input_size
    if family.v_head_dim is not None:  # MiMo-V2-Flash: values narrower than queries and keys
        shape["v_head_dim"] = validation.positive_int(
            f"config['{family.v_head_dim}']", required(config, family.v_head_dim)
        )
    return shape


def _layer_heads(counts: Any, key: Any, layer_idx: int) -> int:
    """Layer i's entry of a list of head counts (``Family.heads_per_layer``)."""
    if layer_idx >= len(counts):
        raise ValueError(
            f"layer_idx is {layer_idx} but the config's {key} has {len(counts)} entries"
        )
    return validation.positive_int(f"config['{key}'][{layer_idx}]", counts[layer_idx])


def options(
    config: Mapping[str, Any],
    family: Family,
    name: str,
    layer_idx: int,
    attention: Mapping[str, Any],
) -> dict[str, Any]:
    """The constructor keywords of the layer, RoPE's aside (``rope.rope_options``).

    Args:
        config: the config mapping.
        family: its row (families.py's ``FAMILIES[name]``).
        name: its model_type (``model_type(config)``).
        layer_idx: the layer.
        attention: the layer's attention entries in the layer's names (Qwen2's biases are read
            from them).
    """
    config = class_view(config, family)
    if family.bidirectional_flag and config.get("use_bidirectional_attention"):
        raise ValueError(
            f"use_bidirectional_attention is set: that {name} layer is not causal, and "
            "GroupedQueryAttention always is"
        )
    if family.layout == "falcon" and not family.all_kv_heads and config.get("alibi"):
        raise ValueError(
            "alibi is set: this Falcon adds ALiBi to its scores instead of rotating q and k "
            "(and scales after the bias); GroupedQueryAttention rotates"
        )
    options: dict[str, Any] = sizes(config, family, layer_idx)
    if family.bias == "<state>":  # q, k and v always carry a bias in Qwen2's code; no config key
        options["bias"] = "q_proj.bias" in attention
    else:
        options["bias"] = _bias(config, family.bias, family.bias_default)
    options["out_bias"] = _bias(config, family.out_bias, family.bias_default)
    options["window"] = _window(config, family, layer_idx)
    if family.attention_dropout:
        options["dropout"] = float(config.get("attention_dropout") or 0.0)
    if (
        family.qk_norm is not None
        and (family.qk_norm_flag is None or flag(config, family.qk_norm_flag))
        and (not family.qk_norm_rotating_only or rotates(config, family, layer_idx))
    ):
        norm_type, shape, offset = family.qk_norm
        options |= {"qk_norm": True, "qk_norm_type": norm_type, "qk_norm_shape": shape}
        options |= {
            "norm_weight_offset": offset,
            "norm_eps": float(required(config, family.norm_eps)),
        }
        if family.qk_norm_after_rope:
            options["qk_norm_position"] = "after_rope"
    if family.query_temperature is not None:
        temperature = family.query_temperature(config, family, layer_idx)
        if temperature is not None:
            options["query_temperature"] = temperature
    if family.scaling == "query_pre_attn_scalar":
        options["scaling"] = float(required(config, family.scaling)) ** -0.5
    elif family.scaling == "attention_multiplier":  # None: 1/sqrt(D) (HyperCLOVA X's default)
        multiplier = config.get(family.scaling, 1.0)
        options["scaling"] = None if multiplier is None else float(multiplier)
    elif family.scaling == "scale_attn_weights":  # false: scores q . k, without 1/sqrt(D)
        options["scaling"] = None if flag(config, family.scaling, True) else 1.0
    elif family.scaling == "unit":  # Gemma 3n, Gemma 4: scores q . k, the QK-norm in charge
        options["scaling"] = 1.0
    elif family.scaling == "half_head_dim":  # Zamba: (D / 2)^-0.5
        options["scaling"] = (options["head_dim"] / 2) ** -0.5
    elif family.scaling == "softmax_scale":  # MPT's attn_config entry; null: 1/sqrt(D)
        value = config.get(family.scaling)
        options["scaling"] = (
            None if value is None else validation.finite_real("attn_config.softmax_scale", value)
        )
    if family.key_multiplier is not None:  # k * m scores as q k^T * (m / sqrt(D))
        multiplier = config.get(family.key_multiplier)
        multiplier = 1.0 if multiplier is None else float(multiplier)
        options["scaling"] = multiplier * options["head_dim"] ** -0.5
    if family.softcap is not None:
        options["softcap"] = float(config.get(family.softcap) or 0.0)
    if family.sinks or (family.sliding_sinks and layer_kind(config, family, layer_idx) == SLIDING):
        options["sinks"] = True
    if family.value_scale is not None:  # null: no scale
        scale = config.get(family.value_scale)
        options["value_scale"] = (
            1.0
            if scale is None
            else validation.finite_real(f"config['{family.value_scale}']", scale)
        )
    if family.clip_qkv is not None and config.get(family.clip_qkv) is not None:
        options["clip_qkv"] = _clip(config, family.clip_qkv)
        options["clip_after_norm"] = family.clip_after_norm and options.get("qk_norm", False)
    if family.output_norm:
        options["output_norm"] = True
        options["output_norm_eps"] = float(required(config, family.norm_eps))
    gate = None if family.gate is None else family.gate(config)
    if gate is not None:
        kind, activation, gate_bias = gate
        options |= {"output_gate": kind, "gate_activation": activation, "gate_bias": gate_bias}
    slopes = None if family.alibi is None else family.alibi(config)
    if slopes is not None:
        options["alibi_slopes"] = slopes
    if family.differential:
        options["differential"] = True
        options["lambda_init"] = lambda_init_from_depth(layer_idx)
        options["differential_eps"] = float(required(config, family.norm_eps))
    chunk = None if family.chunk is None else family.chunk(config, family, layer_idx)
    if chunk is not None:
        options["chunk_size"] = chunk
    if kv_source(config, family, layer_idx) is not None:  # no keys or values of its own
        options["kv_shared"] = True
    else:
        if family.value_norm:
            options |= {"value_norm": True, "norm_eps": float(required(config, family.norm_eps))}
        if family.values_from_keys is not None and family.values_from_keys(
            config, family, layer_idx
        ):
            options["values_from_keys"] = True
    return options


def _clip(config: Mapping[str, Any], key: str) -> float:
    """The clamp's bound c, which must be a number > 0 (0 would zero q, k and v)."""
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"{key} is {value!r}: the clamp of q, k and v to [-{key}, {key}] needs a number > 0 "
            "(null for no clamp)"
        )
    return float(value)


def _bias(config: Mapping[str, Any], key: str | None, default: bool) -> bool:
    """Whether a projection has a bias: never (None), always (``"<always>"``), or as the config
    key says (``default`` where it is missing)."""
    if key is None or key == "<always>":
        return key is not None
    return flag(config, key, default)


def _window(config: Mapping[str, Any], family: Family, layer_idx: int) -> tuple[int, int] | None:
    """(W - 1, 0) on a sliding layer (Hugging Face's W counts the query itself), else None."""
    if layer_kind(config, family, layer_idx) == FULL:
        return None
    width = validation.positive_int("config['sliding_window']", required(config, "sliding_window"))
    return (width - 1, 0)
