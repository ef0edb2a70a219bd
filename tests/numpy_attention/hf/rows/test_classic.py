"""numpy_attention.hf.rows.classic: what the dense decoders' rows read from their config. Which
layers slide when a config has no ``layer_types`` is checked against the real client,
transformers' own config classes (tiny, no download), which write the list their model then
follows; so are the RoPE bases per layer, the head widths, biases, dropout and windows a
config.json leaves out; refusals by hand. (Every family's layer against transformers' modules:
tests/parity/test_hf_models.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf
from numpy_attention.hf.families import FAMILIES, layer_options
from numpy_attention.hf.family import ATTENTION, FULL, SLIDING, layer_kind, sizes
from numpy_attention.hf.rope import hf_inv_freq, rope_parameters, rotary_dim

from ..test_family import LAYERS, SIZES

transformers = pytest.importorskip("transformers")


FALLBACKS = {  # model_type -> what its config class is given besides SIZES
    "qwen2": {"use_sliding_window": True, "max_window_layers": 2},
    "qwen3": {"use_sliding_window": True, "max_window_layers": 3},
    "qwen2_moe": {"use_sliding_window": True, "max_window_layers": 4},
    "gemma2": {},
    "gemma3_text": {"sliding_window_pattern": 3},
    "cohere2": {},
    "gpt_oss": {},
}

PART_B_FALLBACKS = {  # model_type -> what its config class is given besides SIZES
    "granite_swa": {},
    "granitemoe_swa": {},
    "olmo3": {},
    "exaone4": {},
    "exaone_moe": {},
    "dots1": {"max_window_layers": 4},
}


@pytest.mark.parametrize("name", [*FALLBACKS, *PART_B_FALLBACKS])
def test_without_layer_types_the_family_slides_where_its_config_class_would(name):
    given = FALLBACKS[name] if name in FALLBACKS else PART_B_FALLBACKS[name]
    config = transformers.AutoConfig.for_model(name, **SIZES, **given).to_dict()
    theirs = config.pop("layer_types")

    ours = [layer_kind(config, FAMILIES[name], i) for i in range(LAYERS)]

    assert ours == theirs
    assert SLIDING in ours and FULL in ours  # the case tells the rules apart


# -- per-layer bases, NoPE rules, head_dim defaults (Granite SWA to Hy3) --


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


# -- the families read from their config classes (Mixtral to Solar Open) --


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


# -- the config classes' defaults for keys a config.json leaves out (the older rows) --


@pytest.mark.parametrize("model", ["Gemma2", "Gemma3Text", "Glm", "Glm4"])
def test_a_config_json_without_the_keys_reads_as_its_config_class_fills_them(model):
    # Gemma 2 and 3 default head_dim 256 (not C // H), Gemma 2 a cap of 50; GLM rotates half of
    # a 128-wide head: read as C // H, no cap and a whole-head rotation, the layer was wrong.
    config = getattr(transformers, f"{model}Config")(hidden_size=64, num_attention_heads=4)
    full = config.to_dict()
    keys = ("head_dim", "query_pre_attn_scalar", "attn_logit_softcapping", "sliding_window")
    bare = {key: value for key, value in full.items() if key not in keys}
    if model.startswith("Glm"):
        bare["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}

    for layer in (0, 1):
        read = layer_options(bare, full["model_type"], layer, {})
        assert read == layer_options(full, full["model_type"], layer, {})
    assert read["head_dim"] == config.head_dim != 64 // 4
    assert rotary_dim(bare, 0) == rotary_dim(full, 0)


# -- rows that need no new layer option (Emu3 text to ModernBERT decoder) --


def test_emu3_text_reads_its_config_class_dropout():
    config = transformers.Emu3TextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0
    )
    bare = {key: value for key, value in config.to_dict().items() if key != "attention_dropout"}

    assert layer_options(bare, "emu3_text_model", 0, {})["dropout"] == config.attention_dropout
    assert config.attention_dropout == 0.1


def test_mllama_text_cross_attention_layers_are_refused_by_name():
    config = transformers.MllamaTextConfig(num_hidden_layers=10)
    kinds = FAMILIES["mllama_text_model"].mixers(
        {key: value for key, value in config.to_dict().items() if key != "cross_attention_layers"}
    )

    assert [i for i, kind in enumerate(kinds) if kind != ATTENTION] == [3, 8]
    assert config.cross_attention_layers[:2] == [3, 8]
    with pytest.raises(ValueError, match=r"layer 3 .* a cross-attention layer \(keys and values"):
        grouped_from_hf(config.to_dict(), {}, layer_idx=3)
    read = layer_options({**config.to_dict(), "dropout": 0.3}, "mllama_text_model", 0, {})
    assert read["dropout"] == 0.3 and read["head_dim"] == 4096 // 32
    with pytest.raises(ValueError, match="head_dim is 64, but mllama_text_model's attention"):
        grouped_from_hf({**config.to_dict(), "head_dim": 64}, {})


def test_modernbert_decoder_reads_its_config_class_layers_and_window():
    config = transformers.ModernBertDecoderConfig(
        num_hidden_layers=LAYERS, local_attention=10, global_attn_every_n_layers=2
    )
    as_json = {key: value for key, value in config.to_dict().items()
               if key not in ("layer_types", "sliding_window")}  # fmt: skip
    as_json["global_attn_every_n_layers"] = 2

    ours = [layer_kind(as_json, FAMILIES["modernbert-decoder"], i) for i in range(LAYERS)]

    assert ours == config.layer_types and SLIDING in ours and FULL in ours
    assert layer_options(as_json, "modernbert-decoder", 1, {})["window"] == (4, 0)
    assert config.sliding_window == 5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"local_attention": None}, "local_attention is None"),
        ({"num_key_value_heads": 4}, "num_key_value_heads is 4, .* no key/value grouping"),
        ({"rope_parameters": None}, "global_rope_theta, local_rope_theta"),
        ({"head_dim": 32}, "head_dim is 32, but modernbert-decoder's attention heads are .* 64"),
    ],
)
def test_modernbert_decoder_configs_it_cannot_mean_are_refused_by_the_key(change, message):
    config = transformers.ModernBertDecoderConfig(num_attention_heads=12).to_dict() | change
    with pytest.raises(ValueError, match=message):
        grouped_from_hf(config, {})
