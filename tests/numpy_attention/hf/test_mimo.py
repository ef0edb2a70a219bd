"""MiMo-V2-Flash's row (numpy_attention.hf): a config.json read as its config class fills it (layer
pattern, window from ``sliding_window_size``, RoPE per layer type at 0.334 of the head), the
sizes and sinks of each layer as ``MiMoV2FlashAttention`` builds them, the way back with values
narrower than the keys, and the configs it refuses by key. Against the module itself:
tests/parity/test_hf_models.py."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf, hf_attention_state_from_grouped
from numpy_attention.hf.families import layer_options
from numpy_attention.hf.rope import rope_options

transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.mimo_v2_flash.modeling_mimo_v2_flash")

LAYERS = 7  # full, 4 sliding, full, sliding: the config class's pattern
SIZES = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 12}
SIZES |= {"v_head_dim": 8, "num_hidden_layers": LAYERS}
# a config.json as released: no layer_types, no rope_parameters, the SGLang-style window size
JSON = {"model_type": "mimo_v2_flash", **SIZES, "sliding_window_size": 5, "rope_theta": 5e6}


def model_config(**keywords):
    return transformers.MiMoV2FlashConfig(**SIZES, sliding_window_size=5, **keywords)


def options(config, layer_idx):
    return layer_options(config, "mimo_v2_flash", layer_idx, {}) | rope_options(config, layer_idx)


@pytest.mark.parametrize("layer_idx", range(LAYERS))
def test_a_config_json_reads_as_its_config_class_and_the_module_build_it(layer_idx):
    """Each layer's options from the config.json equal those from the config class's dict, and
    agree with what MiMoV2FlashAttention builds: key/value heads, value width, scale, sinks and
    window (sliding_window_size 5: a window of 6 keys)."""
    config = model_config()
    module = modeling.MiMoV2FlashAttention(config, layer_idx)

    ours = options(JSON, layer_idx)

    expected = options(config.to_dict(), layer_idx)
    assert {k: v for k, v in ours.items() if k != "inv_freq"} == {
        k: v for k, v in expected.items() if k != "inv_freq"
    }
    np.testing.assert_array_equal(ours["inv_freq"], expected["inv_freq"])
    sliding = config.layer_types[layer_idx] == "sliding_attention"
    assert ours["num_kv_heads"] == module.k_proj.out_features // 12 == (2 if sliding else 1)
    assert ours["v_head_dim"] == module.v_head_dim == 8
    assert ours["value_scale"] == module.v_scale == 0.707
    assert ours.get("sinks", False) == (module.sinks is not None) == sliding
    assert ours["window"] == ((module.sliding_window - 1, 0) if sliding else None)
    assert ours["rotary_dim"] == 4  # int(12 * 0.334)
    assert not ours["out_bias"] and module.o_proj.bias is None


def test_a_null_value_scale_is_one_and_a_missing_one_the_config_class_s():
    assert options(JSON | {"attention_value_scale": None}, 1)["value_scale"] == 1.0
    assert options({k: v for k, v in JSON.items() if k != "v_head_dim"}, 1)["v_head_dim"] == 128


def test_the_way_back_gives_the_modules_own_state_dict(rng):
    """A sliding layer's state dict (random values, the module's names and shapes: v_proj
    (2 * 8, C), o_proj (C, 4 * 8), sinks) loaded and given back unchanged."""
    config = model_config(attention_bias=True)
    shapes = modeling.MiMoV2FlashAttention(config, 1).state_dict()
    state = {key: rng.standard_normal(tuple(value.shape)) for key, value in shapes.items()}

    layer = grouped_from_hf(config.to_dict(), state, layer_idx=1)
    back = hf_attention_state_from_grouped(config.to_dict(), layer.state_dict(), layer_idx=1)

    assert layer.v_head_dim == 8 and layer.num_kv_heads == 2 and layer.has_sinks
    assert set(back) == set(state)
    for key, value in back.items():
        assert np.array_equal(value, state[key]), key


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"swa_num_key_value_heads": 1}, "swa_num_key_value_heads is 1.*twice"),
        ({"swa_v_head_dim": 12}, "swa_v_head_dim is 12"),
        ({"swa_head_dim": 8}, "swa_head_dim is 8"),
        ({"add_full_attention_sink_bias": True}, "add_full_attention_sink_bias is True"),
        ({"add_swa_attention_sink_bias": False}, "add_swa_attention_sink_bias is False"),
        ({"hybrid_layer_pattern": [0, 1, 1, 1, 1, 1, 1]}, "hybrid_layer_pattern disagrees"),
        ({"rope_theta": 1e6}, "rope_theta = 1000000.0 but no rope_parameters"),
        ({"swa_rope_theta": 1e5}, "swa_rope_theta = 100000.0 but no rope_parameters"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling = "),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor is 0.5 at the top level"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "one entry per layer"),
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                }
            },
            "rope_type 'linear' on MiMo-V2-Flash",
        ),
        ({"attention_value_scale": float("nan")}, "attention_value_scale.*finite"),
    ],
)
def test_what_its_config_class_ignores_is_refused_where_it_says_otherwise(rng, change, message):
    config = model_config()
    shapes = modeling.MiMoV2FlashAttention(config, 1).state_dict()
    state = {key: rng.standard_normal(tuple(value.shape)) for key, value in shapes.items()}

    with pytest.raises(ValueError, match=message):
        grouped_from_hf(JSON | change, state, layer_idx=1)


def test_what_agrees_with_the_model_is_read_without_complaint(rng):
    """The released config.json's own keys, where they say what transformers does."""
    agreeing = {"swa_num_key_value_heads": 2, "swa_v_head_dim": 8, "swa_head_dim": 12}
    agreeing |= {"add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False}
    agreeing |= {"hybrid_layer_pattern": [0, 1, 1, 1, 1, 0, 1], "swa_rope_theta": 1e4}
    agreeing |= {"partial_rotary_factor": 0.334}
    config = model_config()
    shapes = modeling.MiMoV2FlashAttention(config, 1).state_dict()
    state = {key: rng.standard_normal(tuple(value.shape)) for key, value in shapes.items()}

    layer = grouped_from_hf(JSON | agreeing, state, layer_idx=1)

    assert layer.window == (5, 0) and layer.value_scale == 0.707
