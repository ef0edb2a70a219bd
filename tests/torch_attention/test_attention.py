"""torch_attention.attention, the book family: the NumPy twins' state dicts and outputs, the
book's numbers, empty sequences, the causal buffer, and the same validation errors as NumPy.

Gradients of the layers against the NumPy backwards belong to the parity registry
(tests/parity/), not here.
"""

from __future__ import annotations

import pytest
import torch

from . import twins
from .twins import BACKENDS, LAYERS, normal, ones, torch_layer

BOOK_LAYERS = twins.family("attention")


@pytest.mark.parametrize("name", BOOK_LAYERS)
def test_state_dict_matches_the_numpy_twin(name):
    twins.assert_state_dict_matches_the_numpy_twin(name)


@pytest.mark.parametrize("name", ["CausalAttention", "MultiHeadAttention"])
def test_causal_buffer_is_the_books(name):
    layer = torch_layer(name, *LAYERS[name][1])

    assert torch.equal(layer.mask, torch.triu(torch.ones(9, 9), diagonal=1))


@pytest.mark.parametrize("name", BOOK_LAYERS)
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


# -- the NumPy twins' outputs -----------------------------------------------------------------


@pytest.mark.parametrize("backend", ["auto", "math", "manual"])
@pytest.mark.parametrize("name", BOOK_LAYERS)
def test_loaded_float64_layer_with_keep_masks_computes_what_numpy_computes(rng, backend, name):
    twins.assert_train_forward_matches_numpy(rng, backend, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BOOK_LAYERS)
def test_loaded_float64_layer_in_eval_mode_computes_what_numpy_computes(rng, backend, name):
    twins.assert_eval_forward_matches_numpy(rng, backend, name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_mode_without_masks_draws_dropout(rng, backend):
    twins.assert_train_mode_draws_dropout(rng, backend, "CausalAttention")


# -- edge rules -------------------------------------------------------------------------------

# name -> (an input with N = 0, the output shape)
EMPTY = {
    "SimpleSelfAttention": (torch.ones(0, 4), (0, 4)),
    "SelfAttentionV1": (torch.ones(2, 0, 5), (2, 0, 4)),
    "SelfAttentionV2": (torch.ones(0, 5), (0, 4)),
    "CausalAttention": (torch.ones(2, 0, 5), (2, 0, 4)),
    "MultiHeadAttentionWrapper": (torch.ones(2, 0, 5), (2, 0, 12)),
    "MultiHeadAttention": (torch.ones(2, 0, 5), (2, 0, 6)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", EMPTY)
def test_an_empty_sequence_gives_an_empty_output(backend, name):
    x, shape = EMPTY[name]
    layer = torch_layer(name, *LAYERS[name][1], backend=backend)

    out = layer(x)

    assert out.shape == shape


@pytest.mark.parametrize("name", ["CausalAttention", "MultiHeadAttention"])
def test_loading_a_mask_buffer_with_a_hole_is_a_value_error(name):
    layer = torch_layer(name, *LAYERS[name][1])
    state = layer.state_dict()
    state["mask"] = state["mask"].clone()
    state["mask"][2, 5] = 0.0  # query 2 would see key 5

    with pytest.raises(ValueError, match="mask is not the causal buffer"):
        layer.load_state_dict(state)


def test_the_wrapper_checks_the_mask_buffer_of_every_head():
    layer = torch_layer("MultiHeadAttentionWrapper", *LAYERS["MultiHeadAttentionWrapper"][1])
    state = layer.state_dict()
    state["heads.1.mask"] = torch.zeros(9, 9)

    with pytest.raises(ValueError, match="heads.1.mask is not the causal buffer"):
        layer.load_state_dict(state)


def test_a_refused_head_mask_leaves_every_head_unchanged():
    layer = torch_layer("MultiHeadAttentionWrapper", *LAYERS["MultiHeadAttentionWrapper"][1])
    before = {key: value.clone() for key, value in layer.state_dict().items()}
    state = {key: value if key.endswith("mask") else value + 1 for key, value in before.items()}
    state["heads.1.mask"] = torch.zeros(9, 9)  # head 0 comes first: it must not load either

    with pytest.raises(ValueError, match="heads.1.mask"):
        layer.load_state_dict(state)

    for key, value in layer.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize("name", ["CausalAttention", "MultiHeadAttention"])
def test_a_complex_mask_is_a_type_error_before_its_check_like_numpy(name):
    layer = torch_layer(name, *LAYERS[name][1])
    state = layer.state_dict()
    state["mask"] = torch.zeros(9, 9, dtype=torch.complex64)  # complex and not causal either

    with pytest.raises(TypeError, match="'mask' has dtype (torch.)?complex64"):
        twins.numpy_layer(name, *LAYERS[name][1], seed=0).load_state_dict(state)
    with pytest.raises(TypeError, match="'mask' has dtype (torch.)?complex64"):
        layer.load_state_dict(state)


# -- validation: the same errors as NumPy -----------------------------------------------------

# name -> (layer, constructor args, error, message regex)
BAD_CONSTRUCTION = {
    "d_out % num_heads": ("MultiHeadAttention", (5, 4, 9, 0.0, 3), ValueError, "divisible"),
    "dropout 1.0": ("CausalAttention", (5, 4, 9, 1.0), ValueError, "dropout"),
    "d_out 0": ("SelfAttentionV1", (5, 0), ValueError, "d_out"),
    "num_heads float": ("MultiHeadAttentionWrapper", (5, 4, 9, 0.0, 2.0), TypeError, "num_heads"),
}

# name -> (layer, constructor args, train mode, forward args, forward keywords, error, regex)
BAD_FORWARD = {
    "N > context_length": (
        "CausalAttention", (5, 4, 6, 0.0), True, (normal(2, 7, 5),), {},
        ValueError, "context_length",
    ),
    "x of another dtype": (
        "CausalAttention", (5, 4, 9, 0.0), True, (normal(2, 7, 5, dtype="float64"),), {},
        TypeError, "dtype",
    ),
    "x of rank 4": (
        "SelfAttentionV2", (5, 4), True, (normal(1, 2, 7, 5),), {}, ValueError, "rank",
    ),
    "x of rank 2": (
        "MultiHeadAttention", (5, 6, 9, 0.0, 3), True, (normal(7, 5),), {}, ValueError, "rank",
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
}  # fmt: skip


@pytest.mark.parametrize("bad", BAD_CONSTRUCTION)
def test_bad_construction_raises_like_numpy(bad):
    twins.assert_construction_raises_like_numpy(*BAD_CONSTRUCTION[bad])


@pytest.mark.parametrize("bad", BAD_FORWARD)
def test_bad_forward_raises_like_numpy(bad):
    twins.assert_forward_raises_like_numpy(*BAD_FORWARD[bad])
