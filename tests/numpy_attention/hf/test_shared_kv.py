"""Gemma 3n's value norm and KV sharing as the converter reads them (numpy_attention/hf/family.py's
``kv_source``, ``Family.value_norm`` and ``Family.kv_sharing``; ``hf.kv_source_layer``): which
layer each shared layer reads, checked against transformers' own ``kv_sharing_modes``; the
shared layer built without keys or values (a checkpoint's unused entries of it dropped, as the
model drops them on load) and written back without them; bad counts refused by the key. Exact
against transformers: tests/parity/test_hf_models.py (``gemma3n-*``).
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf, hf_attention_state_from_grouped, kv_source_layer

transformers = pytest.importorskip("transformers")

SIZES = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
SIZES |= {"vocab_size": 11, "intermediate_size": 16, "pad_token_id": None}


def gemma3n(**keywords):
    return transformers.Gemma3nTextConfig(**(SIZES | keywords))


@pytest.mark.parametrize(
    "keywords",
    [
        {"num_hidden_layers": 4, "num_kv_shared_layers": 2},  # default pattern: all sliding
        {"num_hidden_layers": 10, "num_kv_shared_layers": 5},  # E4B's pattern, 4 sliding to 1
        {"num_hidden_layers": 35, "num_kv_shared_layers": 15},  # E4B itself
        {"num_hidden_layers": 30, "num_kv_shared_layers": 10},  # E2B
        {"num_hidden_layers": 6, "num_kv_shared_layers": 0},
        {
            "num_hidden_layers": 6,
            "num_kv_shared_layers": 3,
            "layer_types": ["full_attention", "sliding_attention"] * 3,
        },
    ],
)
def test_each_shared_layer_reads_the_layer_transformers_makes_it_read(keywords):
    config = gemma3n(**keywords)
    modes = config.kv_sharing_modes
    types = config.layer_types
    sources = [kv_source_layer(config.to_dict(), i) for i in range(len(types))]

    for i, (mode, source) in enumerate(zip(modes, sources, strict=True)):
        assert (mode == "reuse") == (source is not None), i
        if source is not None:  # the storing layer of the same type
            assert modes[source] == "store" and types[source] == types[i], i


def layer_state(rng, layer_idx, *, unused=True):
    """A checkpoint-style state dict of one Gemma 3n layer: its own entries, plus (``unused``)
    the k/v/norm entries a checkpoint keeps for a shared layer too."""
    state = {
        "q_proj.weight": rng.standard_normal((32, 32)),
        "o_proj.weight": rng.standard_normal((32, 32)),
        "q_norm.weight": rng.standard_normal(8),
    }
    if unused:
        state |= {
            "k_proj.weight": rng.standard_normal((16, 32)),
            "v_proj.weight": rng.standard_normal((16, 32)),
            "k_norm.weight": rng.standard_normal(8),
        }
    return {f"model.layers.{layer_idx}.self_attn.{key}": value for key, value in state.items()}


def test_a_shared_layer_is_built_without_keys_or_values_and_written_back_so(rng):
    config = gemma3n(num_hidden_layers=4, num_kv_shared_layers=2).to_dict()
    state = layer_state(rng, 3)

    layer = grouped_from_hf(config, state, layer_idx=3)
    back = hf_attention_state_from_grouped(config, layer.state_dict(), layer_idx=3)

    assert layer.kv_shared and not layer.value_norm and layer.scaling == 1.0
    assert sorted(back) == ["o_proj.weight", "q_norm.weight", "q_proj.weight"]
    for key, value in back.items():
        np.testing.assert_array_equal(value, state[f"model.layers.3.self_attn.{key}"])


def test_a_storing_layer_norms_its_values_and_needs_its_keys_and_values(rng):
    config = gemma3n(num_hidden_layers=4, num_kv_shared_layers=2).to_dict()

    layer = grouped_from_hf(config, layer_state(rng, 1), layer_idx=1)
    with pytest.raises(KeyError, match="missing keys.*k_proj.weight"):
        grouped_from_hf(config, layer_state(rng, 1, unused=False), layer_idx=1)

    assert layer.value_norm and not layer.kv_shared and layer.v_norm.eps == 1e-6


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"num_hidden_layers": 2}, "num_kv_shared_layers is 15 but the model has 2 layers"),
        (
            {
                "num_hidden_layers": 4,
                "num_kv_shared_layers": 2,
                "layer_types": ["sliding_attention"] * 2 + ["full_attention"] * 2,
            },
            r"num_kv_shared_layers is 2: the shared layers 2..3 have types \['full_attention'\]",
        ),
    ],
)
def test_counts_transformers_cannot_share_are_refused_by_the_key(keywords, message):
    config = SIZES | {"model_type": "gemma3n_text", "num_kv_shared_layers": 15} | keywords

    with pytest.raises(ValueError, match=message):
        kv_source_layer(config, 1)
    with pytest.raises(ValueError, match=message):
        grouped_from_hf(config, {}, layer_idx=0)
