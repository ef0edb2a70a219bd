"""The NumPy fused-QKV family: finite-difference gradients, a plain-NumPy oracle, masks, dropout,
dtypes, state-dict layout and input validation."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import gradcheck
from numpy_attention.fused import (
    BidirectionalAttention,
    CausalSelfAttention,
    CrossAttention,
    SingleHeadAttention,
)

from ..conftest import assert_close, assert_gradcheck

B, N, M, C, H = 2, 5, 7, 6, 3  # odd sizes: head width D = 2, N != M
CONTEXT = 8
ATTN_P, OUT_P = 0.25, 0.4
MULTI_HEAD = ("bidirectional", "causal", "cross", "causal_cross")


def reference(x, y, params, *, num_heads, causal, padding, attn_keep, out_keep):
    """Plain-NumPy oracle, one head at a time, read straight off the weight layout.

    x (B, N, C) gives the queries and y (B, M, C) the keys and values. ``params`` holds torch-layout
    weights wq, wk, wv (H*D, C), wo (C, H*D) and biases; head h uses rows h*D:(h+1)*D of wq, wk,
    wv. padding (B, M) True = padding; attn_keep (B, H, N, M), out_keep (B, N, C) keep-masks.
    Returns (B, N, C).
    """
    n, m = x.shape[1], y.shape[1]
    d = params["wq"].shape[0] // num_heads
    allowed = np.ones((x.shape[0], n, m), dtype=bool)
    if causal:
        allowed &= np.arange(m)[None, :] <= np.arange(n)[:, None]
    if padding is not None:
        allowed &= ~padding[:, None, :]
    heads = []
    for h in range(num_heads):
        rows = slice(h * d, (h + 1) * d)
        q = x @ params["wq"][rows].T + params["bq"][rows]
        k = y @ params["wk"][rows].T + params["bk"][rows]
        v = y @ params["wv"][rows].T + params["bv"][rows]
        scores = np.where(allowed, q @ k.transpose(0, 2, 1) / np.sqrt(d), -np.inf)
        peak = scores.max(axis=-1, keepdims=True)
        exps = np.exp(scores - np.where(np.isfinite(peak), peak, 0.0))
        total = exps.sum(axis=-1, keepdims=True)
        probs = np.divide(exps, total, out=np.zeros_like(exps), where=total > 0)
        if attn_keep is not None:
            probs = probs * attn_keep[:, h] / (1 - ATTN_P)
        heads.append(probs @ v)
    out = np.concatenate(heads, axis=-1) @ params["wo"].T + params["bo"]
    if out_keep is not None:
        out = out * out_keep / (1 - OUT_P)
    return out


def params_of(layer):
    """The layer's weights split by role, zeros for absent biases."""
    state = layer.state_dict()
    if "Wqkv.weight" in state:
        wq, wk, wv = np.split(state["Wqkv.weight"], 3)
        bias = state.get("Wqkv.bias", np.zeros(state["Wqkv.weight"].shape[0]))
        bq, bk, bv = np.split(bias, 3)
    else:
        wq, (wk, wv) = state["Wq.weight"], np.split(state["Wkv.weight"], 2)
        bq = state.get("Wq.bias", np.zeros(wq.shape[0]))
        bk, bv = np.split(state.get("Wkv.bias", np.zeros(2 * wq.shape[0])), 2)
    bo = state.get("Wo.bias", np.zeros(state["Wo.weight"].shape[0]))
    return dict(wq=wq, wk=wk, wv=wv, bq=bq, bk=bk, bv=bv, wo=state["Wo.weight"], bo=bo)


def make_layer(kind, *, train=False, bias=True, hidden=C, num_heads=H):
    """A float64 layer of the given kind; its parameters come from a fixed seed."""
    if kind == "single":
        layer = SingleHeadAttention(hidden, bias, rng=1)
    elif kind == "bidirectional":
        layer = BidirectionalAttention(hidden, num_heads, ATTN_P, OUT_P, bias, rng=1)
    elif kind == "causal":
        layer = CausalSelfAttention(hidden, num_heads, CONTEXT, ATTN_P, OUT_P, bias, rng=1)
    else:
        causal = kind == "causal_cross"
        layer = CrossAttention(hidden, num_heads, ATTN_P, OUT_P, bias, causal, rng=1)
    return layer.astype(np.float64).train(train)


def padding_mask(batch, length):
    """Element 0 pads its first and last key (so a causal row 0 sees nothing); the last element
    is all padding."""
    mask = np.zeros((batch, length), dtype=bool)
    mask[0, [0, -1]] = True
    mask[-1] = True
    return mask


def inputs_and_options(rng, kind, *, padding, train, b=B, n=N, m=M, hidden=C, num_heads=H):
    """The differentiated inputs (x, or x and y) and the forward's keyword options."""
    cross = kind in ("cross", "causal_cross")
    m = m if cross else n
    inputs = (rng.standard_normal((b, n, hidden)),)
    if cross:
        inputs += (rng.standard_normal((b, m, hidden)),)
    options = {}
    if padding:
        options["mask"] = padding_mask(b, m)
    if train:
        options["attn_dropout_mask"] = rng.random((b, num_heads, n, m)) >= ATTN_P
        options["out_dropout_mask"] = rng.random((b, n, hidden)) >= OUT_P
    return inputs, options


def expected_output(layer, kind, inputs, options, num_heads=H):
    x, y = inputs[0], inputs[-1]
    return reference(
        x,
        y,
        params_of(layer),
        num_heads=num_heads,
        causal=kind in ("causal", "causal_cross"),
        padding=options.get("mask"),
        attn_keep=options.get("attn_dropout_mask"),
        out_keep=options.get("out_dropout_mask"),
    )


# -- gradients and values, option by option ---------------------------------------------------


@pytest.mark.parametrize("kind", MULTI_HEAD)
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("train", [False, True])
def test_gradcheck(rng, kind, padding, train):
    layer = make_layer(kind, train=train)
    inputs, options = inputs_and_options(rng, kind, padding=padding, train=train)

    report = gradcheck(layer, *inputs, **options)

    assert_gradcheck(report)


@pytest.mark.parametrize("kind", MULTI_HEAD)
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("train", [False, True])
def test_forward_matches_reference(rng, kind, padding, train):
    layer = make_layer(kind, train=train)
    inputs, options = inputs_and_options(rng, kind, padding=padding, train=train)

    out = layer(*inputs, **options)

    assert out.shape == (B, N, C)
    assert_close(out, expected_output(layer, kind, inputs, options), name=kind)


@pytest.mark.parametrize("kind", ["cross", "causal_cross"])
@pytest.mark.parametrize("lengths", [(5, 7), (7, 5), (1, 4)])
def test_cross_lengths(rng, kind, lengths):
    n, m = lengths
    layer = make_layer(kind, train=True)
    inputs, options = inputs_and_options(rng, kind, padding=True, train=True, n=n, m=m)

    out = layer(*inputs, **options)
    report = gradcheck(layer, *inputs, **options)

    assert_close(out, expected_output(layer, kind, inputs, options), name=kind)
    assert_gradcheck(report)


@pytest.mark.parametrize("kind", MULTI_HEAD)
@pytest.mark.parametrize("shape", [(1, 5, 6, 3), (2, 4, 8, 1), (3, 1, 4, 2)], ids=str)
def test_sizes(rng, kind, shape):
    """B = 1, one head, a single query (B, N, C, H)."""
    b, n, hidden, num_heads = shape
    layer = make_layer(kind, hidden=hidden, num_heads=num_heads)
    inputs, options = inputs_and_options(
        rng, kind, padding=False, train=False, b=b, n=n, m=n + 2, hidden=hidden, num_heads=num_heads
    )

    out = layer(*inputs, **options)
    report = gradcheck(layer, *inputs, **options)

    assert_close(out, expected_output(layer, kind, inputs, options, num_heads), name=kind)
    assert_gradcheck(report)


@pytest.mark.parametrize("kind", MULTI_HEAD + ("single",))
def test_without_bias(rng, kind):
    hidden = 8 if kind == "single" else C
    layer = make_layer(kind, train=kind != "single", bias=False, hidden=hidden)
    inputs, options = inputs_and_options(
        rng, kind, padding=kind != "single", train=kind != "single", hidden=hidden
    )

    out = layer(*inputs, **options)
    report = gradcheck(layer, *inputs, **options)

    assert not any(name.endswith("bias") for name in layer.state_dict())
    num_heads = 1 if kind == "single" else H
    assert_close(out, expected_output(layer, kind, inputs, options, num_heads), name=kind)
    assert_gradcheck(report)


@pytest.mark.parametrize("shape", [(2, 5, 12), (1, 3, 4)], ids=str)
def test_single_head(rng, shape):
    """One head of width C // 4, bidirectional, no dropout even in train mode."""
    b, n, hidden = shape
    layer = make_layer("single", train=True, hidden=hidden)
    x = rng.standard_normal((b, n, hidden))

    out = layer(x)
    report = gradcheck(layer, x)

    assert_close(out, expected_output(layer, "single", (x,), {}, num_heads=1), name="single")
    assert_gradcheck(report)


# -- masks, dropout and dtypes ----------------------------------------------------------------


@pytest.mark.parametrize("kind", MULTI_HEAD)
def test_fully_padded_element_outputs_wo_bias_and_gets_zero_gradient(rng, kind):
    layer = make_layer(kind)
    inputs, options = inputs_and_options(rng, kind, padding=True, train=False)
    dout = rng.standard_normal((B, N, C))

    out = layer(*inputs, **options)
    grads = layer.backward(dout)

    grads = grads if isinstance(grads, tuple) else (grads,)
    np.testing.assert_array_equal(out[-1], np.broadcast_to(layer.Wo.bias, (N, C)))
    assert np.all(np.isfinite(out))
    for grad in grads:
        np.testing.assert_array_equal(grad[-1], 0.0)
        assert np.all(np.isfinite(grad))
    assert all(np.all(np.isfinite(g)) for g in layer.named_grads().values())


@pytest.mark.parametrize("kind", MULTI_HEAD)
def test_train_without_masks_draws_from_the_layer_generator(rng, kind):
    inputs, _ = inputs_and_options(rng, kind, padding=False, train=False)

    first = make_layer(kind, train=True)(*inputs)
    second = make_layer(kind, train=True)(*inputs)
    evaluated = make_layer(kind)(*inputs)

    np.testing.assert_array_equal(first, second)
    assert np.any(first != evaluated)
    assert np.count_nonzero(first == 0) > 0  # output dropout zeroed some entries


@pytest.mark.parametrize("kind", MULTI_HEAD + ("single",))
def test_float32_in_float32_out(rng, kind):
    hidden = 8 if kind == "single" else C
    layer64 = make_layer(kind, hidden=hidden)
    layer32 = make_layer(kind, hidden=hidden).astype(np.float32)
    inputs, options = inputs_and_options(rng, kind, padding=False, train=False, hidden=hidden)
    inputs32 = tuple(t.astype(np.float32) for t in inputs)
    dout = rng.standard_normal((B, N, hidden))

    out32 = layer32(*inputs32, **options)
    grads32 = layer32.backward(dout.astype(np.float32))
    out64 = layer64(*inputs, **options)
    grads64 = layer64.backward(dout)

    grads32 = grads32 if isinstance(grads32, tuple) else (grads32,)
    grads64 = grads64 if isinstance(grads64, tuple) else (grads64,)
    assert out32.dtype == np.float32
    assert_close(out32, out64, dtype=np.float32, name="out")
    for index, (g32, g64) in enumerate(zip(grads32, grads64, strict=True)):
        assert g32.dtype == np.float32
        assert_close(g32, g64, dtype=np.float32, name=f"input{index}")
    for name, grad in layer32.named_grads().items():
        assert grad.dtype == np.float32
        assert_close(grad, layer64.named_grads()[name], dtype=np.float32, name=name)


# -- parameters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (
            "single",
            {"Wqkv.weight": (6, 8), "Wqkv.bias": (6,), "Wo.weight": (8, 2), "Wo.bias": (8,)},
        ),
        (
            "causal",
            {"Wqkv.weight": (18, 6), "Wqkv.bias": (18,), "Wo.weight": (6, 6), "Wo.bias": (6,)},
        ),
        (
            "cross",
            {
                "Wq.weight": (6, 6),
                "Wq.bias": (6,),
                "Wkv.weight": (12, 6),
                "Wkv.bias": (12,),
                "Wo.weight": (6, 6),
                "Wo.bias": (6,),
            },
        ),
    ],
)
def test_state_dict_keys_shapes_and_default_dtype(kind, expected):
    hidden = 8 if kind == "single" else C
    layer = make_layer(kind, hidden=hidden).astype(np.float32)

    state = layer.state_dict()

    assert {name: value.shape for name, value in state.items()} == expected
    assert list(state) == list(expected)
    assert all(value.dtype == np.float32 for value in state.values())


def test_parameters_drawn_like_linear_in_creation_order():
    layer = CrossAttention(C, H, rng=7)
    rng = np.random.default_rng(7)

    bound = 1 / np.sqrt(C)
    for name, rows in (("Wq", C), ("Wkv", 2 * C), ("Wo", C)):
        weight = rng.uniform(-bound, bound, (rows, C)).astype(np.float32)
        bias = rng.uniform(-bound, bound, rows).astype(np.float32)
        np.testing.assert_array_equal(layer.state_dict()[f"{name}.weight"], weight)
        np.testing.assert_array_equal(layer.state_dict()[f"{name}.bias"], bias)


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: SingleHeadAttention(10), ValueError, "multiple of 4"),
        (lambda: SingleHeadAttention(0), ValueError, "hidden_size"),
        (lambda: BidirectionalAttention(6, 4), ValueError, "divisible"),
        (lambda: CausalSelfAttention(6, 4, 8), ValueError, "divisible"),
        (lambda: CrossAttention(6, 4), ValueError, "divisible"),
        (lambda: CausalSelfAttention(6, 3, 0), ValueError, "context_size"),
        (lambda: BidirectionalAttention(6, 0), ValueError, "num_heads"),
        (lambda: BidirectionalAttention(6.0, 3), TypeError, "hidden_size"),
        (lambda: BidirectionalAttention(6, 3, attn_drop=1.0), ValueError, "attn_drop"),
        (lambda: CausalSelfAttention(6, 3, 8, out_drop=-0.1), ValueError, "out_drop"),
        (lambda: CrossAttention(6, 3, attn_drop=1.5), ValueError, "attn_drop"),
        (lambda: CrossAttention(6, 3, causal="no"), TypeError, "causal"),
    ],
)
def test_constructor_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


def _self_call(layer, rng, **change):
    kwargs = {"x": rng.standard_normal((B, N, C)), **change}
    return layer(kwargs.pop("x"), **kwargs)


SELF_CALL_ERRORS = [
    ({"x": np.zeros((N, C))}, ValueError, r"rank 3.*\(5, 6\)"),
    ({"x": np.zeros((B, N, C + 1))}, ValueError, "last axis 7"),
    ({"x": np.zeros((B, N, C), dtype=np.int64)}, TypeError, "floating"),
    ({"x": np.zeros((B, N, C), dtype=np.float32)}, TypeError, "float32.*float64"),
    ({"mask": np.zeros((B, N), dtype=np.int64)}, TypeError, "mask must be a bool"),
    ({"mask": np.zeros((B, N + 1), dtype=bool)}, ValueError, r"\(B, M\) = \(2, 5\)"),
    ({"attn_dropout_mask": np.ones((B, N, N), dtype=bool)}, ValueError, r"\(2, 3, 5, 5\)"),
    ({"attn_dropout_mask": np.ones((B, H, N, N))}, TypeError, "attn_dropout_mask must be a bool"),
    ({"out_dropout_mask": np.ones((B, N, 1), dtype=bool)}, ValueError, r"\(2, 5, 6\)"),
]


@pytest.mark.parametrize("kind", ["bidirectional", "causal"])
@pytest.mark.parametrize(("change", "error", "match"), SELF_CALL_ERRORS)
def test_self_forward_errors(rng, kind, change, error, match):
    layer = make_layer(kind, train=True)

    with pytest.raises(error, match=match):
        _self_call(layer, rng, **change)


@pytest.mark.parametrize("name", ["attn_dropout_mask", "out_dropout_mask"])
def test_keep_mask_in_eval_mode_or_with_zero_probability_raises(rng, name):
    shape = (B, H, N, N) if name == "attn_dropout_mask" else (B, N, C)
    keep = np.ones(shape, dtype=bool)
    zero_p = BidirectionalAttention(C, H, attn_drop=0.0, out_drop=0.0, rng=1).astype(np.float64)

    with pytest.raises(ValueError, match="eval mode"):
        _self_call(make_layer("bidirectional"), rng, **{name: keep})
    with pytest.raises(ValueError, match="probability is 0"):
        _self_call(zero_p, rng, **{name: keep})


def test_causal_rejects_sequences_longer_than_context(rng):
    layer = make_layer("causal")

    with pytest.raises(ValueError, match="N = 9.*context_size is 8"):
        layer(rng.standard_normal((B, CONTEXT + 1, C)))


@pytest.mark.parametrize("name", ["attn_dropout_mask", "out_dropout_mask"])
def test_single_head_has_no_dropout_so_masks_are_refused(rng, name):
    layer = make_layer("single", train=True, hidden=8)

    with pytest.raises(ValueError, match=f"no dropout, so {name}"):
        layer(rng.standard_normal((B, N, 8)), **{name: np.ones((B, 1, N, N), dtype=bool)})


@pytest.mark.parametrize(
    ("y_shape", "options", "error", "match"),
    [
        ((B + 1, M, C), {}, ValueError, "share the batch"),
        ((B, M, C + 2), {}, ValueError, "last axis 8"),
        ((B, M, C), {"mask": np.zeros((B, N), dtype=bool)}, ValueError, r"\(2, 7\)"),
        (
            (B, M, C),
            {"attn_dropout_mask": np.ones((B, H, N, N), dtype=bool)},
            ValueError,
            r"\(2, 3, 5, 7\)",
        ),
    ],
)
def test_cross_forward_errors(rng, y_shape, options, error, match):
    layer = make_layer("cross", train=True)

    with pytest.raises(error, match=match):
        layer(rng.standard_normal((B, N, C)), rng.standard_normal(y_shape), **options)


@pytest.mark.parametrize("kind", MULTI_HEAD)
def test_backward_needs_a_forward_and_the_output_shape(rng, kind):
    layer = make_layer(kind)
    inputs, _ = inputs_and_options(rng, kind, padding=False, train=False)

    with pytest.raises(RuntimeError, match="forward first"):
        layer.backward(np.zeros((B, N, C)))
    layer(*inputs)
    with pytest.raises(ValueError, match=r"output's shape \(2, 5, 6\)"):
        layer.backward(np.zeros((B, N, C + 1)))
