"""Zamba2's per-layer LoRA adapters folded into q, k and v (numpy_attention.hf.adapters), and
through ``grouped_from_hf``: the folded layer computes x W^T + (x A^T) B^T, the layer's own
slot is the one folded, the block's other slots are dropped, missing or misshapen adapters are
named, and the way back refuses a config with adapters (the fold cannot be split). Zamba's and
Zamba2's input width (2 * hidden_size) loads and saves. Against transformers:
tests/parity/test_hf_models.py (cases ``zamba*``).
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import grouped_from_hf, hf_attention_state_from_grouped
from numpy_attention.hf.adapters import fold_adapters

from ...conftest import assert_close

C, H, R = 8, 4, 3  # hidden_size, heads (= kv heads), adapter rank
C_IN, D = 2 * C, 2 * C // H  # the attention's input width, attention_head_dim
# a Zamba2 with two shared blocks over three attention layers (1, 2, 4): slots 0, 1, 2, blocks
# 0, 1, 0; layer 4's block holds slots 0 and 2
ZAMBA2 = {
    "model_type": "zamba2",
    "hidden_size": C,
    "num_attention_heads": H,
    "num_key_value_heads": H,
    "num_hidden_layers": 5,
    "layers_block_type": ["mamba", "hybrid", "hybrid", "mamba", "hybrid"],
    "num_mem_blocks": 2,
    "use_shared_attention_adapter": True,
    "adapter_rank": R,
    "use_mem_rope": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def block(rng, prefix, slots):
    """A shared block's attention entries under ``prefix``, with adapters in ``slots``."""
    state = {f"{prefix}{proj}_proj.weight": rng.standard_normal((C_IN, C_IN)) for proj in "qkv"}
    state[f"{prefix}o_proj.weight"] = rng.standard_normal((C, C_IN))
    for slot in slots:
        for proj in "qkv":
            state[f"{prefix}linear_{proj}_adapter_list.{slot}.0.weight"] = rng.standard_normal(
                (R, C_IN)
            )
            state[f"{prefix}linear_{proj}_adapter_list.{slot}.1.weight"] = rng.standard_normal(
                (C_IN, R)
            )
    return state


def test_the_fold_computes_the_projection_plus_the_adapter(rng):
    state = block(rng, "", [0, 2])
    x = rng.standard_normal((5, C_IN))

    folded = fold_adapters(state, 2)

    assert sorted(folded) == [f"{proj}_proj.weight" for proj in "koqv"]
    for proj in "qkv":
        down = state[f"linear_{proj}_adapter_list.2.0.weight"]
        up = state[f"linear_{proj}_adapter_list.2.1.weight"]
        expected = x @ state[f"{proj}_proj.weight"].T + (x @ down.T) @ up.T
        assert_close(x @ folded[f"{proj}_proj.weight"].T, expected, name=proj)


def test_grouped_from_hf_folds_the_layer_s_own_slot_and_drops_the_others(rng):
    """Layer 4 is the third attention layer: slot 2 (its block also holds layer 1's slot 0)."""
    prefix = "model.layers.4.shared_transformer.self_attn."
    state = block(rng, prefix, [0, 2]) | block(
        rng, "model.layers.2.shared_transformer.self_attn.", [1]
    )

    layer = grouped_from_hf(ZAMBA2, state, layer_idx=4)

    expected = fold_adapters({k.removeprefix(prefix): v for k, v in state.items()
                              if k.startswith(prefix)}, 2)  # fmt: skip
    assert sorted(layer.state_dict()) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(layer.state_dict()[name], value)
    assert layer.input_size == C_IN and layer.hidden_size == C and layer.head_dim == D
    assert layer.scaling == pytest.approx((D / 2) ** -0.5) and layer.rotary_dim == D


def test_a_missing_or_misshapen_adapter_is_named(rng):
    prefix = "model.layers.4.shared_transformer.self_attn."
    state = block(rng, prefix, [0])  # no slot 2
    wrong = block(rng, prefix, [2])
    wrong[f"{prefix}linear_k_adapter_list.2.1.weight"] = rng.standard_normal((C, R))

    with pytest.raises(KeyError, match=r"slot 2 has no \['linear_q_adapter_list\.2\.0\.weight'"):
        grouped_from_hf(ZAMBA2, state, layer_idx=4)
    with pytest.raises(ValueError, match=r"linear_k_adapter_list\.2 has shapes .* k_proj"):
        grouped_from_hf(ZAMBA2, wrong, layer_idx=4)


def test_adapters_without_the_flag_are_unexpected_keys(rng):
    state = block(rng, "model.layers.4.shared_transformer.self_attn.", [2])

    with pytest.raises(KeyError, match="unexpected keys.*linear_q_adapter_list.2.0.weight"):
        grouped_from_hf(ZAMBA2 | {"use_shared_attention_adapter": False}, state, layer_idx=4)


def test_the_way_back_refuses_folded_adapters_and_saves_the_wider_input(rng):
    prefix = "model.layers.4.shared_transformer.self_attn."
    plain = block(rng, prefix, [])
    config = ZAMBA2 | {"use_shared_attention_adapter": False}
    layer = grouped_from_hf(config, plain, layer_idx=4)

    back = hf_attention_state_from_grouped(config, layer.state_dict())

    for name, value in back.items():
        np.testing.assert_array_equal(value, plain[prefix + name])
    assert back["q_proj.weight"].shape == (C_IN, C_IN)
    with pytest.raises(ValueError, match="use_shared_attention_adapter is set.*cannot be split"):
        hf_attention_state_from_grouped(ZAMBA2, layer.state_dict())


def test_zamba_reads_its_attention_head_dim_and_input_width(rng):
    config = {"model_type": "zamba", "hidden_size": C, "num_attention_heads": H}
    config |= {"num_key_value_heads": 2, "num_hidden_layers": 3, "attention_head_dim": 6}
    prefix = "model.layers.2.shared_transf.self_attn."
    state = {f"{prefix}q_proj.weight": rng.standard_normal((H * 6, C_IN))}
    state |= {f"{prefix}{p}_proj.weight": rng.standard_normal((2 * 6, C_IN)) for p in "kv"}
    state[f"{prefix}o_proj.weight"] = rng.standard_normal((C, H * 6))

    layer = grouped_from_hf(config, state, layer_idx=2)

    assert layer.head_dim == 6 and layer.input_size == C_IN and layer.rotary_dim == 0
    assert layer.scaling == pytest.approx(3**-0.5)
