"""Keys and values shared across layers (numpy_attention.shared_kv, GroupedQueryAttention's
``kv_shared``): a source layer and a KV-shared layer as one module, checked by finite
differences and against torch autograd of the same two layers written in torch ops; a shared
layer with the source's query weights reproduces the source; decoding over the source's cache
gives the full sequence; bad use refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention import gradcheck
from numpy_attention.decode.cache import KVCache, PagedKVCache
from numpy_attention.grouped import GroupedQueryAttention
from numpy_attention.module import Module
from numpy_attention.shared_kv import SharedKV

from ..conftest import assert_close, assert_gradcheck, to_torch
from .test_grouped import DROPOUT, left_padded, torch_layer

B, N, C, H, D = 2, 5, 6, 4, 4

# (the source's options, the shared layer's): the same mask, as Gemma's layers of one type
PAIRS = {
    "plain": ({}, {}),
    "gemma3n": (  # QK-norm, value norm, scale 1, a window shorter than the sequence
        {"qk_norm": True, "value_norm": True, "scaling": 1.0, "window": (2, 0), "norm_eps": 0.1},
        {"qk_norm": True, "scaling": 1.0, "window": (2, 0), "norm_eps": 0.1},
    ),
    "after_rope_gate_sinks": (  # the query chain's other branches on the shared layer
        {"qk_norm": True, "qk_norm_position": "after_rope", "value_norm": True},
        {"qk_norm": True, "qk_norm_position": "after_rope", "output_gate": "head"}
        | {"sinks": True, "bias": True},
    ),
    "dropout": ({"dropout": DROPOUT}, {"dropout": DROPOUT, "softcap": 1.5}),
}
KV_HEADS = [1, 2]


def make_pair(rng, kv_heads, source_options, shared_options):
    """A float64 source layer and a KV-shared layer reading it; norm weights and sinks random
    (their initial ones and zeros would hide a wrong gradient)."""
    layers = []
    for options in (source_options, shared_options | {"kv_shared": True}):
        layer = GroupedQueryAttention(C, H, kv_heads, head_dim=D, rng=rng, **options)
        layer.astype(np.float64).train(options.get("dropout", 0.0) > 0)
        state = layer.state_dict()
        for name in ("sinks", "q_norm.weight", "k_norm.weight"):
            if name in state:
                state[name] = 1.0 + 0.5 * rng.standard_normal(state[name].shape)
        layer.load_state_dict(state)
        layers.append(layer)
    return layers


class Pair(Module):
    """Two layers as a model runs them: the source on x0, the shared layer on x1 with the
    source's keys and values; out = stack(source's, shared's) (2, B, N, C). The backward is a
    model's: the shared layer's first, its ``dkv`` then handed to the source's."""

    def __init__(self, source, shared):
        super().__init__()
        self.source, self.shared = source, shared

    def forward(self, x0, x1, *, attn_dropout_mask=(None, None), **forward):
        out0 = self.source(x0, attn_dropout_mask=attn_dropout_mask[0], **forward)
        out1 = self.shared(
            x1, shared_kv=self.source.kv, attn_dropout_mask=attn_dropout_mask[1], **forward
        )
        self._save_ctx(None, np.stack([out0, out1]))
        return np.stack([out0, out1])

    def backward(self, dout):
        dout, _ = self._pop_ctx(dout)
        dx1 = self.shared.backward(dout[1])
        dx0 = self.source.backward(dout[0], dkv=self.shared.dkv)
        return dx0, dx1


def pair_inputs(rng, pair, *, padded):
    x0, x1 = rng.standard_normal((2, B, N, C))
    forward = {}
    if padded:  # element 0: 2 padding tokens on the left, element 1: none
        forward["key_padding_mask"], forward["positions"] = left_padded(B, N, [2, 0])
    if pair.source.training:
        forward["attn_dropout_mask"] = tuple(rng.random((2, B, H, N, N)) >= DROPOUT)
    return x0, x1, forward


def torch_pair(pair, x0, x1, dout, forward):
    """The two layers in torch ops (the source by ``test_grouped.torch_layer``, the shared
    layer's queries and output likewise, its keys and values the source's), differentiated by
    autograd: (out, dx0, dx1, grads by 'source.' / 'shared.' name)."""
    args0, args1 = pair.source.constructor_args(), pair.shared.constructor_args()
    params = {
        name: to_torch(value, requires_grad=True) for name, value in pair.state_dict().items()
    }
    source = {k.removeprefix("source."): v for k, v in params.items() if k.startswith("source.")}
    shared = {k.removeprefix("shared."): v for k, v in params.items() if k.startswith("shared.")}
    tx0, tx1 = to_torch(x0, requires_grad=True), to_torch(x1, requires_grad=True)
    masks = forward.get("attn_dropout_mask", (None, None))
    common = {k: v for k, v in forward.items() if k != "attn_dropout_mask"}
    kept = {}
    out0 = torch_layer(tx0, source, args0, attn_dropout_mask=masks[0], keep_kv=kept, **common)
    out1 = torch_layer(
        tx1, shared, args1, attn_dropout_mask=masks[1], shared_kv=kept["kv"], **common
    )
    out = torch.stack([out0, out1])
    out.backward(to_torch(dout))
    grads = {name: tensor.grad.numpy() for name, tensor in params.items()}
    return out.detach().numpy(), tx0.grad.numpy(), tx1.grad.numpy(), grads


@pytest.mark.parametrize("pair_options", list(PAIRS))
@pytest.mark.parametrize("kv_heads", KV_HEADS)
@pytest.mark.parametrize("padded", [False, True])
def test_matches_torch_autograd(rng, pair_options, kv_heads, padded):
    pair = Pair(*make_pair(rng, kv_heads, *PAIRS[pair_options]))
    x0, x1, forward = pair_inputs(rng, pair, padded=padded)
    dout = rng.standard_normal((2, B, N, C))
    out_expected, dx0_expected, dx1_expected, grads_expected = torch_pair(
        pair, x0, x1, dout, forward
    )

    out = pair(x0, x1, **forward)
    dx0, dx1 = pair.backward(dout)

    assert_close(out, out_expected, name="out")
    assert_close(dx0, dx0_expected, name="dx0")
    assert_close(dx1, dx1_expected, name="dx1")
    grads = pair.named_grads()
    assert sorted(grads) == sorted(grads_expected)
    for name, grad in grads_expected.items():
        assert_close(grads[name], grad, name=name)


@pytest.mark.parametrize("pair_options", list(PAIRS))
def test_gradcheck(rng, pair_options):
    pair = Pair(*make_pair(rng, 2, *PAIRS[pair_options]))
    x0, x1, forward = pair_inputs(rng, pair, padded=True)

    assert_gradcheck(gradcheck(pair, x0, x1, **forward))


def test_the_shared_layers_own_dkv_is_the_gradient_of_the_shared_keys_and_values(rng):
    """Finite differences on k and v themselves, the shared layer alone."""
    _, shared = make_pair(rng, 2, *PAIRS["gemma3n"])
    x = rng.standard_normal((B, N, C))
    k, v = rng.standard_normal((2, B, 2, N, D))

    def forward(x, k, v):
        return shared(x, shared_kv=SharedKV(k, v)), None

    def backward(dout, ctx):
        dx = shared.backward(dout)
        return dx, shared.dkv.k, shared.dkv.v

    assert_gradcheck(gradcheck(forward, x, k, v, backward=backward))


def test_a_shared_layer_with_the_sources_query_weights_reproduces_the_source(rng):
    source, shared = make_pair(rng, 2, *PAIRS["gemma3n"])
    state = {k: v for k, v in source.state_dict().items() if k in shared.state_dict()}
    shared.load_state_dict(state)
    x = rng.standard_normal((B, N, C))

    expected = source(x)
    out = shared(x, shared_kv=source.kv)

    np.testing.assert_array_equal(out, expected)


def test_the_shared_layer_has_no_key_or_value_weights(rng):
    _, shared = make_pair(rng, 2, *PAIRS["gemma3n"])

    assert sorted(shared.state_dict()) == ["o_proj.weight", "q_norm.weight", "q_proj.weight"]


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("step", [1, 2])
def test_decoding_over_the_sources_cache_gives_the_full_sequence(rng, paged, step):
    """Prefill 3 tokens, then ``step`` at a time: the source appends to its cache, the shared
    layer reads it (and appends nothing); every row as the full forward's."""
    source, shared = make_pair(rng, 1, *PAIRS["gemma3n"])
    n, prefill = 9, 3
    x0, x1 = rng.standard_normal((2, B, n, C))
    source(x0)
    full = shared(x1, shared_kv=source.kv)
    cache: KVCache | PagedKVCache = KVCache(B, 1, n, D, np.float64)
    if paged:
        cache = PagedKVCache(B * 5, 2, 1, D, dtype=np.float64)

    outs = []
    for start, stop in [(0, prefill), *((t, t + step) for t in range(prefill, n, step))]:
        stop = min(stop, n)
        source(x0[:, start:stop], cache=cache)
        outs.append(shared(x1[:, start:stop], shared_kv=cache))

    assert cache.length == n
    assert_close(np.concatenate(outs, axis=1), full, name="decoded rows")


def test_backward_after_reading_a_cache_is_refused(rng):
    source, shared = make_pair(rng, 2, {}, {})
    cache = KVCache(B, 2, N, D, np.float64)
    x = rng.standard_normal((B, N, C))
    source(x, cache=cache)
    shared(x, shared_kv=cache)

    with pytest.raises(RuntimeError, match="read one as shared_kv"):
        shared.backward(np.ones((B, N, C)))


def test_a_source_forward_with_a_cache_shares_no_kv(rng):
    source, _ = make_pair(rng, 2, {}, {})
    x = rng.standard_normal((B, N, C))
    source(x)
    source(x, cache=KVCache(B, 2, N, D, np.float64))

    assert source.kv is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"kv_shared": True, "value_norm": True}, ValueError, "value_norm with kv_shared"),
        ({"kv_shared": True, "clip_qkv": 0.5}, ValueError, "clip_qkv=0.5 with kv_shared"),
        (
            {"kv_shared": True, "values_from_keys": True},
            ValueError,
            "values_from_keys with kv_shared",
        ),
        (
            {"values_from_keys": True, "clip_qkv": 0.5},
            ValueError,
            "clip_qkv=0.5 with values_from_keys",
        ),
        ({"values_from_keys": 0}, TypeError, "values_from_keys must be a bool"),
        ({"kv_shared": 1}, TypeError, "kv_shared must be a bool"),
        ({"value_norm": "yes"}, TypeError, "value_norm must be a bool"),
    ],
)
def test_bad_construction_is_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        GroupedQueryAttention(C, H, 2, head_dim=D, **kwargs)


def _shared_kv(rng, m=N, kv_heads=2, dtype=np.float64):
    return SharedKV(*rng.standard_normal((2, B, kv_heads, m, D)).astype(dtype))


@pytest.mark.parametrize(
    ("layer", "forward", "error", "match"),
    [
        ("shared", lambda rng: {}, ValueError, "shared_kv is missing"),
        (
            "shared",
            lambda rng: {"shared_kv": _shared_kv(rng), "cache": KVCache(B, 2, N, D, np.float64)},
            ValueError,
            "cache: a KV-shared layer appends",
        ),
        ("source", lambda rng: {"shared_kv": _shared_kv(rng)}, ValueError, "kv_shared=False"),
        ("shared", lambda rng: {"shared_kv": _shared_kv(rng, m=3)}, ValueError, "M must be"),
        ("shared", lambda rng: {"shared_kv": _shared_kv(rng, kv_heads=1)}, ValueError, "H_kv"),
        (
            "shared",
            lambda rng: {"shared_kv": _shared_kv(rng, dtype=np.float32)},
            TypeError,
            "shared_kv holds float32",
        ),
        ("shared", lambda rng: {"shared_kv": [1, 2, 3]}, TypeError, "shared_kv must be"),
        (
            "shared",
            lambda rng: {"shared_kv": (np.zeros((B, 2, N, D)), np.zeros((B, 2, N + 1, D)))},
            ValueError,
            "one shape",
        ),
    ],
)
def test_bad_forward_input_is_refused(rng, layer, forward, error, match):
    source, shared = make_pair(rng, 2, {}, {})
    x = rng.standard_normal((B, N, C))

    with pytest.raises(error, match=match):
        (shared if layer == "shared" else source)(x, **forward(rng))


def test_bad_dkv_is_refused_and_leaves_the_context(rng):
    source, shared = make_pair(rng, 2, {}, {})
    x = rng.standard_normal((B, N, C))
    dout = rng.standard_normal((B, N, C))
    source(x)
    shared(x, shared_kv=source.kv)

    with pytest.raises(ValueError, match="a KV-shared layer has no keys"):
        shared.backward(dout, dkv=_shared_kv(rng))
    with pytest.raises(ValueError, match=r"dkv.k must have the output's shape"):
        source.backward(dout, dkv=_shared_kv(rng, m=4))
    with pytest.raises(TypeError, match="dkv must be a SharedKV"):
        source.backward(dout, dkv=np.zeros((B, 2, N, D)))
    shared.backward(dout)
    source.backward(dout, dkv=shared.dkv)  # the context was kept: this backward runs
