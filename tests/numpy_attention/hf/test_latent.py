"""numpy_attention.hf.latent: Hugging Face configs and state dicts read into
MultiHeadLatentAttention, NumPy only (hand-written config dicts shaped like ``config.to_dict()``
or a ``config.json``): what each model's config sets (sizes, the query LoRA, the RoPE layout,
YaRN's mscale on the scale, LongCat's scales, Mistral 4's query temperature, Kimi Linear's NoPE and
layer types, Kimi K2.5's text config), prefixes stripped and layers chosen (LongCat's 2i + j),
and every refusal before any work. The layer against transformers' own modules:
tests/parity/test_hf_latent.py.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from numpy_attention import convert
from numpy_attention.hf.latent import REFUSED, SUPPORTED_MODEL_TYPES, latent_from_hf
from numpy_attention.latent import MultiHeadLatentAttention

C, H, L, P, R, DV, Q = 16, 2, 6, 4, 4, 3, 5
BASE = {
    "hidden_size": C,
    "num_attention_heads": H,
    "num_key_value_heads": H,
    "kv_lora_rank": L,
    "qk_nope_head_dim": P,
    "qk_rope_head_dim": R,
    "v_head_dim": DV,
    "q_lora_rank": Q,
    "num_hidden_layers": 2,
    "max_position_embeddings": 64,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def config(model_type, **overrides):
    return {**BASE, "model_type": model_type, **overrides}


def state(rng, *, prefix="model.layers.0.self_attn.", q_lora_rank=Q, bias=False, **sizes):
    """An MLA module's state dict of random float64 arrays under ``prefix``."""
    layer = MultiHeadLatentAttention(
        C,
        H,
        **({"kv_lora_rank": L, "qk_nope_head_dim": P, "qk_rope_head_dim": R, "v_head_dim": DV}
           | sizes),
        q_lora_rank=q_lora_rank,
        bias=bias,
    )  # fmt: skip
    return {prefix + k: rng.standard_normal(v.shape) for k, v in layer.state_dict().items()}


def yarn_mscale(factor, mscale):
    return 0.1 * mscale * math.log(factor) + 1.0


# -- what each model's config sets ------------------------------------------------------------


def test_deepseek_v3_loads_its_weights_unchanged_in_float64(rng):
    weights = state(rng)

    layer = convert.latent_from_hf(config("deepseek_v3", num_key_value_heads=128), weights)

    assert layer.dtype == np.float64 and not layer.training
    for name, value in layer.state_dict().items():
        np.testing.assert_array_equal(value, weights["model.layers.0.self_attn." + name])
    assert layer.q_lora_rank == Q and layer.rope_interleave and layer.scale == (P + R) ** -0.5
    assert layer.kv_a_layernorm.eps == 1e-6  # the module's default, not rms_norm_eps


def test_a_deepseek_v3_config_json_with_yarn_sets_the_scale_and_the_rope_factor(rng):
    """DeepSeek-V3's own config.json form (transformers 4 keys): the scale times mscale^2 of
    mscale_all_dim, cos and sin times mscale(mscale) / mscale(mscale_all_dim)."""
    scaling = {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.8,
               "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1}  # fmt: skip
    raw = config("deepseek_v3", rope_theta=10000.0, rope_scaling=scaling, rms_norm_eps=1e-5)
    del raw["rope_parameters"]

    layer = latent_from_hf(raw, state(rng))

    assert math.isclose(layer.scale, (P + R) ** -0.5 * yarn_mscale(40.0, 0.8) ** 2)
    assert math.isclose(layer.rope_attention_factor, yarn_mscale(40.0, 1.0) / yarn_mscale(40, 0.8))
    assert layer.inv_freq.shape == (R // 2,)


@pytest.mark.parametrize(
    ("model_type", "extra", "interleave"),
    [
        ("deepseek_v2", {"q_lora_rank": None}, True),  # complex pairs: the same scores
        ("deepseek_v3", {"rope_interleave": False}, False),
        ("youtu", {}, True),
        ("minicpm3", {"rope_interleave": True}, False),  # rotate_half whatever the key says
        (
            "longcat_flash",
            {"rope_interleave": False, "num_layers": 1, "head_dim": R},
            True,
        ),  # always pairs
    ],
)
def test_each_model_reads_its_rope_layout(rng, model_type, extra, interleave):
    q_lora_rank = extra.get("q_lora_rank", Q)

    layer = latent_from_hf(config(model_type, **extra), state(rng, q_lora_rank=q_lora_rank))

    assert layer.rope_interleave is interleave


def test_longcat_scales_its_queries_and_its_latent(rng):
    """q_nope and q_pe times sqrt(C / q_lora_rank), in every score once: the scale; the normed
    latent times sqrt(C / kv_lora_rank), which is cached so: latent_scale."""
    weights = {
        f"model.layers.{i}.self_attn.{j}.{k}": v
        for i in range(2)
        for j in range(2)
        for k, v in state(rng, prefix="").items()
    }

    layer = latent_from_hf(config("longcat_flash", num_layers=2, head_dim=R), weights, layer_idx=3)

    assert math.isclose(layer.scale, (P + R) ** -0.5 * (C / Q) ** 0.5)
    assert math.isclose(layer.latent_scale, (C / L) ** 0.5)
    np.testing.assert_array_equal(
        layer.kv_b_proj.weight, weights["model.layers.1.self_attn.1.kv_b_proj.weight"]
    )


def test_mistral4_reads_its_llama4_query_temperature_and_partial_rotary(rng):
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
            "mscale_all_dim": 1.0, "original_max_position_embeddings": 8,
            "llama_4_scaling_beta": 0.1, "partial_rotary_factor": R / (P + R)}  # fmt: skip

    layer = latent_from_hf(config("mistral4", rope_parameters=rope, head_dim=P + R), state(rng))

    assert layer.query_temperature == (0.1, 8.0)
    assert layer.inv_freq.shape == (R // 2,)
    assert math.isclose(layer.scale, (P + R) ** -0.5 * yarn_mscale(4.0, 1.0) ** 2)


def test_kimi_linear_mla_layers_have_no_rope_and_no_mscale(rng):
    kinds = ["linear_attention", "full_attention"]
    layer = latent_from_hf(
        config("kimi_linear", q_lora_rank=None, layer_types=kinds),
        state(rng, prefix="model.layers.1.self_attn.", q_lora_rank=None),
        layer_idx=1,
    )

    assert not layer.inv_freq.any() and layer.scale == (P + R) ** -0.5
    assert not layer.rope_interleave


def test_bailing_hybrid_gates_each_head_and_its_mla_layer_closes_each_group(rng):
    """Layer 5 of 6 (layer_group_size's default pattern); g_proj (H, C) loads; interleaved RoPE
    whatever the config says."""
    weights = state(rng, prefix="model.layers.5.self_attn.", q_lora_rank=None)
    weights["model.layers.5.self_attn.g_proj.weight"] = rng.standard_normal((H, C))
    cfg = config("bailing_hybrid", q_lora_rank=None, num_hidden_layers=6, rope_interleave=False)

    layer = latent_from_hf(cfg, weights, layer_idx=5)

    assert layer.output_gate == "head" and layer.gate_activation == "sigmoid"
    np.testing.assert_array_equal(layer.g_proj.weight, weights[
        "model.layers.5.self_attn.g_proj.weight"])  # fmt: skip
    assert layer.rope_interleave and layer.q_lora_rank is None


def test_kimi_k25_reads_its_text_config_and_its_language_models_weights(rng):
    k25 = {"model_type": "kimi_k25", "text_config": config("kimi_k2"), "vision_config": {}}
    weights = state(rng, prefix="model.language_model.layers.0.self_attn.")

    layer = latent_from_hf(k25, weights)

    assert layer.q_lora_rank == Q and layer.hidden_size == C


def test_minicpm3_v_head_dim_defaults_to_the_head_width(rng):
    layer = latent_from_hf(config("minicpm3", v_head_dim=None), state(rng, v_head_dim=C // H))

    assert layer.v_head_dim == C // H


# -- refusals, each before any work -----------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "error", "match"),
    [
        (config("llama"), ValueError, r"'llama' is not supported; supported: \['axk1'"),
        (config("mistral_large4"), ValueError,
         "'mistral_large4' is not supported.*learned query scale per head"),
        (config("deepseek_v32", index_n_heads=2, index_head_dim=8), ValueError,
         "no 'index_topk', which a deepseek_v32 layer needs"),
        (config("glm_moe_dsa", index_n_heads=2, index_head_dim=8, index_topk=4,
                num_hidden_layers=2, indexer_types=["shared", "full"]), ValueError,
         r"indexer_types\[0\] is 'shared'.*layer 0 has none"),
        (config("hy_v4", index_n_heads=2, index_head_dim=8, index_topk=4,
                num_hidden_layers=2, indexer_types=["full"]), ValueError,
         "indexer_types must hold 'full' or 'shared' for each of the 2 layers"),
        (config("deepseek_v3", qk_rope_head_dim=5), ValueError, "qk_rope_head_dim is 5.*even"),
        (config("deepseek_v3", num_key_value_heads=1), ValueError,
         r"num_key_value_heads \(1\) is below num_attention_heads \(2\)"),
        (config("deepseek_v3", kv_lora_rank=None), ValueError, "no 'kv_lora_rank'"),
        (config("axk1", q_lora_rank=None), ValueError, "no 'q_lora_rank', which a axk1"),
        (config("kimi_linear", layer_types=["linear_attention", "full_attention"]),
         ValueError, r"layer 0 is 'linear_attention'.*'full_attention' layers are: \[1\]"),
        (config("bailing_hybrid", q_lora_rank=None, num_hidden_layers=6), ValueError,
         r"layer 0 is 'linear_attention'.*'full_attention' layers are: \[5\]"),
        (config("bailing_hybrid", layer_types=["full_attention"] * 2), ValueError,
         r"sets q_lora_rank \(5\), but a bailing_hybrid layer always"),
        (config("mistral4"), ValueError, "rotates 8 dims.*qk_rope_head_dim is 4"),
        (config("mistral4", rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                             "partial_rotary_factor": 0.5}),
         ValueError, "rotates 8 dims"),
        (config("mistral4", rope_parameters={"rope_type": "linear", "factor": 2.0,
                                             "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
         ValueError, "llama_4_scaling_beta"),
        (config("longcat_flash", num_layers=1, qk_head_dim=7), ValueError,
         r"qk_head_dim \(7\) must be qk_nope_head_dim \+ qk_rope_head_dim"),
        (config("deepseek_v3", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,
                                                "factor": None, "mscale_all_dim": 1.0}),
         ValueError, "mscale_all_dim but no factor"),
        ({"model_type": "kimi_k25", "text_config": config("llama")}, ValueError,
         "text_config has model_type 'llama'"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_naming_the_field(rng, monkeypatch, cfg, error, match):
    weights = state(rng)

    def built(*args, **kwargs):
        raise AssertionError("the layer was built before the config was checked")

    monkeypatch.setattr(MultiHeadLatentAttention, "__init__", built)
    with pytest.raises(error, match=match):
        latent_from_hf(cfg, weights)


def test_every_refused_model_names_its_reason():
    for model_type, reason in REFUSED.items():
        expected = f"{model_type!r} is not supported: .*{re.escape(reason)}"
        with pytest.raises(ValueError, match=expected):
            latent_from_hf(config(model_type), {})
    assert not set(REFUSED) & set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ("missing", KeyError, r"missing keys \['model\.layers\.0\.self_attn\.kv_b_proj\.weight'\]"),
        ("unexpected", KeyError, r"unexpected keys \[.*self_attn\.q_proj\.weight'"),
        ("rank", ValueError, r"kv_a_proj_with_mqa\.weight has shape \(12, 16\).*kv_lora_rank "
                             r"\+ qk_rope_head_dim, hidden_size give \(10, 16\)"),
        ("none", KeyError, "no 'kv_a_proj_with_mqa.weight'"),
        ("layer", ValueError, "holds layer 0.*layer_idx is 1"),
    ],
)  # fmt: skip
def test_weights_that_disagree_with_the_config_are_refused_naming_the_key(
    rng, change, error, match
):
    weights = state(rng)
    prefix = "model.layers.0.self_attn."
    layer_idx = 0
    if change == "missing":
        del weights[prefix + "kv_b_proj.weight"]
    elif change == "unexpected":
        weights[prefix + "q_proj.weight"] = np.zeros((H * (P + R), C))
    elif change == "rank":  # weights of kv_lora_rank 8, a config of 6
        weights = state(rng, kv_lora_rank=8)
    elif change == "none":
        weights = {"model.embed_tokens.weight": np.zeros((3, C))}
    else:
        layer_idx = 1

    with pytest.raises(error, match=match):
        latent_from_hf(config("deepseek_v3"), weights, layer_idx=layer_idx)


def test_layers_are_chosen_by_number_and_out_of_range_is_refused(rng):
    weights = state(rng) | state(rng, prefix="model.layers.1.self_attn.")

    layer = latent_from_hf(config("deepseek_v3"), weights, layer_idx=1)

    np.testing.assert_array_equal(
        layer.o_proj.weight, weights["model.layers.1.self_attn.o_proj.weight"]
    )
    with pytest.raises(ValueError, match="layer_idx is 2 but the deepseek_v3 config has 2"):
        latent_from_hf(config("deepseek_v3"), weights, layer_idx=2)


def test_float32_weights_give_a_float32_layer_and_inv_freq_is_used_as_given(rng):
    weights = {k: v.astype(np.float32) for k, v in state(rng).items()}
    freqs = np.array([1.0, 0.01], dtype=np.float32)

    layer = latent_from_hf(config("deepseek_v3"), weights, inv_freq=freqs)

    assert layer.dtype == np.float32
    np.testing.assert_array_equal(layer.inv_freq, freqs)
