"""numpy_attention.hf.families: what a family reads from its config. Which layers slide when a
config has no ``layer_types`` is checked against the real client, transformers' own config classes
(tiny, no download), which write the list their model then follows; sizes, refusals and bad configs
by hand. (Every family's layer against transformers' modules: tests/parity/test_hf_models.py.)"""

from __future__ import annotations

import pytest

from numpy_attention.hf.families import (
    FAMILIES,
    FULL,
    SLIDING,
    layer_kind,
    layer_options,
    model_type,
    required,
    sizes,
)
from numpy_attention.hf.rope import rope_parameters, rotary_dim

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


# -- issue 28, part A --


@pytest.mark.parametrize("window", [8, None])
def test_ministral_without_layer_types_slides_every_layer_when_its_config_has_a_window(window):
    config = transformers.MinistralConfig(**(SIZES | {"sliding_window": window})).to_dict()
    theirs = config.pop("layer_types")

    ours = [layer_kind(config, FAMILIES["ministral"], i) for i in range(LAYERS)]

    assert ours == theirs == [SLIDING if window else FULL] * LAYERS


def test_ministral_needs_head_dim_in_its_config():
    config = {**SIZES, "model_type": "ministral", "head_dim": None}

    with pytest.raises(ValueError, match="no 'head_dim', which a ministral layer needs"):
        sizes(config, FAMILIES["ministral"])
    assert sizes({**config, "head_dim": 16}, FAMILIES["ministral"])["head_dim"] == 16


def test_gemma_without_head_dim_reads_its_config_class_default_of_256():
    theirs = transformers.GemmaConfig(**SIZES).head_dim  # C // H would be 8
    config = {**SIZES, "model_type": "gemma"}

    assert sizes(config, FAMILIES["gemma"])["head_dim"] == theirs == 256
    with pytest.raises(ValueError, match="no 'head_dim', which a gemma layer needs"):
        sizes({**config, "head_dim": None}, FAMILIES["gemma"])


def test_gemma_with_bidirectional_attention_is_refused():
    config = {**SIZES, "model_type": "gemma", "head_dim": 8, "use_bidirectional_attention": True}

    with pytest.raises(ValueError, match="use_bidirectional_attention is set: that gemma layer"):
        layer_options(config, "gemma", 0, {})


def test_helium_heads_must_span_its_width_and_its_head_dim_defaults_to_128():
    helium = FAMILIES["helium"]
    config = {**SIZES, "model_type": "helium", "num_attention_heads": 4}

    assert sizes({**config, "head_dim": 8}, helium)["head_dim"] == 8
    assert transformers.HeliumConfig().head_dim == 128
    with pytest.raises(ValueError, match="4 \\* 128, but a helium o_proj takes hidden_size = 32"):
        sizes(config, helium)
    with pytest.raises(ValueError, match="4 \\* 16, but a helium o_proj"):
        sizes({**config, "head_dim": 16}, helium)


def test_vaultgemma_slides_even_layers_and_reads_its_config_class_defaults():
    config = transformers.VaultGemmaConfig(**SIZES).to_dict()
    theirs = config.pop("layer_types")
    bare = {key: value for key, value in SIZES.items() if key != "sliding_window"}
    json = {"model_type": "vaultgemma", **bare}  # a config.json that leaves the rest out

    ours = [layer_kind(config, FAMILIES["vaultgemma"], i) for i in range(LAYERS)]
    options = layer_options(json, "vaultgemma", 0, {})

    assert ours == theirs == [SLIDING, FULL] * (LAYERS // 2)
    assert (options["head_dim"], options["softcap"], options["window"]) == (256, 50.0, (4095, 0))
    assert options["scaling"] == 256**-0.5


def test_cwm_reads_its_config_class_layer_pattern_window_and_rope():
    config = transformers.CwmConfig(**(SIZES | {"num_hidden_layers": 8})).to_dict()
    theirs = config.pop("layer_types")
    bare = {"model_type": "cwm", "hidden_size": 32, "num_attention_heads": 4}  # a config.json

    ours = [layer_kind(config, FAMILIES["cwm"], i) for i in range(8)]

    assert ours == theirs == [FULL, SLIDING, SLIDING, SLIDING] * 2
    assert layer_options(bare, "cwm", 1, {})["window"] == (8191, 0)
    assert sizes(bare, FAMILIES["cwm"])["head_dim"] == 128
    assert rope_parameters(bare) == transformers.CwmConfig().rope_parameters
    with pytest.raises(ValueError, match="rope_theta but no rope_scaling: cwm's config class"):
        rope_parameters({**bare, "rope_theta": 5e5})


def test_seed_oss_reads_its_config_class_biases_and_dropout():
    theirs = transformers.SeedOssConfig()
    bare = {"model_type": "seed_oss", **SIZES}  # a config.json without the keys below

    options = layer_options(bare, "seed_oss", 0, {})

    assert (options["bias"], options["out_bias"]) == (theirs.attention_bias, False) == (True, False)
    assert options["dropout"] == theirs.attention_dropout == 0.1
    assert sizes(bare, FAMILIES["seed_oss"])["head_dim"] == theirs.head_dim == 128


def test_apertus_without_rope_parameters_reads_its_config_class_llama3():
    bare = {"model_type": "apertus", "hidden_size": 32, "num_attention_heads": 4}

    assert rope_parameters(bare) == transformers.ApertusConfig().rope_parameters
    with pytest.raises(ValueError, match="rope_theta but no rope_scaling: apertus's"):
        rope_parameters({**bare, "rope_theta": 5e5})


def test_internlm3_reads_its_config_json_names_and_refuses_two_bias_settings():
    json = {"model_type": "internlm3", **SIZES, "qkv_bias": True, "bias": True}  # config.json

    options = layer_options(json, "internlm3", 0, {})

    assert (options["bias"], options["out_bias"], options["head_dim"]) == (True, True, 128)
    with pytest.raises(ValueError, match="mlp_bias is False: the internlm3 model needs"):
        layer_options({**json, "bias": False}, "internlm3", 0, {})
    with pytest.raises(Exception, match="qkv_bias"):  # its config class refuses it too
        transformers.InternLM3Config(qkv_bias=True, bias=False)


@pytest.mark.parametrize("json", [{}, {"attention_multiplier": None}])
def test_hyperclovax_without_an_attention_multiplier_scales_by_one_over_sqrt_head_dim(json):
    theirs = transformers.HyperCLOVAXConfig(**SIZES, **json).attention_multiplier
    config = {"model_type": "hyperclovax", **SIZES, **json}

    options = layer_options(config, "hyperclovax", 0, {})

    assert options["scaling"] is None  # the layer's 1/sqrt(D)
    assert theirs == (32 // 4) ** -0.5
    assert (
        layer_options({**config, "attention_multiplier": 0.3}, "hyperclovax", 0, {})["scaling"]
        == 0.3
    )


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [("clip_qkv", 8.0, "clamps q, k and v"), ("use_sliding_window", True, "slides")],
)
def test_iquestcoder_refuses_what_its_config_class_refuses(key, value, reason):
    config = {"model_type": "iquestcoder", **SIZES, key: value}

    with pytest.raises(ValueError, match=f"{key} is set: iquestcoder's original code {reason}"):
        layer_options(config, "iquestcoder", 0, {})
    with pytest.raises(Exception, match=key):
        transformers.IQuestCoderConfig(**{key: value})
    assert layer_options({**config, key: None}, "iquestcoder", 0, {})["head_dim"] == 128


def test_mellum_without_layer_types_or_rope_reads_its_config_class():
    theirs = transformers.MellumConfig(**SIZES)
    bare = {"model_type": "mellum", **SIZES}  # a config.json without the keys below

    kinds = [layer_kind(bare, FAMILIES["mellum"], i) for i in range(LAYERS)]

    assert kinds == theirs.layer_types == [FULL] * LAYERS
    assert rope_parameters(bare, 0) == theirs.rope_parameters[FULL]
    assert (
        rope_parameters({**bare, "layer_types": [SLIDING] * LAYERS}, 0)
        == (theirs.rope_parameters[SLIDING])
    )
    with pytest.raises(ValueError, match="rope_theta but no rope_scaling: mellum's"):
        rope_parameters({**bare, "rope_theta": 5e5}, 0)


def test_jais2_has_biases_unless_its_config_says_otherwise():
    bare = {"model_type": "jais2", **SIZES}

    options = layer_options(bare, "jais2", 0, {})

    assert options["bias"] == options["out_bias"] == transformers.Jais2Config().attention_bias
    assert options["bias"] is True


def test_solar_open_reads_no_out_bias_and_refuses_a_partial_rotary_factor():
    rope = {"rope_type": "default", "rope_theta": 1e6}
    config = {"model_type": "solar_open", **SIZES, "attention_bias": True, "rope_parameters": rope}

    options = layer_options(config, "solar_open", 0, {})

    assert (options["bias"], options["out_bias"], options["head_dim"]) == (True, False, 128)
    with pytest.raises(ValueError, match="partial_rotary_factor is 0.5, but a solar_open layer"):
        rotary_dim({**config, "rope_parameters": rope | {"partial_rotary_factor": 0.5}}, 0)
