"""What each Hugging Face decoder family's attention reads from its config, as transformers 5.23's
modeling code reads it: one ``Family`` row per ``model_type``, and the layer options (RoPE aside,
``rope.py``) it gives ``GroupedQueryAttention``. NumPy only; transformers is never imported.

A family row says where the biases come from, which layers slide (and the rule a config without
``layer_types`` gets from the model's own config class), the QK-norm (its kind, its shape, Gemma's
(1 + w)), the score scale, softcap and sinks, the RoPE layout (interleaved pairs, partial rotary,
per-layer-type parameters, NoPE layers) and the projections' layout (separate, or fused: Phi-3's
``qkv_proj``, Falcon's ``query_key_value``). The rows themselves live in ``rows/``, one module per
kind of family, each beside the rules it names; this module joins them into ``FAMILIES`` and
holds the multimodal wrappers. docs/hugging-face.md walks through every family.

Tests: tests/numpy_attention/hf/test_families.py, test_grouped.py; against transformers in
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import validation
from .family import Family, as_mapping, check_kind, kv_source, options
from .refused import REFUSED
from .rows import classic, fused, gated, hybrids, twists


def join_rows(*modules: Any) -> dict[str, Family]:
    """The rows of ``modules`` (each with a ``ROWS`` dict) in one dict; a model type with a row in
    two modules is a mistake that a plain merge would hide (the later row winning): it raises."""
    rows: dict[str, Family] = {}
    for module in modules:
        for name, row in module.ROWS.items():
            if name in rows:
                raise ValueError(f"model_type {name!r} has a row in two modules of rows/")
            rows[name] = row
    return rows


FAMILIES: dict[str, Family] = join_rows(classic, fused, hybrids, gated, twists)
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
    "llama4": (("llama4_text",), "language_model"),
    "gemma4": (("gemma4_text",), "language_model"),
    "gemma4_unified": (("gemma4_unified_text",), "language_model"),
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
