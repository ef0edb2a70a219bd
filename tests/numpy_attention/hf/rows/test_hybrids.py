"""numpy_attention.hf.rows.hybrids: which layers of a hybrid are softmax attention, as its config
class (tiny, no download) builds them from a config.json's rule, the others refused by what they
are; RecurrentGemma's config.json read as its config class reads it. (Every family's layer
against transformers' modules: tests/parity/test_hf_models.py.)"""

from __future__ import annotations

import pytest

from numpy_attention.hf import grouped_from_hf
from numpy_attention.hf.families import FAMILIES, layer_options
from numpy_attention.hf.family import ATTENTION
from numpy_attention.hf.rope import rotary_dim

from ..test_family import LAYERS

transformers = pytest.importorskip("transformers")


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


# -- RecurrentGemma: its config.json, its recurrent blocks --


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
