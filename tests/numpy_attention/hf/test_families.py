"""numpy_attention.hf.families: what a family reads from its config. Which layers slide when a
config has no ``layer_types`` is checked against the real client, transformers' own config classes
(tiny, no download), which write the list their model then follows; sizes, refusals and bad configs
by hand. (Every family's layer against transformers' modules: tests/parity/test_hf_models.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf
from numpy_attention.hf.families import (
    ATTENTION,
    FAMILIES,
    FULL,
    SLIDING,
    layer_kind,
    model_type,
    required,
    sizes,
)
from numpy_attention.hf.rope import hf_inv_freq, rope_parameters, rotary_dim

transformers = pytest.importorskip("transformers")

LAYERS = 6
SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=LAYERS, sliding_window=8)  # fmt: skip
FALLBACKS = {  # model_type -> what its config class is given besides SIZES
    "qwen2": {"use_sliding_window": True, "max_window_layers": 2},
    "qwen3": {"use_sliding_window": True, "max_window_layers": 3},
    "qwen2_moe": {"use_sliding_window": True, "max_window_layers": 4},
    "gemma2": {},
    "gemma3_text": {"sliding_window_pattern": 3},
    "cohere2": {},
    "gpt_oss": {},
}


@pytest.mark.parametrize("name", FALLBACKS)
def test_without_layer_types_the_family_slides_where_its_config_class_would(name):
    config = transformers.AutoConfig.for_model(name, **SIZES, **FALLBACKS[name]).to_dict()
    theirs = config.pop("layer_types")

    ours = [layer_kind(config, FAMILIES[name], i) for i in range(LAYERS)]

    assert ours == theirs
    assert SLIDING in ours and FULL in ours  # the case tells the rules apart


def test_a_config_list_of_layer_types_is_read_and_checked():
    family = FAMILIES["gemma2"]
    config = {**SIZES, "layer_types": [FULL, SLIDING]}

    assert [layer_kind(config, family, i) for i in range(2)] == [FULL, SLIDING]
    with pytest.raises(ValueError, match="layer_types has 2 entries"):
        layer_kind(config, family, 2)
    with pytest.raises(ValueError, match="'chunked_attention'"):
        layer_kind({**config, "layer_types": ["chunked_attention"]}, family, 0)


def test_sizes_as_the_attention_module_takes_them():
    llama, gemma = FAMILIES["llama"], FAMILIES["gemma2"]
    config = {**SIZES, "head_dim": 16}

    assert sizes(config, llama) == {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2,
                                    "head_dim": 16}  # fmt: skip
    assert sizes({**SIZES, "num_key_value_heads": None}, llama)["num_kv_heads"] == 4
    assert sizes(config, gemma)["head_dim"] == 16
    with pytest.raises(ValueError, match="not a multiple of its 3 key/value heads"):
        sizes({**SIZES, "num_key_value_heads": 3}, llama)


def test_falcon_reads_its_key_value_heads_from_its_own_flags():
    falcon = FAMILIES["falcon"]

    assert sizes({**SIZES, "multi_query": True}, falcon)["num_kv_heads"] == 1
    assert sizes({**SIZES, "multi_query": False}, falcon)["num_kv_heads"] == 4
    new = {**SIZES, "new_decoder_architecture": True, "num_kv_heads": 2}
    assert sizes(new, falcon)["num_kv_heads"] == 2


def test_unknown_and_refused_model_types_and_missing_keys_are_named():
    assert model_type({"model_type": "qwen2"}) == "qwen2"
    with pytest.raises(ValueError, match="'bert' is not supported; supported:"):
        model_type({"model_type": "bert"})
    with pytest.raises(ValueError, match="pass config.text_config"):
        model_type({"model_type": "gemma3"})
    with pytest.raises(ValueError, match="no 'hidden_size', which a llama layer needs"):
        required({"model_type": "llama", "hidden_size": None}, "hidden_size")


# -- issue 28, part B --


def test_granite_swa_reads_a_rope_base_per_layer_and_zero_as_nope():
    config = transformers.GraniteSWAConfig(
        **SIZES, layer_rope_theta=[0, 5e4, 1e4, 5e4, 1e4, 1e4]
    ).to_dict()
    llama = {**config, "model_type": "llama"}

    assert [rotary_dim(config, i) for i in range(3)] == [0, 8, 8]
    for layer_idx, theta in ((1, 5e4), (2, 1e4)):
        expected = hf_inv_freq({**llama, "rope_parameters": {"rope_theta": theta}})
        np.testing.assert_array_equal(hf_inv_freq(config, layer_idx=layer_idx), expected)
    with pytest.raises(ValueError, match="layer_rope_theta differs per layer"):
        hf_inv_freq(config)
    with pytest.raises(ValueError, match="layer_rope_theta has 2 entries"):
        rotary_dim({**config, "layer_rope_theta": [0, 1e4]}, 2)


PART_B_FALLBACKS = {  # model_type -> what its config class is given besides SIZES
    "granite_swa": {},
    "granitemoe_swa": {},
    "olmo3": {},
    "exaone4": {},
    "exaone_moe": {},
    "dots1": {"max_window_layers": 4},
}


@pytest.mark.parametrize("name", PART_B_FALLBACKS)
def test_part_b_families_without_layer_types_slide_where_their_config_class_would(name):
    config = transformers.AutoConfig.for_model(name, **SIZES, **PART_B_FALLBACKS[name]).to_dict()
    theirs = config.pop("layer_types")

    ours = [layer_kind(config, FAMILIES[name], i) for i in range(LAYERS)]

    assert ours == theirs
    assert SLIDING in ours and FULL in ours  # the case tells the rules apart


def test_olmo3_gives_a_transformers_4_rope_theta_to_its_full_layers_only():
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}
    raw = {**SIZES, "model_type": "olmo3", "rope_theta": 1e4, "rope_scaling": yarn}
    raw |= {"num_hidden_layers": 2, "layer_types": [SLIDING, FULL]}
    theirs = transformers.Olmo3Config(**raw).rope_parameters

    ours = {kind: rope_parameters(raw, i) for i, kind in enumerate(raw["layer_types"])}

    assert ours == theirs
    assert ours[SLIDING]["rope_theta"] == 5e5  # not the config's 1e4


@pytest.mark.parametrize(
    "keys", [{"sliding_window": None}, {"sliding_window_pattern": "LLLG"}], ids=["none", "string"]
)
def test_exaone4_without_layer_types_refuses_what_its_config_class_cannot_read(keys):
    config = {**SIZES, "model_type": "exaone4", **keys}

    with pytest.raises(ValueError, match="EXAONE 4's config class fails on them; give layer_types"):
        layer_kind(config, FAMILIES["exaone4"], 0)


def test_ernie4_5_defaults_head_dim_to_128_where_the_config_has_no_key():
    ernie = FAMILIES["ernie4_5"]
    config = dict(SIZES)  # C // H = 8

    for given in ({}, {"head_dim": None}, {"head_dim": 16}):
        theirs = transformers.Ernie4_5Config(**config, **given).head_dim
        assert sizes({**config, **given}, ernie)["head_dim"] == theirs
    assert sizes(config, ernie)["head_dim"] == 128


def test_glm4_moe_rotates_half_of_each_head_without_a_partial_rotary_factor():
    raw = {**SIZES, "model_type": "glm4_moe", "head_dim": 16, "rope_theta": 1e4}

    theirs = transformers.Glm4MoeConfig(**raw).rope_parameters["partial_rotary_factor"]

    assert rotary_dim(raw, 0) == int(16 * theirs) == 8


def test_minimax_m2_reads_its_legacy_rotary_dim_where_there_is_no_factor():
    raw = {**SIZES, "model_type": "minimax_m2", "head_dim": 16, "rotary_dim": 8, "rope_theta": 1e4}
    factor = {"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.25}}

    for given, width in (({}, 8), (factor, 4)):
        theirs = transformers.MiniMaxM2Config(**raw, **given).rope_parameters
        assert rotary_dim({**raw, **given}, 0) == int(16 * theirs["partial_rotary_factor"]) == width
    assert sizes({**SIZES, "model_type": "minimax_m2"}, FAMILIES["minimax_m2"])["head_dim"] == 128


def test_cohere2_moe_rotates_its_dense_prefix_when_its_pattern_is_one():
    raw = {**SIZES, "model_type": "cohere2_moe", "head_dim": 8, "rope_theta": 1e4}
    raw["first_k_dense_replace"] = 2
    config = transformers.Cohere2MoeConfig(**raw).to_dict()  # without first_k_dense_replace

    ours = [layer_kind(raw, FAMILIES["cohere2_moe"], i) for i in range(LAYERS)]

    # the prefix is full and rotates; then, counted afresh, 3 sliding (RoPE) and 1 full (NoPE)
    assert ours == config["layer_types"] == [FULL, FULL, SLIDING, SLIDING, SLIDING, FULL]
    assert [rotary_dim(raw, i) for i in range(LAYERS)] == [8, 8, 8, 8, 8, 0]
    assert [rotary_dim(config, i) for i in range(LAYERS)] == [8, 8, 8, 8, 8, 0]


# -- issue 28, part C --


HYBRIDS = {  # model_type -> its config class's keywords, the model's own list of layer kinds
    "jamba": ({"attn_layer_period": 3, "attn_layer_offset": 1}, "layers_block_type", "attention"),
    "bamba": ({"attn_layer_indices": [2, 5]}, "layers_block_type", "full_attention"),
    "lfm2": ({"full_attn_idxs": [0, 3]}, "layer_types", "full_attention"),
    "olmo_hybrid": ({}, "layer_types", "full_attention"),
    "granitemoehybrid": (
        {"layer_types": ["linear_attention", "full_attention"] * 3},
        "layer_types",
        "full_attention",
    ),
    "nemotron_h": ({"hybrid_override_pattern": "M*-EM*"}, "layers_block_type", "full_attention"),
}


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_hybrid_s_attention_layers_are_the_ones_its_config_class_builds(name):
    keywords, key, attention = HYBRIDS[name]
    config = transformers.AutoConfig.for_model(name, num_hidden_layers=LAYERS, **keywords)
    theirs = [kind == attention for kind in getattr(config, key)]
    as_json = {
        key: value
        for key, value in config.to_dict().items()
        if key not in ("layer_types", "layers_block_type") or name == "granitemoehybrid"
    }  # a config.json's keys: the rule, not the list, where the model derives the list
    if name == "nemotron_h":
        as_json["hybrid_override_pattern"] = keywords["hybrid_override_pattern"]

    ours = [kind == ATTENTION for kind in FAMILIES[name].mixers(as_json)]

    assert ours == theirs
    assert True in ours and False in ours  # the case tells the rules apart


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"model_type": "jamba", "num_hidden_layers": 8},
            r"layer 1 of this jamba model is a Mamba layer, not attention; its attention "
            r"layers are \[4\]",
        ),
        (
            {"model_type": "lfm2", "layer_types": ["full_attention", "conv"]},
            r"layer 1 of this lfm2 model is a short-convolution layer, not attention; its "
            r"attention layers are \[0\]",
        ),
        (
            {"model_type": "nemotron_h", "hybrid_override_pattern": "*E"},
            "layer 1 of this nemotron_h model is a mixture-of-experts layer",
        ),
        (
            {"model_type": "olmo_hybrid", "layer_types": ["full_attention", "linear_attention"]},
            "is a gated DeltaNet",
        ),
        ({"model_type": "bamba", "num_hidden_layers": 2}, r"Mamba-2 layer, .* are \[\]"),
        ({"model_type": "granitemoehybrid", "num_hidden_layers": 2}, "Mamba-2 layer"),
        ({"model_type": "lfm2_moe", "num_hidden_layers": 2}, "no 'layer_types'"),
        ({"model_type": "lfm2", "layer_types": ["conv", "sliding_attention"]}, r"layer_types\[1\]"),
        ({"model_type": "lfm2", "layer_types": ["full_attention"]}, "this lfm2 model has 1 layers"),
    ],
)
def test_a_hybrid_s_other_layers_are_refused_by_what_they_are(config, message):
    with pytest.raises(ValueError, match=message):
        grouped_from_hf(config, {}, layer_idx=1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "phi", "qk_layernorm": True}, "phi's QK-norm is a LayerNorm with a bias"),
        (
            {"model_type": "nemotron_h", "sliding_window": 4},
            "sliding_window is set, but nemotron_h's attention never slides",
        ),
        (
            {"model_type": "stablelm", "hidden_size": 32, "num_attention_heads": 4, "head_dim": 16},
            "head_dim is 16, but stablelm's attention heads are .* 8 wide",
        ),
    ],
)
def test_configs_a_family_cannot_mean_are_refused_by_the_key(config, message):
    with pytest.raises(ValueError, match=message):
        grouped_from_hf(config, {})


@pytest.mark.parametrize(
    ("name", "keywords", "rotated"),
    [
        ("stablelm", {}, 2),  # the config class's 0.25 of 8
        ("phi", {}, 4),
        ("nemotron", {"partial_rotary_factor": 0.25}, 2),
        ("bamba", {"partial_rotary_factor": 1.0}, 4),  # the class overwrites it with 0.5
        ("granitemoehybrid", {}, 0),  # NoPE unless position_embedding_type is "rope"
        ("granitemoehybrid", {"position_embedding_type": "rope"}, 8),
        ("olmo_hybrid", {"rope_theta": None}, 0),
        ("jamba", {}, 0),
    ],
)
def test_the_rotated_width_is_the_one_the_config_class_gives(name, keywords, rotated):
    sizes = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2}
    as_json = {"model_type": name, "rope_theta": 10000.0, **sizes, **keywords}
    if name == "olmo_hybrid":
        as_json["layer_types"] = ["full_attention", "linear_attention"]
    mamba = {"mamba_n_heads": 8} if name in ("bamba", "granitemoehybrid") else {}
    config = transformers.AutoConfig.for_model(name, **sizes, **mamba, **keywords)
    theirs = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1) * 8

    assert rotary_dim(as_json, 0) == rotated
    if name in ("stablelm", "phi", "nemotron", "bamba"):
        assert theirs == rotated
