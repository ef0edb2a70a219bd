"""numpy_attention.hf.families: the model types it knows and refuses; the checks whose table spans
several row modules (configs a family cannot mean, the rotated width); the fused rows
(rows/fused.py: Falcon, Persimmon, GPT-BigCode, Phi-4-multimodal) against transformers' own
config classes (tiny, no download); unmerged LoRA adapters refused. Each row module's own rules:
tests/numpy_attention/hf/rows/; the machinery they share: test_family.py. (Every family's layer
against transformers' modules: tests/parity/test_hf_models.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf
from numpy_attention.hf.families import FAMILIES, layer_options, model_type
from numpy_attention.hf.family import required, sizes
from numpy_attention.hf.rope import rotary_dim

from .test_family import SIZES

transformers = pytest.importorskip("transformers")


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
