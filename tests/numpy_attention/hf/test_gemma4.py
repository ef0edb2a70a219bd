"""Gemma 4's rows (gemma4_text, gemma4_unified_text): each full layer's own width and key/value
heads (``per_layer_config``, or the ``global_head_dim`` and ``num_global_key_value_heads`` of a
released config.json), values from k_proj under ``attention_k_eq_v``, the layer types its config
class writes, and the configs refused by key. Against transformers' own config classes (tiny, no
download); the layers themselves: tests/parity/test_hf_models.py."""

from __future__ import annotations

import pytest

from numpy_attention.hf import grouped_from_hf
from numpy_attention.hf.families import FAMILIES, layer_options
from numpy_attention.hf.family import FULL, SLIDING, layer_kind

transformers = pytest.importorskip("transformers")

KEYS = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
KEYS |= {"global_head_dim": 16, "num_global_key_value_heads": 1, "num_hidden_layers": 8}
KEYS |= {"vocab_size": 11}
CLASSES = {"gemma4_text": "Gemma4TextConfig", "gemma4_unified_text": "Gemma4UnifiedTextConfig"}


def config_of(name, **keys):
    return getattr(transformers, CLASSES[name])(**(KEYS | keys)).to_dict()


def released_form(config):
    """The config as a released config.json holds it: the two global keys, no per_layer_config
    and no layer_types."""
    bare = {k: v for k, v in config.items() if k not in ("per_layer_config", "layer_types")}
    return bare | {"global_head_dim": 16, "num_global_key_value_heads": 1}


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("k_eq_v", [True, False])
def test_each_full_layer_reads_its_own_width_heads_and_values(name, k_eq_v):
    config = config_of(name, attention_k_eq_v=k_eq_v)

    for layer in range(8):
        read = layer_options(config, name, layer, {})
        full = config["layer_types"][layer] == FULL
        assert layer_kind(config, FAMILIES[name], layer) == config["layer_types"][layer]
        assert read["head_dim"] == (16 if full else 8)
        assert read["num_kv_heads"] == (1 if full and k_eq_v else 2)
        assert read.get("values_from_keys", False) == (full and k_eq_v)
        assert read["value_norm"] and read["scaling"] == 1.0
        assert read == layer_options(released_form(config), name, layer, {})


@pytest.mark.parametrize("layers", [4, 6, 7])
def test_without_layer_types_the_pattern_and_the_last_full_layer_are_its_config_class_s(layers):
    config = config_of("gemma4_text", num_hidden_layers=layers)
    bare = released_form(config)

    windows = [layer_options(bare, "gemma4_text", i, {})["window"] for i in range(layers)]
    ours = [FULL if window is None else SLIDING for window in windows]

    assert ours == config["layer_types"]
    assert ours[-1] == FULL and SLIDING in ours


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention is 'all'"),
        ({"per_layer_config": {"5": {"sliding_window": 3}}}, r"per_layer_config\[5\] sets"),
        ({"per_layer_config": {"full": {"head_dim": 16}}}, "the key 'full'"),
        (
            {"per_layer_config": {"5": {"head_dim": 16}, "7": {"head_dim": 32}}},
            "full_attention layers head_dim",
        ),
    ],
)
def test_a_config_its_layer_cannot_mean_is_refused_by_the_key(change, message):
    config = config_of("gemma4_text", num_hidden_layers=8) | change

    with pytest.raises(ValueError, match=message):
        if "use_bidirectional_attention" in change:  # refused before the weights are read
            grouped_from_hf(config, {}, layer_idx=5)
        else:
            layer_options(config, "gemma4_text", 5, {})


def test_vision_bidirectionality_leaves_the_text_layers_causal():
    """ "vision" (Gemma 4 Unified's default) is causal in the text model: read, not refused."""
    config = config_of("gemma4_unified_text")
    assert config["use_bidirectional_attention"] == "vision"

    read = layer_options(config, "gemma4_unified_text", 0, {})

    assert read["window"] == (1023, 0)
