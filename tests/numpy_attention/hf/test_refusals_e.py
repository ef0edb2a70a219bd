"""Issue 28, part E: every model type of part E that is not a converter row is refused by
``grouped_from_hf`` by name, with its reason (never the generic "is not supported"), on a config
built by transformers' own config class of that type; the DeepSeek Sparse Attention text configs
by ``latent_from_hf`` too. The exact rows are proven in tests/parity/test_hf_models.py."""

from __future__ import annotations

import re

import pytest

from numpy_attention import convert
from numpy_attention.hf import latent
from numpy_attention.hf.refused import REFUSED

transformers = pytest.importorskip("transformers")

TINY = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
TINY |= {"num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 11}

# model_type -> (the config class's module and name, words its reason must hold)
QSA = ("indexed_attention", "QSA indexer", "top")
DSA = ("DeepSeek Sparse Attention", "top-k indexer")
CASES = {
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
        return config_class(**TINY).to_dict()
    except Exception:  # noqa: BLE001  (hub validation errors are no ValueError)
        return config_class().to_dict()


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_grouped_from_hf_refuses_the_type_by_name_with_its_reason(model_type):
    module, name, words = CASES[model_type]
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
    module, name, _ = CASES[f"{wrapper}_text"]
    config = config_of(module, name)
    with pytest.raises(ValueError, match=re.escape(latent.REFUSED[wrapper])):
        latent.latent_from_hf(config, {})
