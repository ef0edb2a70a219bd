"""Beam's row (numpy_attention.hf): which layers slide and rotate as its config class and model
decide, its per-head gate bias on load and on the way back (weights kept, gradients summed), and
the configs it refuses by key. Against BeamAttention itself: tests/parity/test_hf_models.py."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf, hf_attention_state_from_grouped
from numpy_attention.hf.families import FAMILIES, layer_options
from numpy_attention.hf.family import FULL, SLIDING, layer_kind
from numpy_attention.hf.rope import rotary_dim
from numpy_attention.hf.rows.gated import BEAM_TEMPERATURE

transformers = pytest.importorskip("transformers")

SIZES = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
H, D = 4, 8


def beam_config(**keywords):
    """The config dict BeamConfig writes, tiny."""
    return transformers.BeamConfig(**SIZES, **keywords).to_dict()


def beam_state(rng, config, layer_idx=1):
    """A random state dict of BeamAttention's own names and shapes."""
    from transformers.models.beam.modeling_beam import BeamAttention

    config = transformers.BeamConfig(**{k: v for k, v in config.items() if k in SIZES} | {
        "num_hidden_layers": config["num_hidden_layers"],
        "layer_types": config["layer_types"],
    })  # fmt: skip
    shapes = BeamAttention(config, layer_idx).state_dict()
    return {key: rng.standard_normal(tuple(value.shape)) for key, value in shapes.items()}


def test_without_layer_types_beam_slides_where_its_config_class_would():
    config = beam_config(num_hidden_layers=13)
    theirs = config.pop("layer_types")

    ours = [layer_kind(config, FAMILIES["beam"], i) for i in range(13)]

    assert ours == theirs
    assert ours[5] == ours[11] == ours[12] == FULL and ours[6] == SLIDING


def test_a_null_rope_entry_makes_that_layer_type_nope_with_the_temperature():
    default = beam_config(num_hidden_layers=2)  # sliding rotates, full is NoPE
    swapped = beam_config(
        num_hidden_layers=2,
        rope_parameters={
            "sliding_attention": None,
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        },
    )

    for config, nope in ((default, 1), (swapped, 0)):
        for layer_idx in (0, 1):
            read = layer_options(config, "beam", layer_idx, {})
            if layer_idx == nope:
                assert rotary_dim(config, layer_idx) == 0
                assert read["query_temperature"] == BEAM_TEMPERATURE
            else:
                assert rotary_dim(config, layer_idx) == D
                assert "query_temperature" not in read
            assert (read["output_gate"], read["gate_activation"], read["gate_bias"]) == (
                "element",
                "sigmoid",
                True,
            )


def test_the_per_head_gate_bias_is_repeated_on_load_and_given_back():
    rng = np.random.default_rng(0)
    config = beam_config(num_hidden_layers=2)
    state = beam_state(rng, config)

    layer = grouped_from_hf(config, state, layer_idx=1)
    back = hf_attention_state_from_grouped(config, layer.state_dict(), layer_idx=1)

    bias = layer.state_dict()["g_proj.bias"]
    assert bias.shape == (H * D,)
    assert np.array_equal(bias, np.repeat(state["gate_bias"], D))
    assert set(back) == set(state)
    for key, value in back.items():
        assert np.array_equal(value, state[key]), key


def test_the_way_back_sums_a_gradient_over_each_head_and_refuses_a_bias_that_differs():
    rng = np.random.default_rng(1)
    config = beam_config(num_hidden_layers=2)
    layer = grouped_from_hf(config, beam_state(rng, config), layer_idx=1)
    grads = layer.state_dict() | {"g_proj.bias": rng.standard_normal(H * D)}

    summed = hf_attention_state_from_grouped(config, grads, layer_idx=1, grads=True)

    expected = grads["g_proj.bias"].reshape(H, D).sum(axis=-1)
    assert np.allclose(summed["gate_bias"], expected, rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match=r"g_proj.bias differs within head 0 \(4 of 4 heads\)"):
        hf_attention_state_from_grouped(config, grads, layer_idx=1)
    one_off = layer.state_dict()
    one_off["g_proj.bias"][2 * D + 3] += 1.0  # head 2 only
    with pytest.raises(ValueError, match=r"g_proj.bias differs within head 2 \(1 of 4 heads\)"):
        hf_attention_state_from_grouped(config, one_off, layer_idx=1)


def test_a_gate_bias_of_the_wrong_shape_is_refused_by_its_key():
    rng = np.random.default_rng(2)
    config = beam_config(num_hidden_layers=2)
    state = beam_state(rng, config)
    per_element = state | {"gate_bias": rng.standard_normal(H * D)}

    with pytest.raises(ValueError, match=r"gate_bias has shape \(32,\), but the config"):
        grouped_from_hf(config, per_element, layer_idx=1)
    with pytest.raises(ValueError, match=r"g_proj.bias has shape \(4,\), but the config"):
        back = grouped_from_hf(config, state, layer_idx=1).state_dict()
        hf_attention_state_from_grouped(config, back | {"g_proj.bias": np.zeros(H)}, layer_idx=1)
    without = {key: value for key, value in state.items() if key != "gate_bias"}
    with pytest.raises(KeyError, match="missing keys.*gate_bias"):
        grouped_from_hf(config, without, layer_idx=1)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "no 'full_attention'"),
        (
            {"rope_parameters": {"full_attention": None}},
            "rope_parameters has no 'sliding_attention' entry",
        ),
        ({"rope_parameters": None, "rope_theta": 5e5}, "has rope_theta but no rope_parameters"),
        (
            {"rope_parameters": None, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
            "has rope_scaling but no rope_parameters",
        ),
    ],
    ids=["flat", "a-type-missing", "rope-theta", "rope-scaling"],
)
def test_rope_parameters_beam_cannot_read_per_layer_type_are_refused_by_key(change, words):
    rng = np.random.default_rng(3)
    config = beam_config(num_hidden_layers=2)
    state = beam_state(rng, config, layer_idx=0)

    with pytest.raises(ValueError, match=words):
        grouped_from_hf(config | change, state, layer_idx=0)


def test_a_config_json_without_rope_parameters_gets_its_config_class_s_rope():
    config = beam_config(num_hidden_layers=2)
    bare = {key: value for key, value in config.items() if key != "rope_parameters"}

    for layer_idx in (0, 1):
        assert layer_options(bare, "beam", layer_idx, {}) == layer_options(
            config, "beam", layer_idx, {}
        )
        assert rotary_dim(bare, layer_idx) == rotary_dim(config, layer_idx)
