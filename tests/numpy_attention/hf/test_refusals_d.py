"""Issue 28, part D: the decoder families whose attention the layer cannot compute are refused by
name with their twist, never with the generic "not supported" and never converted silently wrong.

Each config is built by transformers' own config class of that model_type, at tiny sizes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf

transformers = pytest.importorskip("transformers")

TINY = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 11}
NESTED = {"text_config": TINY}  # the multimodal wrappers
# a drafter's text config: every layer shares the target's keys and values, no per-layer inputs
DRAFTER = {
    "text_config": {
        **TINY,
        "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0,
    }
}
# model_type -> (extra config keywords, words the refusal must contain)
REFUSED = {
    "diffllama": ({}, "differential attention"),
    "doge": ({}, "dynamic mask"),
    "inkling_text": ({}, "short convolutions.*relative-position"),
    "inkling2_text": ({}, "output gate.*sinks"),
    "jetmoe": ({}, "mixture of attention heads"),
    "llama4": (NESTED, "llama4_text.*chunked attention"),
    "llama4_text": ({}, "chunks.*after RoPE.*temperature"),
    "mimo_v2_flash": ({}, "v_head_dim.*attention_value_scale"),
    "mpt": ({"d_model": 32, "n_heads": 4, "n_layers": 2, "hidden_size": None}, "ALiBi.*no ALiBi"),
    "gemma3n": (NESTED, "gemma3n_text.*RMSNorm on the values"),
    "gemma3n_text": ({}, "v_norm.*KV sharing"),
    "gemma4": (NESTED, "gemma4_text.*RMSNorm on the values"),
    "gemma4_text": ({}, "v_norm.*KV sharing"),
    "gemma4_unified": (NESTED, "gemma4_unified_text.*RMSNorm on the values"),
    "gemma4_unified_text": ({}, "v_norm.*KV sharing"),
    "gemma4_assistant": (DRAFTER, "reuses the target model's keys and values"),
    "gemma4_unified_assistant": (DRAFTER, "reuses the target model's keys and values"),
}


def tiny_config(model_type, extra):
    """The config dict transformers' own class of that model_type makes at tiny sizes."""
    keywords = extra if "text_config" in extra else {**TINY, **extra}
    keywords = {key: value for key, value in keywords.items() if value is not None}
    return transformers.AutoConfig.for_model(model_type, **keywords).to_dict()


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_the_layer_refuses_by_name_a_family_whose_attention_has_a_twist(model_type):
    extra, words = REFUSED[model_type]
    config = tiny_config(model_type, extra)
    assert config["model_type"] == model_type
    with pytest.raises(ValueError, match=f"'{model_type}' is not supported as such: ") as info:
        grouped_from_hf(config, {}, layer_idx=0)
    assert f"{model_type}: " in str(info.value)
    assert re.search(words, str(info.value)), str(info.value)
    assert "supported:" not in str(info.value)  # never the generic list


def zero_state(hidden=32, heads=4, head_dim=8):
    """An attention state dict of zeros (the shapes matter only where the reading gets there)."""
    width = heads * head_dim
    shapes = {"q_proj": (width, hidden), "k_proj": (width, hidden), "v_proj": (width, hidden)}
    state = {f"{name}.weight": np.zeros(shape) for name, shape in shapes.items()}
    return state | {"o_proj.weight": np.zeros((hidden, width))}


def test_olmoe_refuses_heads_that_do_not_span_the_hidden_size():
    # its q_norm is hidden_size wide: head_dim * num_attention_heads must be hidden_size
    config = tiny_config("olmoe", {"head_dim": 16})
    with pytest.raises(ValueError, match="4 \\* 16, but a olmoe o_proj takes hidden_size = 32"):
        grouped_from_hf(config, zero_state(head_dim=16), layer_idx=0)


def test_phimoe_refuses_a_cos_and_sin_factor_that_changes_between_calls():
    # its rotary embedding takes short_mscale or long_mscale by each call's longest position
    rope = {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 8}
    rope |= {"short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    rope |= {"short_mscale": 1.1, "long_mscale": 1.3}
    sizes = {"num_key_value_heads": 4, "max_position_embeddings": 32}
    config = tiny_config("phimoe", sizes | {"rope_parameters": rope})
    with pytest.raises(ValueError, match="short_mscale is 1.1 but long_mscale is 1.3"):
        grouped_from_hf(config, zero_state(), layer_idx=0)
    config["rope_parameters"]["long_mscale"] = 1.1  # one factor, the short frequencies only
    layer = grouped_from_hf(config, zero_state())
    assert layer.rope_attention_factor == 1.1 and layer.long_inv_freq is None
