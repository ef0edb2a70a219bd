"""numpy_attention.hf.rope: RoPE's frequencies and attention factor read from a config, against the
real client, transformers' own rotary embedding built from the same tiny config (no download), for
every RoPE type a Llama config takes; the rotated width of partial rotary. (Phi-3's LongRoPE and the
per-layer cases of Gemma 3: tests/numpy_attention/hf/test_grouped.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf.rope import hf_inv_freq, hf_rope_attention_factor, rotary_dim

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

SIZES = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256
)
ORIGINAL = {"original_max_position_embeddings": 64}
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0, **ORIGINAL},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, **ORIGINAL},
    "yarn-mscale": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.707,
                    "mscale_all_dim": 1.0, **ORIGINAL},
}  # fmt: skip


@pytest.mark.parametrize("name", ROPES)
def test_frequencies_and_attention_factor_are_transformers_own(name):
    config = transformers.LlamaConfig(**SIZES, rope_parameters=ROPES[name])
    theirs = LlamaRotaryEmbedding(config)

    ours = hf_inv_freq(config)

    # float32 in the model's order of operations: within two float32 ulps of each frequency
    np.testing.assert_allclose(ours, theirs.inv_freq.numpy(), rtol=2 * 2.0**-23, atol=0)
    assert ours.dtype == np.float32
    assert hf_rope_attention_factor(config) == pytest.approx(theirs.attention_scaling, rel=1e-12)


def test_a_scaled_type_changes_the_frequencies():
    plain = hf_inv_freq(transformers.LlamaConfig(**SIZES, rope_parameters=ROPES["default"]))
    linear = hf_inv_freq(transformers.LlamaConfig(**SIZES, rope_parameters=ROPES["linear"]))

    np.testing.assert_allclose(linear, plain / 4.0, rtol=1e-6)


def test_partial_rotary_rotates_that_fraction_of_the_head_where_the_model_honours_it():
    def config(model_type):
        return {"model_type": model_type, **SIZES, "partial_rotary_factor": 0.5,
                "rope_parameters": ROPES["default"]}  # fmt: skip

    assert rotary_dim(config("phi3"), 0) == 8  # head width 16, half of it
    assert hf_inv_freq(config("phi3")).shape == (4,)
    with pytest.raises(ValueError, match="a llama layer rotates the whole head"):
        rotary_dim(config("llama"), 0)  # Llama's code ignores the factor
