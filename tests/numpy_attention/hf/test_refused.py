"""numpy_attention/hf/refused.py: every model type the converters cannot load is refused by name
with its reason (the twist its attention has, what the model is instead, where it goes), never
with the generic "not supported" and never converted silently wrong; each config is built by
transformers' own config class of that model_type, at tiny sizes. The DeepSeek Sparse Attention
text configs are refused by ``latent_from_hf`` too. The exact rows are proven in
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from numpy_attention import convert
from numpy_attention.hf import grouped_from_hf, latent
from numpy_attention.hf.refused import REFUSED

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
# model_type -> (extra config keywords, a regex the refusal must match): an attention twist
TWISTS = {
    "doge": ({}, "dynamic mask"),
    "inkling_text": ({}, "short convolutions.*relative-position"),
    "inkling2_text": ({}, "output gate.*sinks"),
    "jetmoe": ({}, "mixture of attention heads"),
    "gemma3n": (NESTED, "gemma3n_text' is exact.*timm and Pillow"),
    "gemma4_assistant": (DRAFTER, "reuses the target model's keys and values"),
    "gemma4_unified_assistant": (DRAFTER, "reuses the target model's keys and values"),
}


def tiny_config(model_type, extra):
    """The config dict transformers' own class of that model_type makes at tiny sizes."""
    keywords = extra if "text_config" in extra else {**TINY, **extra}
    keywords = {key: value for key, value in keywords.items() if value is not None}
    return transformers.AutoConfig.for_model(model_type, **keywords).to_dict()


@pytest.mark.parametrize("model_type", sorted(TWISTS))
def test_the_layer_refuses_by_name_a_family_whose_attention_has_a_twist(model_type):
    extra, words = TWISTS[model_type]
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


SIZES = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
SIZES |= {"num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 11}

# model_type -> (the config class's module and name, words its reason must hold): built by that
# class (a wrapper, a text config, a type AutoConfig does not map)
QSA = ("indexed_attention", "QSA indexer", "top")
DSA = ("DeepSeek Sparse Attention", "top-k indexer")
BY_CLASS = {
    "qwen4_exp_text": ("qwen4_exp", "Qwen4ExpTextConfig", QSA),
    "qwen4_exp": ("qwen4_exp", "Qwen4ExpConfig", ("multimodal wrapper", "QSA indexer")),
    "cohere_compass_text": (
        "cohere_compass",
        "CohereCompassTextConfig",
        ("multimodal RoPE", "mrope_section", "3-D position_ids"),
    ),
    "zaya": ("zaya", "ZayaConfig", ("convolution", "recurrent", "temperature")),
    "minimax_m3_vl_text": ("minimax_m3_vl", "MiniMaxM3VLTextConfig", ("Lightning Indexer",)),
    "minimax_m3_vl": ("minimax_m3_vl", "MiniMaxM3VLConfig", ("wrapper", "Lightning Indexer")),
    "glm5_next_text": ("glm5_next", "Glm5NextTextConfig", DSA + ("shared across layers",)),
    "mistral_large4_text": (
        "mistral_large4",
        "MistralLarge4TextConfig",
        DSA + ("KV sharing across layers",),
    ),
    "dots3_note_text": ("dots3_note", "Dots3NoteTextConfig", DSA + ("output gate",)),
    "glm5_next": ("glm5_next", "Glm5NextConfig", DSA),
    "mistral_large4": ("mistral_large4", "MistralLarge4Config", DSA),
    "dots3_note": ("dots3_note", "Dots3NoteConfig", DSA),
    "blt": ("blt", "BltConfig", ("Byte Latent Transformer", "cross-attend")),
    "falcon_mamba": ("falcon_mamba", "FalconMambaConfig", ("state-space model", "no softmax")),
    "mamba": ("mamba", "MambaConfig", ("state-space model", "no softmax")),
    "mamba2": ("mamba2", "Mamba2Config", ("state-space model", "no softmax")),
    "rwkv": ("rwkv", "RwkvConfig", ("RNN", "no softmax")),
    "xlstm": ("xlstm", "xLSTMConfig", ("mLSTM", "no softmax")),
    "deepseek_v4": ("deepseek_v4", "DeepseekV4Config", ("shared-KV", "position -i", "CSA/HCA")),
}


def config_of(module: str, name: str) -> dict:
    """``to_dict()`` of transformers' own config class of the type, tiny where it takes the
    sizes (a class that refuses a size keyword is built with its defaults)."""
    config_class = getattr(
        __import__(f"transformers.models.{module}", fromlist=[name]), name, None
    ) or getattr(transformers, name)
    try:
        return config_class(**SIZES).to_dict()
    except Exception:  # noqa: BLE001  (hub validation errors are no ValueError)
        return config_class().to_dict()


@pytest.mark.parametrize("model_type", sorted(BY_CLASS))
def test_grouped_from_hf_refuses_the_type_by_name_with_its_reason(model_type):
    module, name, words = BY_CLASS[model_type]
    config = config_of(module, name)
    assert config["model_type"] == model_type  # the type transformers gives that config
    assert model_type in REFUSED
    with pytest.raises(ValueError) as caught:
        convert.grouped_from_hf(config, {})
    message = str(caught.value)
    assert "is not supported;" not in message  # never the generic message
    assert f"{model_type}:" in message  # names the model
    for word in words:
        assert word in message, word


@pytest.mark.parametrize("wrapper", ["glm5_next", "mistral_large4", "dots3_note"])
def test_latent_from_hf_refuses_a_text_config_as_its_wrapper(wrapper):
    """A DSA wrapper's language model, passed alone, gets its wrapper's reason from
    latent_from_hf too (before: the generic message)."""
    module, name, _ = BY_CLASS[f"{wrapper}_text"]
    config = config_of(module, name)
    with pytest.raises(ValueError, match=re.escape(latent.REFUSED[wrapper])):
        latent.latent_from_hf(config, {})


def test_every_refused_model_type_is_tested_here():
    """Each entry of REFUSED is built and refused through one of the two tables above."""
    assert set(REFUSED) <= set(TWISTS) | set(BY_CLASS), set(REFUSED) - set(TWISTS) - set(BY_CLASS)
