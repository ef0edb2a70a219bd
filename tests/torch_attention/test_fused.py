"""torch_attention.fused, the fused-QKV family: the NumPy twins' state dicts and outputs, keys
that are all gone, and the same validation errors as NumPy.

Gradients of the layers against the NumPy backwards belong to the parity registry
(tests/parity/), not here.
"""

from __future__ import annotations

import pytest
import torch

from . import twins
from .twins import BACKENDS, LAYERS, as_torch, forward_inputs, normal, ones, torch_layer

FUSED_LAYERS = twins.family("fused")


@pytest.mark.parametrize("name", FUSED_LAYERS)
def test_state_dict_matches_the_numpy_twin(name):
    twins.assert_state_dict_matches_the_numpy_twin(name)


@pytest.mark.parametrize("name", FUSED_LAYERS)
def test_unknown_backend_is_a_value_error(name):
    with pytest.raises(ValueError, match="backend must be one of"):
        torch_layer(name, *LAYERS[name][1], backend="flash")


# -- the NumPy twins' outputs -----------------------------------------------------------------


@pytest.mark.parametrize("backend", ["auto", "math", "manual"])
@pytest.mark.parametrize("name", FUSED_LAYERS)
def test_loaded_float64_layer_with_keep_masks_computes_what_numpy_computes(rng, backend, name):
    twins.assert_train_forward_matches_numpy(rng, backend, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FUSED_LAYERS)
def test_loaded_float64_layer_in_eval_mode_computes_what_numpy_computes(rng, backend, name):
    twins.assert_eval_forward_matches_numpy(rng, backend, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["BidirectionalAttention", "CrossAttention"])
def test_train_mode_without_masks_draws_dropout(rng, backend, name):
    twins.assert_train_mode_draws_dropout(rng, backend, name)


def test_sdpa_layer_refuses_an_explicit_keep_mask(rng):
    layer = torch_layer("BidirectionalAttention", 12, 3, backend="sdpa")
    inputs, masks = forward_inputs(rng, "BidirectionalAttention")

    with pytest.raises(ValueError, match="backend='sdpa' cannot compute .* explicit dropout_mask"):
        layer.double()(*map(as_torch, inputs), **{key: as_torch(v) for key, v in masks.items()})


# -- edge rules -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_cross_attention_to_no_keys_is_the_output_projections_bias(backend, causal):
    """M = 0: the attention output is 0, so the layer returns Wo(0) = Wo.bias on every row."""
    layer = torch_layer("CrossAttention", 12, 3, 0.0, 0.0, True, causal, backend=backend)

    out = layer(torch.randn(2, 5, 12), torch.randn(2, 0, 12))

    assert torch.equal(out, layer.Wo.bias.detach().expand(2, 5, 12))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["SingleHeadAttention", "CausalSelfAttention"])
def test_an_empty_sequence_gives_an_empty_output(backend, name):
    layer = torch_layer(name, *LAYERS[name][1], backend=backend)

    out = layer(torch.ones(2, 0, LAYERS[name][1][0]))

    assert out.shape == (2, 0, LAYERS[name][1][0])


@pytest.mark.parametrize("causal", ["no", 1, None])
def test_cross_attentions_causal_flag_must_be_a_bool(causal):
    with pytest.raises(TypeError, match="causal must be a bool"):
        torch_layer("CrossAttention", 12, 3, 0.1, 0.1, True, causal)


# -- validation: the same errors as NumPy -----------------------------------------------------

# name -> (layer, constructor args, error, message regex)
BAD_CONSTRUCTION = {
    "hidden % num_heads": ("BidirectionalAttention", (10, 3), ValueError, "divisible"),
    "hidden % 4": ("SingleHeadAttention", (10,), ValueError, "multiple of 4"),
    "attn_drop 1.0": ("CrossAttention", (12, 3, 1.0), ValueError, "attn_drop"),
    "context_size str": ("CausalSelfAttention", (12, 3, "9"), TypeError, "context_size"),
    "num_heads 0": ("CrossAttention", (12, 0), ValueError, "num_heads"),
}

# name -> (layer, constructor args, train mode, forward args, forward keywords, error, regex)
BAD_FORWARD = {
    "N > context_size": (
        "CausalSelfAttention", (12, 3, 6), False, (normal(2, 7, 12),), {},
        ValueError, "context_size",
    ),
    "x of wrong width": (
        "CrossAttention", (12, 3), False, (normal(2, 7, 11), normal(2, 5, 12)), {},
        ValueError, "last axis",
    ),
    "x and y batches": (
        "CrossAttention", (12, 3), False, (normal(2, 7, 12), normal(3, 5, 12)), {},
        ValueError, "batch",
    ),
    "float out mask": (
        "BidirectionalAttention", (12, 3), True, (normal(2, 7, 12),),
        {"out_dropout_mask": ones(2, 7, 12, dtype="float32")}, TypeError, "out_dropout_mask",
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
    twins.assert_construction_raises_like_numpy(*BAD_CONSTRUCTION[bad])


@pytest.mark.parametrize("bad", BAD_FORWARD)
def test_bad_forward_raises_like_numpy(bad):
    twins.assert_forward_raises_like_numpy(*BAD_FORWARD[bad])
