"""Hugging Face MiniMax lightning attention -> ``LightningAttention``: the config read as the model
reads it, the layer's weights found in a whole model's state dict, NumPy only (transformers is
never imported).

Model (``config["model_type"]``), read from transformers 5.23's ``modeling_minimax.py``:

- ``minimax`` (MiniMax-Text-01): ``layer_types`` says which layers are ``"linear_attention"``
  (``MiniMaxLightningAttention``, read here) and which ``"full_attention"`` (Mistral's softmax
  attention, read by ``grouped_from_hf``); without ``layer_types`` the config class makes the
  even layers softmax and the odd ones lightning. head_dim is ``head_dim`` or hidden_size //
  num_attention_heads; q, k and v come out of one ``qkv_proj`` through ``hidden_act`` (SiLU, the
  only activation taken); the slopes depend on the layer's index and ``num_hidden_layers``
  (``lightning.slope_rates``); ``norm`` keeps RMSNorm's default eps 1e-6 (the config's
  ``rms_norm_eps`` is the decoder's norms'); the core's chunk is the model's ``block_size``.
  The alpha/beta residual factors act outside the attention.

transformers keeps ``slope_rate``, ``query_decay``, ``key_decay`` and ``diagonal_decay`` as
persistent buffers, so a model's state dict carries them: they are functions of the config,
which the reader recomputes in float64 (the buffers of a model built in float32 are float32
roundings), so their shapes are checked and their values not read.

Derivation: docs/derivations/lightning-layer.md. Tests: tests/numpy_attention/test_lightning.py
(the reader's errors); against transformers in tests/parity/test_hf_lightning.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import validation
from ..lightning import LightningAttention
from ..linear_attention import FORMS
from .entries import checked_arrays, layer_entries
from .family import as_mapping

SUPPORTED_MODEL_TYPES = ("minimax",)
_KEY = "qkv_proj.weight"
_EXPECTED_FORM = (
    "expected keys like 'model.layers.{i}.self_attn.qkv_proj.weight' or 'qkv_proj.weight'"
)
_BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")


def lightning_from_hf(
    config: Mapping[str, Any] | Any,
    state_dict: Mapping[str, Any],
    layer_idx: int,
    *,
    form: str = "chunk",
) -> LightningAttention:
    """The NumPy layer of one Hugging Face lightning-attention layer, weights loaded, in eval mode.

    Everything is read from the config as the model reads it (module docstring); the layer's
    dtype is float64 when ``qkv_proj.weight`` is float64 and float32 otherwise. Every check runs
    before the layer is built.

    Args:
        config: ``config.to_dict()`` of a ``minimax`` model (a config object with ``to_dict`` is
            read through it), or the mapping of its ``config.json``.
        state_dict: the attention's state dict with any prefix: a whole model's
            (``model.layers.{i}.self_attn.*``), a decoder layer's or the module's own.
        layer_idx: which layer of the model (a ``"linear_attention"`` one).
        form: the core's ``"chunk"`` or ``"recurrent"`` form.

    Returns:
        a ``LightningAttention`` holding the weights, in eval mode.

    Raises:
        ValueError: another ``model_type``, a softmax (``"full_attention"``) layer (naming
            ``grouped_from_hf`` and the lightning layers), a config the layer cannot run
            (naming the field), weights whose shapes disagree with the config (naming the key
            and the fields).
        KeyError: missing or unexpected attention keys, named with the prefix found.
    """
    fn = "lightning_from_hf"
    config = as_mapping(config)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{fn}: model_type {model_type!r} is not supported; supported: "
            f"{list(SUPPORTED_MODEL_TYPES)}"
        )
    layer_idx = validation.non_negative_int(f"{fn}: layer_idx", layer_idx)
    if form not in FORMS:
        raise ValueError(f"{fn}: form must be one of {list(FORMS)}, got {form!r}")
    options = _layer_options(config, layer_idx)
    prefix, attention = layer_entries(
        fn, state_dict, _KEY, layer_idx, layers="lightning layers", hint=_EXPECTED_FORM
    )
    expected = _expected_shapes(options, int(config.get("block_size") or 256))
    arrays = checked_arrays(
        fn,
        prefix,
        attention,
        expected,
        "config's lightning attention",
        _EXPECTED_FORM,
        optional=_BUFFERS,
        optional_what="transformers' buffers",
    )
    buffers = {name for name in _BUFFERS if name in arrays}

    dtype = np.float64 if arrays[_KEY].dtype == np.float64 else np.float32
    layer = LightningAttention(**options, form=form, rng=0)
    layer.astype(dtype)
    layer.load_state_dict({name: value for name, value in arrays.items() if name not in buffers})
    layer.eval()
    return layer


def minimax_layer_types(config: Mapping[str, Any]) -> list[str]:
    """MiniMax's layer types as its config computes them: ``layer_types``, else
    ``"full_attention"`` on the even layers and ``"linear_attention"`` on the odd ones."""
    count = int(_required(config, "num_hidden_layers"))
    kinds = config.get("layer_types")
    if kinds is None:
        return ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(count)]
    kinds = list(kinds)
    if len(kinds) != count or not set(kinds) <= {"full_attention", "linear_attention"}:
        raise ValueError(
            f"layer_types must hold 'full_attention' or 'linear_attention' for each of the "
            f"{count} layers, got {kinds}"
        )
    return kinds


def _required(config: Mapping[str, Any], key: str) -> Any:
    if config.get(key) is None:
        raise ValueError(f"the config has no {key!r}, which a minimax lightning layer needs")
    return config[key]


def _layer_options(config: Mapping[str, Any], layer_idx: int) -> dict[str, Any]:
    """The constructor keywords of the layer (form aside), after checking that layer_idx is a
    lightning layer and that the layer can run this config."""
    kinds = minimax_layer_types(config)
    if layer_idx >= len(kinds):
        raise ValueError(
            f"lightning_from_hf: layer_idx is {layer_idx} but the minimax config has "
            f"{len(kinds)} layers"
        )
    if kinds[layer_idx] != "linear_attention":
        raise ValueError(
            f"minimax layer {layer_idx} is {kinds[layer_idx]!r} (softmax attention: read it with "
            "grouped_from_hf), not lightning attention; its 'linear_attention' layers are: "
            f"{[i for i, kind in enumerate(kinds) if kind == 'linear_attention']}"
        )
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(
            f"hidden_act is {act!r}: the lightning layer's q, k and v pass through a SiLU, the "
            "only activation it takes (MiniMax's config default)"
        )
    hidden_size = int(_required(config, "hidden_size"))
    heads = int(_required(config, "num_attention_heads"))
    head_dim = config.get("head_dim") or hidden_size // heads
    return {
        "hidden_size": hidden_size,
        "num_heads": heads,
        "head_dim": int(head_dim),
        "layer_idx": layer_idx,
        "num_hidden_layers": len(kinds),
        "chunk_size": int(config.get("block_size") or 256),
    }


def _expected_shapes(
    options: Mapping[str, Any], block: int
) -> dict[str, tuple[tuple[int, ...], str]]:
    """The attention module's state dict: name -> (shape, the config fields that make it);
    transformers' buffers last."""
    c, h, d = options["hidden_size"], options["num_heads"], options["head_dim"]
    width = "num_attention_heads * head_dim"
    return {
        "qkv_proj.weight": ((3 * h * d, c), f"3 * {width}, hidden_size"),
        "output_gate.weight": ((h * d, c), f"{width}, hidden_size"),
        "norm.weight": ((h * d,), width),
        "out_proj.weight": ((c, h * d), f"hidden_size, {width}"),
        "slope_rate": ((h, 1, 1), "num_attention_heads"),
        "query_decay": ((h, block, 1), "num_attention_heads, block_size"),
        "key_decay": ((h, block, 1), "num_attention_heads, block_size"),
        "diagonal_decay": ((1, h, block, block), "num_attention_heads, block_size"),
    }
