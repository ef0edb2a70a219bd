"""numpy_attention.hf.rows.twists: the rows that need an option the classic decoder lacks, the
gated ones aside (test_gated.py): QK-norm after RoPE, the query temperature, Llama 4's chunks and
NoPE layers as its config class (tiny, no download) builds them; what each refuses, by the key.
(MiMo-V2-Flash and Gemma 4: tests/numpy_attention/hf/test_mimo.py, test_gemma4.py; every
family's layer against transformers' modules: tests/parity/test_hf_models.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf
from numpy_attention.hf.families import FAMILIES, layer_options
from numpy_attention.hf.rope import rope_parameters, rotary_dim

from ..test_family import SIZES

transformers = pytest.importorskip("transformers")


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
