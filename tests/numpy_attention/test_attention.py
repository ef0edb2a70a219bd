"""The NumPy book family (numpy_attention.attention): forward values against a plain-NumPy oracle,
hand-derived backward against finite differences, the book's weight transfers, validation, and
the Module contract (no_grad, one backward per forward, state-dict keys).

Sizes are odd on purpose (d_in = 3, N = 5 or 7, d_out = 5) and include B = 1 and one head.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from numpy_attention import gradcheck, no_grad
from numpy_attention.attention import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    SimpleSelfAttention,
)
from numpy_attention.gradcheck import GradcheckReport
from numpy_attention.layers import Linear
from parity_tests.tolerances import FLOAT64_RTOL, structural_floors

from ..conftest import assert_close, assert_gradcheck

D_IN = 3
D_OUT = 5  # single-head layers
HEAD_DIM = 3  # MultiHeadAttention: d_out = num_heads * HEAD_DIM; the wrapper: d_out = HEAD_DIM
CONTEXT_LENGTH = 7
P = 0.3

# -- the oracle -------------------------------------------------------------------------------


def reference_attention(q, k, v, scale, *, causal=False, keep=None, p=0.0):
    """softmax(q k^T * scale), causal on request, inverted dropout, times v; q (..., N, D)."""
    scores = np.einsum("...nd,...md->...nm", q, k) * scale
    if causal:
        scores = np.where(np.tri(scores.shape[-2], scores.shape[-1], dtype=bool), scores, -np.inf)
    exps = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = exps / exps.sum(axis=-1, keepdims=True)
    if keep is not None:
        probs = probs * keep / (1.0 - p)
    return np.einsum("...nm,...md->...nd", probs, v)


def affine(x, state, prefix):
    """x W^T + b for the Linear stored under ``prefix`` (b optional)."""
    out = np.einsum("...i,oi->...o", x, state[prefix + ".weight"])
    return out + state[prefix + ".bias"] if prefix + ".bias" in state else out


def reference_causal(state, x, keep, prefix=""):
    q, k, v = (affine(x, state, prefix + name) for name in ("W_query", "W_key", "W_value"))
    return reference_attention(q, k, v, 1 / math.sqrt(q.shape[-1]), causal=True, keep=keep, p=P)


def reference(module, x, keep):
    """The layer's output from its state dict alone, with plain NumPy."""
    state = module.state_dict()
    if isinstance(module, SimpleSelfAttention):
        return reference_attention(x, x, x, 1.0)
    if isinstance(module, SelfAttentionV1):
        q, k, v = (x @ state[name] for name in ("W_query", "W_key", "W_value"))
        return reference_attention(q, k, v, 1 / math.sqrt(D_OUT))
    if isinstance(module, CausalAttention):  # a SelfAttentionV2 too: ask this first
        return reference_causal(state, x, keep)
    if isinstance(module, SelfAttentionV2):
        q, k, v = (affine(x, state, name) for name in ("W_query", "W_key", "W_value"))
        return reference_attention(q, k, v, 1 / math.sqrt(D_OUT))
    heads = range(module.num_heads)
    if isinstance(module, MultiHeadAttentionWrapper):
        outs = [reference_causal(state, x, _head(keep, h), f"heads.{h}.") for h in heads]
        return np.concatenate(outs, axis=-1)
    q, k, v = (affine(x, state, name) for name in ("W_query", "W_key", "W_value"))
    cols = [slice(h * HEAD_DIM, (h + 1) * HEAD_DIM) for h in heads]
    outs = [
        reference_attention(
            q[..., c], k[..., c], v[..., c], 1 / math.sqrt(HEAD_DIM), causal=True,
            keep=_head(keep, h), p=P,
        )
        for h, c in enumerate(cols)
    ]  # fmt: skip
    return affine(np.concatenate(outs, axis=-1), state, "out_proj")


def _head(keep, h):
    return None if keep is None else keep[:, h]


# -- building layers --------------------------------------------------------------------------

DROPOUT_LAYERS = ("CausalAttention", "MultiHeadAttentionWrapper", "MultiHeadAttention")
BIAS_LAYERS = ("SelfAttentionV2",) + DROPOUT_LAYERS
ALL_LAYERS = ("SimpleSelfAttention", "SelfAttentionV1") + BIAS_LAYERS


def make(name, rng, *, qkv_bias=False, num_heads=2, dropout=P):
    if name == "SimpleSelfAttention":
        return SimpleSelfAttention()
    if name == "SelfAttentionV1":
        return SelfAttentionV1(D_IN, D_OUT, rng=rng)
    if name == "SelfAttentionV2":
        return SelfAttentionV2(D_IN, D_OUT, qkv_bias, rng=rng)
    if name == "CausalAttention":
        return CausalAttention(D_IN, D_OUT, CONTEXT_LENGTH, dropout, qkv_bias, rng=rng)
    if name == "MultiHeadAttentionWrapper":
        return MultiHeadAttentionWrapper(
            D_IN, HEAD_DIM, CONTEXT_LENGTH, dropout, num_heads, qkv_bias, rng=rng
        )
    return MultiHeadAttention(
        D_IN, num_heads * HEAD_DIM, CONTEXT_LENGTH, dropout, num_heads, qkv_bias, rng=rng
    )


def keep_shape(module, batch, n):
    """The attention dropout keep-mask's shape: (B, N, N) for one head, (B, H, N, N) for more."""
    if isinstance(module, CausalAttention):
        return (batch, n, n)
    return (batch, module.num_heads, n, n)


def dropout_kwargs(module, mode, rng, batch, n):
    """Put ``module`` in ``mode``; return the forward keywords (an explicit keep-mask in train)."""
    if mode == "eval":
        module.eval()
        return {}
    return {"attn_dropout_mask": rng.random(keep_shape(module, batch, n)) >= P}


def without_key_bias(report):
    """The key bias's gradient is exactly zero (q_i . b_k is the same for every key j, and
    softmax ignores a per-row shift), so its finite difference is pure rounding and has no
    relative error; ``test_key_bias_gradient_is_zero`` checks it instead."""
    return GradcheckReport([row for row in report.rows if not row.name.endswith("W_key.bias")])


# -- gradcheck --------------------------------------------------------------------------------

SHAPES = [(5, D_IN), (1, 7, D_IN), (2, 5, D_IN)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradcheck_simple(rng, shape):
    report = gradcheck(SimpleSelfAttention(), rng.standard_normal(shape))
    assert_gradcheck(report)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradcheck_v1(rng, shape):
    module = SelfAttentionV1(D_IN, D_OUT, rng=rng)
    assert_gradcheck(gradcheck(module, rng.standard_normal(shape)))


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradcheck_v2(rng, shape, qkv_bias):
    module = SelfAttentionV2(D_IN, D_OUT, qkv_bias, rng=rng)
    assert_gradcheck(without_key_bias(gradcheck(module, rng.standard_normal(shape))))


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("n", [5, CONTEXT_LENGTH])
@pytest.mark.parametrize("batch", [1, 2])
def test_gradcheck_causal(rng, batch, n, qkv_bias, mode):
    module = make("CausalAttention", rng, qkv_bias=qkv_bias)
    kwargs = dropout_kwargs(module, mode, rng, batch, n)
    report = gradcheck(module, rng.standard_normal((batch, n, D_IN)), **kwargs)
    assert_gradcheck(without_key_bias(report))


@pytest.mark.parametrize("layer", ["MultiHeadAttentionWrapper", "MultiHeadAttention"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("num_heads", [1, 3])
@pytest.mark.parametrize("n", [5, CONTEXT_LENGTH])
@pytest.mark.parametrize("batch", [1, 2])
def test_gradcheck_multi_head(rng, batch, n, num_heads, qkv_bias, mode, layer):
    module = make(layer, rng, qkv_bias=qkv_bias, num_heads=num_heads)
    kwargs = dropout_kwargs(module, mode, rng, batch, n)
    report = gradcheck(module, rng.standard_normal((batch, n, D_IN)), **kwargs)
    assert_gradcheck(without_key_bias(report))


@pytest.mark.parametrize("layer", BIAS_LAYERS)
def test_key_bias_gradient_is_zero(rng, layer):
    module = make(layer, rng, qkv_bias=True, num_heads=3).astype(np.float64).eval()
    x = rng.standard_normal((2, 5, D_IN))
    module.backward(rng.standard_normal(module(x).shape))
    grads = module.named_grads()
    query_scale = max(np.max(np.abs(g)) for k, g in grads.items() if k.endswith("W_query.bias"))
    key_bias = max(np.max(np.abs(g)) for k, g in grads.items() if k.endswith("W_key.bias"))
    assert key_bias <= FLOAT64_RTOL * query_scale


# -- forward values against the oracle --------------------------------------------------------


@pytest.mark.parametrize("layer", ["SimpleSelfAttention", "SelfAttentionV1", "SelfAttentionV2"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_matches_reference_no_dropout(rng, shape, layer):
    module = make(layer, rng, qkv_bias=True).astype(np.float64)
    x = rng.standard_normal(shape)
    assert_close(module(x), reference(module, x, None))


@pytest.mark.parametrize("layer", DROPOUT_LAYERS)
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("n", [5, CONTEXT_LENGTH])
@pytest.mark.parametrize("batch", [1, 2])
def test_forward_matches_reference_causal(rng, batch, n, qkv_bias, mode, layer):
    module = make(layer, rng, qkv_bias=qkv_bias, num_heads=3).astype(np.float64)
    kwargs = dropout_kwargs(module, mode, rng, batch, n)
    x = rng.standard_normal((batch, n, D_IN))
    assert_close(module(x, **kwargs), reference(module, x, kwargs.get("attn_dropout_mask")))


FLOAT32_RUNS = [(layer, "eval") for layer in ALL_LAYERS] + [
    (layer, "train") for layer in DROPOUT_LAYERS
]


@pytest.mark.parametrize(("layer", "mode"), FLOAT32_RUNS)
def test_float32_in_float32_out_close_to_float64(rng, layer, mode):
    """The float32 run against the float64 run of the same layer on the same numbers: output,
    input gradient and every parameter gradient, each on its own scale."""
    module32 = make(layer, rng, qkv_bias=True, num_heads=3)
    kwargs = dropout_kwargs(module32, mode, rng, 2, 5)
    module64 = copy.deepcopy(module32).astype(np.float64)
    x = rng.standard_normal((2, 5, D_IN)).astype(np.float32)

    out32 = module32(x, **kwargs)
    dout = rng.standard_normal(out32.shape).astype(np.float32)
    dx32 = module32.backward(dout)
    out64 = module64(x.astype(np.float64), **kwargs)
    dx64 = module64.backward(dout.astype(np.float64))

    assert out32.dtype == dx32.dtype == np.float32
    assert_close(out32, out64, dtype=np.float32, name="out")
    assert_close(dx32, dx64, dtype=np.float32, name="dx")
    grads64 = module64.named_grads()
    # The key bias's gradient is zero by cancellation (without_key_bias): both sides hold
    # rounding noise, so it alone is judged on its projection's weight gradient.
    floors = structural_floors(grads64, one_key=False)
    for name, grad in module32.named_grads().items():
        assert grad.dtype == np.float32, name
        assert_close(grad, grads64[name], dtype=np.float32, name=name, scale=floors.get(name, 0.0))


@pytest.mark.parametrize("layer", DROPOUT_LAYERS)
def test_dropout_without_mask_draws_from_the_layer_generator(layer):
    module, twin = make(layer, 7, num_heads=3), make(layer, 7, num_heads=3)
    x = np.random.default_rng(1).standard_normal((2, 5, D_IN)).astype(np.float32)
    keep = twin.rng.random(keep_shape(twin, 2, 5)) >= P
    assert_close(module(x), twin(x, attn_dropout_mask=keep))


# -- the book's weight transfers --------------------------------------------------------------


def test_v1_with_v2_weights_transposed_matches_v2(rng):
    v2 = SelfAttentionV2(D_IN, D_OUT, rng=rng)
    v1 = SelfAttentionV1(D_IN, D_OUT, rng=rng)
    v1.load_state_dict({name: v2.state_dict()[name + ".weight"].T for name in v1.state_dict()})
    x = rng.standard_normal((2, 5, D_IN)).astype(np.float32)
    dout = rng.standard_normal((2, 5, D_OUT)).astype(np.float32)

    out1, out2 = v1(x), v2(x)
    dx1, dx2 = v1.backward(dout), v2.backward(dout)

    assert_close(out1, out2, name="out")
    assert_close(dx1, dx2, name="dx")
    grads1, grads2 = v1.named_grads(), v2.named_grads()
    for name in grads1:  # dW_V1 = x^T dQ is dW_V2 = dQ^T x transposed
        assert_close(grads1[name], grads2[name + ".weight"].T, name=name)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("num_heads", [1, 3])
def test_wrapper_equals_mha_with_stacked_heads(rng, num_heads, qkv_bias, mode):
    wrapper = make("MultiHeadAttentionWrapper", rng, qkv_bias=qkv_bias, num_heads=num_heads)
    mha = make("MultiHeadAttention", rng, qkv_bias=qkv_bias, num_heads=num_heads)
    wrapper.astype(np.float64)
    mha.astype(np.float64)
    heads, width = wrapper.state_dict(), num_heads * HEAD_DIM
    stacked = {
        name: np.concatenate([heads[f"heads.{h}.{name}"] for h in range(num_heads)])
        for name in mha.state_dict()
        if name.startswith("W_")
    }
    mha.load_state_dict(
        {**stacked, "out_proj.weight": np.eye(width), "out_proj.bias": np.zeros(width),
         "mask": heads["heads.0.mask"]}
    )  # fmt: skip
    kwargs = dropout_kwargs(wrapper, mode, rng, 2, 5)
    mha.train(mode == "train")
    x = rng.standard_normal((2, 5, D_IN))
    dout = rng.standard_normal((2, 5, width))

    out_wrapper, out_mha = wrapper(x, **kwargs), mha(x, **kwargs)
    dx_wrapper, dx_mha = wrapper.backward(dout), mha.backward(dout)

    assert_close(out_mha, out_wrapper, name="out")
    assert_close(dx_mha, dx_wrapper, name="dx")
    wrapper_grads, mha_grads = wrapper.named_grads(), mha.named_grads()
    for name in stacked:
        per_head = [wrapper_grads[f"heads.{h}.{name}"] for h in range(num_heads)]
        assert_close(mha_grads[name], np.concatenate(per_head), name=name)


# -- construction -----------------------------------------------------------------------------


def test_v1_init_is_torch_rand_in_creation_order():
    module = SelfAttentionV1(D_IN, D_OUT, rng=11)
    draws = np.random.default_rng(11)
    for name in ("W_query", "W_key", "W_value"):
        expected = draws.random((D_IN, D_OUT)).astype(np.float32)
        np.testing.assert_array_equal(getattr(module, name), expected, err_msg=name)
    assert module.W_query.dtype == np.float32


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_mha_parameters_drawn_in_creation_order(qkv_bias):
    module = MultiHeadAttention(D_IN, 6, CONTEXT_LENGTH, P, 3, qkv_bias, rng=11)
    draws = np.random.default_rng(11)
    linears = {name: Linear(D_IN, 6, qkv_bias, rng=draws) for name in ("W_query", "W_key")}
    linears["W_value"] = Linear(D_IN, 6, qkv_bias, rng=draws)
    linears["out_proj"] = Linear(6, 6, rng=draws)
    for prefix, linear in linears.items():
        for name, value in linear.state_dict().items():
            np.testing.assert_array_equal(module.state_dict()[f"{prefix}.{name}"], value)


def test_mask_buffer_is_the_books_float_triu(rng):
    expected = np.triu(np.ones((CONTEXT_LENGTH, CONTEXT_LENGTH), dtype=np.float32), k=1)
    for layer in ("CausalAttention", "MultiHeadAttention"):
        mask = make(layer, rng).state_dict()["mask"]
        assert mask.dtype == np.float32
        np.testing.assert_array_equal(mask, expected)


STATE_KEYS = {
    ("SimpleSelfAttention", False): [],
    ("SelfAttentionV1", False): ["W_query", "W_key", "W_value"],
    ("SelfAttentionV2", False): ["W_query.weight", "W_key.weight", "W_value.weight"],
    ("SelfAttentionV2", True): [
        "W_query.weight", "W_query.bias", "W_key.weight", "W_key.bias",
        "W_value.weight", "W_value.bias",
    ],
    ("CausalAttention", False): ["mask", "W_query.weight", "W_key.weight", "W_value.weight"],
    ("MultiHeadAttentionWrapper", False): [
        "heads.0.mask", "heads.0.W_query.weight", "heads.0.W_key.weight", "heads.0.W_value.weight",
        "heads.1.mask", "heads.1.W_query.weight", "heads.1.W_key.weight", "heads.1.W_value.weight",
    ],
    ("MultiHeadAttention", False): [
        "mask", "W_query.weight", "W_key.weight", "W_value.weight",
        "out_proj.weight", "out_proj.bias",
    ],
    ("MultiHeadAttention", True): [
        "mask", "W_query.weight", "W_query.bias", "W_key.weight", "W_key.bias",
        "W_value.weight", "W_value.bias", "out_proj.weight", "out_proj.bias",
    ],
}  # fmt: skip


@pytest.mark.parametrize(("layer", "qkv_bias"), list(STATE_KEYS), ids=str)
def test_state_dict_keys_are_the_torch_book_keys(rng, layer, qkv_bias):
    """The order is torch's too: own parameters, own buffers, then children."""
    module = make(layer, rng, qkv_bias=qkv_bias, num_heads=2)
    assert list(module.state_dict()) == STATE_KEYS[(layer, qkv_bias)]


@pytest.mark.parametrize("layer", ALL_LAYERS[1:])
def test_load_state_dict_round_trip_and_errors(rng, layer):
    module, source = make(layer, rng), make(layer, rng)
    state = source.state_dict()
    first = next(iter(state))

    with pytest.raises(KeyError, match="missing"):
        module.load_state_dict({k: v for k, v in state.items() if k != first})
    with pytest.raises(KeyError, match="unexpected"):
        module.load_state_dict({**state, "extra.weight": state[first]})
    with pytest.raises(ValueError, match="shape"):
        module.load_state_dict({**state, first: np.zeros((1, 1), dtype=np.float32)})
    module.load_state_dict(state)

    x = rng.standard_normal((2, 5, D_IN)).astype(np.float32)
    assert_close(module.eval()(x), source.eval()(x))


# -- validation -------------------------------------------------------------------------------


def _x(*shape, dtype=np.float32):
    return np.ones(shape, dtype=dtype)


def _mask(*shape, dtype=bool):
    return np.ones(shape, dtype=dtype)


INVALID_CALLS = [
    ("SimpleSelfAttention", lambda m: m(_x(3)), ValueError, "rank"),
    ("SimpleSelfAttention", lambda m: m(_x(5, 3, dtype=np.int64)), TypeError, "floating"),
    ("SelfAttentionV1", lambda m: m(_x(1, 2, 5, D_IN)), ValueError, "rank"),
    ("SelfAttentionV1", lambda m: m(_x(5, 4)), ValueError, "last axis"),
    ("SelfAttentionV1", lambda m: m(_x(5, D_IN, dtype=np.float64)), TypeError, "float32"),
    ("SelfAttentionV2", lambda m: m(_x(2, 5, 4)), ValueError, "last axis"),
    ("SelfAttentionV2", lambda m: m(_x(5, D_IN, dtype=np.float64)), TypeError, "float32"),
    ("CausalAttention", lambda m: m(_x(5, D_IN)), ValueError, "rank"),
    ("CausalAttention", lambda m: m(_x(2, 8, D_IN)), ValueError, "context_length"),
    ("CausalAttention", lambda m: m(_x(2, 5, 4)), ValueError, "last axis"),
    ("CausalAttention", lambda m: m(_x(2, 5, D_IN, dtype=np.int32)), TypeError, "floating"),
    ("CausalAttention", lambda m: m(_x(2, 5, D_IN), _mask(2, 5, 4)), ValueError, "shape"),
    ("CausalAttention", lambda m: m(_x(2, 5, D_IN), _mask(2, 5, 5, dtype=np.float32)), TypeError,
     "bool"),
    ("CausalAttention", lambda m: m.eval()(_x(2, 5, D_IN), _mask(2, 5, 5)), ValueError, "eval"),
    ("MultiHeadAttentionWrapper", lambda m: m(_x(2, 8, D_IN)), ValueError, "context_length"),
    ("MultiHeadAttentionWrapper", lambda m: m(_x(2, 5, D_IN), _mask(2, 5, 5)), ValueError,
     "shape"),
    ("MultiHeadAttentionWrapper", lambda m: m.eval()(_x(2, 5, D_IN), _mask(2, 2, 5, 5)),
     ValueError, "eval"),
    ("MultiHeadAttention", lambda m: m(_x(2, 8, D_IN)), ValueError, "context_length"),
    ("MultiHeadAttention", lambda m: m(_x(2, 5, 4)), ValueError, "last axis"),
    ("MultiHeadAttention", lambda m: m(_x(2, 5, D_IN, dtype=np.float64)), TypeError, "float32"),
    ("MultiHeadAttention", lambda m: m(_x(2, 5, D_IN), _mask(2, 5, 5)), ValueError, "shape"),
    ("MultiHeadAttention", lambda m: m(_x(2, 5, D_IN), _mask(2, 2, 5, 5, dtype=np.int8)),
     TypeError, "bool"),
    ("MultiHeadAttention", lambda m: m.eval()(_x(2, 5, D_IN), _mask(2, 2, 5, 5)), ValueError,
     "eval"),
]  # fmt: skip


@pytest.mark.parametrize(("layer", "call", "error", "match"), INVALID_CALLS)
def test_invalid_forward_raises(rng, layer, call, error, match):
    module = make(layer, rng, num_heads=2)
    with pytest.raises(error, match=match):
        call(module)


@pytest.mark.parametrize("layer", DROPOUT_LAYERS)
def test_keep_mask_with_zero_dropout_raises(rng, layer):
    module = make(layer, rng, num_heads=2, dropout=0.0)
    with pytest.raises(ValueError, match="probability is 0"):
        module(_x(2, 5, D_IN), attn_dropout_mask=_mask(*keep_shape(module, 2, 5)))


@pytest.mark.parametrize("dropout", [1.0, -0.1])
@pytest.mark.parametrize("layer", DROPOUT_LAYERS)
def test_dropout_probability_out_of_range_raises(rng, layer, dropout):
    with pytest.raises(ValueError, match="dropout"):
        make(layer, rng, dropout=dropout)


INVALID_SIZES = [
    (lambda: MultiHeadAttention(D_IN, 5, CONTEXT_LENGTH, P, 2), ValueError, "divisible"),
    (lambda: MultiHeadAttention(D_IN, 6, CONTEXT_LENGTH, P, 0), ValueError, "num_heads"),
    (lambda: SelfAttentionV1(0, D_OUT), ValueError, "d_in"),
    (lambda: SelfAttentionV2(D_IN, 0), ValueError, "d_out"),
    (lambda: CausalAttention(D_IN, D_OUT, 0, P), ValueError, "context_length"),
    (lambda: MultiHeadAttentionWrapper(D_IN, D_OUT, CONTEXT_LENGTH, P, 2.0), TypeError,
     "num_heads"),
    (lambda: SelfAttentionV2(D_IN, D_OUT, qkv_bias="no"), TypeError, "bias"),
]  # fmt: skip


@pytest.mark.parametrize(("build", "error", "match"), INVALID_SIZES)
def test_invalid_sizes_raise(build, error, match):
    with pytest.raises(error, match=match):
        build()


# -- the Module contract ----------------------------------------------------------------------


@pytest.mark.parametrize("layer", ALL_LAYERS)
def test_no_grad_caches_nothing(rng, layer):
    module = make(layer, rng, num_heads=2).eval()
    x = rng.standard_normal((2, 5, D_IN)).astype(np.float32)
    with no_grad():
        out = module(x)
    assert all(sub._ctx is None for _, sub in module.named_modules())
    with pytest.raises(RuntimeError, match="forward first"):
        module.backward(np.ones_like(out))


@pytest.mark.parametrize("layer", ALL_LAYERS)
def test_second_backward_raises(rng, layer):
    module = make(layer, rng, num_heads=2).eval()
    out = module(rng.standard_normal((2, 5, D_IN)).astype(np.float32))
    dout = rng.standard_normal(out.shape).astype(np.float32)
    module.backward(dout)
    with pytest.raises(RuntimeError, match="forward first"):
        module.backward(dout)


@pytest.mark.parametrize("layer", ["MultiHeadAttentionWrapper", "MultiHeadAttention"])
def test_backward_checks_dout_shape(rng, layer):
    module = make(layer, rng, num_heads=2).eval()
    out = module(rng.standard_normal((2, 5, D_IN)).astype(np.float32))
    with pytest.raises(ValueError, match="dout"):
        module.backward(np.ones(out.shape[:-1] + (out.shape[-1] + 1,), dtype=np.float32))
