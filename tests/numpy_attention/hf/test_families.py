"""numpy_attention.hf.families: what a family reads from its config. Which layers slide when a
config has no ``layer_types`` is checked against the real client, transformers' own config classes
(tiny, no download), which write the list their model then follows; sizes, refusals and bad configs
by hand. (Every family's layer against transformers' modules: tests/parity/test_hf_models.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf
from numpy_attention.hf.families import FAMILIES, layer_options, model_type
from numpy_attention.hf.family import ATTENTION, FULL, SLIDING, layer_kind, required, sizes
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
    with pytest.raises(ValueError, match="'gemma3' is a multimodal wrapper: .*gemma3_text"):
        model_type({"model_type": "gemma3"})
    with pytest.raises(ValueError, match="no 'hidden_size', which a llama layer needs"):
        required({"model_type": "llama", "hidden_size": None}, "hidden_size")


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


# -- hybrids: which layers are attention --


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
    "zamba": ({"num_hidden_layers": 12}, "layers_block_type", "hybrid"),
    "zamba2": ({"num_hidden_layers": 54}, "layers_block_type", "hybrid"),  # its class's 54
}


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_hybrid_s_attention_layers_are_the_ones_its_config_class_builds(name):
    keywords, key, attention = HYBRIDS[name]
    config = transformers.AutoConfig.for_model(name, **({"num_hidden_layers": LAYERS} | keywords))
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
        (
            {"model_type": "zamba", "num_hidden_layers": 3},
            r"layer 1 of this zamba model is a Mamba layer, not attention; its attention "
            r"layers are \[2\]",
        ),
        (
            {"model_type": "zamba2", "layers_block_type": ["hybrid", "mamba"]},
            r"layer 1 of this zamba2 model is a Mamba-2 layer, .* are \[0\]",
        ),
    ],
)
def test_a_hybrid_s_other_layers_are_refused_by_what_they_are(config, message):
    with pytest.raises(ValueError, match=message):
        grouped_from_hf(config, {}, layer_idx=1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"model_type": "phi", "qk_layernorm": True, "hidden_size": 32}
            | {"num_attention_heads": 4, "head_dim": 10},
            "qk_layernorm is set with head_dim 10: phi's QK-norm is a LayerNorm of width .* 8",
        ),
        (
            {"model_type": "nemotron_h", "sliding_window": 4},
            "sliding_window is set, but nemotron_h's attention never slides",
        ),
        (
            {"model_type": "stablelm", "hidden_size": 32, "num_attention_heads": 4, "head_dim": 16},
            "head_dim is 16, but stablelm's attention heads are .* 8 wide",
        ),
        (
            {"model_type": "persimmon", "hidden_size": 32, "num_attention_heads": 4}
            | {"head_dim": 16},
            "head_dim is 16, but persimmon's attention heads are .* 8 wide",
        ),
        (
            {"model_type": "zamba", "hidden_size": 32, "attention_hidden_size": 48},
            r"attention_hidden_size is 48, but .* 2 \* hidden_size = 64",
        ),
        (
            {"model_type": "zamba2", "num_attention_heads": 4, "num_key_value_heads": 2}
            | {"use_shared_attention_adapter": True},
            "use_shared_attention_adapter is set with num_key_value_heads = 2 below",
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
        ("persimmon", {}, 4),  # the config class's 0.5 of 8
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
    if name in ("stablelm", "phi", "persimmon", "nemotron", "bamba"):
        assert theirs == rotated


def test_persimmon_reads_its_config_class_s_defaults_and_no_kv_head_count():
    """A config.json that leaves qk_layernorm, layer_norm_eps and rope_theta out gets the config
    class's (on, 1e-5, 1e4); num_key_value_heads, which the attention never reads, changes
    nothing: multi-head, the fused query_key_value split per head."""
    sizes = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2}
    model = transformers.PersimmonModel(
        transformers.PersimmonConfig(**sizes, intermediate_size=16, vocab_size=11)
    )
    state = {key: value.detach().numpy() for key, value in model.state_dict().items()}
    as_json = {"model_type": "persimmon", **sizes, "num_key_value_heads": 2}

    layer = grouped_from_hf(as_json, state, layer_idx=1)

    args = layer.constructor_args()
    assert (args["num_heads"], args["num_kv_heads"], args["head_dim"]) == (4, 4, 8)
    assert args["qk_norm"] and args["qk_norm_type"] == "layer_bias" and args["norm_eps"] == 1e-5
    assert args["rope_theta"] == 1e4 and args["rotary_dim"] == 4
    assert args["bias"] and args["out_bias"]
    np.testing.assert_array_equal(
        layer.state_dict()["k_norm.bias"], state["layers.1.self_attn.k_layernorm.bias"]
    )


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


# -- rows that need no new layer option (RecurrentGemma to ModernBERT decoder) --


def test_recurrent_gemma_config_json_reads_as_its_config_class():
    # google/recurrentgemma-2b's config.json (transformers 4): no rope_parameters; its class
    # rotates half of each head, slides over attention_window_size, and keeps a head_dim given
    # (C // H without one)
    as_json = {"model_type": "recurrent_gemma", "hidden_size": 40, "num_attention_heads": 5,
               "num_key_value_heads": 1, "num_hidden_layers": 3, "attention_window_size": 6,
               "rope_theta": 10000.0}  # fmt: skip
    for head_dim in (None, 16):
        given = {} if head_dim is None else {"head_dim": head_dim}
        config = transformers.RecurrentGemmaConfig(
            **{k: v for k, v in as_json.items() if k not in ("model_type", "rope_theta")}, **given
        )

        read = layer_options(as_json | given, "recurrent_gemma", 2, {})

        assert read["head_dim"] == config.head_dim == (head_dim or 8)
        assert read["window"] == (config.sliding_window - 1, 0) == (5, 0)
        assert read["out_bias"] and not read["bias"]
        half = int(config.head_dim * config.rope_parameters["partial_rotary_factor"])
        assert rotary_dim(as_json | given, 2) == half == config.head_dim // 2
        assert rotary_dim(config.to_dict(), 2) == half


def test_recurrent_gemma_s_recurrent_blocks_and_other_rope_types_are_refused():
    config = transformers.RecurrentGemmaConfig(num_hidden_layers=5).to_dict()
    theirs = [kind == "sliding_attention" for kind in transformers.RecurrentGemmaConfig(
        num_hidden_layers=5).layers_block_type]  # fmt: skip

    ours = [kind == ATTENTION for kind in FAMILIES["recurrent_gemma"].mixers(config)]

    assert ours == theirs == [False, False, True, False, False]
    with pytest.raises(ValueError, match=r"layer 1 .* an RG-LRU recurrent block, .* are \[2\]"):
        grouped_from_hf(config, {}, layer_idx=1)
    with pytest.raises(ValueError, match=r"block_types\[1\] is 'mlp'"):
        grouped_from_hf({**config, "block_types": ["attention", "mlp"]}, {})
    linear = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    with pytest.raises(ValueError, match="rotary embedding takes only 'default'"):
        grouped_from_hf({**config, "rope_parameters": linear}, {}, layer_idx=2)


def test_gpt_bigcode_config_json_reads_its_names_and_multi_query():
    # bigcode/starcoder's config.json: n_embd, n_head, n_layer, attn_pdrop; multi_query decides
    # the key/value heads, whatever num_key_value_heads says; no RoPE at all
    as_json = {"model_type": "gpt_bigcode", "n_embd": 64, "n_head": 8, "n_layer": 2,
               "attn_pdrop": 0.2, "num_key_value_heads": 4}  # fmt: skip
    for multi_query, kv_heads in ((None, 1), (True, 1), (False, 8)):
        config = {**as_json, "multi_query": multi_query}
        theirs = transformers.GPTBigCodeConfig(
            n_embd=64, n_head=8, **({} if multi_query is None else {"multi_query": multi_query})
        )

        read = layer_options(config, "gpt_bigcode", 1, {})

        assert read["num_kv_heads"] == kv_heads == theirs.num_key_value_heads
        assert read["head_dim"] == 8 and read["bias"] and read["out_bias"]
        assert read["dropout"] == 0.2 and read.get("scaling") is None
        assert rotary_dim(config, 1) == 0
    unscaled = layer_options({**as_json, "scale_attn_weights": False}, "gpt_bigcode", 0, {})
    assert unscaled["scaling"] == 1.0
    with pytest.raises(ValueError, match="num_hidden_layers = 2"):
        grouped_from_hf(as_json, {"c_attn.weight": np.zeros((80, 64))}, layer_idx=2)
    with pytest.raises(ValueError, match="add_cross_attention is set"):
        grouped_from_hf({**as_json, "add_cross_attention": True}, {})
    with pytest.raises(ValueError, match="num_attention_heads \\* head_dim is 6 \\* 10"):
        layer_options({**as_json, "n_head": 6}, "gpt_bigcode", 0, {})


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


def test_phi4_multimodal_reads_phi3_s_attention_and_refuses_other_rope_types():
    config = transformers.Phi4MultimodalConfig(
        hidden_size=48, num_attention_heads=6, num_key_value_heads=2, partial_rotary_factor=0.75
    ).to_dict()

    assert rotary_dim(config, 0) == 6
    assert layer_options(config, "phi4_multimodal", 0, {}) == layer_options(
        {**config, "model_type": "phi3"}, "phi3", 0, {}
    )
    llama3 = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}
    with pytest.raises(ValueError, match="takes only 'default' and 'longrope'"):
        grouped_from_hf({**config, "rope_parameters": llama3}, {})


@pytest.mark.parametrize(
    "keys",
    [
        ["qkv_proj.base_layer.weight", "qkv_proj.lora_A.vision.weight", "o_proj.weight"],
        ["qkv_proj.weight", "o_proj.base_layer.weight", "o_proj.lora_B.speech.weight"],
    ],
)
def test_unmerged_lora_adapters_are_refused_by_name(keys):
    """PEFT's adapters (Phi-4-multimodal's vision and speech LoRA) are not part of the base
    weights: their scale lives in the adapter's config, so a state dict holding them unmerged is
    refused, never read as its base weights."""
    config = {"model_type": "phi4_multimodal", "hidden_size": 32, "num_attention_heads": 4,
              "num_key_value_heads": 2, "rope_parameters": {"rope_type": "default",
              "rope_theta": 1e4}}  # fmt: skip
    state = {f"model.layers.0.self_attn.{key}": np.zeros((2, 2)) for key in keys}

    with pytest.raises(ValueError, match="unmerged LoRA adapters .* merge_and_unload"):
        grouped_from_hf(config, state)


# -- the gated families: their gates, their layer patterns, their config classes' defaults --

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


# -- QK-norm after RoPE and the query temperature (issue 28) --


@pytest.mark.parametrize("name", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
def test_hunyuan_norms_after_rope_and_needs_head_dim(name):
    config = {"model_type": name, "head_dim": 8, "rms_norm_eps": 1e-5} | SIZES
    config |= {"rope_parameters": {"type": "dynamic", "alpha": 1000.0, "rope_theta": 1e4}}

    options = layer_options(config, name, 0, {})

    assert options["qk_norm_position"] == "after_rope" and options["qk_norm_type"] == "rms"
    assert rope_parameters(config)["rope_type"] == "ntk_alpha"
    with pytest.raises(ValueError, match="no 'head_dim'"):
        layer_options({**config, "head_dim": None}, name, 0, {})
    with pytest.raises(ValueError, match="rope_type 'dynamic' is not supported"):
        rope_parameters({**config, "rope_parameters": {"type": "dynamic", "factor": 2.0}})


def test_nanochat_turns_its_pairs_by_minus_the_angle_with_a_weightless_norm():
    config = {"model_type": "nanochat", "rms_norm_eps": 1e-6} | SIZES
    config |= {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    model_freqs = np.array([1.0, 0.1, 0.01, 0.001], dtype=np.float32)

    layer = grouped_from_hf(config, _zero_state(32, 4, 2, 8), inv_freq=model_freqs)

    np.testing.assert_array_equal(layer.inv_freq, -model_freqs)  # the model's own, negated
    assert (layer.qk_norm_position, layer.qk_norm_shape) == ("after_rope", "head")
    assert list(layer.state_dict()) == [
        f"{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    ]


def test_ministral3_reads_its_temperature_from_rope_parameters():
    config = {"model_type": "ministral3", "head_dim": 8} | SIZES
    yarn = dict(FAMILIES["ministral3"].rope_default)

    read = layer_options(config, "ministral3", 0, {})["query_temperature"]
    given = layer_options(
        {**config, "rope_parameters": yarn | {"llama_4_scaling_beta": 0.3}}, "ministral3", 0, {}
    )["query_temperature"]

    assert read == {"kind": "log_floor", "offset": 0.0, "beta": 0.1, "length": 16384.0}
    assert given["beta"] == 0.3
    assert transformers.Ministral3Config().rope_parameters["llama_4_scaling_beta"] == read["beta"]
    for key in ("llama_4_scaling_beta", "original_max_position_embeddings"):
        without = {k: v for k, v in yarn.items() if k != key}
        with pytest.raises(ValueError, match=f"rope_parameters has no '{key}'"):
            layer_options({**config, "rope_parameters": without}, "ministral3", 0, {})


def _zero_state(c, h, h_kv, d):
    """A plain attention state dict of these sizes (no norm weights, no biases)."""
    return {
        "q_proj.weight": np.zeros((h * d, c)),
        "k_proj.weight": np.zeros((h_kv * d, c)),
        "v_proj.weight": np.zeros((h_kv * d, c)),
        "o_proj.weight": np.zeros((c, h * d)),
    }


# -- chunked attention: Llama 4 --


def test_llama4_reads_chunks_nope_layers_and_qk_norm_as_its_config_class_builds_them():
    """Its config class's defaults (a NoPE layer every fourth, chunked RoPE layers, QK-norm and
    temperature on): the RoPE layers get the chunks and the L2 norm, the NoPE layers a full mask
    and the temperature of the cache's positions; a config.json without those keys reads the
    same."""
    config = transformers.Llama4TextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_hidden_layers=8, attention_chunk_size=16, floor_scale=32, attn_scale=0.2,
    ).to_dict()  # fmt: skip
    bare = {
        key: value
        for key, value in config.items()
        if key not in ("layer_types", "no_rope_layers", "use_qk_norm", "attn_temperature_tuning")
    }

    for layer in range(8):
        read = layer_options(config, "llama4_text", layer, {})
        assert read == layer_options(bare, "llama4_text", layer, {})
        nope = layer % 4 == 3
        assert read.get("chunk_size") == (None if nope else 16)
        assert read.get("qk_norm", False) == (not nope)
        assert rotary_dim(config, layer) == (0 if nope else 8)
        expected = {"kind": "log_floor", "beta": 0.2, "length": 32.0, "offset": 1.0}
        cache = expected | {"positions": "cache"}
        assert read.get("query_temperature") == (cache if nope else None)
    read = layer_options(config, "llama4_text", 0, {})
    assert read["qk_norm_type"] == "rms_weightless" and read["qk_norm_position"] == "after_rope"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention_chunk_size": None}, "attention_chunk_size is None: a llama4_text model"),
        ({"attention_chunk_size": 0}, "attention_chunk_size is 0"),
        (
            {"layer_types": ["sliding_attention", "full_attention"]},
            r"layer_types\[0\] is 'sliding_attention': a llama4_text model builds only",
        ),
    ],
)
def test_llama4_configs_its_model_fails_on_are_refused_by_the_key(change, message):
    config = transformers.Llama4TextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2
    ).to_dict()

    with pytest.raises(ValueError, match=message):
        layer_options(config | change, "llama4_text", 0, {})
    with pytest.raises(ValueError, match=message):
        grouped_from_hf(config | change, {})


def test_llama4_without_temperature_tuning_leaves_its_nope_layers_unscaled():
    config = transformers.Llama4TextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
        attn_temperature_tuning=False,
    ).to_dict()  # fmt: skip

    read = layer_options(config, "llama4_text", 3, {})

    assert "query_temperature" not in read and "chunk_size" not in read
