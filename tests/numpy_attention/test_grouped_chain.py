"""numpy_attention.grouped_chain: the chain of GroupedQueryAttention, forward and backward, run
through the layer: every option's output, dx and parameter gradients against torch autograd (the
oracle of test_grouped.py, or torch's own SDPA with enable_gqa) and numerical gradcheck, GQA's
group sums, float32 following float64. Decoding, the cache, the layer's parameters and its bad
input: test_grouped.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch.nn.functional as F

from numpy_attention import gradcheck

from ..conftest import assert_close, assert_gradcheck
from .test_grouped import (
    KV_HEADS,
    OPTIONS,
    B,
    C,
    D,
    H,
    N,
    assert_matches,
    forward_inputs,
    make_layer,
    torch_grads,
)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("kv_heads", KV_HEADS)
@pytest.mark.parametrize("padded", [False, True])
def test_matches_torch_autograd(rng, option, kv_heads, padded):
    layer = make_layer(rng, kv_heads, **OPTIONS[option])
    x, forward = forward_inputs(rng, layer, padded=padded)
    dout = rng.standard_normal((B, N, C))

    assert_matches(layer, x, dout, torch_grads(layer, x, dout, **forward), **forward)


@pytest.mark.parametrize("kv_heads", KV_HEADS)
@pytest.mark.parametrize("padded", [False, True])
def test_matches_sdpa_with_enable_gqa(rng, kv_heads, padded):
    """The oracle's attention replaced by torch's own SDPA (K and V not repeated by hand)."""

    def sdpa(q, k, v, visible, scale):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=visible, scale=scale, enable_gqa=True
        )

    layer = make_layer(rng, kv_heads, window=(1, 0), scaling=0.7, bias=True)
    x, forward = forward_inputs(rng, layer, padded=padded)
    dout = rng.standard_normal((B, N, C))

    assert_matches(
        layer, x, dout, torch_grads(layer, x, dout, attention=sdpa, **forward), **forward
    )


@pytest.mark.parametrize(
    "option",
    [
        "plain",
        "everything",
        "qk_norm_all",
        "gate_element",
        "gate_element_softplus_bias",
        "clip",
        "clip_after_norm",
        "output_norm",
        "qk_norm_after_rope",
        "qk_norm_weightless_all",
        "everything_after_rope",
        "temperature_power",
        "qk_norm_layer_bias",
        "qk_norm_layer_bias_all_clip",
        "qk_norm_layer_bias_per_head_partial",
        "alibi_mpt",
        "alibi_rope_window_sinks",
        "value_width_scale",
        "value_width_gate_head",
        "value_width_output_norm",
        "chunk_llama4_rope",
        "temperature_cache_nope",
    ],
)
@pytest.mark.parametrize("kv_heads", KV_HEADS)
def test_gradcheck(rng, option, kv_heads):
    layer = make_layer(rng, kv_heads, **OPTIONS[option])
    padded = option.startswith(("everything", "chunk", "temperature_cache"))
    x, forward = forward_inputs(rng, layer, padded=padded, n=4)

    assert_gradcheck(gradcheck(layer, x, **forward))


def test_kv_heads_are_shared_by_consecutive_query_heads(rng):
    """GQA with H_kv kv heads is MHA whose kv head h is kv head h // (H / H_kv): the same
    output, and each shared kv weight's gradient is the sum of its group's gradients."""
    group = H // 2
    gqa = make_layer(rng, 2, bias=True)
    mha = make_layer(rng, H, bias=True)
    state = gqa.state_dict()
    repeated = {  # rows of kv head c, repeated for each query head of its group
        name: np.repeat(state[name].reshape(2, D, -1), group, axis=0).reshape(H * D, -1)
        for name in ("k_proj.weight", "v_proj.weight")
    }
    repeated.update(
        {
            name: np.repeat(state[name].reshape(2, D), group, axis=0).reshape(H * D)
            for name in ("k_proj.bias", "v_proj.bias")
        }
    )
    mha.load_state_dict({**state, **repeated})
    x = rng.standard_normal((B, N, C))
    dout = rng.standard_normal((B, N, C))

    out_gqa, out_mha = gqa(x), mha(x)
    dx_gqa, dx_mha = gqa.backward(dout), mha.backward(dout)

    assert_close(out_gqa, out_mha, name="out")
    assert_close(dx_gqa, dx_mha, name="dx")
    for name, grad in gqa.named_grads().items():
        summed = mha.named_grads()[name]
        if name.split(".")[0] in ("k_proj", "v_proj"):  # (H*D, ...) -> sum over each group
            summed = summed.reshape(2, group, D, -1).sum(axis=1).reshape(grad.shape)
        assert_close(grad, summed, name=name)


def test_float32_follows_float64(rng):
    layer64 = make_layer(rng, 2, **OPTIONS["everything"])
    layer32 = copy.deepcopy(layer64).astype(np.float32)
    x, forward = forward_inputs(rng, layer64, padded=True)
    dout = rng.standard_normal((B, N, C))

    out32 = layer32(x.astype(np.float32), **forward)
    dx32 = layer32.backward(dout.astype(np.float32))
    out64 = layer64(x, **forward)
    dx64 = layer64.backward(dout)

    assert out32.dtype == dx32.dtype == np.float32
    assert_close(out32, out64, dtype=np.float32, name="out")
    assert_close(dx32, dx64, dtype=np.float32, name="dx")
    for name, grad in layer64.named_grads().items():
        assert layer32.named_grads()[name].dtype == np.float32
        assert_close(layer32.named_grads()[name], grad, dtype=np.float32, name=name)
