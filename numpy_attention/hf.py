"""Hugging Face decoder attention -> ``GroupedQueryAttention``: the config read as the model reads
it, the attention weights found in any state dict, NumPy only (transformers is never imported).

Models (``config["model_type"]``): Llama, Mistral, Qwen2, Qwen3, Gemma 2 and GPT-OSS. What each
model's code does, and where it differs from this project's conventions:

- Sizes: ``head_dim`` where the config has it, else ``hidden_size // num_attention_heads``;
  ``num_key_value_heads`` (None: multi-head).
- Biases: ``attention_bias`` on all four projections (Llama, Qwen3, Gemma 2, GPT-OSS); none for
  Mistral; Qwen2 has no config key and biases on q, k and v only: read from the state dict.
- QK-norm (Qwen3): ``q_norm``, ``k_norm`` = RMSNorm(head_dim, ``rms_norm_eps``) per head, before
  RoPE.
- Sliding windows: a layer slides where ``layer_types[layer_idx]`` is ``"sliding_attention"``
  (Qwen2/3, Gemma 2, GPT-OSS; without ``layer_types``, Qwen slides from ``max_window_layers`` on
  when ``use_sliding_window``); Mistral slides on every layer when ``sliding_window`` is set.
  Hugging Face's ``sliding_window = W`` lets a query see W keys, itself included
  (``kv > q - W``), so ``window = (W - 1, 0)``.
- Gemma 2: scores scaled by ``query_pre_attn_scalar ** -0.5`` (not ``head_dim ** -0.5``) and
  capped by ``attn_logit_softcapping``. GPT-OSS: one sink logit per head (``sinks``).
- RoPE: half-split pairs (``rotate_half``) in all six. ``rope_parameters`` (transformers 5), or
  ``rope_theta`` and ``rope_scaling`` (a transformers 4 ``config.json``), of type ``default``,
  ``linear``, ``llama3`` or ``yarn``; YaRN's attention factor multiplies cos and sin
  (``rope_attention_factor``). Hugging Face computes ``inv_freq`` in float32; so does
  ``hf_inv_freq``, in the same order of operations, which agrees with the model's own
  frequencies to within a float32 ulp or two (torch's vectorized ``pow`` rounds the last bit
  differently from NumPy's). For exactly the model's frequencies pass them as ``inv_freq=``
  (``model.model.rotary_emb.inv_freq``): they are used as given.

The padding convention differs too, at call time: Hugging Face's ``attention_mask`` is 1 = keep,
the layer's ``key_padding_mask`` is True = padding; with left padding each row's positions start
at its first real token. ``padding_from_hf`` turns one into the other.
docs/hugging-face.md walks through each model.

Tests: tests/numpy_attention/test_hf.py; against transformers in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import validation
from .grouped import GroupedQueryAttention
from .module import _to_numpy

SUPPORTED_MODEL_TYPES = ("gemma2", "gpt_oss", "llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")

_EXPECTED_FORM = "expected keys like 'model.layers.{i}.self_attn.q_proj.weight' or 'q_proj.weight'"
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MODELS_WITH_ATTENTION_BIAS = ("gemma2", "gpt_oss", "llama", "qwen3")
_QWEN = ("qwen2", "qwen3")


# -- the attention weights of one layer -------------------------------------------------------


def hf_attention_state(state_dict: Mapping[str, Any], *, layer_idx: int = 0) -> dict[str, Any]:
    """The attention entries of one layer, named as the attention module names them.

    The prefix is whatever precedes ``q_proj.weight``: none for an attention module's own state
    dict, ``self_attn.`` for a decoder layer's, ``model.layers.{i}.self_attn.`` for a whole
    model's, where ``layer_idx`` chooses i. Entries outside the prefix (embeddings, MLPs, other
    layers) are left out; every entry under it is returned, expected or not.

    Args:
        state_dict: name -> array-like (NumPy arrays, torch tensors, ...).
        layer_idx: the layer to take from a state dict that holds several; a dict that holds one
            layer under a numbered prefix must hold this one.

    Returns:
        ``{"q_proj.weight": ..., ...}``, the values as given (not copied or converted).

    Raises:
        KeyError: no ``q_proj.weight`` at all, or none for ``layer_idx``, naming the expected
            key form.
        ValueError: a one-layer dict whose prefix names another layer than ``layer_idx``.
    """
    return _attention_entries("hf_attention_state", state_dict, layer_idx)[1]


def _attention_entries(
    fn: str, state_dict: Mapping[str, Any], layer_idx: Any
) -> tuple[str, dict[str, Any]]:
    """``hf_attention_state``'s work: the prefix found and the entries under it."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"{fn}: state_dict must be a mapping, got {type(state_dict).__name__}")
    layer_idx = validation.non_negative_int(f"{fn}: layer_idx", layer_idx)
    prefixes = sorted(
        key.removesuffix("q_proj.weight")
        for key in state_dict
        if key == "q_proj.weight" or key.endswith(".q_proj.weight")
    )
    if not prefixes:
        raise KeyError(f"{fn}: the state dict has no 'q_proj.weight'; {_EXPECTED_FORM}")
    numbered = {prefix: _layer_number(prefix) for prefix in prefixes}
    if len(prefixes) == 1:
        prefix = prefixes[0]
        if numbered[prefix] not in (None, layer_idx):
            raise ValueError(
                f"{fn}: the state dict holds layer {numbered[prefix]} "
                f"('{prefix}q_proj.weight') but layer_idx is {layer_idx}"
            )
    else:
        chosen = [prefix for prefix in prefixes if numbered[prefix] == layer_idx]
        if len(chosen) != 1:
            shown = ", ".join(f"'{prefix}q_proj.weight'" for prefix in prefixes[:3])
            raise KeyError(
                f"{fn}: the state dict holds {len(prefixes)} attention layers ({shown}, ...) "
                f"and {len(chosen)} of them for layer_idx {layer_idx}; {_EXPECTED_FORM}"
            )
        prefix = chosen[0]
    entries = {
        key.removeprefix(prefix): value
        for key, value in state_dict.items()
        if key.startswith(prefix)
    }
    return prefix, entries


def _layer_number(prefix: str) -> int | None:
    """The last numbered segment of a prefix (``model.layers.3.self_attn.`` -> 3), or None."""
    numbers = re.findall(r"(?:^|\.)(\d+)(?=\.)", prefix)
    return int(numbers[-1]) if numbers else None


# -- the layer ---------------------------------------------------------------------------------


def grouped_from_hf(
    config: Mapping[str, Any] | Any,
    state_dict: Mapping[str, Any],
    *,
    layer_idx: int = 0,
    inv_freq: Any = None,
) -> GroupedQueryAttention:
    """The NumPy layer of one Hugging Face attention layer, weights loaded, in eval mode.

    Everything is read from the config as the model reads it (module docstring); the layer's
    dtype is float64 when ``q_proj.weight`` is float64 and float32 otherwise (float16 and
    bfloat16 weights are computed in float32). Every check runs before the layer is built.

    Args:
        config: ``config.to_dict()`` of a supported model (a config object with ``to_dict`` is
            read through it), or the mapping of its ``config.json``.
        state_dict: the attention's state dict with any prefix (``hf_attention_state``): a whole
            model's, a decoder layer's or the attention module's own.
        layer_idx: which layer: its weights in a whole model's state dict, and its type (sliding
            or full attention) in the config.
        inv_freq: (head_dim / 2,) RoPE frequencies, used as given, e.g. the model's own float32
            ``rotary_emb.inv_freq``; None computes them from the config (``hf_inv_freq``).

    Returns:
        a ``GroupedQueryAttention`` holding the weights, in eval mode.

    Raises:
        ValueError: an unsupported ``model_type`` (naming the supported ones) or RoPE type, a
            config the layer cannot express, a layer_idx past ``num_hidden_layers``, weights of
            shapes other than the config's.
        KeyError: missing or unexpected attention keys, named with the prefix found.
    """
    fn = "grouped_from_hf"
    config = _as_mapping(config)
    model_type = _model_type(config)
    layer_idx = validation.non_negative_int(f"{fn}: layer_idx", layer_idx)
    num_layers = config.get("num_hidden_layers")
    if num_layers is not None and layer_idx >= num_layers:
        raise ValueError(
            f"{fn}: layer_idx is {layer_idx} but the config has num_hidden_layers = {num_layers}"
        )
    prefix, attention = _attention_entries(fn, state_dict, layer_idx)
    options = _layer_options(config, model_type, layer_idx, attention)
    expected = _expected_shapes(options)
    _check_keys(attention, expected, prefix)
    arrays = {name: _to_numpy(value) for name, value in attention.items()}
    for name, shape in expected.items():
        if arrays[name].shape != shape:
            raise ValueError(
                f"{fn}: {name} has shape {arrays[name].shape}, but the config "
                f"({_sizes(options)}) gives {shape}"
            )
        validation.float_array(f"{fn}: {name}", arrays[name])
    if inv_freq is None:
        inv_freq = hf_inv_freq(config)
    options["inv_freq"] = inv_freq

    dtype = np.float64 if arrays["q_proj.weight"].dtype == np.float64 else np.float32
    layer = GroupedQueryAttention(**options, rng=0)
    layer.astype(dtype)
    layer.load_state_dict(arrays)
    layer.eval()
    return layer


def _as_mapping(config: Any) -> Mapping[str, Any]:
    if hasattr(config, "to_dict") and not isinstance(config, Mapping):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (config.to_dict()), got {type(config).__name__}")
    return config


def _model_type(config: Mapping[str, Any]) -> str:
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}"
        )
    return str(model_type)


def _required(config: Mapping[str, Any], key: str) -> Any:
    if config.get(key) is None:
        raise ValueError(f"the config has no {key!r}, which a {config['model_type']} layer needs")
    return config[key]


def _layer_options(
    config: Mapping[str, Any], model_type: str, layer_idx: int, attention: Mapping[str, Any]
) -> dict[str, Any]:
    """The constructor keywords of the layer, inv_freq aside."""
    hidden_size = _required(config, "hidden_size")
    num_heads = _required(config, "num_attention_heads")
    num_kv_heads = config.get("num_key_value_heads") or num_heads
    head_dim = config.get("head_dim") or hidden_size // num_heads
    if model_type in _MODELS_WITH_ATTENTION_BIAS:
        bias = out_bias = bool(config.get("attention_bias", False))
    elif model_type == "qwen2":  # q, k and v always carry a bias in its code; no config key
        bias, out_bias = "q_proj.bias" in attention, False
    else:  # mistral
        bias = out_bias = False
    options: dict[str, Any] = {
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "bias": bias,
        "out_bias": out_bias,
        "rope_theta": _rope_parameters(config)["rope_theta"],
        "rope_attention_factor": hf_rope_attention_factor(config),
        "window": _window(config, model_type, layer_idx),
        "dropout": float(config.get("attention_dropout") or 0.0),
    }
    if model_type == "qwen3":
        options["qk_norm"] = True
        options["norm_eps"] = float(_required(config, "rms_norm_eps"))
    if model_type == "gemma2":
        if config.get("use_bidirectional_attention"):
            raise ValueError(
                "use_bidirectional_attention is set: that Gemma 2 layer is not causal, and "
                "GroupedQueryAttention always is"
            )
        options["scaling"] = float(_required(config, "query_pre_attn_scalar")) ** -0.5
        options["softcap"] = float(config.get("attn_logit_softcapping") or 0.0)
    if model_type == "gpt_oss":
        options["sinks"] = True
    return options


def _window(config: Mapping[str, Any], model_type: str, layer_idx: int) -> tuple[int, int] | None:
    """(W - 1, 0) on a sliding layer (Hugging Face's W counts the query itself), else None."""
    layer_types = config.get("layer_types")
    if model_type == "mistral":
        sliding = config.get("sliding_window") is not None
    elif model_type == "llama":
        sliding = False
    elif layer_types is not None:
        if layer_idx >= len(layer_types):
            raise ValueError(
                f"layer_idx is {layer_idx} but the config's layer_types has {len(layer_types)} "
                "entries"
            )
        kind = layer_types[layer_idx]
        if kind not in ("full_attention", "sliding_attention"):
            raise ValueError(
                f"layer_types[{layer_idx}] is {kind!r}; supported: 'full_attention', "
                "'sliding_attention'"
            )
        sliding = kind == "sliding_attention"
    elif model_type in _QWEN:  # a config.json without layer_types: Qwen's own rule
        sliding = bool(config.get("use_sliding_window")) and layer_idx >= config.get(
            "max_window_layers", 0
        )
        sliding = sliding and config.get("sliding_window") is not None
    else:  # gemma2, gpt_oss: every other layer, from the first
        sliding = layer_idx % 2 == 0
    if not sliding:
        return None
    width = validation.positive_int("config['sliding_window']", _required(config, "sliding_window"))
    return (width - 1, 0)


# -- RoPE ---------------------------------------------------------------------------------------


def _rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_parameters`` (transformers 5), or the same built from a transformers 4 config's
    ``rope_theta`` and ``rope_scaling``; its ``rope_type`` checked."""
    params = config.get("rope_parameters")
    if params is None:
        params = dict(config.get("rope_scaling") or {})
        params["rope_type"] = params.pop("type", params.get("rope_type", "default"))
        params["rope_theta"] = config.get("rope_theta")
    params = dict(params)
    if "full_attention" in params or "sliding_attention" in params:
        raise ValueError(
            "rope_parameters per layer type is not supported; these models have one RoPE"
        )
    rope_type = params.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {list(ROPE_TYPES)}")
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(
            f"partial_rotary_factor is {partial}; the layer rotates the whole head (1.0)"
        )
    if params.get("rope_theta") is None:
        raise ValueError("the config has no rope_theta (in rope_parameters or at the top level)")
    params["rope_type"] = rope_type
    return params


def _head_dim(config: Mapping[str, Any]) -> int:
    return int(
        config.get("head_dim")
        or _required(config, "hidden_size") // _required(config, "num_attention_heads")
    )


def hf_rope_attention_factor(config: Mapping[str, Any] | Any) -> float:
    """The factor Hugging Face multiplies RoPE's cos and sin by: YaRN's (``attention_factor``,
    else from ``factor``, ``mscale`` and ``mscale_all_dim``), 1 for the other RoPE types."""
    config = _as_mapping(config)
    params = _rope_parameters(config)
    if params["rope_type"] != "yarn":
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = _yarn_factor(config, params)
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_factor(config: Mapping[str, Any], params: Mapping[str, Any]) -> float:
    if params.get("factor") is not None:
        return float(params["factor"])
    return float(_required(config, "max_position_embeddings")) / _yarn_original_length(
        config, params
    )


def _yarn_original_length(config: Mapping[str, Any], params: Mapping[str, Any]) -> float:
    length = params.get("original_max_position_embeddings")
    return float(length if length is not None else _required(config, "max_position_embeddings"))


def hf_inv_freq(config: Mapping[str, Any] | Any) -> np.ndarray:
    """RoPE's (head_dim / 2,) frequencies as Hugging Face's rotary embedding computes them: in
    float32, in its order of operations, for ``default``, ``linear``, ``llama3`` and ``yarn``.

    Within a float32 ulp or two of the model's own ``inv_freq`` (torch's vectorized ``pow``
    rounds the last bit differently); pass the model's to ``grouped_from_hf`` for exactly its
    frequencies.

    Returns:
        float32 (head_dim / 2,).
    """
    config = _as_mapping(config)
    params = _rope_parameters(config)
    dim = _head_dim(config)
    base = np.float32(params["rope_theta"])
    # Python floats below are weak scalars: every step stays float32, as in torch.
    exponents = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)  # (D/2,)
    powers = base**exponents  # base^(2i/D)
    rope_type = params["rope_type"]
    if rope_type == "default":
        return np.float32(1.0) / powers
    if rope_type == "linear":
        return np.float32(1.0) / powers / np.float32(params["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(np.float32(1.0) / powers, params)
    return _yarn_inv_freq(powers, config, params, dim)


def _llama3_inv_freq(inv_freq: np.ndarray, params: Mapping[str, Any]) -> np.ndarray:
    """Llama 3.1: long wavelengths divided by ``factor``, short ones kept, a smooth blend
    between ``original_max_position_embeddings / low_freq_factor`` and ``/ high_freq_factor``."""
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn_inv_freq(
    powers: np.ndarray, config: Mapping[str, Any], params: Mapping[str, Any], dim: int
) -> np.ndarray:
    """YaRN: interpolation (``/ factor``) for slow frequencies, extrapolation (unchanged) for
    fast ones, a linear ramp between the dimensions that turn ``beta_slow`` and ``beta_fast``
    times over ``original_max_position_embeddings``."""
    base = float(params["rope_theta"])
    factor = _yarn_factor(config, params)
    original = _yarn_original_length(config, params)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # weight of the unchanged frequency, per pair
    inv_extrapolation = 1.0 / powers
    inv_interpolation = 1.0 / (factor * powers)
    blended = inv_interpolation * (1 - extrapolation) + inv_extrapolation * extrapolation
    return blended.astype(np.float32)


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
    shapes: dict[str, tuple[int, ...]] = {
        "q_proj.weight": (h * d, c),
        "k_proj.weight": (h_kv * d, c),
        "v_proj.weight": (h_kv * d, c),
        "o_proj.weight": (c, h * d),
    }
    if options["bias"]:
        shapes |= {"q_proj.bias": (h * d,), "k_proj.bias": (h_kv * d,), "v_proj.bias": (h_kv * d,)}
    if options["out_bias"]:
        shapes["o_proj.bias"] = (c,)
    if options.get("qk_norm"):
        shapes |= {"q_norm.weight": (d,), "k_norm.weight": (d,)}
    if options.get("sinks"):
        shapes["sinks"] = (h,)
    return shapes


def _sizes(options: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{name}={options[name]}"
        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim")
    )


def _check_keys(
    attention: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], prefix: str
) -> None:
    missing = [prefix + name for name in expected if name not in attention]
    unexpected = sorted(prefix + name for name in attention if name not in expected)
    if missing or unexpected:
        raise KeyError(
            f"grouped_from_hf: missing keys {missing}, unexpected keys {unexpected} for this "
            f"config's attention ({sorted(expected)} under the prefix '{prefix}'); "
            f"{_EXPECTED_FORM}"
        )
