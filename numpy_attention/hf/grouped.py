"""Hugging Face decoder attention -> ``GroupedQueryAttention`` and back: the config read as the
model reads it, the attention weights found in any state dict, fused projections split on load
and joined on save, NumPy only (transformers is never imported).

Models (``config["model_type"]``): ``families.SUPPORTED_MODEL_TYPES`` and
``families.WRAPPERS``, 105 model types (Llama, Mistral, the Qwens, the Gemmas, GPT-OSS, Phi,
OLMo, Cohere, Granite, GLM, Falcon and their
relatives; the hybrids' softmax layers). What each family's code reads is one row of
``families.FAMILIES``; RoPE is ``rope.py``'s, the fused projections ``layouts.py``'.

- Clip and output norm: ``clip_qkv`` clamps q, k and v (OLMo, DBRX; OLMoE after its QK-norm);
  BitNet's ``attn_sub_norm`` is the layer's output norm, an RMSNorm of the merged heads.
- Differential attention (DiffLlama): the layer's ``differential``, lambda_init from the layer's
  depth, the weightless norm's eps ``rms_norm_eps``, ``lambda_q1`` ... ``lambda_k2`` loaded
  under their names; ``attention_dropout`` and an odd key/value head count refused by key.
- Sizes: ``head_dim`` where the config has it (Cohere 2 and Falcon: always C // H), else the
  config class's default (``Family.config_defaults``: 256 for the Gemmas, 128 for several), else
  ``hidden_size // num_attention_heads``; ``num_key_value_heads`` (None: multi-head; Falcon:
  ``num_kv_heads`` in its new decoder architecture, one with ``multi_query``); MiMo-V2-Flash's
  values are ``v_head_dim`` wide and scaled by ``attention_value_scale`` (the layer's
  ``v_head_dim`` and ``value_scale``), its sliding layers have twice the key/value heads and
  sinks.
- Biases: the family's config key (``attention_bias``, ``qkv_bias``, ``use_bias``, ``bias``)
  on its projections; Qwen2 has no key and biases on q, k and v only: read from the state dict.
- QK-norm: RMSNorm per head (Qwen3, Qwen3-MoE), per head with Gemma's (1 + w) (Gemma 3), over
  the whole projection (OLMo 2), or a bias-free LayerNorm with a weight per head (Cohere, under
  ``use_qk_norm``), or a LayerNorm with a bias per head (Persimmon's ``qk_layernorm``: the
  ``q_norm.bias`` and ``k_norm.bias`` of ``qk_norm_type="layer_bias"``), before RoPE; after
  RoPE in Hunyuan (RMSNorm per head) and nanochat (a weightless RMSNorm).
- Sliding windows: ``layer_types[layer_idx]``, else the family's own rule; Mistral, Phi-3 and
  StarCoder 2 slide on every layer when ``sliding_window`` is set, Qwen3-MoE under
  ``use_sliding_window``. Hugging Face's ``sliding_window = W`` lets a query see W keys, itself
  included (``kv > q - W``), so ``window = (W - 1, 0)``.
- Chunks: Llama 4's RoPE layers attend in chunks of ``attention_chunk_size`` keys
  (``layer_types``' ``chunked_attention``; ``Family.chunk``), the layer's ``chunk_size``, each
  left-padded sequence's chunks counted from its first real token as transformers counts them.
- Output gates before o_proj (``Family.gate``): sigmoid per element in Qwen3-Next and Qwen3.5
  (carried in q_proj: the ``"q_gate"`` layout splits it into ``g_proj``), AFMoE and HRM-Text
  (``gate_proj``), sigmoid per head in LFM3, softplus per head or per element in Laguna (whose
  query heads may differ per layer); Beam's sigmoid per element has a bias per head
  (``gate_bias`` (H,), repeated over each head's D on load; on the way back a weight's D copies
  must agree and a gradient's are summed, ``grads=True``).
- Scores: Gemma 2/3 scale by ``query_pre_attn_scalar ** -0.5``, Granite by
  ``attention_multiplier``, Zamba and Zamba2 by ``(head_dim / 2) ** -0.5``; Gemma 2 caps them
  (``attn_logit_softcapping``); GPT-OSS has sinks.
- Input width: Zamba's and Zamba2's shared attention reads 2 * hidden_size features (the hidden
  states concatenated with the embeddings): the layer's ``input_size``. Zamba2's per-layer LoRA
  adapters on q, k and v are folded into the layer's projections (``adapters.py``); the way
  back refuses such a config.
- RoPE: half-split pairs (``rotate_half``), interleaved in Cohere 1/2 and GLM; a partial
  rotary width in Phi-3 and GLM (``partial_rotary_factor``); NoPE layers in SmolLM 3
  (``no_rope_layers``) and Cohere 2 (its full layers); one RoPE per layer type in Gemma 3;
  nanochat's pairs turn by -angle (the frequencies negated); Ministral 3 scales its queries by
  Llama 4's temperature of the position after RoPE; Beam's layer types whose
  ``rope_parameters`` entry is null are NoPE and scale theirs by (1 + (p + 1) / 2048) ** 0.1.
  ``rope_parameters`` (transformers 5), or ``rope_theta`` and ``rope_scaling`` (a transformers
  4 ``config.json``), of type ``default``, ``linear``, ``llama3``, ``yarn``, ``proportional``
  (LFM3) or ``longrope``
  (the layer switches to the long frequencies per call, as the model does). For exactly the
  model's frequencies pass them as ``inv_freq=`` (and ``long_inv_freq=``): used as given.

A multimodal wrapper's config (Gemma 3's) is read through its ``text_config``, and its state
dict through the entries under ``language_model.`` (``families.WRAPPERS``).

The padding convention differs too, at call time: Hugging Face's ``attention_mask`` is 1 = keep,
the layer's ``key_padding_mask`` is True = padding; with left padding each row's positions start
at its first real token. ``padding_from_hf`` turns one into the other.
docs/hugging-face.md walks through each model.

Tests: tests/numpy_attention/hf/test_grouped.py; against transformers in
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import validation
from ..differential import LAMBDA_NAMES
from ..gate import gate_width
from ..grouped import GroupedQueryAttention
from ..module import _to_numpy
from .adapters import fold_adapters
from .entries import layer_entries
from .families import (
    FAMILIES,
    check_layer,
    language_model,
    language_model_entries,
    layer_options,
    model_type,
)
from .family import ATTENTION, Family, as_mapping, class_view, flag, kv_source, sizes
from .layouts import ANCHORS, expected_form, hf_shapes, join, split
from .rope import rope_options

__all__ = [
    "grouped_from_hf",
    "hf_attention_state",
    "hf_attention_state_from_grouped",
    "padding_from_hf",
]

# -- the attention weights of one layer -------------------------------------------------------


def hf_attention_state(state_dict: Mapping[str, Any], *, layer_idx: int = 0) -> dict[str, Any]:
    """The attention entries of one layer, named as the attention module names them.

    The prefix is whatever precedes the attention's first projection (``q_proj.weight``, or the
    fused ``qkv_proj.weight`` of Phi-3, ``query_key_value.weight`` of Falcon and ``Wqkv.weight``
    of DBRX): none for an
    attention module's own state dict, ``self_attn.`` for a decoder layer's,
    ``model.layers.{i}.self_attn.`` for a whole model's, where ``layer_idx`` chooses i. Entries
    outside the prefix (embeddings, MLPs, other layers) are left out; every entry under it is
    returned, expected or not.

    Args:
        state_dict: name -> array-like (NumPy arrays, torch tensors, ...).
        layer_idx: the layer to take from a state dict that holds several; a dict that holds one
            layer under a numbered prefix must hold this one.

    Returns:
        ``{"q_proj.weight": ..., ...}``, the values as given (not copied or converted).

    Raises:
        KeyError: no attention projection at all, or none for ``layer_idx``, naming the
            expected key form.
        ValueError: a one-layer dict whose prefix names another layer than ``layer_idx``.
    """
    anchors = [
        anchor
        for anchor in ANCHORS.values()
        if isinstance(state_dict, Mapping)
        and any(key == anchor or key.endswith("." + anchor) for key in state_dict)
    ]
    anchor = anchors[0] if len(anchors) == 1 else ANCHORS["separate"]
    layout = next(name for name, value in ANCHORS.items() if value == anchor)
    return _attention_entries("hf_attention_state", state_dict, layer_idx, layout)[1]


def _attention_entries(
    fn: str, state_dict: Mapping[str, Any], layer_idx: Any, layout: str = "separate"
) -> tuple[str, dict[str, Any]]:
    """``hf_attention_state``'s work for the projections' ``layout``: the prefix found and the
    entries under it."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"{fn}: state_dict must be a mapping, got {type(state_dict).__name__}")
    layer_idx = validation.non_negative_int(f"{fn}: layer_idx", layer_idx)
    anchor = ANCHORS[layout]
    if not any(key == anchor or key.endswith("." + anchor) for key in state_dict):
        _check_adapters(fn, state_dict)  # LoRA's base_layer hides the anchor: say so first
    prefix, entries = layer_entries(
        fn, state_dict, anchor, layer_idx, layers="attention layers", hint=expected_form(layout)
    )
    _check_adapters(fn, {prefix + key: value for key, value in entries.items()})
    return prefix, entries


def _check_adapters(fn: str, state_dict: Mapping[str, Any]) -> None:
    """PEFT's unmerged LoRA adapters (``qkv_proj.base_layer.weight``, ``qkv_proj.lora_A.<name>.
    weight``: Phi-4-multimodal's speech and vision adapters) change the projections by
    ``scaling * B A``, whose scaling lives in the adapter's own config, not in the state dict:
    refused by name rather than read as the base weights alone."""
    pattern = re.compile(r"(?:^|\.)(?:base_layer|lora_[AB]|lora_embedding_[AB])\.")
    found = sorted(key for key in state_dict if pattern.search(key))
    if found:
        raise ValueError(
            f"{fn}: the state dict holds unmerged LoRA adapters ('{found[0]}', {len(found)} "
            "entries): the layer has no adapters; merge them into the base weights (PEFT's "
            "merge_and_unload, with the adapter meant) or pass the base model's state dict"
        )


# -- the layer ---------------------------------------------------------------------------------


def grouped_from_hf(
    config: Mapping[str, Any] | Any,
    state_dict: Mapping[str, Any],
    *,
    layer_idx: int = 0,
    inv_freq: Any = None,
    long_inv_freq: Any = None,
) -> GroupedQueryAttention:
    """The NumPy layer of one Hugging Face attention layer, weights loaded, in eval mode.

    Everything is read from the config as the model reads it (module docstring); fused
    projections (Phi-3's ``qkv_proj``, Falcon's ``query_key_value``, DBRX's ``Wqkv``) are split
    into the layer's q_proj, k_proj and v_proj. The layer's dtype is float64 when the weights
    are float64 and float32 otherwise (float16 and bfloat16 weights are computed in float32).
    Every check runs before the layer is built.

    Args:
        config: ``config.to_dict()`` of a supported model (a config object with ``to_dict`` is
            read through it), or the mapping of its ``config.json``.
        state_dict: the attention's state dict with any prefix (``hf_attention_state``): a whole
            model's, a decoder layer's or the attention module's own.
        layer_idx: which layer: its weights in a whole model's state dict, and its type (sliding
            or full attention, RoPE or NoPE, its RoPE parameters) in the config.
        inv_freq: (R/2,) RoPE frequencies, used as given, e.g. the model's own float32
            ``rotary_emb.inv_freq`` (Gemma 3: the layer type's,
            ``rotary_emb.sliding_attention_inv_freq``); None computes them from the config
            (``hf_inv_freq``). Ignored on a NoPE layer.
        long_inv_freq: LongRoPE's long frequencies, used as given; None computes them (PhiMoE,
            which keeps its short frequencies at every length, never uses them).

    Returns:
        a ``GroupedQueryAttention`` holding the weights, in eval mode.

    Raises:
        ValueError: an unsupported ``model_type`` (naming the supported ones) or RoPE type, a
            config the layer cannot express, a layer_idx past ``num_hidden_layers``, weights of
            shapes other than the config's.
        KeyError: missing or unexpected attention keys, named with the prefix found.
    """
    fn = "grouped_from_hf"
    config = as_mapping(config)
    state_dict = language_model_entries(config, state_dict)
    config = language_model(config)
    name = model_type(config)
    family = FAMILIES[name]
    layout = family.layout
    layer_idx = validation.non_negative_int(f"{fn}: layer_idx", layer_idx)
    check_layer(config, name, layer_idx)
    shared = kv_source(config, family, layer_idx) is not None
    num_layers = class_view(config, family).get("num_hidden_layers")  # GPT-BigCode: n_layer
    if num_layers is not None and layer_idx >= num_layers:
        raise ValueError(
            f"{fn}: layer_idx is {layer_idx} but the config has num_hidden_layers = {num_layers}"
        )
    prefix, attention = _attention_entries(fn, state_dict, layer_idx, layout)
    if shared:  # a checkpoint keeps a KV-shared layer's unused k, v and norms; the model drops them
        attention = {key: value for key, value in attention.items() if not key.startswith(_UNUSED)}
    if family.adapters is not None and flag(config, family.adapters):
        attention = _with_adapters_folded(fn, config, family, layer_idx, prefix, attention)
    options = layer_options(config, name, layer_idx, attention)
    options |= rope_options(config, layer_idx, inv_freq, long_inv_freq)
    expected = _model_shapes(
        family, hf_shapes(layout, _expected_shapes(options)), options["num_heads"]
    )
    _check_keys(attention, expected, prefix, layout)
    arrays = {key: _to_numpy(value) for key, value in attention.items()}
    for key, shape in expected.items():
        if arrays[key].shape != shape:
            raise ValueError(
                f"{fn}: {key} has shape {arrays[key].shape}, but the config "
                f"({_sizes(options)}) gives {shape}"
            )
        validation.float_array(f"{fn}: {key}", arrays[key])

    arrays = _layer_names(
        family,
        split(layout, arrays, options["num_heads"], options["num_kv_heads"]),
        options["head_dim"],
    )
    dtype = np.float64 if arrays["q_proj.weight"].dtype == np.float64 else np.float32
    layer = GroupedQueryAttention(**options, rng=0)
    layer.astype(dtype)
    layer.load_state_dict(arrays)
    layer.eval()
    return layer


def hf_attention_state_from_grouped(
    config: Mapping[str, Any] | Any,
    state_dict: Mapping[str, Any],
    *,
    layer_idx: int = 0,
    grads: bool = False,
) -> dict[str, np.ndarray]:
    """The layer's state dict (or gradients, ``named_grads()``) in the model's attention layout:
    ``grouped_from_hf``'s way back. The names are the attention module's own (no prefix);
    q, k and v are joined where the model fuses them (Phi-3's ``qkv_proj``, Falcon's
    ``query_key_value``, whose ``o_proj`` is ``dense``, DBRX's ``Wqkv``, whose ``o_proj`` is
    ``out_proj``), q and the output gate where q_proj carries the gate (Qwen3-Next's, Qwen3.5's
    ``q_proj``); the other families keep the names (renamed where the model's differ:
    ``gate_proj``, ``out_proj``, BitNet's ``attn_sub_norm`` is the layer's ``o_norm``, ...).

    Args:
        config: the model's config (as for ``grouped_from_hf``).
        state_dict: the layer's names -> arrays: ``q_proj.weight`` (H*D, C), ``k_proj.weight``
            and ``v_proj.weight`` (H_kv*D, C), ``o_proj.weight``, and whatever else the layer
            has (biases, norms, sinks, the gate's ``g_proj``, DiffLlama's lambdas), passed
            through.
        layer_idx: the layer, whose query heads the config may give per layer (Laguna).
        grads: ``state_dict`` holds gradients (``named_grads()``), not weights. It matters only
            where one model parameter is several of the layer's: Beam's per-head ``gate_bias``
            (H,) is g_proj's bias (H*D,) repeated over each head, so a weight's D copies must be
            equal (one is kept) and a gradient's are summed (the chain rule).

    Returns:
        the model's names -> fresh NumPy arrays (copies).

    Raises:
        KeyError: a projection missing, or a bias on some of q, k, v only where they are fused.
        ValueError: projections of other shapes than the config's; a per-head bias whose D
            copies differ (not ``grads``).
    """
    fn = "hf_attention_state_from_grouped"
    config = language_model(as_mapping(config))
    name = model_type(config)
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"{fn}: state_dict must be a mapping, got {type(state_dict).__name__}")
    family = FAMILIES[name]
    layer_idx = validation.non_negative_int(f"{fn}: layer_idx", layer_idx)
    if family.adapters is not None and flag(config, family.adapters):
        raise ValueError(
            f"{fn}: {family.adapters} is set: grouped_from_hf folded the layer's LoRA adapters "
            "into q_proj, k_proj and v_proj (W + B A), which cannot be split back into the "
            "shared W and the layer's A and B"
        )
    shape = sizes(config, family, layer_idx)
    shared = kv_source(config, family, layer_idx) is not None
    arrays = {key: np.array(_to_numpy(value)) for key, value in state_dict.items()}
    h, h_kv, d, c = (
        shape["num_heads"],
        shape["num_kv_heads"],
        shape["head_dim"],
        shape["hidden_size"],
    )
    c_in = shape.get("input_size", c)  # Zamba's shared attention reads 2 * hidden_size
    dv = shape.get("v_head_dim", d)  # MiMo-V2-Flash's values are narrower
    expected: dict[str, tuple[int, ...]] = {
        "q_proj.weight": (h * d, c_in),
        "k_proj.weight": (h_kv * d, c_in),
        "v_proj.weight": (h_kv * dv, c_in),
        "o_proj.weight": (c, h * dv),
    }
    if shared:  # a KV-shared layer has no key or value projection
        del expected["k_proj.weight"], expected["v_proj.weight"]
    elif layer_options(config, name, layer_idx, arrays).get("values_from_keys"):
        del expected["v_proj.weight"]  # Gemma 4's full layers: the values are k_proj's
    fused = {"separate": (), "q_gate": ("q_proj", "g_proj")}.get(
        family.layout, ("q_proj", "k_proj", "v_proj")
    )
    if family.layout == "q_gate":  # the gate is half of the model's q_proj
        expected["g_proj.weight"] = (h * d, c)
    if family.gate_bias_per_head:  # Beam: one bias per head, repeated over its D in the layer
        expected["g_proj.bias"] = (h * d,)
    missing = [key for key in expected if key not in arrays]
    biases = [f"{proj}.bias" for proj in fused]  # fused: their biases are one entry
    if any(key in arrays for key in biases):
        missing += [key for key in biases if key not in arrays]
    if missing:
        raise KeyError(
            f"{fn}: missing keys {missing} of a {name} layer's state dict (where projections "
            "are fused, their biases go together)"
        )
    for key, want in expected.items():
        if arrays[key].shape != want:
            raise ValueError(
                f"{fn}: {key} has shape {arrays[key].shape}, but the config "
                f"({_sizes(shape)}) gives {want}"
            )
    joined = join(family.layout, arrays, h, h_kv)
    return _model_names(family, joined, head_bias=lambda bias: _head_bias(bias, h, d, grads))


def _head_bias(bias: np.ndarray, heads: int, head_dim: int, grads: bool) -> np.ndarray:
    """g_proj's bias (H*D,) as the model's per-head bias (H,): a gradient summed over each
    head's D coordinates, a weight's one value per head, which its D copies must all hold."""
    rows = bias.reshape(heads, head_dim)
    if grads:
        return rows.sum(axis=-1)
    differ = np.flatnonzero((rows != rows[:, :1]).any(axis=-1))
    if differ.size:
        raise ValueError(
            "hf_attention_state_from_grouped: g_proj.bias differs within head "
            f"{int(differ[0])} ({differ.size} of {heads} heads): the model's gate bias is one "
            "value per head, repeated over its head_dim coordinates, so the layer's must be too "
            "(for gradients, pass grads=True: they are summed)"
        )
    return rows[:, 0].copy()


def _with_adapters_folded(
    fn: str,
    config: Mapping[str, Any],
    family: Family,
    layer_idx: int,
    prefix: str,
    attention: Mapping[str, Any],
) -> dict[str, Any]:
    """The entries with the layer's LoRA adapters folded into q, k and v (``adapters.py``): the
    k-th attention layer of the family's ``mixers`` uses slot k."""
    kinds = [] if family.mixers is None else family.mixers(config)
    slot = kinds[:layer_idx].count(ATTENTION)
    arrays = {key: _to_numpy(value) for key, value in attention.items()}
    try:
        return fold_adapters(arrays, slot)
    except KeyError as error:
        raise KeyError(f"{fn}: under the prefix '{prefix}', {error.args[0]}") from None
    except ValueError as error:
        raise ValueError(f"{fn}: {prefix}{error}") from None


# -- the model's module names (LFM2's out_proj, StableLM's per-head norms) -------------------


def _model_shapes(
    family: Family, shapes: Mapping[str, tuple[int, ...]], heads: int
) -> dict[str, tuple[int, ...]]:
    """The layer's entries and shapes under the model's names (``_model_names``)."""
    return _model_names(
        family,
        shapes,
        per_head=lambda shape: [shape[1:]] * shape[0],
        head_bias=lambda shape: (heads,),
    )


def _model_names(
    family: Family, state: Mapping[str, Any], per_head: Any = list, head_bias: Any = None
) -> dict[str, Any]:
    """The layer's entries under the model's names: ``family.renames`` applied, a per-head
    norm (H, D) split by ``per_head`` into one (D,) entry per head (StableLM), g_proj's bias
    made the model's per-head bias by ``head_bias`` (Beam's ``gate_bias``)."""
    to_model = {layer: model for model, layer in family.renames}
    out: dict[str, Any] = {}
    for key, value in state.items():
        if family.gate_bias_per_head and key == "g_proj.bias":
            out[family.gate_bias_per_head] = head_bias(value)
            continue
        module, _, kind = key.partition(".")
        name = to_model.get(module, module)
        if family.norms_per_head_modules and module in ("q_norm", "k_norm"):
            out |= {f"{name}.norms.{h}.{kind}": row for h, row in enumerate(per_head(value))}
        else:
            out[name + key[len(module) :]] = value
    return out


def _layer_names(
    family: Family, state: Mapping[str, np.ndarray], head_dim: int
) -> dict[str, np.ndarray]:
    """``_model_names``' inverse: the model's entries under the layer's names, per-head norms
    stacked in head order (the caller has checked that every head is there), a per-head gate
    bias (H,) repeated over each head's ``head_dim`` coordinates into g_proj's (H*D,)."""
    to_layer = dict(family.renames)
    out: dict[str, np.ndarray] = {}
    heads: dict[str, list[tuple[int, np.ndarray]]] = {}
    for key, value in state.items():
        if family.gate_bias_per_head and key == family.gate_bias_per_head:
            out["g_proj.bias"] = np.repeat(value, head_dim)
            continue
        module, _, rest = key.partition(".")
        name = to_layer.get(module, module)
        if family.norms_per_head_modules and rest.startswith("norms."):
            head, _, kind = rest.removeprefix("norms.").partition(".")
            heads.setdefault(f"{name}.{kind}", []).append((int(head), value))
        else:
            out[name + key[len(module) :]] = value
    for key, rows in heads.items():
        out[key] = np.stack([row for _, row in sorted(rows, key=lambda pair: pair[0])])
    return out


# -- padding ------------------------------------------------------------------------------------


def padding_from_hf(attention_mask: Any, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Hugging Face's ``attention_mask`` as the layer's ``key_padding_mask`` and RoPE positions.

    Hugging Face marks the tokens to keep with 1; the layer's mask marks padding with True, so
    ``key_padding_mask = attention_mask == 0``. With left padding each row's first real token is
    at position 0: positions are ``cumsum(attention_mask) - 1`` (0 on the padding, whose queries
    see nothing), as ``generate`` computes them.

    Args:
        attention_mask: (B, M) of 0 and 1 (or bool), over every token so far (the cached ones
            and this call's), as ``generate`` passes it.
        n: the number of this call's tokens, the last n of the M; None for all M (no cache).

    Returns:
        ``key_padding_mask`` bool (B, M) and ``positions`` int (B, n).
    """
    mask = _to_numpy(attention_mask)
    if mask.ndim != 2 or mask.dtype.kind not in "biu" or not np.isin(mask, (0, 1)).all():
        raise ValueError(
            "attention_mask must be (B, M) of 0 (padding) and 1 (keep), got shape "
            f"{mask.shape} and dtype {mask.dtype}"
        )
    m = mask.shape[1]
    n = m if n is None else validation.non_negative_int("n", n)
    if n > m:
        raise ValueError(f"n = {n} new tokens, but attention_mask covers only M = {m}")
    keep = mask.astype(np.bool_)
    positions = np.maximum(np.cumsum(keep, axis=1) - 1, 0)  # (B, M)
    return ~keep, positions[:, m - n :]


# -- checks -------------------------------------------------------------------------------------


def _expected_shapes(options: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The attention module's state dict for these options: name -> shape."""
    c, h, h_kv, d = (
        options["hidden_size"],
        options["num_heads"],
        options["num_kv_heads"],
        options["head_dim"],
    )
    c_in = options.get("input_size", c)
    dv = options.get("v_head_dim", d)  # the values' head width (MiMo-V2-Flash's narrower)
    shapes: dict[str, tuple[int, ...]] = {
        "q_proj.weight": (h * d, c_in),
        "k_proj.weight": (h_kv * d, c_in),
        "v_proj.weight": (h_kv * dv, c_in),
        "o_proj.weight": (c, h * dv),
    }
    if options["bias"]:
        shapes |= {"q_proj.bias": (h * d,), "k_proj.bias": (h_kv * d,), "v_proj.bias": (h_kv * dv,)}
    if options["out_bias"]:
        shapes["o_proj.bias"] = (c,)
    if options.get("qk_norm") and options.get("qk_norm_type") != "rms_weightless":
        shapes |= {
            "q_norm.weight": _norm_shape(options.get("qk_norm_shape", "head"), h, d),
            "k_norm.weight": _norm_shape(options.get("qk_norm_shape", "head"), h_kv, d),
        }
        if options.get("qk_norm_type") == "layer_bias":  # nn.LayerNorm's bias, as its weight
            shapes |= {
                "q_norm.bias": shapes["q_norm.weight"],
                "k_norm.bias": shapes["k_norm.weight"],
            }
    if options.get("sinks"):
        shapes["sinks"] = (h,)
    if options.get("output_norm"):
        shapes["o_norm.weight"] = (h * dv,)
    if options.get("differential"):  # DiffLlama's lambdas
        shapes |= {name: (d,) for name in LAMBDA_NAMES}
    if options.get("output_gate"):
        width = gate_width(options["output_gate"], h, dv)
        shapes["g_proj.weight"] = (width, c)
        if options.get("gate_bias"):
            shapes["g_proj.bias"] = (width,)
    if options.get("kv_shared"):  # its keys and values are another layer's
        shapes = {key: shape for key, shape in shapes.items() if not key.startswith(_UNUSED)}
    if options.get("values_from_keys"):  # Gemma 4's full layers: no v_proj
        shapes = {key: shape for key, shape in shapes.items() if not key.startswith("v_proj.")}
    return shapes


_UNUSED = ("k_proj.", "v_proj.", "k_norm.", "v_norm.")  # a KV-shared layer's (Gemma 3n)


def _norm_shape(shape: str, heads: int, head_dim: int) -> tuple[int, ...]:
    """The QK-norm weight's shape, as ``GroupedQueryAttention`` makes it."""
    if shape == "per_head":
        return (heads, head_dim)
    return (heads * head_dim,) if shape == "all" else (head_dim,)


def _sizes(options: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{name}={options[name]}"
        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "v_head_dim")
        if name in options
    )


def _check_keys(
    attention: Mapping[str, Any],
    expected: Mapping[str, tuple[int, ...]],
    prefix: str,
    layout: str,
) -> None:
    missing = [prefix + name for name in expected if name not in attention]
    unexpected = sorted(prefix + name for name in attention if name not in expected)
    if missing or unexpected:
        raise KeyError(
            f"grouped_from_hf: missing keys {missing}, unexpected keys {unexpected} for this "
            f"config's attention ({sorted(expected)} under the prefix '{prefix}'); "
            f"{expected_form(layout)}"
        )
