"""numpy_attention.hf.layouts: where each Hugging Face layout keeps q, k, v and the output
projection, read row by row from fused weights whose rows name their own origin (head, slot,
coordinate), and the split and join inverse to each other. (Against transformers' modules:
tests/parity/test_hf_models.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf import layouts

H, H_KV, D, C = 4, 2, 3, 5  # query heads, key/value heads, head width, model width


def _labelled_falcon() -> np.ndarray:
    """query_key_value.weight ((H + 2 H_kv) D, C) whose row r holds 1000 c + 100 slot + d in
    column 0 (c the kv head, slot 0..g-1 its query heads, g its key, g + 1 its value)."""
    group = H // H_KV
    rows = [
        1000 * c + 100 * slot + d
        for c in range(H_KV)
        for slot in range(group + 2)
        for d in range(D)
    ]
    weight = np.zeros((len(rows), C))
    weight[:, 0] = rows
    return weight


def test_falcon_rows_are_grouped_per_kv_head():
    group = H // H_KV
    state = {"query_key_value.weight": _labelled_falcon(), "dense.weight": np.eye(C)}

    layer = layouts.split("falcon", state, H, H_KV)

    q_heads = [layer["q_proj.weight"][h * D : (h + 1) * D, 0] for h in range(H)]
    for h, rows in enumerate(q_heads):  # query head h reads kv head h // g, slot h % g
        assert rows.tolist() == [1000 * (h // group) + 100 * (h % group) + d for d in range(D)]
    for c in range(H_KV):
        assert layer["k_proj.weight"][c * D : (c + 1) * D, 0].tolist() == [
            1000 * c + 100 * group + d for d in range(D)
        ]
        assert layer["v_proj.weight"][c * D : (c + 1) * D, 0].tolist() == [
            1000 * c + 100 * (group + 1) + d for d in range(D)
        ]
    assert np.array_equal(layer["o_proj.weight"], np.eye(C)) and "dense.weight" not in layer


@pytest.mark.parametrize(("layout", "fused_name"), [("qkv_proj", "qkv_proj"), ("dbrx", "Wqkv")])
def test_stacked_rows_are_all_queries_then_keys_then_values(layout, fused_name):
    fused = np.arange((H + 2 * H_KV) * D, dtype=float)[:, None] * np.ones(C)

    layer = layouts.split(layout, {f"{fused_name}.weight": fused}, H, H_KV)

    assert layer["q_proj.weight"][:, 0].tolist() == list(range(H * D))
    assert layer["k_proj.weight"][:, 0].tolist() == list(range(H * D, (H + H_KV) * D))
    assert layer["v_proj.weight"][:, 0].tolist() == list(range((H + H_KV) * D, (H + 2 * H_KV) * D))


def test_q_gate_rows_are_each_head_s_query_then_its_gate():
    # Qwen3-Next's q_proj (2 H D, C): the model views it as (H, 2 D) per token and chunks it, so
    # row r belongs to head r // (2 D), to the query if r % (2 D) < D, else to the gate
    rows = np.arange(2 * H * D, dtype=float)
    state = {"q_proj.weight": rows[:, None] * np.ones(C), "q_proj.bias": rows}

    layer = layouts.split("q_gate", state, H, H_KV)

    for h in range(H):
        query = [2 * D * h + d for d in range(D)]
        gate = [2 * D * h + D + d for d in range(D)]
        assert layer["q_proj.weight"][h * D : (h + 1) * D, 0].tolist() == query
        assert layer["g_proj.weight"][h * D : (h + 1) * D, 0].tolist() == gate
        assert layer["g_proj.bias"][h * D : (h + 1) * D].tolist() == gate
    assert layouts.hf_name("q_gate", "g_proj.bias") == "q_proj.bias"
    assert layouts.hf_shapes(
        "q_gate", {"q_proj.weight": (H * D, C), "g_proj.weight": (H * D, C)}
    ) == {"q_proj.weight": (2 * H * D, C)}


def test_gpt_bigcode_multi_query_rows_are_all_queries_then_one_key_then_one_value():
    """GPT-BigCode's multi-query split: the output at H D, then D for k and D for v."""
    fused = np.arange((H + 2) * D, dtype=float)[:, None] * np.ones(C)

    layer = layouts.split("gpt_bigcode", {"c_attn.weight": fused}, H, 1)

    assert layer["q_proj.weight"][:, 0].tolist() == list(range(H * D))
    assert layer["k_proj.weight"][:, 0].tolist() == list(range(H * D, (H + 1) * D))
    assert layer["v_proj.weight"][:, 0].tolist() == list(range((H + 1) * D, (H + 2) * D))


def test_gpt_bigcode_multi_head_rows_are_q_k_v_per_head():
    """GPT-BigCode without multi_query views its output as (H, 3 D): head h's q, k, v in turn;
    row r of c_attn holds 100 h + 10 slot + d (slot 0 q, 1 k, 2 v)."""
    rows = [100 * h + 10 * slot + d for h in range(H) for slot in range(3) for d in range(D)]
    state = {"c_attn.bias": np.array(rows, dtype=float), "c_proj.weight": np.eye(C)}

    layer = layouts.split("gpt_bigcode", state, H, H)

    for slot, name in enumerate(("q_proj", "k_proj", "v_proj")):
        expected = [100 * h + 10 * slot + d for h in range(H) for d in range(D)]
        assert layer[f"{name}.bias"].tolist() == expected, name
    assert np.array_equal(layer["o_proj.weight"], np.eye(C)) and "c_proj.weight" not in layer


@pytest.mark.parametrize(
    ("layout", "kv_heads"),
    [("separate", H_KV), ("qkv_proj", H_KV), ("falcon", H_KV), ("gpt_bigcode", 1)]
    + [("gpt_bigcode", H), ("dbrx", H_KV), ("q_gate", H_KV)],
)
def test_join_is_the_inverse_of_split_for_weights_and_biases(layout, kv_heads):
    rng = np.random.default_rng(0)
    layer = {
        f"{name}.{kind}": rng.standard_normal((rows, C) if kind == "weight" else (rows,))
        for name, rows in (("q_proj", H * D), ("k_proj", kv_heads * D), ("v_proj", kv_heads * D))
        for kind in ("weight", "bias")
    }
    layer["o_proj.weight"] = rng.standard_normal((C, H * D))
    if layout == "q_gate":  # the output gate, whose rows the model keeps in q_proj
        layer |= {
            "g_proj.weight": rng.standard_normal((H * D, C)),
            "g_proj.bias": rng.standard_normal(H * D),
        }

    model = layouts.join(layout, layer, H, kv_heads)
    again = layouts.split(layout, model, H, kv_heads)

    assert set(model) == set(layouts.hf_shapes(layout, {k: v.shape for k, v in layer.items()}))
    assert set(again) == set(layer)
    for key, value in layer.items():
        np.testing.assert_array_equal(again[key], value, err_msg=key)


def test_names_and_shapes_of_the_model():
    shapes = {"q_proj.weight": (H * D, C), "k_proj.weight": (H_KV * D, C),
              "v_proj.weight": (H_KV * D, C), "o_proj.weight": (C, H * D)}  # fmt: skip

    assert layouts.hf_name("falcon", "o_proj.weight") == "dense.weight"
    assert layouts.hf_name("qkv_proj", "k_proj.bias") == "qkv_proj.bias"
    assert layouts.hf_name("separate", "k_proj.weight") == "k_proj.weight"
    assert layouts.hf_shapes("falcon", shapes) == {
        "query_key_value.weight": ((H + 2 * H_KV) * D, C),
        "dense.weight": (C, H * D),
    }
    assert "query_key_value.weight" in layouts.expected_form("falcon")
    assert layouts.hf_name("gpt_bigcode", "o_proj.bias") == "c_proj.bias"
    multi_query = {"k_proj.weight": (D, C), "v_proj.weight": (D, C)}
    assert layouts.hf_shapes("gpt_bigcode", shapes | multi_query) == {
        "c_attn.weight": ((H + 2) * D, C),
        "c_proj.weight": (C, H * D),
    }
    assert layouts.hf_shapes("dbrx", shapes) == {
        "Wqkv.weight": ((H + 2 * H_KV) * D, C),
        "out_proj.weight": (C, H * D),
    }
