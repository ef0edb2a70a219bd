"""State-dict layout converters (numpy_attention.convert): exact round trips, converted layers that
compute the same outputs and gradients (gradients mapped through the same converter), the torch
``nn.MultiheadAttention`` and GPT-2 layouts checked against torch, and errors. The .npz files are
tested with numpy_attention.state, in test_state.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numpy_attention import convert
from numpy_attention.attention import (
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
)
from numpy_attention.fused import BidirectionalAttention, CausalSelfAttention, CrossAttention
from parity_tests.tolerances import structural_floors

from ..conftest import assert_close, to_numpy, to_torch

B, N, M, C, H = 2, 5, 7, 6, 3
CONTEXT = 8
P = 0.3


def run(layer, inputs, dout, **options):
    """Forward, then backward with ``dout``: (out, input gradients as a tuple)."""
    out = layer(*inputs, **options)
    grads = layer.backward(dout)
    return out, grads if isinstance(grads, tuple) else (grads,)


def assert_same_state(actual, expected):
    """Same keys, and every array identical in value, shape and dtype."""
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def assert_fresh(result, *sources):
    """A converter gives new C-contiguous arrays that share no memory with its input."""
    for name, value in result.items():
        assert isinstance(value, np.ndarray) and value.flags.c_contiguous, name
        for source in sources:
            for original in source.values():
                assert not np.shares_memory(value, original), name


def fused_layer(kind, *, bias=True, attn_drop=0.0, train=False, seed=1):
    if kind == "self":
        layer = CausalSelfAttention(C, H, CONTEXT, attn_drop, 0.0, bias, rng=seed)
    elif kind == "bidirectional":
        layer = BidirectionalAttention(C, H, attn_drop, 0.0, bias, rng=seed)
    else:
        layer = CrossAttention(C, H, attn_drop, 0.0, bias, causal=kind == "causal_cross", rng=seed)
    return layer.astype(np.float64).train(train)


# -- the book's transfers ---------------------------------------------------------------------


def test_v2_to_v1_gives_the_same_layer_and_maps_gradients(rng):
    v2 = SelfAttentionV2(5, 3, rng=1).astype(np.float64)
    v1 = SelfAttentionV1(5, 3, rng=2).astype(np.float64)
    v1.load_state_dict(convert.v1_from_v2(v2.state_dict()))
    x = rng.standard_normal((B, N, 5))
    dout = rng.standard_normal((B, N, 3))

    out1, (dx1,) = run(v1, (x,), dout)
    out2, (dx2,) = run(v2, (x,), dout)

    assert_close(out1, out2, name="out")
    assert_close(dx1, dx2, name="dx")
    mapped = convert.v1_from_v2(v2.named_grads())
    for name, grad in v1.named_grads().items():
        assert_close(mapped[name], grad, name=name)


def test_v1_v2_round_trips_are_exact():
    v1 = SelfAttentionV1(5, 3, rng=1).state_dict()
    v2 = SelfAttentionV2(5, 3, rng=2).state_dict()

    v2_again = convert.v2_from_v1(convert.v1_from_v2(v2))
    v1_again = convert.v1_from_v2(convert.v2_from_v1(v1))

    assert_same_state(v2_again, v2)
    assert_same_state(v1_again, v1)
    assert_fresh(convert.v1_from_v2(v2), v2)
    assert_fresh(convert.v2_from_v1(v1), v1)


def test_v1_from_v2_refuses_to_drop_a_nonzero_bias():
    state = SelfAttentionV2(5, 3, qkv_bias=True, rng=1).state_dict()
    zero_bias = {k: (np.zeros_like(v) if k.endswith("bias") else v) for k, v in state.items()}

    with pytest.raises(ValueError, match="W_query.bias is non-zero"):
        convert.v1_from_v2(state)
    assert sorted(convert.v1_from_v2(zero_bias)) == ["W_key", "W_query", "W_value"]


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("train", [False, True])
def test_wrapper_to_mha_gives_the_same_layer_and_maps_gradients(rng, qkv_bias, train):
    wrapper = MultiHeadAttentionWrapper(5, 2, CONTEXT, P, H, qkv_bias, rng=1).astype(np.float64)
    mha = MultiHeadAttention(5, 2 * H, CONTEXT, P, H, qkv_bias, rng=2).astype(np.float64)
    mha.load_state_dict(convert.mha_from_wrapper(wrapper.state_dict(), H))
    wrapper.train(train)
    mha.train(train)
    options = {"attn_dropout_mask": rng.random((B, H, N, N)) >= P} if train else {}
    x = rng.standard_normal((B, N, 5))
    dout = rng.standard_normal((B, N, 2 * H))

    out_mha, (dx_mha,) = run(mha, (x,), dout, **options)
    out_wrapper, (dx_wrapper,) = run(wrapper, (x,), dout, **options)

    assert_close(out_mha, out_wrapper, name="out")
    assert_close(dx_mha, dx_wrapper, name="dx")
    mapped = convert.mha_from_wrapper(wrapper.named_grads(), H)
    grads = mha.named_grads()
    floors = structural_floors(grads, one_key=False)  # the key bias: 0 by cancellation
    for name in mapped:
        if not name.startswith("W_"):
            continue  # out_proj is the wrapper's fixed identity, not a gradient
        assert_close(mapped[name], grads[name], name=name, scale=floors.get(name, 0.0))
    np.testing.assert_array_equal(mha.out_proj.weight, np.eye(2 * H))


@pytest.mark.parametrize("train", [False, True])
def test_book_mha_to_causal_self_attention_maps_outputs_and_gradients(rng, train):
    mha = MultiHeadAttention(C, C, CONTEXT, P, H, qkv_bias=True, rng=1).astype(np.float64)
    fused = fused_layer("self", attn_drop=P, seed=2)
    fused.load_state_dict(convert.fused_from_separate(mha.state_dict()))
    mha.train(train)
    fused.train(train)
    options = {"attn_dropout_mask": rng.random((B, H, N, N)) >= P} if train else {}
    x = rng.standard_normal((B, N, C))
    dout = rng.standard_normal((B, N, C))

    out_fused, (dx_fused,) = run(fused, (x,), dout, **options)
    out_mha, (dx_mha,) = run(mha, (x,), dout, **options)

    assert_close(out_fused, out_mha, name="out")
    assert_close(dx_fused, dx_mha, name="dx")
    mapped = convert.fused_from_separate(mha.named_grads())
    for name, grad in fused.named_grads().items():
        assert_close(grad, mapped[name], name=name)


@pytest.mark.parametrize("kind", ["self", "causal_cross"])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_to_book_mha_for_self_and_cross_layouts(rng, kind, bias):
    """CrossAttention(x, x) with causal=True is the book's layer on x: dx_book = dx + dy."""
    fused = fused_layer(kind, bias=bias)
    mha = MultiHeadAttention(C, C, CONTEXT, 0.0, H, qkv_bias=bias, rng=2).astype(np.float64)
    separate = convert.separate_from_fused(fused.state_dict(), context_length=CONTEXT)
    mha.load_state_dict(separate)
    x = rng.standard_normal((B, N, C))
    dout = rng.standard_normal((B, N, C))
    inputs = (x, x) if kind == "causal_cross" else (x,)

    out_fused, grads_fused = run(fused, inputs, dout)
    out_mha, (dx_mha,) = run(mha, (x,), dout)

    assert_close(out_fused, out_mha, name="out")
    assert_close(sum(grads_fused), dx_mha, name="dx")
    mapped = convert.fused_from_separate(mha.named_grads(), cross=kind == "causal_cross")
    for name, grad in fused.named_grads().items():
        assert_close(grad, mapped[name], name=name)
    if not bias:
        np.testing.assert_array_equal(separate["out_proj.bias"], 0.0)


# -- exact round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_torch_mha_round_trip_is_exact(kind, bias):
    fused = fused_layer(kind, bias=bias).state_dict()

    mha = convert.torch_mha_from_fused(fused)
    again = convert.fused_from_torch_mha(mha, cross=kind == "cross")

    expected = {"in_proj_weight": (3 * C, C), "out_proj.weight": (C, C)}
    if bias:
        expected.update({"in_proj_bias": (3 * C,), "out_proj.bias": (C,)})
    assert {name: value.shape for name, value in mha.items()} == expected
    assert_same_state(again, fused)
    assert list(again) == list(fused)
    assert_fresh(mha, fused)
    assert_fresh(again, mha)


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_fused_gpt2_round_trip_is_exact(kind):
    fused = fused_layer(kind).state_dict()

    gpt2 = convert.gpt2_from_fused(fused)
    again = convert.fused_from_gpt2(gpt2)

    expected = {"c_attn.weight": (C, 3 * C), "c_attn.bias": (3 * C,)}
    if kind == "cross":
        expected = {
            "q_attn.weight": (C, C),
            "q_attn.bias": (C,),
            "c_attn.weight": (C, 2 * C),
            "c_attn.bias": (2 * C,),
        }
    expected.update({"c_proj.weight": (C, C), "c_proj.bias": (C,)})
    assert {name: value.shape for name, value in gpt2.items()} == expected
    assert_same_state(again, fused)
    assert_same_state(convert.gpt2_from_fused(again), gpt2)
    assert_fresh(gpt2, fused)
    assert_fresh(again, gpt2)


def test_gpt2_fills_missing_biases_with_zeros():
    fused = fused_layer("self", bias=False).state_dict()

    gpt2 = convert.gpt2_from_fused(fused)

    np.testing.assert_array_equal(gpt2["c_attn.bias"], np.zeros(3 * C))
    np.testing.assert_array_equal(gpt2["c_proj.bias"], np.zeros(C))


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_separate_round_trips_are_exact(kind):
    fused = fused_layer(kind).state_dict()
    book = MultiHeadAttention(C, C, CONTEXT, 0.0, H, qkv_bias=True, rng=3).state_dict()

    fused_again = convert.fused_from_separate(
        convert.separate_from_fused(fused), cross=kind == "cross"
    )
    book_again = convert.separate_from_fused(
        convert.fused_from_separate(book, cross=kind == "cross"), context_length=CONTEXT
    )

    assert_same_state(fused_again, fused)
    assert_same_state(book_again, book)
    assert_fresh(convert.separate_from_fused(fused), fused)


def test_fused_from_separate_without_qkv_bias_fills_zeros():
    book = MultiHeadAttention(C, C, CONTEXT, 0.0, H, qkv_bias=False, rng=3).state_dict()

    fused = convert.fused_from_separate(book)

    np.testing.assert_array_equal(fused["Wqkv.bias"], np.zeros(3 * C, dtype=np.float32))
    np.testing.assert_array_equal(fused["Wo.bias"], book["out_proj.bias"])


# -- the torch and GPT-2 layouts, checked against torch ---------------------------------------


def torch_mha_call(module, x, y, *, causal, padding):
    """``nn.MultiheadAttention`` on x (queries) and y (keys and values), masks in its
    conventions: bool ``attn_mask`` True = NOT allowed, ``key_padding_mask`` True = padding."""
    n, m = x.shape[1], y.shape[1]
    attn_mask = torch.ones(n, m, dtype=torch.bool).triu(1) if causal else None
    out, _ = module(x, y, y, key_padding_mask=padding, attn_mask=attn_mask, need_weights=False)
    return out


@pytest.mark.parametrize("kind", ["bidirectional", "self", "cross", "causal_cross"])
@pytest.mark.parametrize("bias", [True, False])
def test_torch_mha_layout_matches_torch(rng, kind, bias):
    """Weights come from a torch module through fused_from_torch_mha (tensors in); outputs and
    gradients (torch's mapped through the same converter) agree; the reverse gives torch's."""
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(C, H, bias=bias, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.uniform_(-0.5, 0.5)
    cross = kind in ("cross", "causal_cross")
    layer = fused_layer(kind, bias=bias, seed=5)
    layer.load_state_dict(convert.fused_from_torch_mha(module.state_dict(), cross=cross))
    m = M if cross else N
    x, y = rng.standard_normal((B, N, C)), rng.standard_normal((B, m, C))
    padding = np.zeros((B, m), dtype=bool)
    padding[0, -2:] = True  # no fully masked row: nn.MultiheadAttention would give NaN there
    dout = rng.standard_normal((B, N, C))
    x_t = to_torch(x, requires_grad=True)
    y_t = to_torch(y, requires_grad=True) if cross else x_t

    out, grads = run(layer, (x, y) if cross else (x,), dout, mask=padding)
    out_t = torch_mha_call(
        module, x_t, y_t, causal=kind in ("self", "causal_cross"), padding=to_torch(padding)
    )
    out_t.backward(to_torch(dout))

    assert_close(out, out_t, name="out")
    assert_close(grads[0], x_t.grad, name="dx")
    if cross:
        assert_close(grads[1], y_t.grad, name="dy")
    torch_grads = {name: p.grad for name, p in module.named_parameters()}
    mapped = convert.fused_from_torch_mha(torch_grads, cross=cross)
    for name, grad in layer.named_grads().items():
        assert_close(grad, mapped[name], name=name)
    back = convert.torch_mha_from_fused(layer.state_dict())
    assert_same_state(back, {k: to_numpy(v) for k, v in module.state_dict().items()})


def gpt2_attention(state, x, y, num_heads, *, causal):
    """GPT-2's attention from its own layout, in torch: Conv1D is x @ W + b with W (in, out); the
    fused projection's columns are [q | k | v], each split into heads as (B, N, H, D)."""
    c = x.shape[-1]
    if "q_attn.weight" in state:
        q = x @ state["q_attn.weight"] + state["q_attn.bias"]
        k, v = (y @ state["c_attn.weight"] + state["c_attn.bias"]).split(c, dim=-1)
    else:
        q, k, v = (x @ state["c_attn.weight"] + state["c_attn.bias"]).split(c, dim=-1)

    def heads(t):
        return t.view(t.shape[0], t.shape[1], num_heads, c // num_heads).transpose(1, 2)

    out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=causal)
    merged = out.transpose(1, 2).reshape(x.shape)  # (B, H, N, D) -> (B, N, C)
    return merged @ state["c_proj.weight"] + state["c_proj.bias"]


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_gpt2_layout_matches_a_gpt2_forward(rng, kind):
    """A fused layer converted to GPT-2's layout runs GPT-2's attention to the same output, and
    the GPT-2 gradients mapped back with fused_from_gpt2 are the fused layer's gradients."""
    layer = fused_layer(kind)
    state = {
        name: to_torch(value, requires_grad=True)
        for name, value in convert.gpt2_from_fused(layer.state_dict()).items()
    }
    cross = kind == "cross"
    x, y = rng.standard_normal((B, N, C)), rng.standard_normal((B, M if cross else N, C))
    dout = rng.standard_normal((B, N, C))

    out, _ = run(layer, (x, y) if cross else (x,), dout)
    out_t = gpt2_attention(state, to_torch(x), to_torch(y if cross else x), H, causal=not cross)
    out_t.backward(to_torch(dout))

    assert_close(out, out_t, name="out")
    mapped = convert.fused_from_gpt2({name: t.grad for name, t in state.items()})
    for name, grad in layer.named_grads().items():
        assert_close(grad, mapped[name], name=name)


# -- errors -----------------------------------------------------------------------------------


def _fused_state():
    return fused_layer("self").state_dict()


def _book_state(**changes):
    state = MultiHeadAttention(C, C, CONTEXT, 0.0, H, qkv_bias=True, rng=3).state_dict()
    return {**state, **changes}


def _wrapper_state():
    return MultiHeadAttentionWrapper(5, 2, CONTEXT, 0.0, H, qkv_bias=True, rng=1).state_dict()


def _without(state, *names):
    return {k: v for k, v in state.items() if k not in names}


def _differing_masks():
    state = _wrapper_state()
    state["heads.1.mask"] = np.zeros_like(state["heads.1.mask"])
    return state


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: convert.v1_from_v2({"W_query.weight": np.eye(2)}), KeyError, "W_key.weight"),
        (lambda: convert.v2_from_v1({"W_query": np.eye(2)}), KeyError, "W_value"),
        (lambda: convert.separate_from_fused({}), KeyError, "Wqkv.weight"),
        (
            lambda: convert.separate_from_fused(_without(_fused_state(), "Wo.weight")),
            KeyError,
            "Wo.weight",
        ),
        (
            lambda: convert.fused_from_separate(_without(_book_state(), "W_key.bias")),
            KeyError,
            "W_key.bias",
        ),
        (lambda: convert.fused_from_separate(_book_state(extra=np.eye(2))), KeyError, "extra"),
        (lambda: convert.mha_from_wrapper(_wrapper_state(), H + 1), KeyError, "heads.3"),
        (lambda: convert.mha_from_wrapper(_wrapper_state(), H - 1), KeyError, "heads.2"),
        (
            lambda: convert.mha_from_wrapper(_without(_wrapper_state(), "heads.2.mask"), H),
            KeyError,
            "heads.2.mask",
        ),
        (lambda: convert.fused_from_torch_mha({"in_proj_weight": np.eye(3)}), KeyError, "out_proj"),
        (lambda: convert.fused_from_gpt2({"c_attn.weight": np.eye(3)}), KeyError, "c_proj.weight"),
    ],
)
def test_missing_and_unexpected_keys(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: convert.v2_from_v1(
                {
                    "W_query": np.zeros((3, 2)),
                    "W_key": np.zeros((3, 2)),
                    "W_value": np.zeros((2, 3)),
                }
            ),
            r"W_value has shape \(2, 3\), expected \(3, 2\)",
        ),
        (
            lambda: convert.fused_from_separate(_book_state(**{"W_key.weight": np.zeros((C, 4))})),
            r"W_key.weight has shape \(6, 4\)",
        ),
        (
            lambda: convert.fused_from_separate(
                {
                    k: np.zeros((C, 4)) if k.startswith("W_") and k.endswith("weight") else v
                    for k, v in _book_state().items()
                }
            ),
            r"C -> C, but W_query.weight is \(d_out, d_in\) = \(6, 4\)",
        ),
        (
            lambda: convert.fused_from_torch_mha(
                {"in_proj_weight": np.zeros((2 * C, C)), "out_proj.weight": np.zeros((C, C))}
            ),
            r"in_proj_weight has shape \(12, 6\), expected \(18, 6\)",
        ),
        (
            lambda: convert.fused_from_gpt2(
                {
                    "c_attn.weight": np.zeros((3 * C, C)),
                    "c_attn.bias": np.zeros(3 * C),
                    "c_proj.weight": np.zeros((C, C)),
                    "c_proj.bias": np.zeros(C),
                }
            ),
            r"c_attn.weight has shape \(18, 6\), expected \(6, 18\)",
        ),
        (
            lambda: convert.fused_from_separate(_book_state(mask=np.zeros((CONTEXT, CONTEXT)))),
            "not the causal buffer",
        ),
        (lambda: convert.mha_from_wrapper(_differing_masks(), H), "heads.1.mask differs"),
        (
            lambda: convert.fused_from_torch_mha(
                {**convert.torch_mha_from_fused(_fused_state()), "bias_k": np.zeros((1, 1, C))}
            ),
            "add_bias_kv",
        ),
        (
            lambda: convert.separate_from_fused(_fused_state(), context_length=0),
            "context_length",
        ),
        (lambda: convert.mha_from_wrapper(_wrapper_state(), 0), "num_heads"),
    ],
)
def test_inconsistent_shapes_and_lossy_conversions_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_integer_weights_raise_type_error():
    with pytest.raises(TypeError, match="W_query must be a floating-point"):
        convert.v2_from_v1(
            {name: np.zeros((3, 2), dtype=int) for name in ("W_query", "W_key", "W_value")}
        )


def test_gradient_dicts_without_buffers_convert(rng):
    wrapper = MultiHeadAttentionWrapper(5, 2, CONTEXT, 0.0, H, rng=1)
    book = MultiHeadAttention(C, C, CONTEXT, 0.0, H, rng=2)

    mha = convert.mha_from_wrapper(wrapper.named_grads(), H)
    fused = convert.fused_from_separate(book.named_grads())
    separate = convert.separate_from_fused(fused_layer("self").named_grads())

    assert "mask" not in mha and "mask" not in separate
    assert sorted(fused) == ["Wo.bias", "Wo.weight", "Wqkv.bias", "Wqkv.weight"]
