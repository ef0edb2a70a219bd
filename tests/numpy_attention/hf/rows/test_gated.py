"""numpy_attention.hf.rows.gated: the families with an output gate before o_proj. Their attention
layers and gates as their config classes (tiny, no download) build them, the gate weight's kind
against the config's, Laguna's query heads per layer, what each refuses, by the key. (Beam's row:
tests/numpy_attention/hf/test_beam.py; every family's layer against transformers' modules:
tests/parity/test_hf_models.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf
from numpy_attention.hf.families import FAMILIES, layer_options
from numpy_attention.hf.family import ATTENTION, FULL, SLIDING, layer_kind, sizes
from numpy_attention.hf.rope import hf_inv_freq, rotary_dim

from ..test_family import LAYERS, SIZES

transformers = pytest.importorskip("transformers")


# -- their layer patterns, their gates, their config classes' defaults --

GATED_PATTERNS = {  # model_type -> the config class's keywords, a config.json's rule keys
    "qwen3_next": ({"full_attention_interval": 3}, {"full_attention_interval": 3}),
    "qwen3_5_text": ({}, {}),
    "qwen3_5_moe_text": ({"full_attention_interval": 2}, {"full_attention_interval": 2}),
    "lfm3": ({}, {}),
}


@pytest.mark.parametrize("name", GATED_PATTERNS)
def test_a_gated_hybrid_s_attention_layers_are_the_ones_its_config_class_builds(name):
    keywords, rule = GATED_PATTERNS[name]
    config = transformers.AutoConfig.for_model(name, num_hidden_layers=LAYERS, **keywords)
    as_json = {k: v for k, v in config.to_dict().items() if k != "layer_types"} | rule
    family = FAMILIES[name]

    ours = [kind == ATTENTION for kind in family.mixers(as_json)]
    kinds = [layer_kind(as_json, family, i) for i in range(LAYERS) if ours[i]]

    assert ours == [kind != "linear_attention" and kind != "conv" for kind in config.layer_types]
    assert kinds == [kind for kind in config.layer_types if kind in (FULL, SLIDING)]
    assert True in ours and False in ours  # the case tells the rules apart


@pytest.mark.parametrize(
    ("name", "kinds", "words"),
    [
        (
            "qwen3_next",
            ["linear_attention", "full_attention"],
            "a gated DeltaNet layer (gated_deltanet_from_hf reads it)",
        ),
        ("qwen3_5_text", ["linear_attention", "full_attention"], "a gated DeltaNet layer"),
        ("lfm3", ["conv", "sliding_attention"], "a short-convolution layer"),
    ],
)
def test_a_gated_hybrid_s_linear_layers_are_refused_by_name(name, kinds, words):
    config = {"model_type": name, "num_hidden_layers": 2, "layer_types": kinds}
    with pytest.raises(ValueError) as caught:
        grouped_from_hf(config, {}, layer_idx=0)
    message = str(caught.value)
    assert f"layer 0 of this {name} model is {words}" in message
    assert "its attention layers are [1]" in message


GATES = {  # model_type, config keys -> the layer's (output_gate, gate_activation, gate_bias)
    "qwen3_next-bias": ("qwen3_next", {"attention_bias": True}, ("element", "sigmoid", True)),
    "qwen3_5_text": ("qwen3_5_text", {}, ("element", "sigmoid", False)),
    "lfm3": ("lfm3", {}, ("head", "sigmoid", False)),
    "lfm3-off": ("lfm3", {"use_attention_gate": False}, None),
    "laguna-true": ("laguna", {"gating": True}, ("head", "softplus", False)),
    "laguna-per-head": ("laguna", {"gating": "per-head"}, ("head", "softplus", False)),
    "laguna-per-element": ("laguna", {"gating": "per-element"}, ("element", "softplus", False)),
    "afmoe": ("afmoe", {"attention_bias": True}, ("element", "sigmoid", False)),
    "hrm_text-bias": ("hrm_text", {"attention_bias": True}, ("element", "sigmoid", True)),
}


@pytest.mark.parametrize("case", GATES)
def test_each_gated_family_reads_its_gate_as_its_model_builds_it(case):
    name, keywords, gate = GATES[case]
    kinds = {"layer_types": [FULL, FULL]} if name in ("lfm3", "laguna", "afmoe") else {}
    if name.startswith("qwen"):
        kinds = {"layer_types": ["linear_attention", FULL]}
    config = {"model_type": name, **SIZES, "num_hidden_layers": 2, **kinds, **keywords}

    read = layer_options(config, name, 1, {})

    if gate is None:
        assert "output_gate" not in read
    else:
        assert (read["output_gate"], read["gate_activation"], read["gate_bias"]) == gate


def test_laguna_refuses_a_gating_its_config_class_does_not_know():
    config = {"model_type": "laguna", **SIZES, "gating": False}
    with pytest.raises(ValueError, match="gating is False; laguna's config class knows"):
        layer_options(config, "laguna", 0, {})


def test_a_gate_weight_of_another_kind_than_the_config_s_is_refused_by_its_key():
    # gating "per-element" needs g_proj (H * D, C); a per-head checkpoint's (H, C) is refused
    config = transformers.LagunaConfig(**SIZES, head_dim=8, gating="per-element").to_dict()
    state = {f"{name}.weight": np.zeros(shape) for name, shape in (
        ("q_proj", (32, 32)), ("k_proj", (16, 32)), ("v_proj", (16, 32)), ("o_proj", (32, 32)),
        ("q_norm", (8,)), ("k_norm", (8,)), ("g_proj", (4, 32)))}  # fmt: skip
    with pytest.raises(ValueError, match=r"g_proj.weight has shape \(4, 32\), but the config"):
        grouped_from_hf(config, state)
    state["g_proj.weight"] = np.zeros((32, 32))
    assert grouped_from_hf(config, state).output_gate == "element"


def test_laguna_reads_its_query_heads_per_layer():
    config = {"model_type": "laguna", **SIZES, "num_attention_heads_per_layer": [4, 8, 2]}
    config |= {"head_dim": 8}

    heads = [sizes(config, FAMILIES["laguna"], i)["num_heads"] for i in range(3)]

    assert heads == [4, 8, 2]
    assert sizes(config, FAMILIES["laguna"])["num_heads"] == 4  # the global count
    with pytest.raises(ValueError, match="num_attention_heads_per_layer has 3 entries"):
        sizes(config, FAMILIES["laguna"], 3)


def test_hrm_text_refuses_key_value_heads_its_code_never_reads():
    config = {"model_type": "hrm_text", **SIZES}  # num_key_value_heads 2 of 4 heads
    with pytest.raises(ValueError, match="num_key_value_heads is 2, but hrm_text's attention"):
        grouped_from_hf(config, {})


@pytest.mark.parametrize("model", ["Lfm3", "Laguna", "Afmoe", "Qwen3Next", "HrmText"])
def test_a_gated_family_s_config_json_reads_as_its_config_class_fills_it(model):
    # LFM3's default RoPE (proportional on the full layers, half the pairs turning), Laguna's
    # (half rotary on the full layers), the default head widths and windows
    config = getattr(transformers, f"{model}Config")(hidden_size=64, num_attention_heads=8)
    full = config.to_dict()
    keys = ("head_dim", "sliding_window", "rope_parameters", "num_key_value_heads")
    keys += ("norm_eps", "rms_norm_eps")
    bare = {key: value for key, value in full.items() if key not in keys}
    if model in ("Afmoe", "Qwen3Next", "HrmText"):  # a single RoPE: its base is required
        bare["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
        full = full | {"rope_parameters": full["rope_parameters"] | bare["rope_parameters"]}
    attention = [i for i, kind in enumerate(FAMILIES[full["model_type"]].mixers(full))
                 if kind == ATTENTION] if FAMILIES[full["model_type"]].mixers else [0]  # fmt: skip

    for layer in attention[:3]:
        read = layer_options(bare, full["model_type"], layer, {})
        assert read == layer_options(full, full["model_type"], layer, {})
        assert rotary_dim(bare, layer) == rotary_dim(full, layer)
        np.testing.assert_array_equal(
            hf_inv_freq(bare, layer_idx=layer), hf_inv_freq(full, layer_idx=layer)
        )
    assert read["head_dim"] == config.head_dim != 64 // 8
