"""The families of the clip of q, k and v and of the output norm, as the converter reads their
configs: OLMo and OLMoE's ``clip_qkv`` (OLMoE's after its QK-norm), DBRX's nested ``attn_config``
and fused ``Wqkv``, BitNet's ``attn_sub_norm``; and the configs each refuses by name. Each config
is built by transformers' own config class at tiny sizes. (Against transformers' modules:
tests/parity/test_hf_models.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf, hf_attention_state_from_grouped

transformers = pytest.importorskip("transformers")

TINY = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 11}
DBRX = {"d_model": 32, "n_heads": 4, "n_layers": 2, "vocab_size": 11}
DBRX_ATTN = {"clip_qkv": 8, "kv_n_heads": 2, "rope_theta": 10000.0}


def config_of(model_type, **keywords):
    """The config dict transformers' own class of that model_type makes."""
    base = DBRX if model_type == "dbrx" else TINY
    return transformers.AutoConfig.for_model(model_type, **(base | keywords)).to_dict()


def state(kv_heads=4, head_dim=8, hidden=32, heads=4, **extra):
    """An attention state dict of random weights with separate projections."""
    rng = np.random.default_rng(0)
    shapes = {
        "q_proj.weight": (heads * head_dim, hidden),
        "k_proj.weight": (kv_heads * head_dim, hidden),
        "v_proj.weight": (kv_heads * head_dim, hidden),
        "o_proj.weight": (hidden, heads * head_dim),
    } | extra
    return {name: rng.standard_normal(shape) for name, shape in shapes.items()}


NORMS = {"q_norm.weight": (32,), "k_norm.weight": (32,)}  # OLMoE's, over the whole projection


# -- OLMo and OLMoE ----------------------------------------------------------------------------


@pytest.mark.parametrize(("model_type", "after_norm"), [("olmo", False), ("olmoe", True)])
def test_clip_qkv_is_read_and_olmoe_clamps_after_its_norm(model_type, after_norm):
    config = config_of(model_type, clip_qkv=8.0)
    extra = NORMS if model_type == "olmoe" else {}

    layer = grouped_from_hf(config, state(**extra))
    unclipped = grouped_from_hf(config | {"clip_qkv": None}, state(**extra))

    assert layer.clip_qkv == 8.0 and isinstance(layer.clip_qkv, float)
    assert layer.clip_after_norm is after_norm
    assert unclipped.clip_qkv is None and unclipped.clip_after_norm is False


@pytest.mark.parametrize("model_type", ["olmo", "olmoe", "dbrx"])
@pytest.mark.parametrize("clip", [0, -8.0, True, "8"])
def test_a_clip_that_is_not_a_positive_number_is_refused_by_name(model_type, clip):
    # 0 would zero q, k and v (the models test `is not None`); a negative one clamps nonsense
    if model_type == "dbrx":
        config = config_of("dbrx", attn_config=DBRX_ATTN)
        config["attn_config"]["clip_qkv"] = clip
        weights = {"Wqkv.weight": np.zeros((64, 32)), "out_proj.weight": np.zeros((32, 32))}
    else:
        config = config_of(model_type) | {"clip_qkv": clip}
        weights = state(**(NORMS if model_type == "olmoe" else {}))

    with pytest.raises(ValueError, match=r"clip_qkv is .*: the clamp of q, k and v .* > 0"):
        grouped_from_hf(config, weights)


# -- DBRX ------------------------------------------------------------------------------------


def test_dbrx_reads_its_nested_attn_config_and_splits_wqkv():
    config = config_of("dbrx", attn_config=DBRX_ATTN | {"attn_pdrop": 0.25})
    fused = np.arange(64)[:, None] * np.ones((1, 32))  # rows [q 32; k 16; v 16]

    layer = grouped_from_hf(config, {"Wqkv.weight": fused, "out_proj.weight": np.eye(32)})

    assert (layer.hidden_size, layer.num_heads, layer.num_kv_heads, layer.head_dim) == (32, 4, 2, 8)
    assert layer.clip_qkv == 8.0 and layer.dropout == 0.25
    assert not layer.output_norm and not layer.qk_norm
    assert layer.q_proj.weight[:, 0].tolist() == list(range(32))
    assert layer.k_proj.weight[:, 0].tolist() == list(range(32, 48))
    assert layer.v_proj.weight[:, 0].tolist() == list(range(48, 64))
    back = hf_attention_state_from_grouped(config, layer.state_dict())
    assert sorted(back) == ["Wqkv.weight", "out_proj.weight"]
    np.testing.assert_array_equal(back["Wqkv.weight"], fused)


def test_dbrx_reads_a_config_json_without_its_config_classs_copies():
    """A config.json as saved: no top-level num_key_value_heads (the class copies kv_n_heads
    up) nor rope parameters (the class's default base, 1e4)."""
    config = {"model_type": "dbrx", "attn_config": DBRX_ATTN | {"kv_n_heads": 1}} | DBRX
    fused = np.zeros((48, 32))

    layer = grouped_from_hf(config, {"Wqkv.weight": fused, "out_proj.weight": np.zeros((32, 32))})

    assert layer.num_kv_heads == 1 and layer.constructor_args()["rope_theta"] == 10000.0


@pytest.mark.parametrize(
    ("attn", "top", "match"),
    [
        ({"clip_qkv": None}, {}, "attn_config.clip_qkv is null: .*clamp\\(min=None, max=None\\)"),
        ({"rope_theta": 500000}, {}, "attn_config.rope_theta is 500000 but .* rope_theta 10000"),
        ({"alibi": True}, {}, "attn_config.alibi is set"),
        ({"qk_ln": True}, {}, "attn_config.qk_ln is set"),
    ],
)
def test_dbrx_refuses_what_its_transformers_code_cannot_mean(attn, top, match):
    # the released DBRX's attn_config.rope_theta 5e5: transformers 5 rotates at 1e4 unless the
    # top-level rope_parameters say 5e5 too
    config = config_of("dbrx", attn_config=DBRX_ATTN) | top
    config["attn_config"] |= attn

    with pytest.raises(ValueError, match=match):
        grouped_from_hf(config, {"Wqkv.weight": np.zeros((64, 32))})


def test_dbrx_refuses_an_attn_config_without_rope_theta():
    config = config_of("dbrx", attn_config={"clip_qkv": 8, "kv_n_heads": 2})

    with pytest.raises(ValueError, match="attn_config has no rope_theta"):
        grouped_from_hf(config, {"Wqkv.weight": np.zeros((64, 32))})


def test_dbrx_with_both_bases_equal_converts():
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    config = config_of("dbrx", attn_config=DBRX_ATTN | {"rope_theta": 500000}, rope_parameters=rope)

    layer = grouped_from_hf(
        config, {"Wqkv.weight": np.zeros((64, 32)), "out_proj.weight": np.zeros((32, 32))}
    )

    assert layer.constructor_args()["rope_theta"] == 500000.0


# -- BitNet ----------------------------------------------------------------------------------


def test_bitnet_loads_attn_sub_norm_as_the_output_norm():
    config = config_of("bitnet", num_key_value_heads=2, rms_norm_eps=1e-4)
    weights = state(kv_heads=2, **{"attn_sub_norm.weight": (32,)})

    layer = grouped_from_hf(config, weights)

    assert layer.output_norm and layer.o_norm.eps == 1e-4
    np.testing.assert_array_equal(layer.o_norm.weight, weights["attn_sub_norm.weight"])
    back = hf_attention_state_from_grouped(config, layer.state_dict())
    assert "attn_sub_norm.weight" in back and "o_norm.weight" not in back


def test_bitnet_refuses_its_quantized_linears():
    quantized = {"quant_method": "bitnet", "linear_class": "autobitlinear"}
    config = config_of("bitnet") | {
        "quantization_config": quantized | {"quantization_mode": "online"}
    }

    with pytest.raises(ValueError, match="quantization_config is set: bitnet's quantized linears"):
        grouped_from_hf(config, state(**{"attn_sub_norm.weight": (32,)}))


def test_bitnet_refuses_heads_that_do_not_span_the_hidden_size():
    # attn_sub_norm is hidden_size wide: the merged heads must be too
    config = config_of("bitnet", num_key_value_heads=4, head_dim=16)

    with pytest.raises(ValueError, match="4 \\* 16, but a bitnet o_proj takes hidden_size = 32"):
        grouped_from_hf(config, state(head_dim=16, **{"attn_sub_norm.weight": (32,)}))


def test_bitnet_without_its_norm_weight_is_named():
    with pytest.raises(KeyError, match="attn_sub_norm.weight"):
        grouped_from_hf(config_of("bitnet", num_key_value_heads=4), state())


# -- MPT: DBRX's Wqkv layout with ALiBi instead of RoPE ----------------------------------------

MPT = {"d_model": 48, "n_heads": 6, "n_layers": 2, "vocab_size": 11, "max_seq_len": 16}


def mpt_config(attn=None, **top):
    return transformers.MptConfig(**(MPT | top), attn_config=attn or {}).to_dict()


def test_mpt_reads_its_nested_attn_config_alibi_and_no_rope():
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    config = mpt_config({"clip_qkv": 6.0, "softmax_scale": 0.25})
    config["attn_config"]["attn_pdrop"] = 0.125  # the config class types it int
    fused = np.arange(144)[:, None] * np.ones((1, 48))  # rows [q 48; k 48; v 48]

    layer = grouped_from_hf(config, {"Wqkv.weight": fused, "out_proj.weight": np.eye(48)})
    # the model's bias of the last query row: -slope_h * (M - 1 - j), here M = 2, key j = 0
    model_slopes = -build_mpt_alibi_tensor(6, 2)[:, 0, 0].double().numpy()

    assert (layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.rotary_dim) == (6, 6, 8, 0)
    assert layer.clip_qkv == 6.0 and layer.scaling == 0.25 and layer.dropout == 0.125
    np.testing.assert_array_equal(layer.alibi_slopes, model_slopes)  # powers of 2: exact
    assert layer.k_proj.weight[:, 0].tolist() == list(range(48, 96))
    back = hf_attention_state_from_grouped(config, layer.state_dict())
    np.testing.assert_array_equal(back["Wqkv.weight"], fused)


@pytest.mark.parametrize(
    ("attn", "top", "match"),
    [
        ({"alibi": False}, {}, "attn_config.alibi is False: transformers' MPT adds ALiBi"),
        ({"alibi_bias_max": 16}, {}, "attn_config.alibi_bias_max is 16: .* with 8"),
        ({"qk_ln": True}, {}, "attn_config.qk_ln is True: .*LayerNorm of q and k"),
        ({"prefix_lm": True}, {}, "attn_config.prefix_lm is True"),
        ({"attn_uses_sequence_id": True}, {}, "attn_config.attn_uses_sequence_id is True"),
        ({"attn_type": "multiquery_attention"}, {}, "attn_config.attn_type is 'multiquery"),
        ({}, {"no_bias": False}, "no_bias is False: .*no biases on Wqkv and out_proj"),
        ({"softmax_scale": float("nan")}, {}, "attn_config.softmax_scale"),
        ({"clip_qkv": -1.0}, {}, "clip_qkv is -1.0"),
    ],
)
def test_mpt_refuses_what_its_transformers_code_cannot_mean(attn, top, match):
    config = mpt_config(**top)
    config["attn_config"] |= attn

    with pytest.raises(ValueError, match=match):
        grouped_from_hf(config, {"Wqkv.weight": np.zeros((144, 48))})
