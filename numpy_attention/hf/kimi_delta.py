"""Hugging Face Kimi Linear's KDA layers -> ``KimiDeltaAttention``: the config read as
transformers 5.23's ``KimiLinearDeltaAttention`` reads it, the layer's weights found in the whole
model's state dict, NumPy only (transformers is never imported).

``kimi_linear`` (Kimi Linear) interleaves two attentions; ``layer_types`` (or, in a checkpoint's
config.json, the 1-indexed ``linear_attn_config`` lists; else every 4th layer from layer 4 is
full) says which is where, as ``latent.py``'s ``_kimi_linear_layer_types`` reads it:
``"linear_attention"`` layers are KDA (read here), ``"full_attention"`` layers are MLA without
RoPE (``latent_from_hf``). Both sit at ``model.layers.{i}.self_attn``.

What the layer reads: ``hidden_size``; ``linear_num_heads`` (H), ``linear_head_dim`` (K),
``linear_conv_kernel_dim`` (W), or a checkpoint's ``linear_attn_config`` ``num_heads``,
``head_dim``, ``short_conv_kernel_size`` (transformers' defaults 32, 128, 4); ``rms_norm_eps``
(o_norm's, default 1e-5); ``hidden_act``, the short convolution's activation, which must be
``"silu"`` (the config's default; the layer's convolution takes SiLU or nothing). The projections
have no biases whatever ``attention_bias`` says; the L2 norm's eps (1e-6) and the scale K^-0.5
are fixed in transformers' code, not the config.

Derivation: docs/derivations/kimi-delta-layer.md. Tests: tests/parity/test_hf_kimi_delta.py
(against transformers), tests/numpy_attention/test_kimi_delta.py (the reader's errors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import validation
from ..kimi_delta import KimiDeltaAttention
from .entries import checked_arrays, entries_under, layer_number, marked_prefixes
from .family import as_mapping
from .latent import _kimi_linear_layer_types

__all__ = ["kimi_delta_from_hf"]

_MARKER = "forget_gate.A_log"  # a key only a KDA layer has
_EXPECTED_FORM = (
    "expected keys like 'model.layers.{i}.self_attn.forget_gate.A_log' or 'forget_gate.A_log'"
)
# transformers' defaults, and the names a checkpoint's linear_attn_config gives them
_SIZES = {
    "linear_num_heads": ("num_heads", 32),
    "linear_head_dim": ("head_dim", 128),
    "linear_conv_kernel_dim": ("short_conv_kernel_size", 4),
}


def kimi_delta_from_hf(
    config: Mapping[str, Any] | Any,
    state_dict: Mapping[str, Any],
    layer_idx: int,
    *,
    form: str = "chunk",
) -> KimiDeltaAttention:
    """The NumPy layer of one Kimi Linear KDA layer, weights loaded, in eval mode.

    Args:
        config: ``config.to_dict()`` of a ``kimi_linear`` model (a config object with
            ``to_dict`` is read through it), or its ``config.json`` mapping.
        state_dict: the whole model's state dict (``model.layers.{i}.self_attn.*``), a decoder
            layer's, or the attention module's own.
        layer_idx: the decoder layer, a ``"linear_attention"`` one.
        form: the core's form, ``"chunk"`` (transformers' prefill) or ``"recurrent"``.

    Returns:
        a ``KimiDeltaAttention`` in float64 when ``q_proj.weight`` is float64, else float32.

    Raises:
        ValueError: another model_type, a layer that is not KDA (naming what it is and which
            layers are), a config the layer cannot run (naming the field), weights whose shapes
            disagree with the config (naming the key and the fields).
        KeyError: missing or unexpected keys, named with the prefix found.
    """
    fn = "kimi_delta_from_hf"
    config = as_mapping(config)
    model_type = config.get("model_type")
    if model_type != "kimi_linear":
        raise ValueError(
            f"{fn}: model_type {model_type!r} is not supported; KDA layers are read from "
            "'kimi_linear' configs"
        )
    layer_idx = validation.non_negative_int(f"{fn}: layer_idx", layer_idx)
    _check_layer(config, layer_idx)
    options = _layer_options(config)
    prefix, entries = _entries(fn, state_dict, layer_idx)
    expected = _expected_shapes(options)
    arrays = checked_arrays(fn, prefix, entries, expected, "config's KDA layer", _EXPECTED_FORM)
    dtype = np.float64 if arrays["q_proj.weight"].dtype == np.float64 else np.float32
    layer = KimiDeltaAttention(**options, form=form, rng=0)
    layer.astype(dtype)
    layer.load_state_dict(arrays)
    layer.eval()
    return layer


def _check_layer(config: Mapping[str, Any], layer_idx: int) -> None:
    """layer_idx within the model, and a KDA ("linear_attention") layer."""
    kinds = _kimi_linear_layer_types(config)
    if kinds is None:
        return
    if layer_idx >= len(kinds):
        raise ValueError(
            f"kimi_delta_from_hf: layer_idx is {layer_idx} but the kimi_linear config has "
            f"{len(kinds)} layers"
        )
    if kinds[layer_idx] != "linear_attention":
        other = (
            " (MLA without RoPE: latent_from_hf)" if kinds[layer_idx] == "full_attention" else ""
        )
        raise ValueError(
            f"kimi_linear layer {layer_idx} is {kinds[layer_idx]!r}{other}, not Kimi Delta "
            "Attention; its 'linear_attention' (KDA) layers are: "
            f"{[i for i, kind in enumerate(kinds) if kind == 'linear_attention']}"
        )


def _layer_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The layer's constructor keywords from the config (module docstring)."""
    if config.get("hidden_size") is None:
        raise ValueError("the config has no 'hidden_size', which a kimi_linear layer needs")
    linear = config.get("linear_attn_config") or {}
    sizes = {}
    for key, (checkpoint_key, default) in _SIZES.items():
        value = config.get(key, linear.get(checkpoint_key, default))
        sizes[key] = validation.positive_int(f"kimi_delta_from_hf: {key}", value)
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(
            f"kimi_delta_from_hf: hidden_act is {act!r}; KDA's short convolution runs "
            "hidden_act, and the layer's takes 'silu' only"
        )
    return {
        "hidden_size": int(config["hidden_size"]),
        "num_heads": sizes["linear_num_heads"],
        "head_dim": sizes["linear_head_dim"],
        "conv_kernel_size": sizes["linear_conv_kernel_dim"],
        "norm_eps": float(config.get("rms_norm_eps", 1e-5)),
    }


def _entries(fn: str, state_dict: Mapping[str, Any], layer_idx: int) -> tuple[str, dict[str, Any]]:
    """The prefix before ``forget_gate.A_log`` for layer_idx, and the entries under it (prefix
    removed): the only one, or the one numbered layer_idx."""
    prefixes = marked_prefixes(fn, state_dict, _MARKER, _EXPECTED_FORM, absent=" (no KDA layer)")
    numbered = {prefix: layer_number(prefix) for prefix in prefixes}
    chosen = [prefix for prefix in prefixes if numbered[prefix] == layer_idx]
    if len(prefixes) == 1 and numbered[prefixes[0]] is None:
        chosen = prefixes  # the module's own state dict, or a decoder layer's
    if len(chosen) != 1:
        found = sorted(number for number in numbered.values() if number is not None)
        raise KeyError(
            f"{fn}: the state dict holds KDA layers {found} ('{prefixes[0]}{_MARKER}', ...), "
            f"not layer_idx {layer_idx}; {_EXPECTED_FORM}"
        )
    return chosen[0], entries_under(state_dict, chosen[0])


def _expected_shapes(options: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """The KDA module's state dict for these options: name -> (shape, the config fields)."""
    c, h = options["hidden_size"], options["num_heads"]
    k, w = options["head_dim"], options["conv_kernel_size"]
    hk = "linear_num_heads * linear_head_dim"
    return {
        "q_proj.weight": ((h * k, c), f"{hk}, hidden_size"),
        "k_proj.weight": ((h * k, c), f"{hk}, hidden_size"),
        "v_proj.weight": ((h * k, c), f"{hk}, hidden_size"),
        "conv1d.weight": ((3 * h * k, 1, w), f"3 * {hk}, 1, linear_conv_kernel_dim"),
        "forget_gate.f_a_proj.weight": ((k, c), "linear_head_dim, hidden_size"),
        "forget_gate.f_b_proj.weight": ((h * k, k), f"{hk}, linear_head_dim"),
        "forget_gate.dt_bias": ((h * k,), hk),
        "forget_gate.A_log": ((1, 1, h, 1), "1, 1, linear_num_heads, 1"),
        "b_proj.weight": ((h, c), "linear_num_heads, hidden_size"),
        "g_a_proj.weight": ((k, c), "linear_head_dim, hidden_size"),
        "g_b_proj.weight": ((h * k, k), f"{hk}, linear_head_dim"),
        "o_norm.weight": ((k,), "linear_head_dim"),
        "o_proj.weight": ((c, h * k), f"hidden_size, {hk}"),
    }
