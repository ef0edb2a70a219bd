"""numpy_attention.hf: Hugging Face configs and state dicts read into GroupedQueryAttention, NumPy
only (hand-written config dicts shaped like ``config.to_dict()``): what each model's config sets
(sizes, biases, QK-norm, windows per layer, Gemma 2's scale and cap, GPT-OSS's sinks, RoPE),
prefixes stripped and layers chosen, dtypes, and every refusal before any work. The layer against
transformers' own modules: tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import convert
from numpy_attention.grouped import GroupedQueryAttention
from numpy_attention.hf import grouped_from_hf, hf_attention_state, hf_inv_freq, padding_from_hf

C, H, H_KV, D, LAYERS, W = 16, 4, 2, 6, 3, 4
FULL, SLIDING = "full_attention", "sliding_attention"

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
}


def config(model_type, **overrides):
    return {**BASE, "model_type": model_type, **MODELS[model_type], **overrides}


def attention_state(rng, *, bias=False, out_bias=False, qk_norm=False, sinks=False, d=D):
    """An attention module's state dict (random float64 arrays) with the named extras."""
    shapes = {
        "q_proj.weight": (H * d, C),
        "k_proj.weight": (H_KV * d, C),
        "v_proj.weight": (H_KV * d, C),
        "o_proj.weight": (C, H * d),
    }
    if bias:
        shapes |= {"q_proj.bias": (H * d,), "k_proj.bias": (H_KV * d,), "v_proj.bias": (H_KV * d,)}
    if out_bias:
        shapes["o_proj.bias"] = (C,)
    if qk_norm:
        shapes |= {"q_norm.weight": (d,), "k_norm.weight": (d,)}
    if sinks:
        shapes["sinks"] = (H,)
    return {name: rng.standard_normal(shape) for name, shape in shapes.items()}


# The attention entries each model's module has (``attention_state`` keywords).
EXTRAS = {
    "llama": {},
    "mistral": {},
    "qwen2": {"bias": True},
    "qwen3": {"qk_norm": True},
    "gemma2": {},
    "gpt_oss": {"bias": True, "out_bias": True, "sinks": True},
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
}
DEFAULTS = {
    "bias": False,
    "out_bias": False,
    "qk_norm": False,
    "window": None,
    "softcap": 0.0,
    "sinks": False,
    "scaling": None,
    "rope_interleaved": False,
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
    state = attention_state(rng, **EXTRAS[model])

    layer = grouped_from_hf(config(model), state)

    assert not layer.training
    assert set(layer.state_dict()) == set(state)
    for name, value in layer.state_dict().items():
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

    layer = grouped_from_hf(Config(), attention_state(rng, qk_norm=True))

    assert layer.qk_norm


def test_head_dim_defaults_to_hidden_over_heads(rng):
    cfg = config("qwen2", head_dim=None)  # Qwen2's config has no head_dim

    layer = grouped_from_hf(cfg, attention_state(rng, bias=True, d=C // H))

    assert layer.head_dim == C // H


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
            r"model_type 'gpt2' is not supported; supported: \['cohere', 'cohere2', 'falcon', "
            r"'gemma2', 'gemma3_text', 'glm', 'glm4', 'gpt_oss', 'granite', 'llama', 'mistral', "
            r"'olmo2', 'phi3', 'qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe', 'smollm3', "
            r"'starcoder2'\]",
        ),
        (
            config("llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4}),
            ValueError,
            r"rope_type 'dynamic' is not supported; supported: \['default', 'linear', "
            r"'llama3', 'yarn', 'longrope'\]",
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
    ],
)
def test_configs_the_layer_cannot_express_are_refused(rng, cfg, error, message):
    with pytest.raises(error, match=message):
        grouped_from_hf(cfg, attention_state(rng))


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
