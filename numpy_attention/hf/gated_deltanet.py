"""Hugging Face gated DeltaNet -> ``GatedDeltaNet``: the linear-attention layers of Qwen3-Next and
Qwen3.5, the config read as the model reads it, the layer's weights found in any state dict,
NumPy only (transformers is never imported).

Models (``config["model_type"]``), each read from its transformers 5.23 model file:

- ``qwen3_next``: ``Qwen3NextGatedDeltaNet``, the fused projections ``in_proj_qkvz`` and
  ``in_proj_ba`` with their rows grouped per key head (``projections="fused"``).
- ``qwen3_5`` and ``qwen3_5_moe`` (multimodal wrappers: their ``text_config``, model_type
  ``qwen3_5_text`` / ``qwen3_5_moe_text``, is read, and the weights sit under
  ``model.language_model.``), and those text configs alone: ``Qwen3_5GatedDeltaNet``, four
  projections ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a`` in head order
  (``projections="split"``); the rest of the layer is Qwen3-Next's line for line.

Read from the config: ``hidden_size``; ``linear_num_key_heads``, ``linear_num_value_heads``,
``linear_key_head_dim``, ``linear_value_head_dim``, ``linear_conv_kernel_dim`` (defaults 16, 32,
128, 128, 4, the config classes'); ``rms_norm_eps`` (1e-6), the gated RMSNorm's eps; ``hidden_act``
("silu"), which the model applies after the convolution (only SiLU is taken); the layer kinds,
``layer_types`` or, without it, every ``full_attention_interval``-th layer (4) ``full_attention``
and the others ``linear_attention``, as the config classes fill them in. A ``full_attention``
layer is refused naming the linear ones (its softmax attention loads with ``grouped_from_hf``).
transformers' scale is always ``linear_key_head_dim ** -0.5`` (its torch path takes no other), the
L2 norm's eps 1e-6.

Derivation: docs/derivations/gated-deltanet-layer.md. Tests: against transformers in
tests/parity/test_hf_gated_deltanet.py; the reader's errors in
tests/numpy_attention/test_gated_deltanet.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import validation
from ..gated_deltanet import GatedDeltaNet
from .entries import checked_arrays, entries_under, layer_number, marked_prefixes
from .family import as_mapping

__all__ = ["SUPPORTED_MODEL_TYPES", "gated_deltanet_from_hf"]

_WRAPPERS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next")
# the config classes' defaults, the same in all three
_DEFAULTS = {
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}
_KEY = "A_log"  # one entry every gated DeltaNet layer has, whatever its projections
_EXPECTED_FORM = (
    "expected keys like 'model.layers.{i}.linear_attn.A_log', "
    "'model.language_model.layers.{i}.linear_attn.A_log' or 'A_log'"
)


def gated_deltanet_from_hf(
    config: Mapping[str, Any] | Any,
    state_dict: Mapping[str, Any],
    layer_idx: int = 0,
    *,
    form: str = "chunk",
    chunk_size: int = 64,
) -> GatedDeltaNet:
    """The NumPy layer of one Hugging Face gated DeltaNet layer, weights loaded, in eval mode.

    The torch twin is ``torch_attention.GatedDeltaNet(**layer.constructor_args())`` filled by
    ``torch_attention.from_numpy(twin, layer)``.

    Args:
        config: ``config.to_dict()`` of a supported model (a config object is read through its
            ``to_dict``), or its ``config.json`` as a mapping.
        state_dict: a whole model's state dict, a decoder layer's or the ``linear_attn``
            module's own (any prefix).
        layer_idx: the decoder layer, a ``linear_attention`` one.
        form: the core's form, ``"chunk"`` (transformers' prefill) or ``"recurrent"``.
        chunk_size: the core's chunk length.

    Returns:
        a ``GatedDeltaNet`` holding the weights, float64 when ``A_log`` is, else float32.

    Raises:
        ValueError: an unsupported ``model_type``, a config the layer cannot run (naming the
            field), a layer that is not ``linear_attention`` (naming what it is and the linear
            ones), weights whose shapes disagree with the config (naming the key and fields).
        KeyError: missing or unexpected keys under the layer's prefix, named.
    """
    fn = "gated_deltanet_from_hf"
    model_type, config = _text_config(as_mapping(config))
    layer_idx = validation.non_negative_int(f"{fn}: layer_idx", layer_idx)
    _check_layer(config, model_type, layer_idx)
    options = _layer_options(config, model_type) | {"form": form, "chunk_size": chunk_size}
    prefix, entries = _layer_entries(fn, state_dict, layer_idx)
    expected = _expected_shapes(options)
    arrays = checked_arrays(fn, prefix, entries, expected, f"{model_type} layer", _EXPECTED_FORM)
    layer = GatedDeltaNet(**options, rng=0)
    layer.astype(np.float64 if arrays[_KEY].dtype == np.float64 else np.float32)
    layer.load_state_dict(arrays)
    layer.eval()
    return layer


def _text_config(config: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The model_type checked, and the config the layer reads (a wrapper's ``text_config``)."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"gated_deltanet_from_hf: model_type {model_type!r} is not supported; supported: "
            f"{list(SUPPORTED_MODEL_TYPES)}"
        )
    if model_type not in _WRAPPERS:
        return str(model_type), config
    if config.get("text_config") is None:
        raise ValueError(f"the {model_type} config has no text_config, which holds its layers")
    text = as_mapping(config["text_config"])
    if text.get("model_type") != _WRAPPERS[model_type]:
        raise ValueError(
            f"the {model_type} config's text_config has model_type {text.get('model_type')!r}; "
            f"its language model is {_WRAPPERS[model_type]!r}"
        )
    return _WRAPPERS[model_type], text


def _get(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    return _DEFAULTS[key] if value is None else value


def layer_types(config: Mapping[str, Any]) -> list[str]:
    """Each decoder layer's kind as the config classes fill it in: ``layer_types``, else every
    ``full_attention_interval``-th layer (default 4) ``full_attention``, the rest
    ``linear_attention``."""
    if config.get("layer_types") is not None:
        return list(config["layer_types"])
    count = config.get("num_hidden_layers")
    if count is None:
        raise ValueError(
            "the config has neither 'layer_types' nor 'num_hidden_layers': which layers are "
            "gated DeltaNet is unknown"
        )
    interval = config.get("full_attention_interval") or 4
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(count)
    ]


def _check_layer(config: Mapping[str, Any], model_type: str, layer_idx: int) -> None:
    kinds = layer_types(config)
    if layer_idx >= len(kinds):
        raise ValueError(
            f"gated_deltanet_from_hf: layer_idx is {layer_idx} but this {model_type} model has "
            f"{len(kinds)} layers"
        )
    if kinds[layer_idx] != "linear_attention":
        linear = [i for i, kind in enumerate(kinds) if kind == "linear_attention"]
        raise ValueError(
            f"gated_deltanet_from_hf: layer {layer_idx} of this {model_type} model is "
            f"{kinds[layer_idx]!r}, not a gated DeltaNet ('linear_attention') layer; its "
            f"linear_attention layers are {linear} (a full_attention layer loads with "
            "grouped_from_hf)"
        )


def _layer_options(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The constructor keywords of the layer (form and chunk size aside)."""
    if config.get("hidden_size") is None:
        raise ValueError(f"the config has no 'hidden_size', which a {model_type} layer needs")
    activation = _get(config, "hidden_act")
    if activation != "silu":
        raise ValueError(
            f"the config's hidden_act is {activation!r}: the model applies it after the short "
            "convolution, and GatedDeltaNet's convolution takes SiLU alone"
        )
    sizes = {
        name: int(_get(config, key))
        for name, key in (
            ("num_k_heads", "linear_num_key_heads"),
            ("num_v_heads", "linear_num_value_heads"),
            ("head_k_dim", "linear_key_head_dim"),
            ("head_v_dim", "linear_value_head_dim"),
            ("conv_kernel_size", "linear_conv_kernel_dim"),
        )
    }
    if sizes["num_v_heads"] % sizes["num_k_heads"]:
        raise ValueError(
            f"linear_num_value_heads ({sizes['num_v_heads']}) must be a multiple of "
            f"linear_num_key_heads ({sizes['num_k_heads']}): each key head serves "
            "linear_num_value_heads // linear_num_key_heads value heads"
        )
    return {
        "hidden_size": int(config["hidden_size"]),
        **sizes,
        "projections": "fused" if model_type == "qwen3_next" else "split",
        "norm_eps": float(_get(config, "rms_norm_eps")),
    }


def _layer_entries(
    fn: str, state_dict: Mapping[str, Any], layer_idx: int
) -> tuple[str, dict[str, Any]]:
    """The prefix before ``A_log`` for layer_idx, and the entries under it (prefix removed): the
    only one, or the one numbered layer_idx."""
    prefixes = marked_prefixes(fn, state_dict, _KEY, _EXPECTED_FORM)
    numbers = {prefix: layer_number(prefix) for prefix in prefixes}
    if len(prefixes) == 1 and numbers[prefixes[0]] in (None, layer_idx):
        prefix = prefixes[0]
    else:
        chosen = [prefix for prefix in prefixes if numbers[prefix] == layer_idx]
        if len(chosen) != 1:
            shown = ", ".join(f"'{prefix}{_KEY}'" for prefix in prefixes[:3])
            raise KeyError(
                f"{fn}: the state dict holds {len(prefixes)} gated DeltaNet layers ({shown}"
                f"{', ...' if len(prefixes) > 3 else ''}) and {len(chosen)} of them numbered "
                f"layer_idx {layer_idx}; {_EXPECTED_FORM}"
            )
        prefix = chosen[0]
    return prefix, entries_under(state_dict, prefix)


def _expected_shapes(options: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """The layer's state dict for these options: name -> (shape, the config fields making it)."""
    c = options["hidden_size"]
    hk, hv = options["num_k_heads"], options["num_v_heads"]
    kd, vd = hk * options["head_k_dim"], hv * options["head_v_dim"]
    keys = "linear_num_key_heads * linear_key_head_dim"
    values = "linear_num_value_heads * linear_value_head_dim"
    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    if options["projections"] == "fused":
        shapes["in_proj_qkvz.weight"] = (
            (2 * kd + 2 * vd, c),
            f"2 {keys} + 2 {values}, hidden_size",
        )
        shapes["in_proj_ba.weight"] = ((2 * hv, c), "2 linear_num_value_heads, hidden_size")
    else:
        shapes["in_proj_qkv.weight"] = ((2 * kd + vd, c), f"2 {keys} + {values}, hidden_size")
        shapes["in_proj_z.weight"] = ((vd, c), f"{values}, hidden_size")
        shapes["in_proj_b.weight"] = ((hv, c), "linear_num_value_heads, hidden_size")
        shapes["in_proj_a.weight"] = ((hv, c), "linear_num_value_heads, hidden_size")
    shapes["conv1d.weight"] = (
        (2 * kd + vd, 1, options["conv_kernel_size"]),
        f"2 {keys} + {values}, 1, linear_conv_kernel_dim",
    )
    shapes["dt_bias"] = ((hv,), "linear_num_value_heads")
    shapes[_KEY] = ((hv,), "linear_num_value_heads")
    shapes["norm.weight"] = ((options["head_v_dim"],), "linear_value_head_dim")
    shapes["out_proj.weight"] = ((c, vd), f"hidden_size, {values}")
    return shapes
