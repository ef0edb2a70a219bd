"""GroupedQueryAttention and KVCache (numpy_attention.grouped): the torch oracle of every option
(its chain's gradients, GQA's grouping and float32 are checked against it in
test_grouped_chain.py), dropout, decoding with the cache equal to the full sequence, the cache's
own contract, module files, and bad input refused before any work.

The torch oracle is the layer written in torch ops: ``F.linear``, torch's ``F.rms_norm``,
``test_rope.torch_rope``, and the attention of ``oracle.py`` (K and V repeated for GQA, the sink
as one more softmax column), or ``F.scaled_dot_product_attention`` with ``enable_gqa`` where its
options suffice.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numpy_attention import gradcheck, load_module, no_grad, save_module
from numpy_attention.decode.cache import KVCache, PagedKVCache
from numpy_attention.differential import LAMBDA_NAMES
from numpy_attention.grouped import GroupedQueryAttention

from ..conftest import assert_close, assert_gradcheck, to_torch
from .oracle import attention as oracle_attention
from .test_rope import torch_rope

B, N, C, H, D = 2, 5, 6, 4, 4  # head_dim set apart from C // H
KV_HEADS = [1, 2, 4]  # MQA, GQA, MHA
DROPOUT = 0.3
# float32 frequencies as a model hands them over (llama3-style: the low ones scaled down)
MODEL_INV_FREQ = np.array([1.0, 0.0125], dtype=np.float32)
LONG_INV_FREQ = np.array([0.7, 0.002], dtype=np.float32)  # LongRoPE's long set, other values
TEMPERATURE_LOG_FLOOR = {"kind": "log_floor", "beta": 0.6, "length": 2.0, "offset": 0.0}
ALIBI_SLOPES = np.array([0.5, 0.25, 0.125, 1.5])  # (H,): one per query head, unequal
TEMPERATURE_POWER = {"kind": "power", "exponent": 0.7, "length": 3.0, "offset": 1.0}
TEMPERATURE_CACHE = TEMPERATURE_LOG_FLOOR | {"offset": 1.0, "positions": "cache"}

# Each option on its own, and all of them together. Dropout runs in train mode with an explicit
# keep-mask.
OPTIONS = {
    "plain": {},
    "qk_norm": {"qk_norm": True, "norm_eps": 0.1},
    "sinks": {"sinks": True},
    "window": {"window": (2, 0)},
    "softcap": {"softcap": 1.5},
    "bias": {"bias": True},
    "out_bias": {"out_bias": True},
    "scaling": {"scaling": 0.8},
    "dropout": {"dropout": DROPOUT},
    "rope": {"rope_interleaved": True, "rope_attention_factor": 1.2, "rope_theta": 100.0},
    "inv_freq": {"inv_freq": MODEL_INV_FREQ},
    "partial_rotary": {"rotary_dim": 2, "rope_theta": 100.0},
    "nope": {"rotary_dim": 0},
    # positions reach 4 >= 3: every call here rotates with the long frequencies
    "long_rope": {"long_inv_freq": LONG_INV_FREQ, "original_max_positions": 3},
    "qk_norm_offset": {"qk_norm": True, "norm_weight_offset": 1.0},
    "qk_norm_all": {"qk_norm": True, "qk_norm_shape": "all", "norm_eps": 0.1},
    "qk_norm_layer": {
        "qk_norm": True,
        "qk_norm_type": "layer",
        "qk_norm_shape": "per_head",
        "norm_eps": 0.1,
    },
    "gate_element": {"output_gate": "element"},  # Qwen3-Next, Qwen3.5
    "gate_head_softplus": {"output_gate": "head", "gate_activation": "softplus"},  # Laguna
    "gate_element_softplus_bias": {
        "output_gate": "element",
        "gate_activation": "softplus",
        "gate_bias": True,
    },
    "gate_head_bias": {"output_gate": "head", "gate_bias": True},  # LFM3 (without the bias)
    "clip": {"clip_qkv": 0.5, "bias": True},  # OLMo, DBRX: about 40% of q, k, v clamped
    "clip_before_norm": {"clip_qkv": 0.5, "qk_norm": True, "qk_norm_type": "layer"},  # MPT
    "clip_after_norm": {  # OLMoE: q and k clamped after their whole-projection norm
        "clip_qkv": 0.8,
        "qk_norm": True,
        "qk_norm_shape": "all",
        "clip_after_norm": True,
    },
    "output_norm": {"output_norm": True, "output_norm_eps": 0.1},  # BitNet's attn_sub_norm
    "output_norm_clip_gqa": {"output_norm": True, "clip_qkv": 0.6, "sinks": True},
    "qk_norm_after_rope": {"qk_norm": True, "qk_norm_position": "after_rope"},  # Hunyuan
    "qk_norm_weightless_after_rope": {  # nanochat, Llama 4's L2Norm
        "qk_norm": True,
        "qk_norm_type": "rms_weightless",
        "qk_norm_position": "after_rope",
        "norm_eps": 0.1,
    },
    "qk_norm_layer_per_head_after_rope": {
        "qk_norm": True,
        "qk_norm_type": "layer",
        "qk_norm_shape": "per_head",
        "qk_norm_position": "after_rope",
    },
    "qk_norm_weightless_all": {
        "qk_norm": True,
        "qk_norm_type": "rms_weightless",
        "qk_norm_shape": "all",
        "qk_norm_position": "after_rope",
    },
    # positions reach 4: t(p) takes 3 values over the rows (1, 1 + beta log 2, 1 + beta log 3)
    "temperature_log_floor": {"query_temperature": TEMPERATURE_LOG_FLOOR},  # Ministral 3
    "temperature_power": {"query_temperature": TEMPERATURE_POWER, "rotary_dim": 0},  # Beam
    "qk_norm_layer_bias": {  # Persimmon: nn.LayerNorm over each head, one (D,) weight and bias
        "qk_norm": True,
        "qk_norm_type": "layer_bias",
        "norm_eps": 0.1,
    },
    "qk_norm_layer_bias_all_clip": {  # MPT's qk_ln with its clip_qkv (its ALiBi aside)
        "qk_norm": True,
        "qk_norm_type": "layer_bias",
        "qk_norm_shape": "all",
        "clip_qkv": 0.8,
    },
    # a weight and bias per head, partial rotary. (After RoPE a bias on k would be a no-op, b . q
    # the same for every key of a row: softmax drops it and its gradient is 0.)
    "qk_norm_layer_bias_per_head_partial": {
        "qk_norm": True,
        "qk_norm_type": "layer_bias",
        "qk_norm_shape": "per_head",
        "norm_weight_offset": 1.0,
        "rotary_dim": 2,
    },
    "everything": {
        "qk_norm": True,
        "norm_eps": 0.1,
        "qk_norm_type": "layer",
        "qk_norm_shape": "per_head",
        "norm_weight_offset": 1.0,
        "sinks": True,
        "window": (2, None),
        "softcap": 1.5,
        "bias": True,
        "out_bias": True,
        "scaling": 0.8,
        "dropout": DROPOUT,
        "rope_interleaved": True,
        "rope_attention_factor": 1.2,
        "rotary_dim": 2,
        "output_gate": "head",
        "gate_activation": "softplus",
        "gate_bias": True,
        "clip_qkv": 0.8,
        "clip_after_norm": True,
    },
    # MPT's ALiBi without RoPE; then with its whole-projection LayerNorm with a bias and its
    # clip, half of each head rotated here: without RoPE k_norm.bias adds q . b to a whole row
    # of scores, its gradient 0 (to rounding, which no relative error can compare)
    "alibi_nope": {"alibi_slopes": ALIBI_SLOPES, "rotary_dim": 0},
    "alibi_mpt": {
        "alibi_slopes": ALIBI_SLOPES,
        "rotary_dim": 2,
        "qk_norm": True,
        "qk_norm_type": "layer_bias",
        "qk_norm_shape": "all",
        "clip_qkv": 0.8,
    },
    "alibi_rope_window_sinks": {"alibi_slopes": ALIBI_SLOPES, "window": (2, 0), "sinks": True},
    "value_norm": {"value_norm": True, "norm_eps": 0.1},  # Gemma 3n's weightless v_norm
    "values_from_keys": {"values_from_keys": True, "bias": True},  # no v_proj: v = k_proj(x)
    "values_from_keys_gemma4_full": {  # Gemma 4's full layers: v = v_norm(k_proj(x))
        "values_from_keys": True,
        "value_norm": True,
        "qk_norm": True,
        "scaling": 1.0,
        "norm_eps": 0.1,
    },
    "value_norm_gemma3n": {  # with its QK-norm and scale 1, a window
        "value_norm": True,
        "qk_norm": True,
        "scaling": 1.0,
        "window": (2, 0),
    },
    "everything_after_rope": {  # Llama 4's RoPE layers with its NoPE layers' temperature
        "qk_norm": True,
        "qk_norm_type": "rms_weightless",
        "qk_norm_position": "after_rope",
        "query_temperature": TEMPERATURE_LOG_FLOOR | {"offset": 1.0},
        "sinks": True,
        "window": (2, None),
        "bias": True,
        "rotary_dim": 2,
        "output_gate": "element",
    },
    # MiMo-V2-Flash: values narrower (and wider) than the keys, times a constant before caching
    "value_width": {"v_head_dim": 3},
    "value_width_scale": {"v_head_dim": 6, "value_scale": 0.7, "bias": True, "sinks": True}
    | {"window": (2, 0)},
    "value_width_gate_head": {"v_head_dim": 3, "value_scale": 1.3, "output_gate": "head"}
    | {"gate_bias": True},
    "value_width_gate_element_clip": {"v_head_dim": 3, "output_gate": "element", "clip_qkv": 0.6},
    "value_width_output_norm": {"v_head_dim": 5, "value_scale": -0.4, "output_norm": True},
    "chunk_llama4_rope": {  # Llama 4's RoPE layers: chunks, interleaved RoPE, L2 norm after it
        "chunk_size": 3,
        "rope_interleaved": True,
        "qk_norm": True,
        "qk_norm_type": "rms_weightless",
        "qk_norm_position": "after_rope",
    },
    "chunk_window_sinks": {"chunk_size": 2, "window": (1, 0), "sinks": True},
    "temperature_cache_nope": {  # Llama 4's NoPE layers: t(p) of the cache's positions
        "query_temperature": TEMPERATURE_CACHE,
        "rotary_dim": 0,
    },
}


def make_layer(rng, kv_heads=2, **options):
    """A float64 layer; sinks, norm weights and norm biases random (their initial zeros and ones
    would hide a wrong gradient); train mode only with dropout (whose keep-masks the tests give)."""
    layer = GroupedQueryAttention(C, H, kv_heads, head_dim=D, rng=rng, **options)
    layer.astype(np.float64).train(options.get("dropout", 0.0) > 0)
    state = layer.state_dict()
    for name in ("sinks", "q_norm.weight", "k_norm.weight", "o_norm.weight"):
        if name in state:
            state[name] = 1.0 + 0.5 * rng.standard_normal(state[name].shape)
    for name in ("q_norm.bias", "k_norm.bias", *LAMBDA_NAMES):
        if name in state:
            state[name] = 0.5 * rng.standard_normal(state[name].shape)
    layer.load_state_dict(state)
    return layer


def left_padded(batch, n, pads):
    """Element b has ``pads[b]`` padding tokens on the left: key_padding_mask (B, N), True =
    padding, and per-batch positions counting real tokens from 0 (0 on the padding too)."""
    padding = np.arange(n)[None, :] < np.asarray(pads)[:, None]
    positions = np.maximum(np.cumsum(~padding, axis=1) - 1, 0)
    return padding, positions


def forward_inputs(rng, layer, *, padded, n=N):
    """x and the forward's keywords: left padding with per-batch positions when ``padded``, a
    keep-mask when the layer is in train mode."""
    x = rng.standard_normal((B, n, C))
    options = {}
    if padded:  # element 0: 2 padding tokens (two queries that see nothing), element 1: none
        options["key_padding_mask"], options["positions"] = left_padded(B, n, [2, 0])
    if layer.training:
        options["attn_dropout_mask"] = rng.random((B, H, n, n)) >= DROPOUT
    return x, options


def torch_layer(x, params, args, *, positions=None, key_padding_mask=None, attn_dropout_mask=None,
                attention=None, shared_kv=None, keep_kv=None):  # fmt: skip
    """The layer in torch ops, from its constructor arguments ``args`` (constructor_args()).

    x (B, N, C) and ``params`` (state-dict name -> tensor) are torch tensors; the others NumPy.
    ``attention(q, k, v, visible, scale)`` replaces the oracle's attention where given.
    ``shared_kv`` (k, v) replaces the layer's own keys and values (a KV-shared layer's);
    ``keep_kv`` (a dict), where given, receives them as attended under ``"kv"``.
    """
    b, n, _ = x.shape
    heads, kv_heads, d = args["num_heads"], args["num_kv_heads"], args["head_dim"]
    dv = d if args["v_head_dim"] is None else args["v_head_dim"]  # the values' head width

    def norm(y, norm_name):
        """QK-norm of y (B, N, count*D): over each head's D or the whole width, scale (o + w)
        (1 without a weight), plus the bias of ``"layer_bias"``."""
        weight = params.get(f"{norm_name}.weight")
        bias = params[f"{norm_name}.bias"] if args["qk_norm_type"] == "layer_bias" else None
        if args["qk_norm_shape"] != "all":
            y = y.reshape(b, n, -1, d)  # (B, N, count, D): per head
        if args["qk_norm_type"] in ("layer", "layer_bias"):
            y_hat = F.layer_norm(y, y.shape[-1:], None, None, args["norm_eps"])
        else:
            y_hat = F.rms_norm(y, y.shape[-1:], None, args["norm_eps"])
        scale = 1.0 if weight is None else args["norm_weight_offset"] + weight
        shift = 0.0 if bias is None else bias
        return (y_hat * scale + shift).reshape(b, n, -1)

    before_rope = args["qk_norm"] and args["qk_norm_position"] == "before_rope"
    after_rope = args["qk_norm"] and args["qk_norm_position"] == "after_rope"

    def project(name, count, norm_name=None, width=d):
        y = F.linear(x, params[f"{name}.weight"], params.get(f"{name}.bias"))
        clip = args["clip_qkv"]
        if clip is not None and not args["clip_after_norm"]:
            y = y.clamp(-clip, clip)
        if norm_name is not None and before_rope:
            y = norm(y, norm_name)
        if clip is not None and args["clip_after_norm"]:  # v too: it has no norm
            y = y.clamp(-clip, clip)
        return y.reshape(b, n, count, width).transpose(1, 2)  # -> (B, count, N, width)

    def norm_heads(y, norm_name):  # after RoPE: (B, count, N, D) normed as the projection
        flat = norm(y.transpose(1, 2).reshape(b, n, -1), norm_name)
        return flat.reshape(b, n, -1, d).transpose(1, 2)

    own = shared_kv is None
    q = project("q_proj", heads, "q_norm")
    if own:
        values = "k_proj" if args["values_from_keys"] else "v_proj"  # the raw projection
        k, v = project("k_proj", kv_heads, "k_norm"), project(values, kv_heads, width=dv)
        if args["value_norm"]:  # each head of v over its Dv, no weight
            v = F.rms_norm(v, (dv,), None, args["norm_eps"])
        v = v * args["value_scale"]  # (B, H_kv, N, Dv)
    else:
        k, v = shared_kv
    theta, r = args["rope_theta"], d if args["rotary_dim"] is None else args["rotary_dim"]
    positions = torch.arange(n) if positions is None else to_torch(positions)
    inv_freq = (
        1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
        if args["inv_freq"] is None
        else torch.tensor(args["inv_freq"], dtype=torch.float64)
    )
    if args["long_inv_freq"] is not None and positions.max() + 1 > args["original_max_positions"]:
        inv_freq = torch.tensor(args["long_inv_freq"], dtype=torch.float64)
    rope = {"interleaved": args["rope_interleaved"], "factor": args["rope_attention_factor"]}

    def turn(y):  # the first r coordinates of each head rotate, the rest pass through
        return torch.cat([torch_rope(y[..., :r], positions, inv_freq, **rope), y[..., r:]], -1)

    q = turn(q)
    k = turn(k) if own else k
    if after_rope:
        q = norm_heads(q, "q_norm")
        k = norm_heads(k, "k_norm") if own else k
    if keep_kv is not None:
        keep_kv["kv"] = (k, v)
    if args["query_temperature"] is not None:  # t(p), straight from its formula
        spec = args["query_temperature"]
        counted = torch.arange(n) if spec.get("positions") == "cache" else positions
        p = counted.to(torch.float64) + spec["offset"]
        if spec["kind"] == "log_floor":
            t = 1 + spec["beta"] * torch.log(1 + torch.floor(p / spec["length"]))
        else:
            t = (1 + p / spec["length"]) ** spec["exponent"]
        q = q * (t[:, None, :, None] if t.ndim == 2 else t[:, None])  # per row of q
    padding = None if key_padding_mask is None else to_torch(key_padding_mask)
    chunk_start = None  # chunks start at each sequence's first real token
    if args["chunk_size"] is not None and padding is not None:
        chunk_start = torch.tensor([int(np.argmax(~row)) for row in key_padding_mask])

    def attend(v):
        if attention is None:
            out, _ = oracle_attention(
                q, k, v, causal=True, window=args["window"], key_padding_mask=padding,
                scale=args["scaling"], softcap=args["softcap"], sinks=params.get("sinks"),
                alibi_slopes=None if args["alibi_slopes"] is None else torch.tensor(
                    args["alibi_slopes"], dtype=torch.float64
                ), enable_gqa=True, dropout_p=args["dropout"],
                dropout_mask=None if attn_dropout_mask is None else to_torch(attn_dropout_mask),
                chunk_size=args["chunk_size"], chunk_start=chunk_start,
            )  # fmt: skip
            return out
        visible = torch.ones(n, n, dtype=torch.bool).tril()
        if args["window"] is not None:
            visible &= torch.ones(n, n, dtype=torch.bool).triu(-args["window"][0])
        if padding is not None:
            visible = visible & ~padding[:, None, None, :]  # (B, 1, N, N)
        return attention(q, k, v, visible, args["scaling"])

    if args["differential"]:  # two calls, as DiffLlama: each value half repeated to H_kv heads
        v1, v2 = (half.repeat(1, 2, 1, 1) for half in v.chunk(2, dim=1))
        out = torch.cat([attend(v1), attend(v2)], dim=-1)  # (B, H, N, 2D)
    else:
        out = attend(v)
    out = out.transpose(1, 2)  # (B, H, N, D or 2D) -> (B, N, H, D or 2D)
    if args["differential"]:  # head h minus lambda times head h + H/2, normed over 2D
        first, second, init = *out.chunk(2, dim=2), args["lambda_init"]
        lambda_1 = torch.exp((params["lambda_q1"] * params["lambda_k1"]).sum())
        lambda_2 = torch.exp((params["lambda_q2"] * params["lambda_k2"]).sum())
        diff = first - (lambda_1 - lambda_2 + init) * second  # (B, N, H/2, 2D)
        out = (1 - init) * F.rms_norm(diff, (2 * d,), None, args["differential_eps"])
    out = out.reshape(b, n, heads * dv)  # -> (B, N, H*Dv)
    if args["output_gate"] is not None:  # act(x W_g + b_g): (B, N, H*Dv) or (B, N, H)
        pre = F.linear(x, params["g_proj.weight"], params.get("g_proj.bias"))
        gate = torch.sigmoid(pre) if args["gate_activation"] == "sigmoid" else F.softplus(pre)
        if args["output_gate"] == "head":
            gate = gate.repeat_interleave(dv, dim=-1)  # one gate for each head's Dv coordinates
        out = out * gate
    if args["output_norm"]:  # an RMSNorm over the H*Dv merged coordinates
        out = F.rms_norm(out, out.shape[-1:], params["o_norm.weight"], args["output_norm_eps"])
    return F.linear(out, params["o_proj.weight"], params.get("o_proj.bias"))


def torch_grads(layer, x, dout, attention=None, **forward):
    """Output and gradients (dx and every parameter's, by name) of ``torch_layer``, as NumPy."""
    tx = to_torch(x, requires_grad=True)
    params = {
        name: to_torch(value, requires_grad=True) for name, value in layer.state_dict().items()
    }
    out = torch_layer(tx, params, layer.constructor_args(), attention=attention, **forward)
    out.backward(to_torch(dout))
    grads = {name: tensor.grad.numpy() for name, tensor in params.items()}
    return out.detach().numpy(), tx.grad.numpy(), grads


def assert_matches(layer, x, dout, expected, **forward):
    """The layer's forward and backward against (out, dx, grads by name)."""
    out_expected, dx_expected, grads_expected = expected

    out = layer(x, **forward)
    dx = layer.backward(dout)

    assert_close(out, out_expected, name="out")
    assert_close(dx, dx_expected, name="dx")
    grads = layer.named_grads()
    assert sorted(grads) == sorted(grads_expected)
    for name, grad in grads_expected.items():
        assert_close(grads[name], grad, name=name)


# -- dropout: the layer's own generator -------------------------------------------------------


def test_dropout_draws_from_the_layers_generator_and_is_off_in_eval(rng):
    layer = make_layer(rng, 2, dropout=DROPOUT)
    x = rng.standard_normal((B, N, C))
    twin = copy.deepcopy(layer)  # the same generator state

    drawn = layer(x)
    keep = twin.rng.random((B, H, N, N)) >= DROPOUT  # what the layer's generator gave
    explicit = twin(x, attn_dropout_mask=keep)
    evaluated = layer.eval()(x)
    without = copy.deepcopy(layer)
    without.dropout = 0.0

    np.testing.assert_array_equal(drawn, explicit)
    np.testing.assert_array_equal(evaluated, without(x))
    assert np.abs(drawn - evaluated).max() > 1e-3
    with pytest.raises(ValueError, match="attn_dropout_mask was given in eval mode"):
        layer(x, attn_dropout_mask=keep)


# -- decoding with the cache ------------------------------------------------------------------

DECODE = {
    "plain": ({}, 2),
    "value_norm": (OPTIONS["value_norm_gemma3n"], 1),  # v normed before it is cached
    "values_from_keys": (OPTIONS["values_from_keys_gemma4_full"], 2),
    "alibi_mpt": (OPTIONS["alibi_mpt"], 2),  # each cached key's distance to the new rows
    "alibi_rope_gqa": ({"alibi_slopes": ALIBI_SLOPES, "qk_norm": True}, 1),
    "left_padding": ({}, 2),
    "window": ({"window": (2, 0)}, 2),  # a window shorter than the sequence
    "sinks_softcap_qk_norm": (
        {"sinks": True, "softcap": 1.5, "qk_norm": True, "bias": True, "scaling": 0.8},
        2,
    ),
    "mqa_interleaved": ({"rope_interleaved": True, "rope_attention_factor": 1.2}, 1),
    "partial_rotary_layer_norm": (
        {"rotary_dim": 2, "qk_norm": True, "qk_norm_type": "layer", "qk_norm_shape": "per_head"},
        2,
    ),
    "nope_full_width_norm": ({"rotary_dim": 0, "qk_norm": True, "qk_norm_shape": "all"}, 2),
    "gate_element": ({"output_gate": "element", "qk_norm": True, "rotary_dim": 2}, 2),
    "gate_head_softplus_bias": (
        {"output_gate": "head", "gate_activation": "softplus", "gate_bias": True},
        1,
    ),
    "clip_output_norm": ({"clip_qkv": 0.5, "bias": True, "output_norm": True}, 2),
    "clip_after_norm": (
        {"clip_qkv": 0.8, "qk_norm": True, "qk_norm_shape": "all", "clip_after_norm": True},
        1,
    ),
    "qk_norm_after_rope_temperature": (  # t(p) of each decoded token's own position
        {"qk_norm": True, "qk_norm_position": "after_rope"}
        | {"query_temperature": TEMPERATURE_LOG_FLOOR},
        2,
    ),
    "persimmon_layer_bias_partial_rotary": (  # MHA, half the head rotated, biases everywhere
        {"qk_norm": True, "qk_norm_type": "layer_bias", "rotary_dim": 2, "bias": True}
        | {"out_bias": True},
        4,
    ),
    "weightless_after_rope_power": (
        {"qk_norm": True, "qk_norm_type": "rms_weightless", "qk_norm_position": "after_rope"}
        | {"query_temperature": TEMPERATURE_POWER},
        1,
    ),
    "value_width_scale_sinks": (  # MiMo-V2-Flash's sliding layers: the cache holds s_v * v
        {"v_head_dim": 3, "value_scale": 0.7, "sinks": True, "window": (2, 0), "rotary_dim": 2},
        2,
    ),
    "value_width_gate": ({"v_head_dim": 6, "output_gate": "head"}, 1),
    # differential attention: the cache holds v; the value halves are laid side by side on read
    "differential_gqa": ({"differential": True, "lambda_init": 0.3, "bias": True}, 2),
    "differential_mha_window": (
        {"differential": True, "lambda_init": 0.6, "window": (2, 0), "qk_norm": True},
        4,
    ),
    "chunk_left_padding": (OPTIONS["chunk_llama4_rope"], 2),  # chunk edges inside each step
    "temperature_cache_left_padding": (OPTIONS["temperature_cache_nope"], 1),
}
LEFT_PADDED = (
    "left_padding",
    "qk_norm_after_rope_temperature",
    "chunk_left_padding",
    "temperature_cache_left_padding",
)


@pytest.mark.parametrize("case", list(DECODE))
@pytest.mark.parametrize("step", [1, 2])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decoding_with_the_cache_gives_the_full_sequence(rng, case, step, paged):
    """Prefill 3 tokens, then ``step`` tokens at a time: every row as the full forward's, with a
    contiguous cache or pages of 2 (each sequence's pages one run in its region of the pool)."""
    options, kv_heads = DECODE[case]
    n, prefill = 9, 3
    layer = make_layer(rng, kv_heads, **options)
    x = rng.standard_normal((B, n, C))
    forward = {}
    if case in LEFT_PADDED:  # element 0: 2 pads, 1: 4
        forward["key_padding_mask"], forward["positions"] = left_padded(B, n, [2, 4])
    dv = layer.v_head_dim
    cache: KVCache | PagedKVCache = KVCache(B, kv_heads, n + 1, D, np.float64, v_head_dim=dv)
    if paged:
        cache = PagedKVCache(B * 5, 2, kv_heads, D, v_head_dim=dv, dtype=np.float64)

    full = layer(x, **forward)
    outs = []
    for start, stop in [(0, prefill), *((t, t + step) for t in range(prefill, n, step))]:
        stop = min(stop, n)
        part = {}
        if forward:  # positions of these tokens; padding over everything cached
            part = {
                "positions": forward["positions"][:, start:stop],
                "key_padding_mask": forward["key_padding_mask"][:, :stop],
            }
        outs.append(layer(x[:, start:stop], cache=cache, **part))

    assert cache.length == n
    assert_close(np.concatenate(outs, axis=1), full, name="decoded rows")


def test_long_rope_switches_frequencies_per_call_as_hugging_face_does(rng):
    """A call whose largest position + 1 exceeds original_max_positions rotates with the long
    frequencies, every other call with inv_freq (also while decoding: keys cached earlier keep
    the rotation of their own call)."""
    short = make_layer(rng, 2, inv_freq=MODEL_INV_FREQ)
    long = make_layer(rng, 2, inv_freq=LONG_INV_FREQ)
    long.load_state_dict(short.state_dict())
    both = make_layer(rng, 2, **{**OPTIONS["long_rope"], "inv_freq": MODEL_INV_FREQ})
    both.load_state_dict(short.state_dict())
    x = rng.standard_normal((B, 4, C))

    within = both(x[:, :3])  # positions 0..2: 3 > 3 is false
    past = both(x)  # positions 0..3: 4 > 3

    assert_close(within, short(x[:, :3]), name="within the original length")
    assert_close(past, long(x), name="past it")
    assert np.abs(past - short(x)).max() > 1e-3


def test_default_positions_continue_from_the_cache(rng):
    """Without positions, a call with a cache puts its tokens at cache.length + arange(N)."""
    layer = make_layer(rng, 2)
    x = rng.standard_normal((B, 4, C))
    cache = KVCache(B, 2, 4, D, np.float64)
    layer(x[:, :3], cache=cache)
    reference = KVCache(B, 2, 4, D, np.float64)
    layer(x[:, :3], cache=reference)

    implicit = layer(x[:, 3:], cache=cache)
    explicit = layer(x[:, 3:], cache=reference, positions=np.array([3]))
    shifted = layer(x[:, 3:], cache=KVCache(B, 2, 4, D, np.float64), positions=np.array([3]))

    np.testing.assert_array_equal(implicit, explicit)
    np.testing.assert_array_equal(cache.k, reference.k)
    assert np.abs(implicit - shifted).max() > 1e-3  # the cache is attended, not only positions


def test_backward_after_a_cached_forward_is_refused(rng):
    layer = make_layer(rng, 2)
    x = rng.standard_normal((B, 3, C))
    layer(x, cache=KVCache(B, 2, 3, D, np.float64))

    with pytest.raises(RuntimeError, match="last forward appended to a KVCache"):
        layer.backward(np.ones((B, 3, C)))


# -- the cache itself -------------------------------------------------------------------------


def test_cache_appends_and_returns_views_of_everything_so_far(rng):
    cache = KVCache(B, 2, 6, D, np.float32)
    k1, v1 = rng.standard_normal((2, B, 2, 4, D)).astype(np.float32)
    k2, v2 = rng.standard_normal((2, B, 2, 1, D)).astype(np.float32)

    cache.append(k1, v1)
    keys, values = cache.append(k2, v2)

    assert cache.length == 5 and keys.shape == values.shape == (B, 2, 5, D)
    np.testing.assert_array_equal(keys, np.concatenate([k1, k2], axis=2))
    np.testing.assert_array_equal(values, np.concatenate([v1, v2], axis=2))
    assert np.shares_memory(keys, cache.k) and np.shares_memory(values, cache.v)
    cache.reset()
    assert cache.length == 0
    keys, _ = cache.append(k2, v2)
    np.testing.assert_array_equal(keys, k2)


@pytest.mark.parametrize(
    ("shape", "dtype", "error", "match"),
    [
        ((B, 2, 3, D), np.float64, ValueError, "too short: max_len = 4.*2 cached.*3 new.*5"),
        ((B + 1, 2, 1, D), np.float64, ValueError, r"\(2, 2, N, 4\), got \(3, 2, 1, 4\)"),
        ((B, 1, 1, D), np.float64, ValueError, r"\(2, 2, N, 4\), got \(2, 1, 1, 4\)"),
        ((B, 2, 1, D + 2), np.float64, ValueError, r"\(2, 2, N, 4\), got \(2, 2, 1, 6\)"),
        ((B, 2, 1, D), np.float32, TypeError, "cache holds float64, got .* float32"),
    ],
)
def test_cache_refuses_what_does_not_fit_and_writes_nothing(rng, shape, dtype, error, match):
    cache = KVCache(B, 2, 4, D, np.float64)
    cache.append(*rng.standard_normal((2, B, 2, 2, D)))
    before = cache.k.copy(), cache.v.copy()
    k, v = rng.standard_normal((2, *shape)).astype(dtype)

    with pytest.raises(error, match=match):
        cache.append(k, v)

    assert cache.length == 2
    np.testing.assert_array_equal(cache.k, before[0])
    np.testing.assert_array_equal(cache.v, before[1])


def test_cache_refuses_bad_construction_and_mismatched_k_v():
    with pytest.raises(TypeError, match="KVCache needs a floating dtype, got int64"):
        KVCache(B, 2, 4, D, np.int64)
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        KVCache(B, 2, 0, D, np.float64)
    with pytest.raises(ValueError, match=r"k and v must be \(B, H_kv, N, D\) and \(B, H_kv, N, Dv"):
        KVCache(B, 2, 4, D, np.float64).append(np.zeros((B, 2, 1, D)), np.zeros((B, 2, 2, D)))


# -- the layer's contract: parameters, module files, bad input --------------------------------


@pytest.mark.parametrize(
    ("options", "q_shape", "k_shape"),
    [
        ({"qk_norm_shape": "per_head", "qk_norm_type": "layer"}, (4, 2), (2, 2)),  # Cohere
        ({"qk_norm_shape": "all"}, (8,), (4,)),  # OLMo 2
        ({"norm_weight_offset": 1.0}, (2,), (2,)),  # Gemma 3: (1 + w), w at zeros
    ],
    ids=["per_head", "all", "offset"],
)
def test_qk_norm_weights_take_hugging_faces_shapes(rng, options, q_shape, k_shape):
    layer = GroupedQueryAttention(8, 4, 2, qk_norm=True, rng=rng, **options)

    state = layer.state_dict()

    assert state["q_norm.weight"].shape == q_shape and state["k_norm.weight"].shape == k_shape
    assert np.all(state["q_norm.weight"] == 1.0 - options.get("norm_weight_offset", 0.0))


def test_parameters_are_named_like_hugging_face(rng):
    layer = GroupedQueryAttention(8, 4, 2, bias=True, qk_norm=True, sinks=True, rng=rng)
    plain = GroupedQueryAttention(8, 4, 2, rng=rng)

    shapes = {name: value.shape for name, value in layer.state_dict().items()}
    assert shapes == {
        "sinks": (4,),
        "q_proj.weight": (8, 8),
        "q_proj.bias": (8,),
        "k_proj.weight": (4, 8),
        "k_proj.bias": (4,),
        "v_proj.weight": (4, 8),
        "v_proj.bias": (4,),
        "o_proj.weight": (8, 8),
        "q_norm.weight": (2,),
        "k_norm.weight": (2,),
    }
    assert list(plain.state_dict()) == [
        f"{proj}.weight" for proj in ("q_proj", "k_proj", "v_proj", "o_proj")
    ]
    for kind, rows in [("element", 8), ("head", 4)]:  # Qwen3-Next split / Laguna, LFM3
        gated = GroupedQueryAttention(8, 4, 2, output_gate=kind, gate_bias=True, rng=rng)
        shapes = {name: value.shape for name, value in gated.state_dict().items()}
        assert list(shapes)[-2:] == ["g_proj.weight", "g_proj.bias"]
        assert shapes["g_proj.weight"] == (rows, 8) and shapes["g_proj.bias"] == (rows,)
    normed = GroupedQueryAttention(8, 4, 2, head_dim=6, output_norm=True, rng=rng)
    shapes = {name: value.shape for name, value in normed.state_dict().items()}
    assert list(shapes)[-1] == "o_norm.weight" and shapes["o_norm.weight"] == (24,)  # H*D, not C
    assert np.all(normed.o_norm.weight == 1)
    weightless = GroupedQueryAttention(8, 4, 2, qk_norm=True, qk_norm_type="rms_weightless")
    assert list(weightless.state_dict()) == list(plain.state_dict())  # no norm parameter at all
    assert layer.dtype == np.float32 and np.all(layer.sinks == 0)


def test_a_module_file_keeps_model_frequencies_and_the_window(tmp_path, rng):
    options = {"inv_freq": MODEL_INV_FREQ, "window": (3, 0), "qk_norm": True, "sinks": True}
    options |= {**OPTIONS["long_rope"], "qk_norm_shape": "all", "norm_weight_offset": 1.0}
    options |= {"qk_norm_position": "after_rope", "query_temperature": TEMPERATURE_POWER}
    layer = make_layer(rng, 2, **options)
    path = tmp_path / "gqa.npz"
    x = rng.standard_normal((B, N, C))

    save_module(path, layer)
    loaded = load_module(path, make_layer(np.random.default_rng(0), 2, **options))
    # what load_module does to rebuild a layer: its arguments, through JSON
    rebuilt = GroupedQueryAttention(**json.loads(json.dumps(layer.constructor_args())))

    assert loaded.constructor_args()["inv_freq"] == MODEL_INV_FREQ.astype(float).tolist()
    assert rebuilt.constructor_args() == layer.constructor_args()
    np.testing.assert_array_equal(rebuilt.inv_freq, MODEL_INV_FREQ)
    np.testing.assert_array_equal(loaded(x), layer(x))
    with pytest.raises(ValueError, match=r"gqa\.npz.*window"):
        load_module(path, make_layer(rng, 2, **{**options, "window": (2, 0)}))


def test_a_module_file_keeps_the_clip_the_output_norm_and_alibi(tmp_path, rng):
    options = {"clip_qkv": 0.5, "qk_norm": True, "clip_after_norm": True, "output_norm": True}
    options |= {"output_norm_eps": 0.01, "alibi_slopes": ALIBI_SLOPES}
    layer = make_layer(rng, 2, **options)
    path = tmp_path / "gqa.npz"
    x = rng.standard_normal((B, N, C))

    save_module(path, layer)
    loaded = load_module(path, make_layer(np.random.default_rng(0), 2, **options))

    assert loaded.constructor_args() == layer.constructor_args()
    np.testing.assert_array_equal(loaded(x), layer(x))
    with pytest.raises(ValueError, match=r"gqa\.npz.*clip_qkv"):
        load_module(path, make_layer(rng, 2, **{**options, "clip_qkv": 0.6}))
    with pytest.raises(ValueError, match=r"gqa\.npz.*alibi_slopes"):
        load_module(path, make_layer(rng, 2, **{**options, "alibi_slopes": ALIBI_SLOPES / 2}))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((8, 6, 4), {}, ValueError, r"num_heads \(6\) must be a multiple of num_kv_heads \(4\)"),
        ((10, 4, 2), {}, ValueError, r"hidden_size \(10\) must be divisible by num_heads \(4\)"),
        ((8, 4, 2), {"head_dim": 3}, ValueError, "head_dim must be even, got 3"),
        ((6, 2, 2), {}, ValueError, "head_dim must be even, got 3"),
        ((8, 4, 2), {"inv_freq": np.ones(2)}, ValueError, r"inv_freq must be .* \(1,\), got .*2"),
        ((8, 4, 2), {"window": (-1, 0)}, ValueError, r"window\[0\] must be a non-negative int"),
        ((8, 4, 2), {"window": 4}, TypeError, r"window must be \(left, right\) or None"),
        ((8, 4, 2), {"softcap": -1.0}, ValueError, "softcap must be >= 0"),
        ((8, 4, 2), {"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
        ((8, 4, 2), {"norm_eps": 0.0}, ValueError, "norm_eps must be > 0"),
        ((8, 4, 2), {"scaling": np.nan}, ValueError, "scaling must be finite"),
        ((8, 4, 2), {"sinks": 1}, TypeError, "sinks must be a bool"),
        ((8, 4, 2), {"rotary_dim": 1}, ValueError, "rotary_dim must be even .* got 1"),
        ((8, 4, 2), {"rotary_dim": 4}, ValueError, "at most head_dim = 2, got 4"),
        ((8, 4, 2), {"rotary_dim": 0, "inv_freq": np.ones(1)}, ValueError, r"\(0,\), got"),
        ((8, 4, 2), {"long_inv_freq": np.ones(1)}, ValueError, "go together .* None"),
        ((8, 4, 2), {"original_max_positions": 4}, ValueError, "go together .* 4"),
        (
            (8, 4, 2),
            {"long_inv_freq": np.ones(2), "original_max_positions": 4},
            ValueError,
            r"long_inv_freq must be \(rotary_dim / 2,\) = \(1,\)",
        ),
        (
            (8, 4, 2),
            {"long_inv_freq": np.ones(0), "original_max_positions": 4, "rotary_dim": 0},
            ValueError,
            "long_inv_freq needs RoPE",
        ),
        ((8, 4, 2), {"qk_norm": True, "qk_norm_type": "l2"}, ValueError, "qk_norm_type must be"),
        ((8, 4, 2), {"qk_norm": True, "qk_norm_shape": "x"}, ValueError, "qk_norm_shape must be"),
        ((8, 4, 2), {"qk_norm_shape": "all"}, ValueError, "but qk_norm is False"),
        ((8, 4, 2), {"norm_weight_offset": 1.0}, ValueError, "but qk_norm is False"),
        ((8, 4, 2), {"qk_norm_position": "after_rope"}, ValueError, "but qk_norm is False"),
        (
            (8, 4, 2),
            {"qk_norm": True, "qk_norm_position": "after"},
            ValueError,
            "qk_norm_position must be one of",
        ),
        (
            (8, 4, 2),
            {"qk_norm": True, "qk_norm_type": "rms_weightless", "qk_norm_shape": "per_head"},
            ValueError,
            "has no weight: qk_norm_shape",
        ),
        (
            (8, 4, 2),
            {"qk_norm": True, "qk_norm_type": "rms_weightless", "norm_weight_offset": 1.0},
            ValueError,
            "has no weight.*norm_weight_offset 0",
        ),
        ((8, 4, 2), {"query_temperature": "log_floor"}, TypeError, "query_temperature must be"),
        (
            (8, 4, 2),
            {"query_temperature": {"kind": "log", "beta": 0.1, "length": 4, "offset": 0}},
            ValueError,
            r"query_temperature\['kind'\] must be one of",
        ),
        (
            (8, 4, 2),
            {"query_temperature": {"kind": "power", "beta": 0.1, "length": 4, "offset": 0}},
            ValueError,
            r"kind 'power' takes \['exponent', 'length', 'offset'\], got \['beta'",
        ),
        (
            (8, 4, 2),
            {"query_temperature": {"kind": "log_floor", "beta": 0.1, "length": 0, "offset": 0}},
            ValueError,
            r"query_temperature\['length'\] must be > 0",
        ),
        (
            (8, 4, 2),
            {"query_temperature": {"kind": "power", "exponent": np.nan, "length": 2, "offset": 0}},
            ValueError,
            "exponent",
        ),
        ((8, 4, 2), {"output_gate": "channel"}, ValueError, "output_gate must be None or one of"),
        ((8, 4, 2), {"output_gate": True}, ValueError, "output_gate must be None or one of"),
        (
            (8, 4, 2),
            {"output_gate": "head", "gate_activation": "silu"},
            ValueError,
            "gate_activation must be one of .*'silu'",
        ),
        ((8, 4, 2), {"gate_activation": "softplus"}, ValueError, "but output_gate is None"),
        ((8, 4, 2), {"gate_bias": True}, ValueError, "but output_gate is None"),
        ((8, 4, 2), {"output_gate": "head", "gate_bias": 1}, TypeError, "gate_bias must be a bool"),
        ((8, 4, 2), {"alibi_slopes": [0.5, 0.25]}, ValueError, r"alibi_slopes must be \(H,\)"),
        ((8, 4, 2), {"alibi_slopes": [[0.5] * 4]}, ValueError, r"alibi_slopes must be \(H,\)"),
        (
            (8, 4, 2),
            {"alibi_slopes": [0.5, np.inf, 0.1, 0.2]},
            ValueError,
            "alibi_slopes must be finite",
        ),
        ((8, 4, 2), {"v_head_dim": 0}, ValueError, "v_head_dim must be a positive int"),
        ((8, 4, 2), {"value_scale": np.inf}, ValueError, "value_scale must be finite"),
        ((8, 4, 2), {"chunk_size": 0}, ValueError, "chunk_size must be a positive int"),
        ((8, 4, 2), {"chunk_size": 2.5}, TypeError, "chunk_size must be an int"),
        (
            (8, 4, 2),
            {"query_temperature": TEMPERATURE_LOG_FLOOR | {"positions": "rows"}},
            ValueError,
            r"query_temperature\['positions'\] must be one of \['rope', 'cache'\]",
        ),
        ((8, 4, 2), {"clip_qkv": 0}, ValueError, "clip_qkv must be > 0"),
        ((8, 4, 2), {"clip_qkv": -8.0}, ValueError, "clip_qkv must be > 0"),
        ((8, 4, 2), {"clip_qkv": 8.0, "clip_after_norm": True}, ValueError, "qk_norm is False"),
        ((8, 4, 2), {"qk_norm": True, "clip_after_norm": True}, ValueError, "clip_qkv is None"),
        ((8, 4, 2), {"output_norm": 1}, TypeError, "output_norm must be a bool"),
        ((8, 4, 2), {"output_norm_eps": 1e-5}, ValueError, "but output_norm is False"),
        ((8, 4, 2), {"output_norm": True, "output_norm_eps": 0.0}, ValueError, "must be > 0"),
        (
            (8, 4, 2),
            {"output_norm": True, "output_gate": "head"},
            ValueError,
            "output_norm and output_gate='head' together",
        ),
        ((8, 4, 1), {"differential": True, "lambda_init": 0.2}, ValueError, "num_kv_heads must"),
        ((8, 4, 2), {"differential": True}, ValueError, "needs lambda_init"),
        ((8, 4, 2), {"lambda_init": 0.2}, ValueError, "but differential is False"),
        ((8, 4, 2), {"differential_eps": 1e-5}, ValueError, "but differential is False"),
        ((8, 4, 2), {"differential": 1, "lambda_init": 0.2}, TypeError, "differential must be"),
        ((8, 4, 2), {"differential": True, "lambda_init": "0.2"}, TypeError, "lambda_init"),
        (
            (8, 4, 2),
            {"differential": True, "lambda_init": 0.2, "differential_eps": 0.0},
            ValueError,
            "differential_eps must be > 0",
        ),
        (
            (8, 4, 2),
            {"differential": True, "lambda_init": 0.2, "output_gate": "head"},
            ValueError,
            "differential attention with output_gate='head'",
        ),
        (
            (8, 4, 2),
            {"differential": True, "lambda_init": 0.2, "output_norm": True},
            ValueError,
            "differential attention with output_norm=True",
        ),
        (
            (8, 4, 2),
            {"differential": True, "lambda_init": 0.2, "dropout": 0.1},
            ValueError,
            "differential attention with dropout=0.1",
        ),
    ],
)
def test_bad_construction_is_refused(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        GroupedQueryAttention(*args, **kwargs)


@pytest.mark.parametrize(("saved", "expected"), [("head", "element"), ("element", "head")])
def test_a_gate_of_the_other_kind_is_refused_on_load(rng, saved, expected):
    """A per-head g_proj (H, C) loaded into a per-element layer (H*D, C), and back: the error
    names the key and both shapes."""
    state = GroupedQueryAttention(8, 4, 2, output_gate=saved, rng=rng).state_dict()
    rows = {"head": 4, "element": 8}

    with pytest.raises(
        ValueError, match=rf"g_proj\.weight.*\({rows[saved]}, 8\).*\({rows[expected]}, 8\)"
    ):
        GroupedQueryAttention(8, 4, 2, output_gate=expected, rng=rng).load_state_dict(state)


def test_a_gate_missing_from_the_state_dict_is_named(rng):
    state = GroupedQueryAttention(8, 4, 2, rng=rng).state_dict()

    with pytest.raises(KeyError, match=r"g_proj\.weight"):
        GroupedQueryAttention(8, 4, 2, output_gate="head", rng=rng).load_state_dict(state)


# -- an input wider than the output (Zamba's shared attention: 2 * hidden_size in, C out) -------

WIDE = 2 * C  # input_size


@pytest.mark.parametrize("option", ["plain", "gate_head_bias", "everything"])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_a_wider_input_matches_torch_autograd_and_gradcheck(rng, option, kv_heads):
    """q, k, v (and g) read input_size features, o_proj writes C: out (B, N, C), dx (B, N, 2C)."""
    layer = make_layer(rng, kv_heads, input_size=WIDE, **OPTIONS[option])
    _, forward = forward_inputs(rng, layer, padded=option == "everything")
    x = rng.standard_normal((B, N, WIDE))
    dout = rng.standard_normal((B, N, C))

    assert_matches(layer, x, dout, torch_grads(layer, x, dout, **forward), **forward)
    assert_gradcheck(gradcheck(layer, x[:, :4], **_first(forward, 4)))


def _first(forward, n):
    """The forward keywords cut to the first n tokens (positions, padding, keep-masks)."""
    cut = {"positions": lambda a: a[..., :n], "key_padding_mask": lambda a: a[:, :n],
           "attn_dropout_mask": lambda a: a[..., :n, :n]}  # fmt: skip
    return {key: cut[key](value) for key, value in forward.items()}


def test_a_wider_input_decodes_like_the_full_sequence(rng):
    layer = make_layer(rng, 2, input_size=WIDE, output_gate="element").eval()
    x = rng.standard_normal((B, 6, WIDE))
    cache = KVCache(B, 2, 6, D, np.float64)

    full = layer(x)
    steps = [layer(x[:, start:stop], cache=cache) for start, stop in [(0, 3), (3, 4), (4, 6)]]

    assert_close(np.concatenate(steps, axis=1), full, name="decoded rows")


def test_a_wider_input_sizes_the_projections_and_refuses_an_x_of_width_c(rng):
    layer = GroupedQueryAttention(8, 4, 2, input_size=16, output_gate="head", rng=rng)

    shapes = {name: value.shape for name, value in layer.state_dict().items()}

    assert shapes["q_proj.weight"] == (8, 16) and shapes["k_proj.weight"] == (4, 16)
    assert shapes["v_proj.weight"] == (4, 16) and shapes["g_proj.weight"] == (4, 16)
    assert shapes["o_proj.weight"] == (8, 8)
    assert layer(np.zeros((1, 3, 16), np.float32)).shape == (1, 3, 8)
    with pytest.raises(ValueError, match="x.*16"):
        layer(np.zeros((1, 3, 8), np.float32))
    with pytest.raises(ValueError, match="input_size must be a positive int"):
        GroupedQueryAttention(8, 4, 2, input_size=0)


def test_weights_of_another_head_dim_are_refused(rng):
    state = GroupedQueryAttention(8, 4, 2, head_dim=4, rng=rng).state_dict()

    with pytest.raises(ValueError, match=r"q_proj\.weight.*\(16, 8\).*\(8, 8\)"):
        GroupedQueryAttention(8, 4, 2, rng=rng).load_state_dict(state)


@pytest.mark.parametrize(
    ("forward", "error", "match"),
    [
        ({"positions": np.arange(4)}, ValueError, r"positions must be \(N,\) = \(3,\)"),
        ({"positions": np.zeros((B + 1, 3), int)}, ValueError, r"\(B, N\) = \(2, 3\).*\(3, 3\)"),
        ({"positions": np.zeros(3, bool)}, TypeError, "positions must be integers"),
        ({"key_padding_mask": np.zeros((B, 3), bool)}, ValueError, r"cache's length.*\(2, 5\)"),
        ({"cache": KVCache(B, 2, 2, D, np.float64)}, ValueError, "max_len = 2.*length of 3"),
        ({"cache": KVCache(B + 1, 2, 8, D, np.float64)}, ValueError, r"\(3, 2, 8, 4\)"),
        ({"cache": KVCache(B, 1, 8, D, np.float64)}, ValueError, r"\(2, 1, 8, 4\)"),
        ({"cache": KVCache(B, 2, 8, D + 2, np.float64)}, ValueError, r"\(2, 2, 8, 6\)"),
        (
            {"cache": KVCache(B, 2, 8, D, np.float64, v_head_dim=D + 1)},
            ValueError,
            "the cache holds values of width 5, but this layer's v_head_dim is 4",
        ),
        ({"cache": KVCache(B, 2, 8, D, np.float32)}, TypeError, "holds float32.*float64"),
        ({"cache": "cache"}, TypeError, "cache must be a KVCache or a PagedKVCache, got str"),
    ],
)
def test_bad_forward_input_is_refused_before_any_work(rng, monkeypatch, forward, error, match):
    """Nothing is projected and nothing is written to any cache."""
    layer = make_layer(rng, 2)
    cache = KVCache(B, 2, 8, D, np.float64)
    layer(rng.standard_normal((B, 2, C)), cache=cache)  # 2 tokens cached
    given = forward.get("cache")
    if not isinstance(given, (KVCache, str)):
        forward = {**forward, "cache": cache}
    caches = [c for c in (cache, given) if isinstance(c, KVCache)]
    before = [(c.length, c.k.copy(), c.v.copy()) for c in caches]

    def projected(x):
        raise AssertionError("q_proj ran before the input was checked")

    monkeypatch.setattr(layer.q_proj, "forward", projected)
    with pytest.raises(error, match=match):
        layer(rng.standard_normal((B, 3, C)), **forward)

    for c, (length, k, v) in zip(caches, before, strict=True):
        assert c.length == length
        np.testing.assert_array_equal(c.k, k)
        np.testing.assert_array_equal(c.v, v)


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (np.zeros((B, N, C + 1)), ValueError, r"x has last axis 7"),
        (np.zeros((N, C)), ValueError, r"x must have rank 3"),
        (np.zeros((B, N, C), np.float32), TypeError, "x has dtype float32"),
    ],
)
def test_bad_x_is_refused(rng, x, error, match):
    with pytest.raises(error, match=match):
        make_layer(rng, 2)(x)


def test_no_grad_forward_keeps_nothing(rng):
    layer = make_layer(rng, 2, qk_norm=True)

    with no_grad():
        layer(rng.standard_normal((B, N, C)))

    with pytest.raises(RuntimeError, match="forward first"):
        layer.backward(np.ones((B, N, C)))


# -- differential attention (DiffLlama) ----------------------------------------------------------
# The oracle (torch_layer) is DiffLlama's two attention calls, one per value half; the layer makes
# one call over both halves side by side. H_kv = 2: one value pair, each key head read by two
# query heads; H_kv = 4: two pairs, multi-head.
DIFFERENTIAL = {
    "differential": {"differential": True, "lambda_init": 0.3},
    "differential_everything": {
        "differential": True,
        "lambda_init": 0.7,
        "differential_eps": 0.1,
        "qk_norm": True,
        "sinks": True,
        "window": (2, None),
        "softcap": 1.5,
        "bias": True,
        "out_bias": True,
        "rotary_dim": 2,
        "clip_qkv": 0.8,
        "scaling": 0.8,
    },
}


@pytest.mark.parametrize("option", list(DIFFERENTIAL))
@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("padded", [False, True])
def test_differential_matches_torch_autograd(rng, option, kv_heads, padded):
    layer = make_layer(rng, kv_heads, **DIFFERENTIAL[option])
    x, forward = forward_inputs(rng, layer, padded=padded)
    dout = rng.standard_normal((B, N, C))

    assert_matches(layer, x, dout, torch_grads(layer, x, dout, **forward), **forward)


@pytest.mark.parametrize("option", list(DIFFERENTIAL))
@pytest.mark.parametrize("kv_heads", [2, 4])
def test_differential_gradcheck(rng, option, kv_heads):
    layer = make_layer(rng, kv_heads, **DIFFERENTIAL[option])
    x, forward = forward_inputs(rng, layer, padded=True, n=4)

    assert_gradcheck(gradcheck(layer, x, **forward))


def test_differential_lambdas_are_named_and_shaped_like_hugging_face(tmp_path, rng):
    """lambda_q1, lambda_k1, lambda_q2, lambda_k2 (D,), first (the layer's own parameters before
    its modules', as in DiffLlama's state dict); o_proj still reads H*D (H/2 heads of 2D);
    lambda_init kept through a module file."""
    layer = GroupedQueryAttention(8, 4, 2, head_dim=6, differential=True, lambda_init=0.25)
    shapes = {name: value.shape for name, value in layer.state_dict().items()}
    path = tmp_path / "gqa.npz"

    assert list(shapes)[:4] == list(LAMBDA_NAMES)
    assert all(shapes[name] == (6,) for name in LAMBDA_NAMES)
    assert shapes["o_proj.weight"] == (8, 24)
    save_module(path, layer)
    assert load_module(path, layer).constructor_args() == layer.constructor_args()
    other = GroupedQueryAttention(8, 4, 2, head_dim=6, differential=True, lambda_init=0.5)
    with pytest.raises(ValueError, match=r"gqa\.npz.*lambda_init"):
        load_module(path, other)
