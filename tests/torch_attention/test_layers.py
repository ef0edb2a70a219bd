"""torch_attention's layers: the NumPy twins' state dicts, the book's numbers, weight transfer,
explicit dropout masks, and the same validation errors as NumPy.

Gradients of the layers against the NumPy backwards belong to the parity registry, not here.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import numpy_attention
import torch_attention
from torch_attention import from_numpy, to_numpy

from ..conftest import assert_close, to_torch

BACKENDS = ["auto", "sdpa", "math", "manual"]

# name -> (family, constructor args); small sizes, every option that changes the state dict on.
LAYERS = {
    "SimpleSelfAttention": ("attention", ()),
    "SelfAttentionV1": ("attention", (5, 4)),
    "SelfAttentionV2": ("attention", (5, 4, True)),
    "CausalAttention": ("attention", (5, 4, 9, 0.2, True)),
    "MultiHeadAttentionWrapper": ("attention", (5, 4, 9, 0.2, 3, True)),
    "MultiHeadAttention": ("attention", (5, 6, 9, 0.2, 3)),
    "SingleHeadAttention": ("fused", (8,)),
    "BidirectionalAttention": ("fused", (12, 3, 0.2, 0.3)),
    "CausalSelfAttention": ("fused", (12, 3, 9, 0.2, 0.3)),
    "CrossAttention": ("fused", (12, 3, 0.2, 0.3, True, True)),
}


def numpy_layer(name, *args, seed=None):
    """The NumPy twin; ``seed`` goes to ``rng=`` (SimpleSelfAttention has no weights to draw)."""
    layer = getattr(importlib.import_module(f"numpy_attention.{LAYERS[name][0]}"), name)
    return layer(*args) if seed is None or not LAYERS[name][1] else layer(*args, rng=seed)


def torch_layer(name, *args, **kwargs):
    family = importlib.import_module(f"torch_attention.{LAYERS[name][0]}")
    return getattr(family, name)(*args, **kwargs)


def forward_inputs(rng, name, b=2, n=7, m=5):
    """Float64 forward arguments for ``name`` in train mode, with every explicit keep-mask the
    layer takes (shared by both packages) and a padding mask that empties one batch element."""
    x = rng.standard_normal((b, n, 5 if LAYERS[name][0] == "attention" else 12))
    padding = np.zeros((b, n), dtype=bool)
    padding[-1] = True
    keep_out = rng.random((b, n, 12)) > 0.3
    if name in ("SimpleSelfAttention", "SelfAttentionV1", "SelfAttentionV2"):
        return (x,), {}
    if name == "CausalAttention":
        return (x,), {"attn_dropout_mask": rng.random((b, n, n)) > 0.2}
    if name in ("MultiHeadAttentionWrapper", "MultiHeadAttention"):
        return (x,), {"attn_dropout_mask": rng.random((b, 3, n, n)) > 0.2}
    if name == "SingleHeadAttention":
        return (rng.standard_normal((b, n, 8)),), {}
    if name == "CrossAttention":
        y = rng.standard_normal((b, m, 12))
        padding_y = np.zeros((b, m), dtype=bool)
        padding_y[0, -2:] = True
        keep_attn = rng.random((b, 3, n, m)) > 0.2
        masks = {"attn_dropout_mask": keep_attn, "out_dropout_mask": keep_out}
        return (x, y, padding_y), masks
    keep_attn = rng.random((b, 3, n, n)) > 0.2
    return (x, padding), {"attn_dropout_mask": keep_attn, "out_dropout_mask": keep_out}


def as_torch(value):
    return to_torch(value) if isinstance(value, np.ndarray) else value


# -- construction -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", LAYERS)
def test_state_dict_matches_the_numpy_twin(name):
    args = LAYERS[name][1]

    expected = numpy_layer(name, *args, seed=0).state_dict()
    actual = torch_layer(name, *args).state_dict()

    assert list(actual) == list(expected)
    assert [tuple(t.shape) for t in actual.values()] == [a.shape for a in expected.values()]
    assert all(t.dtype == torch.float32 for t in actual.values())


@pytest.mark.parametrize("name", ["CausalAttention", "MultiHeadAttention"])
def test_causal_buffer_is_the_books(name):
    layer = torch_layer(name, *LAYERS[name][1])

    assert torch.equal(layer.mask, torch.triu(torch.ones(9, 9), diagonal=1))


@pytest.mark.parametrize("name", LAYERS)
def test_unknown_backend_is_a_value_error(name):
    with pytest.raises(ValueError, match="backend must be one of"):
        torch_layer(name, *LAYERS[name][1], backend="flash")


# -- the book's numbers (chapter 3, printed to 4 decimals) ------------------------------------

INPUTS = [
    [0.43, 0.15, 0.89],  # Your
    [0.55, 0.87, 0.66],  # journey
    [0.57, 0.85, 0.64],  # starts
    [0.22, 0.58, 0.33],  # with
    [0.77, 0.25, 0.10],  # one
    [0.05, 0.80, 0.55],  # step
]
CAUSAL_ROWS = [
    [-0.4519, 0.2216],
    [-0.5874, 0.0058],
    [-0.6300, -0.0632],
    [-0.5675, -0.0843],
    [-0.5526, -0.0981],
    [-0.5299, -0.1081],
]
SECOND_HEAD_ROWS = [
    [0.4772, 0.1063],
    [0.5891, 0.3257],
    [0.6202, 0.3860],
    [0.5478, 0.3589],
    [0.5321, 0.3428],
    [0.5077, 0.3493],
]
# name -> (seed, constructor args, batched input, the output of one batch element)
BOOK = {
    "SimpleSelfAttention": (
        123,
        (),
        False,
        [
            [0.4421, 0.5931, 0.5790],
            [0.4419, 0.6515, 0.5683],
            [0.4431, 0.6496, 0.5671],
            [0.4304, 0.6298, 0.5510],
            [0.4671, 0.5910, 0.5266],
            [0.4177, 0.6503, 0.5645],
        ],
    ),
    "SelfAttentionV1": (
        123,
        (3, 2),
        False,
        [
            [0.2996, 0.8053],
            [0.3061, 0.8210],
            [0.3058, 0.8203],
            [0.2948, 0.7939],
            [0.2927, 0.7891],
            [0.2990, 0.8040],
        ],
    ),
    "SelfAttentionV2": (
        789,
        (3, 2),
        False,
        [
            [-0.0739, 0.0713],
            [-0.0748, 0.0703],
            [-0.0749, 0.0702],
            [-0.0760, 0.0685],
            [-0.0763, 0.0679],
            [-0.0754, 0.0693],
        ],
    ),
    "CausalAttention": (123, (3, 2, 6, 0.0), True, CAUSAL_ROWS),
    "MultiHeadAttentionWrapper": (
        123,
        (3, 2, 6, 0.0, 2),
        True,
        [a + b for a, b in zip(CAUSAL_ROWS, SECOND_HEAD_ROWS, strict=True)],
    ),
    "MultiHeadAttention": (
        123,
        (3, 2, 6, 0.0, 2),
        True,
        [
            [0.3190, 0.4858],
            [0.2943, 0.3897],
            [0.2856, 0.3593],
            [0.2693, 0.3873],
            [0.2639, 0.3928],
            [0.2575, 0.4028],
        ],
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BOOK)
def test_reproduces_the_books_numbers(backend, name):
    seed, args, batched, rows = BOOK[name]
    inputs = torch.tensor(INPUTS)
    x = torch.stack((inputs, inputs)) if batched else inputs
    torch.manual_seed(seed)
    layer = torch_layer(name, *args, backend=backend)

    with torch.no_grad():
        out = layer(x)

    # The book prints 4 decimals: rounding to them must give its table exactly.
    expected = torch.tensor(rows).expand(out.shape)
    assert torch.equal(out.round(decimals=4), expected)


# -- weight transfer --------------------------------------------------------------------------


@pytest.mark.parametrize("name", LAYERS)
def test_numpy_weights_round_trip_exactly(name):
    args = LAYERS[name][1]
    source = numpy_layer(name, *args, seed=1)
    layer = torch_layer(name, *args)

    from_numpy(layer, source.state_dict())
    state = to_numpy(layer)

    expected = source.state_dict()
    assert list(state) == list(expected)
    for key, value in expected.items():
        assert state[key].dtype == value.dtype, key
        assert np.array_equal(state[key], value), key


@pytest.mark.parametrize("backend", ["auto", "math", "manual"])
@pytest.mark.parametrize("name", LAYERS)
def test_loaded_float64_layer_with_keep_masks_computes_what_numpy_computes(rng, backend, name):
    args = LAYERS[name][1]
    source = numpy_layer(name, *args, seed=2).astype(np.float64)
    layer = from_numpy(torch_layer(name, *args, backend=backend).double(), source)
    inputs, masks = forward_inputs(rng, name)

    out = layer(*map(as_torch, inputs), **{key: as_torch(v) for key, v in masks.items()})

    assert out.dtype == torch.float64
    assert_close(out, source(*inputs, **masks), name=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", LAYERS)
def test_loaded_float64_layer_in_eval_mode_computes_what_numpy_computes(rng, backend, name):
    args = LAYERS[name][1]
    source = numpy_layer(name, *args, seed=2).astype(np.float64).eval()
    layer = from_numpy(torch_layer(name, *args, backend=backend).double(), source).eval()
    inputs, _ = forward_inputs(rng, name)

    out = layer(*map(as_torch, inputs))

    assert_close(out, source(*inputs), name=name)


def test_sdpa_layer_refuses_an_explicit_keep_mask(rng):
    layer = torch_layer("BidirectionalAttention", 12, 3, backend="sdpa")
    inputs, masks = forward_inputs(rng, "BidirectionalAttention")

    with pytest.raises(ValueError, match="cannot take an explicit dropout_mask"):
        layer.double()(*map(as_torch, inputs), **{key: as_torch(v) for key, v in masks.items()})


def test_from_numpy_keeps_the_modules_dtype():
    source = numpy_layer("MultiHeadAttention", *LAYERS["MultiHeadAttention"][1], seed=3)
    layer = torch_layer("MultiHeadAttention", *LAYERS["MultiHeadAttention"][1]).double()

    from_numpy(layer, source.state_dict())

    assert all(t.dtype == torch.float64 for t in layer.state_dict().values())
    assert np.array_equal(layer.out_proj.weight.detach().numpy(), source.out_proj.weight)


def test_from_numpy_names_missing_and_unexpected_keys():
    layer = torch_layer("SelfAttentionV2", 5, 4, True)
    state = numpy_layer("SelfAttentionV2", 5, 4, False, seed=0).state_dict()

    with pytest.raises(KeyError, match="W_query.bias"):
        from_numpy(layer, state)
    with pytest.raises(KeyError, match="extra"):
        from_numpy(layer, {**numpy_layer("SelfAttentionV2", 5, 4, True).state_dict(), "extra": 0})


def test_from_numpy_rejects_a_wrong_shape():
    layer = torch_layer("SelfAttentionV1", 5, 4)
    state = numpy_layer("SelfAttentionV1", 4, 5, seed=0).state_dict()

    with pytest.raises(ValueError, match="W_query"):
        from_numpy(layer, state)


# -- dropout ----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["CausalAttention", "BidirectionalAttention", "CrossAttention"])
def test_train_mode_without_masks_draws_dropout(rng, backend, name):
    inputs, _ = forward_inputs(rng, name)
    inputs = [to_torch(v.astype(np.float32) if v.dtype == np.float64 else v) for v in inputs]
    layer = torch_layer(name, *LAYERS[name][1], backend=backend)
    torch.manual_seed(5)
    dropped = layer(*inputs)

    torch.manual_seed(5)
    again = layer(*inputs)

    assert torch.equal(dropped, again)
    assert not torch.equal(dropped, layer.eval()(*inputs))


def test_dropout_layer_matches_numpy(rng):
    x = rng.standard_normal((2, 7, 12))
    keep = rng.random(x.shape) > 0.3

    out = torch_attention.Dropout(0.3)(to_torch(x), mask=to_torch(keep))

    assert_close(out, numpy_attention.Dropout(0.3)(x, mask=keep))


def test_dropout_layer_is_the_identity_in_eval_mode(rng):
    x = to_torch(rng.standard_normal((2, 7, 12)))

    assert torch.equal(torch_attention.Dropout(0.3).eval()(x), x)


# -- validation: the same errors as NumPy -----------------------------------------------------


def normal(*shape, dtype=np.float32):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def ones(*shape, dtype=bool):
    return np.ones(shape, dtype=dtype)


# name -> (layer, constructor args, error, message regex)
BAD_CONSTRUCTION = {
    "d_out % num_heads": ("MultiHeadAttention", (5, 4, 9, 0.0, 3), ValueError, "divisible"),
    "hidden % num_heads": ("BidirectionalAttention", (10, 3), ValueError, "divisible"),
    "hidden % 4": ("SingleHeadAttention", (10,), ValueError, "multiple of 4"),
    "dropout 1.0": ("CausalAttention", (5, 4, 9, 1.0), ValueError, "dropout"),
    "attn_drop 1.0": ("CrossAttention", (12, 3, 1.0), ValueError, "attn_drop"),
    "d_out 0": ("SelfAttentionV1", (5, 0), ValueError, "d_out"),
    "context_size str": ("CausalSelfAttention", (12, 3, "9"), TypeError, "context_size"),
}

# name -> (layer, constructor args, train mode, forward args, forward keywords, error, regex)
BAD_FORWARD = {
    "N > context_length": (
        "CausalAttention", (5, 4, 6, 0.0), True, (normal(2, 7, 5),), {},
        ValueError, "context_length",
    ),
    "N > context_size": (
        "CausalSelfAttention", (12, 3, 6), False, (normal(2, 7, 12),), {},
        ValueError, "context_size",
    ),
    "x of another dtype": (
        "CausalAttention", (5, 4, 9, 0.0), True, (normal(2, 7, 5, dtype=np.float64),), {},
        TypeError, "dtype",
    ),
    "x of rank 4": (
        "SelfAttentionV2", (5, 4), True, (normal(1, 2, 7, 5),), {}, ValueError, "rank",
    ),
    "x of rank 2": (
        "MultiHeadAttention", (5, 6, 9, 0.0, 3), True, (normal(7, 5),), {}, ValueError, "rank",
    ),
    "x of wrong width": (
        "CrossAttention", (12, 3), False, (normal(2, 7, 11), normal(2, 5, 12)), {},
        ValueError, "last axis",
    ),
    "x and y batches": (
        "CrossAttention", (12, 3), False, (normal(2, 7, 12), normal(3, 5, 12)), {},
        ValueError, "batch",
    ),
    "wrapper mask shape": (
        "MultiHeadAttentionWrapper", (5, 4, 9, 0.2, 3), True, (normal(2, 7, 5),),
        {"attn_dropout_mask": ones(2, 7, 7)}, ValueError, "attn_dropout_mask",
    ),
    "mask in eval mode": (
        "MultiHeadAttention", (5, 6, 9, 0.2, 3), False, (normal(2, 7, 5),),
        {"attn_dropout_mask": ones(2, 3, 7, 7)}, ValueError, "eval mode",
    ),
    "mask with dropout 0": (
        "CausalAttention", (5, 4, 9, 0.0), True, (normal(2, 7, 5),),
        {"attn_dropout_mask": ones(2, 7, 7)}, ValueError, "probability is 0",
    ),
    "float out mask": (
        "BidirectionalAttention", (12, 3), True, (normal(2, 7, 12),),
        {"out_dropout_mask": ones(2, 7, 12, dtype=np.float32)}, TypeError, "out_dropout_mask",
    ),
    "padding shape": (
        "BidirectionalAttention", (12, 3), False, (normal(2, 7, 12), ones(2, 6)), {},
        ValueError, "key padding mask",
    ),
    "single head mask": (
        "SingleHeadAttention", (8,), True, (normal(2, 7, 8),),
        {"out_dropout_mask": ones(2, 7, 8)}, ValueError, "no dropout",
    ),
}  # fmt: skip


@pytest.mark.parametrize("bad", BAD_CONSTRUCTION)
def test_bad_construction_raises_like_numpy(bad):
    name, args, error, match = BAD_CONSTRUCTION[bad]

    with pytest.raises(error, match=match):
        numpy_layer(name, *args)
    with pytest.raises(error, match=match):
        torch_layer(name, *args)


@pytest.mark.parametrize("bad", BAD_FORWARD)
def test_bad_forward_raises_like_numpy(bad):
    name, args, training, inputs, masks, error, match = BAD_FORWARD[bad]
    numpy_module = numpy_layer(name, *args).train(training)
    torch_module = torch_layer(name, *args).train(training)

    with pytest.raises(error, match=match):
        numpy_module(*inputs, **masks)
    with pytest.raises(error, match=match):
        torch_module(*map(as_torch, inputs), **{key: as_torch(v) for key, v in masks.items()})


def test_linear_refuses_another_dtype_like_numpy(rng):
    x = rng.standard_normal((2, 5))

    with pytest.raises(TypeError, match="dtype"):
        numpy_attention.Linear(5, 3)(x)
    with pytest.raises(TypeError, match="dtype"):
        torch_attention.Linear(5, 3)(to_torch(x))


def test_dropout_probability_one_is_refused_like_numpy():
    with pytest.raises(ValueError, match="p must be in"):
        numpy_attention.Dropout(1.0)
    with pytest.raises(ValueError, match="p must be in"):
        torch_attention.Dropout(1.0)
