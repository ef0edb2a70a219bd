"""RoPE as Hugging Face's rotary embeddings compute it, read from a config: the parameters of a
layer (one dict, or one per layer type as in Gemma 3), the rotated width (partial rotary, NoPE
layers), the frequencies in float32 in the model's order of operations (``default``, ``linear``,
``llama3``, ``yarn``, ``longrope``'s short and long sets, ``proportional``'s pairs with their
zeros, Hunyuan's ``dynamic`` with an ``alpha``, read as fixed NTK-alpha frequencies) and the
attention factor. NumPy only.

``hf_inv_freq`` agrees with the model's own ``inv_freq`` buffer to within a float32 ulp or two
(torch's vectorized ``pow`` rounds the last bit differently from NumPy's); the converter takes
the model's buffer as given where the caller passes it.

Tests: tests/numpy_attention/hf/test_rope.py, test_grouped.py; against transformers' rotary
embeddings in tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .families import FAMILIES
from .family import (
    Family,
    as_mapping,
    class_view,
    layer_kind,
    layer_rope_theta,
    required,
    rotates,
    sizes,
)

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")
_SCALED = ("llama3", "yarn", "longrope")  # the types that read original_max_position_embeddings


def _family(config: Mapping[str, Any]) -> Family:
    """The config's family; a model type this module does not know reads like Llama."""
    return FAMILIES.get(str(config.get("model_type")), Family())


def rope_parameters(config: Mapping[str, Any], layer_idx: int | None = None) -> dict[str, Any]:
    """The RoPE parameters of layer ``layer_idx``: ``rope_parameters`` (transformers 5), or the
    same built from a transformers 4 config's ``rope_theta`` and ``rope_scaling``; Gemma 3's
    dict per layer type read for the layer's type. ``rope_type`` and ``rope_theta`` checked.
    The config is read as its config class reads it (``class_view``: DBRX's default base)."""
    family = _family(config)
    config = class_view(config, family)
    params = config.get("rope_parameters")
    if params is None:
        params = _transformers_4_parameters(config, family)
    params = dict(params)
    if "full_attention" in params or "sliding_attention" in params:
        if not family.rope_per_layer_type:
            raise ValueError(
                "rope_parameters per layer type is not supported; these models have one RoPE"
            )
        if layer_idx is None:
            raise ValueError(
                "the config's rope_parameters differ per layer type: give layer_idx to choose"
            )
        params = dict(params.get(layer_kind(config, family, layer_idx)) or {})
    if family.rope_theta_per_layer and config.get(family.rope_theta_per_layer) is not None:
        params["rope_theta"] = _layer_theta(config, family, layer_idx, params.get("rope_theta"))
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    rope_type = dict(family.rope_renames).get(rope_type, rope_type)
    if family.rope_ntk_alpha and rope_type == "dynamic" and params.get("alpha"):
        rope_type = "ntk_alpha"  # Hunyuan: a fixed alpha stretches the base, nothing dynamic
    elif rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {list(ROPE_TYPES)}")
    if params.get("rope_theta") is None:
        raise ValueError("the config has no rope_theta (in rope_parameters or at the top level)")
    if rope_type in _SCALED and config.get("original_max_position_embeddings") is not None:
        # Phi-3 keeps its pretraining length at the top level, and the model prefers it
        params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    params["rope_type"] = rope_type
    return params


def _layer_theta(
    config: Mapping[str, Any], family: Family, layer_idx: int | None, default: Any
) -> Any:
    """Granite SWA's base of layer ``layer_idx`` from its per-layer list; on a NoPE layer (0)
    the global one, whose embedding the model builds and never uses."""
    key = str(family.rope_theta_per_layer)
    if layer_idx is None:
        bases = {float(theta) for theta in config[key] if theta}
        if len(bases) > 1:
            raise ValueError(f"the config's {key} differs per layer: give layer_idx to choose")
        return bases.pop() if bases else default
    return layer_rope_theta(config, family, layer_idx) or default


def _transformers_4_parameters(config: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """rope_parameters from ``rope_theta`` and ``rope_scaling`` (``"type"`` its rope_type), or
    the family's ``rope_default`` where there is no ``rope_scaling`` (CWM); Gemma 3's: the
    scaling and ``rope_theta`` (default 1e6) for its full layers, ``rope_local_base_freq``
    (default 1e4) unscaled for its sliding ones (OLMo 3's: no local key, its sliding layers
    always at 5e5; ``Family.rope_type_thetas``)."""
    if family.rope_default and not config.get("rope_scaling"):
        if config.get("rope_theta") is not None:
            raise ValueError(
                f"the config has rope_theta but no rope_scaling: {config.get('model_type')}'s "
                "config class then ignores rope_theta and uses its own RoPE; give "
                "rope_parameters (or rope_scaling)"
            )
        return dict(family.rope_default)
    scaling = dict(config.get("rope_scaling") or {})
    scaling["rope_type"] = scaling.pop("type", scaling.get("rope_type", "default"))
    if not family.rope_per_layer_type:
        return scaling | {"rope_theta": config.get("rope_theta")}
    full_default, local_key, local_default = family.rope_type_thetas
    full = scaling | {"rope_theta": config.get("rope_theta") or full_default}
    local_theta = config.get(local_key) if local_key else None
    local = {"rope_type": "default", "rope_theta": local_theta or local_default}
    return {"full_attention": full, "sliding_attention": local}


def rotary_dim(config: Mapping[str, Any], layer_idx: int) -> int:
    """The width RoPE turns in each head of layer ``layer_idx``: 0 on a NoPE layer, else the
    rotary embedding's (``_rotated_width``)."""
    if not rotates(config, _family(config), layer_idx):
        return 0
    return _rotated_width(config, rope_parameters(config, layer_idx), layer_idx)


def _rotated_width(
    config: Mapping[str, Any], params: Mapping[str, Any], layer_idx: int | None = None
) -> int:
    """The width of the model's rotary embedding: ``int(head_dim * partial_rotary_factor)``
    where the model honours the factor (which must be 1 elsewhere); ``head_dim`` layer
    ``layer_idx``'s where the family gives it per layer (Gemma 4)."""
    family = _family(config)
    head_dim = sizes(config, family, layer_idx)["head_dim"]
    if params["rope_type"] == "proportional":  # every pair turns, those past the factor at 0
        return int(head_dim)
    top_level = config.get("partial_rotary_factor") if family.partial_rotary_top_level else None
    partial = params.get("partial_rotary_factor", top_level)
    if partial is None and family.rotary_dim_key and config.get(family.rotary_dim_key) is not None:
        partial = config[family.rotary_dim_key] / head_dim  # MiniMax-M2's legacy rotary_dim
    partial = family.partial_rotary_default if partial is None else float(partial)
    if partial == 1.0:
        return int(head_dim)
    if not family.partial_rotary:
        raise ValueError(
            f"partial_rotary_factor is {partial}, but a {config.get('model_type')} layer rotates "
            "the whole head (its code ignores the factor)"
        )
    dim = int(head_dim * partial)
    if dim % 2 or dim <= 0:
        raise ValueError(
            f"partial_rotary_factor {partial} of head_dim {head_dim} rotates {dim} coordinates; "
            "RoPE needs an even number of them, at least 2"
        )
    return dim


def hf_rope_attention_factor(
    config: Mapping[str, Any] | Any, *, layer_idx: int | None = None
) -> float:
    """The factor Hugging Face multiplies RoPE's cos and sin by: YaRN's (``attention_factor``,
    else from ``factor``, ``mscale`` and ``mscale_all_dim``), LongRoPE's (``attention_factor``,
    else sqrt(1 + ln(factor) / ln(original_max_position_embeddings))), 1 for the other types.

    Args:
        config: the config mapping (or object with ``to_dict``).
        layer_idx: the layer, needed where RoPE differs per layer type (Gemma 3).
    """
    config = as_mapping(config)
    params = rope_parameters(config, layer_idx)
    if _family(config).rope_mscale and params["rope_type"] != "default":
        return _mscale(params)
    if params["rope_type"] not in ("yarn", "longrope"):
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = _scaling_factor(config, params)
    if params["rope_type"] == "longrope":
        original = _original_length(config, params)
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _scaling_factor(config: Mapping[str, Any], params: Mapping[str, Any]) -> float:
    """``factor``, else max_position_embeddings / original_max_position_embeddings."""
    if params.get("factor") is not None:
        return float(params["factor"])
    return float(required(config, "max_position_embeddings")) / _original_length(config, params)


def _original_length(config: Mapping[str, Any], params: Mapping[str, Any]) -> float:
    length = params.get("original_max_position_embeddings")
    return float(length if length is not None else required(config, "max_position_embeddings"))


def _mscale(params: Mapping[str, Any]) -> float:
    """PhiMoE's factor on cos and sin (``Family.rope_mscale``): its short and long mscale, which
    must agree (the model picks one per call, by the call's longest position)."""
    short, long = params.get("short_mscale"), params.get("long_mscale")
    if short is None or long is None:
        raise ValueError(
            f"rope_type {params['rope_type']!r} needs short_mscale and long_mscale in "
            "rope_parameters (the model scales cos and sin by them)"
        )
    if float(short) != float(long):
        raise ValueError(
            f"short_mscale is {short} but long_mscale is {long}: the model scales cos and sin by "
            "one or the other depending on each call's longest position, a factor the layer "
            "cannot change between calls"
        )
    return float(short)


def long_rope_switch(config: Mapping[str, Any], layer_idx: int | None = None) -> int | None:
    """LongRoPE's ``original_max_position_embeddings`` (a call past it uses the long
    frequencies), or None for the other RoPE types (and for PhiMoE, which keeps its short
    frequencies at every length)."""
    if _family(config).rope_mscale:
        return None
    params = rope_parameters(config, layer_idx)
    return int(_original_length(config, params)) if params["rope_type"] == "longrope" else None


def hf_inv_freq(
    config: Mapping[str, Any] | Any, *, layer_idx: int | None = None, long: bool = False
) -> np.ndarray:
    """RoPE's (R/2,) frequencies as Hugging Face's rotary embedding computes them: in float32,
    in its order of operations, for ``default``, ``linear``, ``llama3``, ``yarn`` and
    ``longrope``; R the rotated width (``head_dim`` times ``partial_rotary_factor``).

    Within a float32 ulp or two of the model's own ``inv_freq`` (torch's vectorized ``pow``
    rounds the last bit differently); pass the model's to ``grouped_from_hf`` for exactly its
    frequencies.

    Args:
        config: the config mapping (or object with ``to_dict``).
        layer_idx: the layer, needed where RoPE differs per layer type (Gemma 3).
        long: LongRoPE's long frequencies (``long_factor``: a sequence longer than
            ``original_max_position_embeddings``); the short ones otherwise.

    Returns:
        float32 (R/2,).
    """
    config = as_mapping(config)
    params = rope_parameters(config, layer_idx)
    # also on a NoPE layer: the embedding it does not use
    dim = _rotated_width(config, params, layer_idx)
    base = np.float32(params["rope_theta"])
    # Python floats below are weak scalars: every step stays float32, as in torch.
    exponents = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)  # (R/2,)
    powers = base**exponents  # base^(2i/R)
    rope_type = params["rope_type"]
    if long and rope_type != "longrope":
        raise ValueError(
            f"long frequencies are LongRoPE's; this layer's rope_type is {rope_type!r}"
        )
    if rope_type == "default":
        return np.float32(1.0) / powers
    if rope_type == "ntk_alpha":  # base theta * alpha^(D / (D - 2)), in Python floats as Hunyuan
        head_dim = required(config, "head_dim")
        base = params["rope_theta"] * params["alpha"] ** (head_dim / (head_dim - 2))
        return np.float32(1.0) / np.float32(base) ** exponents
    if rope_type == "linear":
        return np.float32(1.0) / powers / np.float32(params["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(np.float32(1.0) / powers, params)
    if rope_type == "proportional":
        return _proportional_inv_freq(params, dim)
    if rope_type == "longrope":
        factors = np.asarray(params["long_factor" if long else "short_factor"], dtype=np.float32)
        if factors.shape != powers.shape:
            raise ValueError(
                f"rope_parameters' {'long' if long else 'short'}_factor has {factors.size} "
                f"entries; the rotated width {dim} needs {dim // 2}"
            )
        return np.float32(1.0) / (factors * powers)
    return _yarn_inv_freq(powers, config, params, dim)


def _proportional_inv_freq(params: Mapping[str, Any], head_dim: int) -> np.ndarray:
    """LFM3's full layers: RoPE over the whole head, pairs (x_i, x_i+D/2), but only the first
    ``int(partial_rotary_factor * D // 2)`` pairs turn, at base^(-2i/D) (the exponent over the
    head's width, not over the turned part's), the others at frequency 0 (cos 1, sin 0: left
    as they are); all divided by ``factor`` (1 by default)."""
    partial = params.get("partial_rotary_factor")
    turned = int((1.0 if partial is None else float(partial)) * head_dim // 2)
    exponents = np.arange(0, 2 * turned, 2).astype(np.float32) / np.float32(head_dim)
    inv_freq = np.zeros(head_dim // 2, dtype=np.float32)
    inv_freq[:turned] = np.float32(1.0) / np.float32(params["rope_theta"]) ** exponents
    return inv_freq / np.float32(params.get("factor") or 1.0)


def _llama3_inv_freq(inv_freq: np.ndarray, params: Mapping[str, Any]) -> np.ndarray:
    """Llama 3.1: long wavelengths divided by ``factor``, short ones kept, a smooth blend
    between ``original_max_position_embeddings / low_freq_factor`` and ``/ high_freq_factor``."""
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    # Llama 4 Scout gives both factors 1: the blend band is empty and its 0 / 0 unused, as in
    # transformers' own computation
    with np.errstate(divide="ignore", invalid="ignore"):
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
    factor = _scaling_factor(config, params)
    original = _original_length(config, params)
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


def rope_options(
    config: Mapping[str, Any], layer_idx: int, inv_freq: Any = None, long_inv_freq: Any = None
) -> dict[str, Any]:
    """The layer's RoPE keywords for layer ``layer_idx``: rope_theta, rotary_dim, the pair
    layout, the attention factor, the frequencies (the caller's where given, used as given;
    ignored on a NoPE layer) and LongRoPE's long set and switch length."""
    family = _family(config)
    dim = rotary_dim(config, layer_idx)
    if dim == 0:  # a NoPE layer: no frequencies, and no RoPE keys read (Jamba's config has none)
        return {"rotary_dim": 0, "rope_interleaved": family.interleaved, "inv_freq": None}
    params = rope_parameters(config, layer_idx)
    options: dict[str, Any] = {
        "rope_theta": float(params["rope_theta"]),
        "rotary_dim": dim,
        "rope_interleaved": family.interleaved,
        "rope_attention_factor": hf_rope_attention_factor(config, layer_idx=layer_idx),
        "inv_freq": None,
    }
    options["inv_freq"] = hf_inv_freq(config, layer_idx=layer_idx) if inv_freq is None else inv_freq
    if family.rope_reversed:  # nanochat's pairs turn by -angle: -inv_freq (cos even, sin odd)
        options["inv_freq"] = -np.asarray(options["inv_freq"])
    switch = long_rope_switch(config, layer_idx)
    if switch is not None:
        options["original_max_positions"] = switch
        options["long_inv_freq"] = (
            hf_inv_freq(config, layer_idx=layer_idx, long=True)
            if long_inv_freq is None
            else long_inv_freq
        )
    return options
