"""numpy_attention.hf.grouped: Hugging Face configs and state dicts read into GroupedQueryAttention,
NumPy only (hand-written config dicts shaped like ``config.to_dict()``): what each model's config
sets (sizes, biases, QK-norm, windows per layer, Gemma 2's scale and cap, GPT-OSS's sinks, RoPE),
prefixes stripped and layers chosen, dtypes, and every refusal before any work. The layer against
transformers' own modules: tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from numpy_attention import convert
from numpy_attention.differential import LAMBDA_NAMES, lambda_init_from_depth
from numpy_attention.grouped import GroupedQueryAttention
from numpy_attention.hf import (
    SUPPORTED_MODEL_TYPES,
    grouped_from_hf,
    hf_attention_state,
    hf_attention_state_from_grouped,
    hf_inv_freq,
    hf_rope_attention_factor,
    padding_from_hf,
)

from ...conftest import assert_close

C, H, H_KV, D, LAYERS, W = 16, 4, 2, 6, 3, 4
FULL, SLIDING = "full_attention", "sliding_attention"
GLM_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}

BASE = {
    "hidden_size": C,
    "num_attention_heads": H,
    "num_key_value_heads": H_KV,
    "head_dim": D,
    "num_hidden_layers": LAYERS,
    "rms_norm_eps": 1e-5,
    "attention_dropout": 0.0,
    "max_position_embeddings": 64,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
# What transformers 5's config.to_dict() holds for each model, at these sizes.
MODELS = {
    "llama": {"attention_bias": False},
    "mistral": {"sliding_window": W},
    "qwen2": {
        "use_sliding_window": True,
        "sliding_window": W,
        "max_window_layers": 1,
        "layer_types": [FULL, SLIDING, SLIDING],
    },
    "qwen3": {
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 28,
        "layer_types": [FULL, FULL, FULL],
    },
    "gemma2": {
        "attention_bias": False,
        "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 30.0,
        "sliding_window": W,
        "layer_types": [SLIDING, FULL, SLIDING],
    },
    "gpt_oss": {
        "attention_bias": True,
        "sliding_window": W,
        "layer_types": [SLIDING, FULL, SLIDING],
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 16,
            "rope_theta": 150000.0,
        },
    },
    "gemma3_text": {
        "attention_bias": False,
        "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 30.0,  # kept in the config, never applied by the model
        "sliding_window": W,
        "layer_types": [SLIDING, SLIDING, FULL],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        },
    },
    "phi3": {"sliding_window": None, "original_max_position_embeddings": 64},
    "olmo2": {"attention_bias": False},
    "cohere": {"attention_bias": False, "use_qk_norm": True, "layer_norm_eps": 1e-5},
    "cohere2": {  # its config class sets head_dim to hidden_size // num_attention_heads
        "attention_bias": False,
        "head_dim": C // H,
        "sliding_window": W,
        "layer_types": [SLIDING, SLIDING, FULL],
    },
    "starcoder2": {"use_bias": True, "sliding_window": W},
    "granite": {"attention_bias": False, "attention_multiplier": 0.3},
    "smollm3": {
        "attention_bias": False,
        "no_rope_layers": [1, 1, 0],
        "use_sliding_window": True,
        "sliding_window": W,
        "layer_types": [FULL, FULL, SLIDING],
    },
    "qwen2_moe": {
        "qkv_bias": True,
        "use_sliding_window": True,
        "sliding_window": W,
        "max_window_layers": 2,
        "layer_types": [SLIDING, FULL, FULL],
    },
    "qwen3_moe": {"attention_bias": False, "use_sliding_window": True, "sliding_window": W},
    "glm": {"attention_bias": True, "head_dim": 8, "rope_parameters": GLM_ROPE},
    "glm4": {"attention_bias": True, "head_dim": 8, "rope_parameters": GLM_ROPE},
    "falcon": {  # head_dim is hidden_size // num_attention_heads, no config key
        "head_dim": None,
        "num_key_value_heads": None,
        "num_kv_heads": H_KV,
        "new_decoder_architecture": True,
        "multi_query": True,
        "bias": True,
        "alibi": False,
    },
}
FUSED = ("phi3", "falcon")


def config(model_type, **overrides):
    return {**BASE, "model_type": model_type, **MODELS[model_type], **overrides}


def attention_state(
    rng, *, bias=False, out_bias=False, qk_norm=None, sinks=False, d=D, model=None
):  # fmt: skip
    """An attention module's state dict (random float64 arrays) with the named extras: q_norm
    and k_norm of ``qk_norm`` shape ("head", "per_head" or "all"); with ``model`` a fused
    family, the model's own layout (the separate one joined by the converter's way back,
    itself checked by the tests of the fused layouts below)."""
    h, h_kv = H, (1 if model == "falcon-mqa" else H_KV)
    shapes = {
        "q_proj.weight": (h * d, C),
        "k_proj.weight": (h_kv * d, C),
        "v_proj.weight": (h_kv * d, C),
        "o_proj.weight": (C, h * d),
    }
    if bias:
        shapes |= {"q_proj.bias": (h * d,), "k_proj.bias": (h_kv * d,), "v_proj.bias": (h_kv * d,)}
    if out_bias:
        shapes["o_proj.bias"] = (C,)
    if qk_norm is not None:
        q_shape, k_shape = {
            "head": ((d,), (d,)),
            "per_head": ((h, d), (h_kv, d)),
            "all": ((h * d,), (h_kv * d,)),
        }[qk_norm]
        shapes |= {"q_norm.weight": q_shape, "k_norm.weight": k_shape}
    if sinks:
        shapes["sinks"] = (h,)
    state = {name: rng.standard_normal(shape) for name, shape in shapes.items()}
    if model in FUSED:
        return hf_attention_state_from_grouped(config(model), state)
    if model == "falcon-mqa":
        return hf_attention_state_from_grouped(
            config("falcon", new_decoder_architecture=False), state
        )
    return state


# The attention entries each model's module has (``attention_state`` keywords).
EXTRAS = {
    "llama": {},
    "mistral": {},
    "qwen2": {"bias": True},
    "qwen3": {"qk_norm": "head"},
    "gemma2": {},
    "gpt_oss": {"bias": True, "out_bias": True, "sinks": True},
    "gemma3_text": {"qk_norm": "head"},
    "phi3": {"model": "phi3"},
    "olmo2": {"qk_norm": "all"},
    "cohere": {"qk_norm": "per_head"},
    "cohere2": {"d": C // H},
    "starcoder2": {"bias": True, "out_bias": True},
    "granite": {},
    "smollm3": {},
    "qwen2_moe": {"bias": True},
    "qwen3_moe": {"qk_norm": "head"},
    "glm": {"bias": True, "d": 8},
    "glm4": {"bias": True, "d": 8},
    "falcon": {"bias": True, "out_bias": True, "d": C // H, "model": "falcon"},
}


def model_state(rng, layers=LAYERS, **extras):
    """A whole causal LM's state dict: embeddings, each layer's attention, MLP and norms."""
    state = {"model.embed_tokens.weight": rng.standard_normal((10, C)), "lm_head.weight": None}
    for i in range(layers):
        for name, value in attention_state(rng, **extras).items():
            state[f"model.layers.{i}.self_attn.{name}"] = value
        state[f"model.layers.{i}.mlp.up_proj.weight"] = rng.standard_normal((8, C))
        state[f"model.layers.{i}.input_layernorm.weight"] = rng.standard_normal(C)
    return state


# -- what each model's config sets --------------------------------------------------------------


GEMMA3_NORM = {"qk_norm": True, "norm_eps": 1e-5, "norm_weight_offset": 1.0}
# (model, layer) -> the layer's options that differ from the constructor's defaults
EXPECTED = {
    ("llama", 0): {},
    ("mistral", 0): {"window": (W - 1, 0)},
    ("mistral", 2): {"window": (W - 1, 0)},
    ("qwen2", 0): {"bias": True},
    ("qwen2", 1): {"bias": True, "window": (W - 1, 0)},
    ("qwen3", 1): {"qk_norm": True, "norm_eps": 1e-5},
    ("gemma2", 0): {"scaling": 24**-0.5, "softcap": 30.0, "window": (W - 1, 0)},
    ("gemma2", 1): {"scaling": 24**-0.5, "softcap": 30.0},
    ("gpt_oss", 0): {"bias": True, "out_bias": True, "sinks": True, "window": (W - 1, 0)},
    ("gpt_oss", 1): {"bias": True, "out_bias": True, "sinks": True},
    ("gemma3_text", 0): {**GEMMA3_NORM, "scaling": 24**-0.5, "window": (W - 1, 0)},
    ("gemma3_text", 2): {**GEMMA3_NORM, "scaling": 24**-0.5},  # softcap 0: never applied
    ("phi3", 0): {},
    ("olmo2", 0): {"qk_norm": True, "qk_norm_shape": "all", "norm_eps": 1e-5},
    ("cohere", 0): {
        "qk_norm": True,
        "qk_norm_type": "layer",
        "qk_norm_shape": "per_head",
        "norm_eps": 1e-5,
        "rope_interleaved": True,
    },
    ("cohere2", 0): {"head_dim": 4, "rotary_dim": 4, "rope_interleaved": True, "window": (3, 0)},
    ("cohere2", 2): {"head_dim": 4, "rotary_dim": 0, "rope_interleaved": True},  # NoPE
    ("starcoder2", 0): {"bias": True, "out_bias": True, "window": (W - 1, 0)},
    ("granite", 0): {"scaling": 0.3},
    ("smollm3", 0): {},
    ("smollm3", 2): {"rotary_dim": 0, "window": (W - 1, 0)},  # NoPE, sliding
    ("qwen2_moe", 0): {"bias": True, "window": (W - 1, 0)},
    ("qwen2_moe", 1): {"bias": True},
    ("qwen3_moe", 2): {"qk_norm": True, "norm_eps": 1e-5, "window": (W - 1, 0)},
    ("glm", 0): {"head_dim": 8, "rotary_dim": 4, "bias": True, "rope_interleaved": True},
    ("glm4", 1): {"head_dim": 8, "rotary_dim": 4, "bias": True, "rope_interleaved": True},
    ("falcon", 0): {"head_dim": 4, "rotary_dim": 4, "bias": True, "out_bias": True},
}
DEFAULTS = {
    "bias": False,
    "out_bias": False,
    "qk_norm": False,
    "qk_norm_type": "rms",
    "qk_norm_shape": "head",
    "norm_weight_offset": 0.0,
    "window": None,
    "softcap": 0.0,
    "sinks": False,
    "scaling": None,
    "rope_interleaved": False,
    "rotary_dim": D,
    "original_max_positions": None,
}


@pytest.mark.parametrize(("model", "layer_idx"), EXPECTED, ids=lambda v: str(v))
def test_each_model_sets_what_its_code_does(rng, model, layer_idx):
    layer = grouped_from_hf(
        config(model), attention_state(rng, **EXTRAS[model]), layer_idx=layer_idx
    )

    args = layer.constructor_args()
    expected = DEFAULTS | {"hidden_size": C, "num_heads": H, "num_kv_heads": H_KV, "head_dim": D}
    expected |= EXPECTED[model, layer_idx]
    assert {name: args[name] for name in expected} == expected


@pytest.mark.parametrize("model", MODELS)
def test_the_weights_are_loaded_as_given_in_eval_mode(rng, model):
    """Under their own names (fused projections through the way back to the model's layout)."""
    state = attention_state(rng, **EXTRAS[model])

    layer = grouped_from_hf(config(model), state)

    back = hf_attention_state_from_grouped(config(model), layer.state_dict())
    assert not layer.training
    assert set(back) == set(state)
    for name, value in back.items():
        assert np.array_equal(value, state[name]), name


def test_hugging_faces_window_counts_the_query_itself(rng):
    """sliding_window = W lets a query see W keys: itself and W - 1 before it."""
    layer = grouped_from_hf(config("mistral", sliding_window=3), attention_state(rng))
    x = rng.standard_normal((1, 6, C))
    dout = np.zeros_like(x)
    dout[0, 5] = rng.standard_normal(C)  # the last query only

    layer(x)
    dx = layer.backward(dout)

    seen = np.flatnonzero(np.abs(dx[0]).sum(axis=-1) > 0)
    assert seen.tolist() == [3, 4, 5]


def test_qwen2_takes_its_biases_from_the_state_dict(rng):
    with_bias = grouped_from_hf(config("qwen2"), attention_state(rng, bias=True))
    without = grouped_from_hf(config("qwen2"), attention_state(rng))

    assert with_bias.constructor_args()["bias"] and not without.constructor_args()["bias"]
    with pytest.raises(KeyError, match=r"unexpected keys \['o_proj.bias'\]"):
        grouped_from_hf(config("qwen2"), attention_state(rng, bias=True, out_bias=True))


@pytest.mark.parametrize(
    ("overrides", "windows"),
    [
        ({"use_sliding_window": False, "sliding_window": None, "layer_types": [FULL] * 3}, []),
        ({"layer_types": None}, [1, 2]),  # a config.json without layer_types: Qwen's own rule
        ({"layer_types": None, "use_sliding_window": False}, []),
        ({"layer_types": None, "max_window_layers": 2}, [2]),
    ],
    ids=["off", "from-max_window_layers", "flag-off", "max_window_layers-2"],
)
def test_qwen_slides_where_its_config_says(rng, overrides, windows):
    sliding = [
        i
        for i in range(LAYERS)
        if grouped_from_hf(
            config("qwen2", **overrides), attention_state(rng, bias=True), layer_idx=i
        ).constructor_args()["window"]
        is not None
    ]

    assert sliding == windows


@pytest.mark.parametrize("model", ["gemma2", "gpt_oss"])
def test_alternating_models_without_layer_types_slide_on_even_layers(rng, model):
    cfg = config(model, layer_types=None)

    windows = [
        grouped_from_hf(cfg, attention_state(rng, **EXTRAS[model]), layer_idx=i).window
        for i in range(LAYERS)
    ]

    assert windows == [(W - 1, 0), None, (W - 1, 0)]


def test_mistral_without_a_sliding_window_attends_everything(rng):
    layer = grouped_from_hf(config("mistral", sliding_window=None), attention_state(rng))

    assert layer.window is None


def test_gemma2_without_a_cap_has_softcap_0(rng):
    layer = grouped_from_hf(config("gemma2", attn_logit_softcapping=None), attention_state(rng))

    assert layer.softcap == 0.0


def test_a_config_object_is_read_through_to_dict(rng):
    class Config:
        def to_dict(self):
            return config("qwen3")

    layer = grouped_from_hf(Config(), attention_state(rng, qk_norm="head"))

    assert layer.qk_norm


def test_head_dim_defaults_to_hidden_over_heads(rng):
    cfg = config("qwen2", head_dim=None)  # Qwen2's config has no head_dim

    layer = grouped_from_hf(cfg, attention_state(rng, bias=True, d=C // H))

    assert layer.head_dim == C // H


@pytest.mark.parametrize(
    ("model", "overrides", "windows"),
    [
        ("qwen2_moe", {"layer_types": None}, [0]),  # even layers below max_window_layers (2)
        ("qwen2_moe", {"layer_types": None, "max_window_layers": 3}, [0, 2]),
        ("qwen3_moe", {}, [0, 1, 2]),  # every layer under use_sliding_window
        ("qwen3_moe", {"use_sliding_window": False}, []),
        ("gemma3_text", {"layer_types": None, "sliding_window_pattern": 3}, [0, 1]),
        ("gemma3_text", {"layer_types": None}, [0, 1, 2]),  # every 6th is full
        ("cohere2", {"layer_types": None}, [0, 1, 2]),  # every 4th is full
        ("smollm3", {"layer_types": None}, [2]),  # the NoPE layers, under the flag
        ("smollm3", {"layer_types": None, "use_sliding_window": False}, []),
        ("phi3", {"sliding_window": W}, [0, 1, 2]),
        ("starcoder2", {"sliding_window": None}, []),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_each_family_slides_where_its_code_says(rng, model, overrides, windows):
    """Without layer_types (a config.json of the model's own), each config class's rule."""
    cfg = config(model, **overrides)

    sliding = [
        i
        for i in range(LAYERS)
        if grouped_from_hf(cfg, attention_state(rng, **EXTRAS[model]), layer_idx=i).window
        is not None
    ]

    assert sliding == windows


@pytest.mark.parametrize(
    ("model", "overrides", "rotating"),
    [
        ("smollm3", {"layer_types": None}, [0, 1]),  # no_rope_layers [1, 1, 0]
        (
            "smollm3",
            {"layer_types": None, "no_rope_layers": None, "no_rope_layer_interval": 2},
            [0, 2],
        ),
        ("cohere2", {}, [0, 1]),  # RoPE on its sliding layers only
        ("llama", {}, [0, 1, 2]),
    ],
    ids=["smollm3", "smollm3-interval", "cohere2", "llama"],
)
def test_nope_layers_have_rotary_dim_0_and_ignore_given_frequencies(
    rng, model, overrides, rotating
):
    given = rng.random(EXTRAS[model].get("d", D) // 2).astype(np.float32)

    layers = [
        grouped_from_hf(
            config(model, **overrides),
            attention_state(rng, **EXTRAS[model]),
            layer_idx=i,
            inv_freq=given,
        )
        for i in range(LAYERS)
    ]

    assert [i for i, layer in enumerate(layers) if layer.rotary_dim] == rotating
    for layer in layers:
        expected = given if layer.rotary_dim else np.zeros(0)
        assert np.array_equal(layer.inv_freq, expected.astype(np.float64))


def test_gemma3_rotates_each_layer_type_with_its_own_parameters(rng):
    """Sliding layers: the local base, unscaled; full layers: the global base, scaled by 8."""
    cfg = config("gemma3_text")
    state = attention_state(rng, **EXTRAS["gemma3_text"])

    sliding = grouped_from_hf(cfg, state, layer_idx=0)
    full = grouped_from_hf(cfg, state, layer_idx=2)

    local = 1.0 / 1e4 ** (np.arange(0, D, 2) / D)
    assert_close(sliding.inv_freq, local, dtype=np.float32, name="local")
    assert_close(full.inv_freq, 1.0 / 1e6 ** (np.arange(0, D, 2) / D) / 8, dtype=np.float32)
    thetas = [layer.constructor_args()["rope_theta"] for layer in (sliding, full)]
    assert thetas == [1e4, 1e6]
    with pytest.raises(ValueError, match="differ per layer type: give layer_idx"):
        hf_inv_freq(cfg)


def test_a_transformers_4_gemma3_config_reads_its_two_bases(rng):
    """rope_theta (global, with rope_scaling) and rope_local_base_freq at the top level."""
    v5 = config("gemma3_text")
    v4 = {key: value for key, value in v5.items() if key != "rope_parameters"}
    v4 |= {"rope_theta": 1e6, "rope_local_base_freq": 1e4}
    v4["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}

    for i in (0, 2):
        assert np.array_equal(hf_inv_freq(v4, layer_idx=i), hf_inv_freq(v5, layer_idx=i))


def test_long_rope_reads_both_sets_and_the_models_original_length(rng):
    """Phi-3's LongRoPE: short factors below original_max_position_embeddings (the top-level
    one, which the model prefers), long ones past it; the attention factor from the ratio of
    the lengths."""
    factors = {"short_factor": [1.0, 2.0, 4.0], "long_factor": [2.0, 8.0, 32.0]}
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, **factors}
    rope["original_max_position_embeddings"] = 4  # the top-level value wins
    cfg = config("phi3", rope_parameters=rope, max_position_embeddings=256)
    plain = hf_inv_freq(config("phi3"))

    layer = grouped_from_hf(cfg, attention_state(rng, **EXTRAS["phi3"]))

    assert layer.original_max_positions == 64
    assert_close(layer.inv_freq, plain / np.array([1.0, 2.0, 4.0]), dtype=np.float32)
    assert_close(layer.long_inv_freq, plain / np.array([2.0, 8.0, 32.0]), dtype=np.float32)
    assert layer.rope_attention_factor == hf_rope_attention_factor(cfg)
    assert layer.rope_attention_factor == np.sqrt(1 + np.log(4) / np.log(64))
    renamed = config("phi3", rope_parameters=rope | {"rope_type": "su"})  # its old name
    assert np.array_equal(hf_inv_freq(renamed, long=True), hf_inv_freq(cfg, long=True))
    with pytest.raises(ValueError, match="long_factor has 2 entries; the rotated width 6 needs 3"):
        hf_inv_freq(config("phi3", rope_parameters=rope | {"long_factor": [1.0, 2.0]}), long=True)


def test_partial_rotary_turns_the_models_share_of_each_head(rng):
    """Phi-3 honours partial_rotary_factor (here 4 of 6 coordinates: int(6 * 0.7)), GLM too;
    a factor that leaves an odd width is refused, and so is a factor on a model that ignores
    it (Llama's RoPE turns the whole head)."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.7}

    layer = grouped_from_hf(
        config("phi3", rope_parameters=rope), attention_state(rng, **EXTRAS["phi3"])
    )

    assert layer.rotary_dim == 4 and layer.inv_freq.shape == (2,)
    assert_close(layer.inv_freq, 1.0 / 1e4 ** (np.arange(0, 4, 2) / 4), dtype=np.float32)
    with pytest.raises(ValueError, match="rotates 3 coordinates; RoPE needs an even number"):
        grouped_from_hf(
            config("glm", rope_parameters=rope | {"partial_rotary_factor": 0.375}),
            attention_state(rng, **EXTRAS["glm"]),
        )


def test_cohere_without_use_qk_norm_has_no_qk_norm(rng):
    layer = grouped_from_hf(config("cohere", use_qk_norm=False), attention_state(rng))

    assert not layer.qk_norm and layer.rope_interleaved


def test_falcon_reads_its_kv_heads_from_its_architecture(rng):
    """New decoder: num_kv_heads; otherwise multi_query's one kv head; neither: all heads. No
    attention dropout: Falcon's rotary path never applies it."""
    mqa = config("falcon", new_decoder_architecture=False, attention_dropout=0.3)
    state = attention_state(rng, bias=True, out_bias=True, d=C // H, model="falcon-mqa")

    layer = grouped_from_hf(mqa, state)

    assert layer.num_kv_heads == 1 and layer.dropout == 0.0
    assert (
        grouped_from_hf(config("falcon"), attention_state(rng, **EXTRAS["falcon"])).num_kv_heads
        == H_KV
    )


# -- fused projections: split on load, joined on save ------------------------------------------


def test_phi3_qkv_proj_rows_are_query_then_key_then_value_heads(rng):
    fused = np.arange((H + 2 * H_KV) * D, dtype=np.float64)[:, None] * np.ones(C)  # row r = r
    state = {"qkv_proj.weight": fused, "o_proj.weight": rng.standard_normal((C, H * D))}

    layer = grouped_from_hf(config("phi3"), state)

    rows = {
        name: layer.state_dict()[f"{name}.weight"][:, 0] for name in ("q_proj", "k_proj", "v_proj")
    }
    assert rows["q_proj"].tolist() == list(range(H * D))
    assert rows["k_proj"].tolist() == list(range(H * D, (H + H_KV) * D))
    assert rows["v_proj"].tolist() == list(range((H + H_KV) * D, (H + 2 * H_KV) * D))


def test_falcon_query_key_value_rows_are_grouped_per_kv_head(rng):
    """Per kv head c: its H / H_kv query heads, then k_c, then v_c, each head_dim rows (written
    out head by head here, as Falcon's _split_heads views them)."""
    d, group = C // H, H // H_KV
    fused = np.arange((H + 2 * H_KV) * d, dtype=np.float64)
    state = {
        "query_key_value.weight": fused[:, None] * np.ones(C),
        "query_key_value.bias": fused,
        "dense.weight": rng.standard_normal((C, H * d)),
        "dense.bias": rng.standard_normal(C),
    }
    heads = [fused[i * d : (i + 1) * d] for i in range(H + 2 * H_KV)]  # the fused rows, by head
    blocks = [heads[c * (group + 2) : (c + 1) * (group + 2)] for c in range(H_KV)]
    expected = {
        "q_proj": np.concatenate([head for block in blocks for head in block[:group]]),
        "k_proj": np.concatenate([block[group] for block in blocks]),
        "v_proj": np.concatenate([block[group + 1] for block in blocks]),
    }

    layer = grouped_from_hf(config("falcon"), state)

    for name, rows in expected.items():
        assert np.array_equal(layer.state_dict()[f"{name}.weight"][:, 0], rows), name
        assert np.array_equal(layer.state_dict()[f"{name}.bias"], rows), name
    assert np.array_equal(layer.state_dict()["o_proj.bias"], state["dense.bias"])


@pytest.mark.parametrize("model", ["phi3", "falcon", "gemma3_text"])
def test_the_way_back_restores_the_models_state_dict(rng, model):
    """grouped_from_hf, then hf_attention_state_from_grouped: the very arrays, under the model's
    names (separate families keep theirs); gradient dicts map the same way."""
    state = attention_state(rng, **EXTRAS[model])
    if model in FUSED:  # a fused state written directly, not through the way back
        state = {name: rng.standard_normal(value.shape) for name, value in state.items()}

    layer = grouped_from_hf(config(model), state)
    back = hf_attention_state_from_grouped(config(model), layer.state_dict())

    assert set(back) == set(state)
    for name, value in back.items():
        assert np.array_equal(value, state[name]), name


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"q_proj.weight": None}, KeyError, r"missing keys \['q_proj.weight'\] of a falcon"),
        ({"k_proj.bias": None}, KeyError, r"missing keys \['k_proj.bias'\].*biases go together"),
        ({"k_proj.weight": np.zeros((3, C))}, ValueError, r"k_proj.weight has shape \(3, 16\)"),
    ],
    ids=["missing", "one-bias", "shape"],
)
def test_the_way_back_refuses_what_the_model_cannot_hold(rng, change, error, message):
    state = grouped_from_hf(config("falcon"), attention_state(rng, **EXTRAS["falcon"])).state_dict()
    state = {k: v for k, v in ({**state, **change}).items() if v is not None}

    with pytest.raises(error, match=message):
        hf_attention_state_from_grouped(config("falcon"), state)


def test_hf_attention_state_finds_fused_projections(rng):
    state = {
        f"transformer.h.1.self_attention.{k}": v
        for k, v in attention_state(rng, **EXTRAS["falcon"]).items()
    }
    state["transformer.h.1.mlp.dense_h_to_4h.weight"] = rng.standard_normal((8, C))

    assert set(hf_attention_state(state, layer_idx=1)) == {
        "query_key_value.weight",
        "query_key_value.bias",
        "dense.weight",
        "dense.bias",
    }


# -- RoPE ---------------------------------------------------------------------------------------


def test_inv_freq_is_used_as_given(rng):
    given = rng.random(D // 2).astype(np.float32)

    layer = grouped_from_hf(config("llama"), attention_state(rng), inv_freq=given)

    assert np.array_equal(layer.inv_freq, given.astype(np.float64))


def test_default_frequencies_are_computed_in_float32(rng):
    layer = grouped_from_hf(config("llama"), attention_state(rng))

    freqs = hf_inv_freq(config("llama"))
    assert freqs.dtype == np.float32
    assert np.array_equal(layer.inv_freq, freqs.astype(np.float64))
    assert not np.array_equal(freqs.astype(np.float64), 1.0 / 10000.0 ** (np.arange(0, D, 2) / D))


def test_a_transformers_4_config_reads_like_rope_parameters(rng):
    """transformers 4's config.json: rope_theta and rope_scaling ("type") at the top level."""
    v5 = config(
        "llama",
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    v4 = {key: value for key, value in v5.items() if key != "rope_parameters"}
    v4 |= {"rope_theta": 500000.0, "rope_scaling": dict(v5["rope_parameters"])}
    v4["rope_scaling"]["type"] = v4["rope_scaling"].pop("rope_type")
    del v4["rope_scaling"]["rope_theta"]

    assert np.array_equal(hf_inv_freq(v4), hf_inv_freq(v5))
    assert not np.array_equal(
        hf_inv_freq(v5),
        hf_inv_freq(
            config("llama", rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
        ),
    )  # the scaling is applied


def test_yarn_takes_an_explicit_attention_factor(rng):
    params = MODELS["gpt_oss"]["rope_parameters"] | {"attention_factor": 1.25}
    state = attention_state(rng, **EXTRAS["gpt_oss"])

    layer = grouped_from_hf(config("gpt_oss", rope_parameters=params), state)

    assert layer.rope_attention_factor == 1.25


# -- state dicts: prefixes and layers -----------------------------------------------------------


def test_a_whole_models_state_dict_gives_the_chosen_layer(rng):
    state = model_state(rng, **EXTRAS["gpt_oss"])

    layer = grouped_from_hf(config("gpt_oss"), state, layer_idx=1)

    prefix = "model.layers.1.self_attn."
    for name, value in layer.state_dict().items():
        assert np.array_equal(value, state[prefix + name]), name


def test_a_decoder_layers_state_dict_is_stripped_of_self_attn(rng):
    state = {f"self_attn.{k}": v for k, v in attention_state(rng).items()}
    state["mlp.up_proj.weight"] = rng.standard_normal((8, C))

    assert set(hf_attention_state(state)) == {
        "q_proj.weight",
        "k_proj.weight",
        "v_proj.weight",
        "o_proj.weight",
    }
    assert convert.grouped_from_hf is grouped_from_hf  # importable with the other layouts


def test_a_one_layer_dict_of_another_layer_is_refused(rng):
    state = {f"model.layers.2.self_attn.{k}": v for k, v in attention_state(rng).items()}

    grouped_from_hf(config("mistral"), state, layer_idx=2)
    with pytest.raises(ValueError, match="holds layer 2 .* but layer_idx is 0"):
        grouped_from_hf(config("mistral"), state)


def test_a_layer_the_state_dict_lacks_names_the_expected_form(rng):
    state = model_state(rng, layers=2)

    with pytest.raises(KeyError, match=r"2 attention layers .* 0 of them for layer_idx 2.*"):
        grouped_from_hf(config("llama"), state, layer_idx=2)


def test_a_state_dict_without_attention_names_the_expected_form(rng):
    state = {"h.0.attn.c_attn.weight": rng.standard_normal((C, 3 * C))}

    with pytest.raises(
        KeyError,
        match=r"expected keys like 'model.layers.\{i\}.self_attn.q_proj.weight' or 'q_proj.weight'",
    ):
        grouped_from_hf(config("llama"), state)


def test_missing_keys_are_named_with_their_prefix(rng):
    state = model_state(rng, **EXTRAS["gpt_oss"])
    del state["model.layers.0.self_attn.sinks"]

    with pytest.raises(KeyError, match=r"missing keys \['model.layers.0.self_attn.sinks'\]"):
        grouped_from_hf(config("gpt_oss"), state)


@pytest.mark.parametrize(
    ("model", "extra"),
    [("llama", "q_proj.bias"), ("mistral", "q_norm.weight"), ("qwen3", "rotary_emb.inv_freq")],
)
def test_unexpected_attention_keys_are_refused(rng, model, extra):
    """Named as the caller wrote them, before the layer is built (the layer's own
    load_state_dict would name them without the prefix)."""
    state = model_state(rng, **EXTRAS[model])
    state[f"model.layers.0.self_attn.{extra}"] = rng.standard_normal(H * D)

    with pytest.raises(
        KeyError,
        match=rf"unexpected keys \['model.layers.0.self_attn.{extra}'\] for this config's "
        r"attention .* under the prefix 'model.layers.0.self_attn.'",
    ):
        grouped_from_hf(config(model), state)


# -- dtypes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "layer_dtype"),
    [(np.float64, np.float64), (np.float32, np.float32), (np.float16, np.float32)],
)
def test_the_layer_takes_the_weights_precision(rng, dtype, layer_dtype):
    state = {k: v.astype(dtype) for k, v in attention_state(rng).items()}

    layer = grouped_from_hf(config("llama"), state)

    assert layer.dtype == layer_dtype
    assert isinstance(layer, GroupedQueryAttention)


# -- refusals, before any work -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "error", "message"),
    [
        (
            {**BASE, "model_type": "gpt2"},
            ValueError,
            re.escape(
                f"model_type 'gpt2' is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}"
            ),
        ),
        (
            config("llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4}),
            ValueError,
            r"rope_type 'dynamic' is not supported; supported: \['default', 'linear', "
            r"'llama3', 'yarn', 'longrope', 'proportional'\]",
        ),
        (
            config("llama", partial_rotary_factor=0.5),
            ValueError,
            "partial_rotary_factor is 0.5",
        ),
        (
            config("gemma2", use_bidirectional_attention=True),
            ValueError,
            "not causal",
        ),
        (
            config("llama", rope_parameters={"rope_type": "default"}),
            ValueError,
            "no rope_theta",
        ),
        (
            config("llama", num_hidden_layers=0),
            ValueError,
            "layer_idx is 0 but the config has num_hidden_layers = 0",
        ),
        (
            config("gemma2", layer_types=["chunked_attention", FULL, FULL]),
            ValueError,
            "layer_types\\[0\\] is 'chunked_attention'",
        ),
        (
            config("mistral", sliding_window=0),
            ValueError,
            "sliding_window",
        ),
        (["not", "a", "mapping"], TypeError, "config must be a mapping"),
        (
            {**BASE, "model_type": "gemma3"},
            ValueError,
            "the gemma3 config has no text_config, which holds its language model",
        ),
        (config("falcon", alibi=True), ValueError, "alibi is set: .* adds ALiBi"),
        (config("gemma3_text", use_bidirectional_attention=True), ValueError, "not causal"),
        (
            config("smollm3", use_sliding_window=False, layer_types=[SLIDING] * 3),
            ValueError,
            r"layer_types\[0\] is 'sliding_attention' but use_sliding_window is false",
        ),
        (config("phi3", partial_rotary_factor=0.5), ValueError, "rotates 3 coordinates"),
        (config("falcon", num_kv_heads=3), ValueError, "4 attention heads are not a multiple"),
    ],
    ids=[
        "model-type",
        "rope-type",
        "partial-rotary",
        "bidirectional",
        "no-theta",
        "layer-idx",
        "layer-type",
        "window-0",
        "not-a-mapping",
        "gemma3-multimodal",
        "falcon-alibi",
        "gemma3-bidirectional",
        "smollm3-inconsistent",
        "phi3-odd-partial",
        "falcon-kv-heads",
    ],
)
def test_configs_the_layer_cannot_express_are_refused(rng, cfg, error, message):
    model = cfg["model_type"] if isinstance(cfg, dict) else None
    state = attention_state(rng, **EXTRAS.get(model, {}))

    with pytest.raises(error, match=message):
        grouped_from_hf(cfg, state)


def test_weights_of_another_head_dim_name_the_config(rng):
    with pytest.raises(
        ValueError,
        match=r"q_proj.weight has shape \(32, 16\), but the config \(hidden_size=16, "
        r"num_heads=4, num_kv_heads=2, head_dim=6\) gives \(24, 16\)",
    ):
        grouped_from_hf(config("llama"), attention_state(rng, d=8))


def test_integer_weights_are_refused(rng):
    state = attention_state(rng)
    state["v_proj.weight"] = state["v_proj.weight"].astype(np.int64)

    with pytest.raises(TypeError, match="v_proj.weight must be a floating-point array"):
        grouped_from_hf(config("llama"), state)


def test_a_state_dict_that_is_no_mapping_is_refused():
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        hf_attention_state([("q_proj.weight", np.zeros((2, 2)))])


# -- padding ------------------------------------------------------------------------------------


def test_padding_from_hf_flips_the_polarity_and_starts_positions_at_the_first_token():
    attention_mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])

    padding, positions = padding_from_hf(attention_mask)

    assert padding.tolist() == [[False] * 5, [True, True, False, False, False]]
    assert positions.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]


def test_padding_from_hf_gives_the_positions_of_a_decode_steps_tokens():
    attention_mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=bool)

    padding, positions = padding_from_hf(attention_mask, 1)

    assert padding.shape == (2, 4) and positions.tolist() == [[2], [3]]


@pytest.mark.parametrize(
    ("attention_mask", "n", "message"),
    [
        (np.array([1, 1, 0]), None, r"\(B, M\) of 0 \(padding\) and 1 \(keep\), got shape \(3,\)"),
        (np.array([[1, 2]]), None, "of 0 .padding. and 1"),
        (np.array([[1.0, 0.0]]), None, "dtype float64"),
        (np.ones((1, 3), int), 4, "n = 4 new tokens, but attention_mask covers only M = 3"),
    ],
    ids=["rank", "values", "float", "n"],
)
def test_padding_from_hf_refuses_what_is_no_attention_mask(attention_mask, n, message):
    with pytest.raises(ValueError, match=message):
        padding_from_hf(attention_mask, n)


# -- multimodal wrappers: the language model's config and entries -------------------------------


def wrapper_state(rng):
    """A whole multimodal model's state dict: a vision tower's attention (other shapes) beside
    the language model's layers, as Gemma3Model names them."""
    text = attention_state(rng, qk_norm="head")
    projections = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")
    vision = {
        f"vision_tower.encoder.layers.0.self_attn.{key}": rng.standard_normal((6, 6))
        for key in projections
    }
    layers = {
        f"language_model.layers.{i}.self_attn.{k}": v for i in (0, 1) for k, v in text.items()
    }
    return text, vision | layers


@pytest.mark.parametrize("layer_idx", [0, 1])  # layer 0: the vision tower's has that number too
def test_a_wrapper_reads_its_text_config_and_its_language_models_entries(rng, layer_idx):
    text, whole = wrapper_state(rng)
    wrapper = {"model_type": "gemma3", "text_config": config("gemma3_text")}

    from_whole = grouped_from_hf(wrapper, whole, layer_idx=layer_idx)
    from_text = grouped_from_hf(config("gemma3_text"), text, layer_idx=layer_idx)

    assert from_whole.constructor_args() == from_text.constructor_args()
    for key, value in from_text.state_dict().items():
        np.testing.assert_array_equal(from_whole.state_dict()[key], value)
    back = hf_attention_state_from_grouped(wrapper, from_whole.state_dict())
    assert back.keys() == text.keys()


def test_a_wrapper_reads_the_language_models_own_state_dict_too(rng):
    text, _ = wrapper_state(rng)
    wrapper = {"model_type": "gemma3", "text_config": config("gemma3_text")}

    layer = grouped_from_hf(wrapper, text)

    np.testing.assert_array_equal(layer.state_dict()["q_proj.weight"], text["q_proj.weight"])


def test_a_wrappers_text_config_of_another_model_type_is_refused(rng):
    text, whole = wrapper_state(rng)
    wrapper = {"model_type": "gemma3", "text_config": config("llama")}

    with pytest.raises(ValueError, match="text_config has model_type 'llama'.*'gemma3_text'"):
        grouped_from_hf(wrapper, whole)


# -- differential attention: DiffLlama ------------------------------------------------------------
DIFFLLAMA = {**BASE, "model_type": "diffllama", "attention_bias": False, "lambda_std_dev": 0.1}


def diffllama_state(rng):
    """DiffLlama's attention state dict: Llama's projections and the four lambda vectors (D,)."""
    lambdas = {name: rng.standard_normal(D) for name in LAMBDA_NAMES}
    return attention_state(rng) | lambdas


@pytest.mark.parametrize("layer_idx", [0, 2])
def test_diffllama_reads_lambda_init_from_the_layers_depth(rng, layer_idx):
    layer = grouped_from_hf(DIFFLLAMA, diffllama_state(rng), layer_idx=layer_idx)

    args = layer.constructor_args()
    assert args["differential"] is True
    assert args["lambda_init"] == lambda_init_from_depth(layer_idx)
    assert args["differential_eps"] == BASE["rms_norm_eps"]  # its groupnorm's eps


def test_diffllama_lambdas_load_and_come_back_under_their_names(rng):
    state = diffllama_state(rng)

    layer = grouped_from_hf(DIFFLLAMA, state)
    back = hf_attention_state_from_grouped(DIFFLLAMA, layer.state_dict())

    assert set(back) == set(state)
    for name, value in back.items():
        assert np.array_equal(value, state[name]), name


def test_diffllama_without_its_lambdas_is_refused_by_name(rng):
    state = {k: v for k, v in diffllama_state(rng).items() if k != "lambda_k2"}

    with pytest.raises(KeyError, match=r"missing keys \['lambda_k2'\]"):
        grouped_from_hf(DIFFLLAMA, state)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"attention_dropout": 0.1}, "attention_dropout is 0.1: DiffLlama's attention refuses"),
        ({"num_key_value_heads": 1}, "num_key_value_heads is 1: .* even count"),
        ({"num_key_value_heads": None, "num_attention_heads": 3}, "num_key_value_heads is 3"),
    ],
    ids=["dropout", "odd-kv-heads", "odd-heads-multi-head"],
)
def test_diffllama_configs_its_model_refuses_are_refused_by_key(rng, overrides, message):
    with pytest.raises(ValueError, match=message):
        grouped_from_hf({**DIFFLLAMA, **overrides}, diffllama_state(rng))
