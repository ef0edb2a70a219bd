"""Hugging Face as the real client of lightning attention: MiniMax's ``linear_attention`` layers,
converted by ``numpy_attention.convert.lightning_from_hf`` from the whole model's state dict,
against transformers' own ``MiniMaxLightningAttention`` in float64 within FLOAT64_RTOL, both
forms of the NumPy layer and the torch twin.

The model is built from a tiny random config in code (no download): hidden 32, 4 heads of width
8, three layers (``layer_types``: two lightning layers, 0 and 1, whose slopes differ through the
layer index, then a softmax one), ``block_size`` 4 (transformers' prefill crosses blocks, and the
layer's chunks are as long), float64 by ``from_config(..., dtype=torch.float64)``, so that the
slopes and decay tables transformers computes at init are float64 (a model built in float32 and
cast holds their float32 roundings: the last test measures what that costs). The attention's
weights are redrawn at a scale where the SiLU and the gate are neither flat nor saturated; the
norm's weights around 1. ``Float64Math`` (test_hf_models.py) turns MiniMaxRMSNorm's float32 cast
into float64.

As in test_hf_latent.py, the model runs with hooks on the attention module, which is then called
on a fresh input with the mask the model built, and differentiated (every parameter's gradient
and dx). Batch element 1 is left-padded by 3 tokens and (in the forward test) element 0
right-padded by 2, whose queries meet a state that is not zero: the model hands its lightning
layers the 2-D mask (``create_recurrent_attention_mask``), which zeroes the padded tokens' q, k
and v; the layer gets it as ``key_padding_mask``. Padded rows are exactly 0 on both sides, so
every row is compared.

Decoding runs the model with its ``MiniMaxCache``, prefill then one token at a time (transformers'
per-token recurrence), against the layer over a ``LinearStateCache`` or a
``PagedLinearStateCache`` fed the attention's own inputs; then the final states: transformers'
``linear_cache[layer_idx]`` (B, H, D, D) against the layer's cache.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
import torch

import torch_attention
import torch_attention.lightning
from numpy_attention import convert
from numpy_attention import linear_cache as np_cache
from parity_tests.tolerances import FLOAT64_RTOL, rel_error
from torch_attention import linear_cache as torch_cache

from ..conftest import SEED, assert_close, to_numpy, to_torch
from .test_hf_latent import float64_math

transformers = pytest.importorskip("transformers")
from transformers.models.minimax.modeling_minimax import MiniMaxCache  # noqa: E402

B, N, PREFILL, PAD = 2, 9, 6, 3  # batch, tokens, prefill length, left padding of element 1
RIGHT_PAD = 2  # right padding of element 0 in the forward test
C, H, D = 32, 4, 8  # hidden, heads, head width
CONFIG = {
    "hidden_size": C,
    "num_attention_heads": H,
    "num_key_value_heads": H,
    "head_dim": D,
    "num_hidden_layers": 3,
    "layer_types": ["linear_attention", "linear_attention", "full_attention"],
    "block_size": 4,
    "intermediate_size": 16,
    "num_local_experts": 2,
    "num_experts_per_tok": 1,
    "vocab_size": 11,
    "pad_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
}
LAYERS = (0, 1)


@functools.cache
def built(dtype: torch.dtype = torch.float64) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """The config (as the converter reads it), the base model built in ``dtype`` then float64,
    its attention weights redrawn, and its state dict."""
    torch.manual_seed(SEED)
    config = transformers.MiniMaxConfig(**CONFIG)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # grouped_mm has no float64
    model = transformers.AutoModel.from_config(config, dtype=dtype).double().eval()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if ".self_attn." in key:
                param.normal_(0.0, 1.5 / param.shape[1] ** 0.5 if param.ndim == 2 else 0.3)
                if key.endswith("self_attn.norm.weight"):
                    param.add_(1.0)
    return config.to_dict(), model, model.state_dict()


def convert_layer(layer_idx, package, form="chunk"):
    """The converted layer from the whole model's state dict; for "torch", the twin built from
    the NumPy layer's arguments and state."""
    config, _, state = built()
    layer = convert.lightning_from_hf(config, state, layer_idx, form=form)
    if package == "numpy":
        return layer
    twin = torch_attention.lightning.LightningAttention(**layer.constructor_args())
    return torch_attention.from_numpy(twin.double().eval(), layer)


def inputs(rng, right_pad=0):
    """inputs_embeds (B, N, C) and Hugging Face's attention_mask (1 = keep): element 1
    left-padded, element 0 right-padded by ``right_pad`` tokens."""
    embeds = torch.from_numpy(rng.standard_normal((B, N, C)))
    attention_mask = torch.ones(B, N, dtype=torch.long)
    attention_mask[1, :PAD] = 0
    attention_mask[0, N - right_pad :] = 0
    return embeds, attention_mask


def record_attention_calls(model, **model_kwargs):
    """Run the model; return each lightning layer's call keywords and output."""
    seen: dict[int, dict] = {i: {} for i in LAYERS}
    hooks = []
    for i in LAYERS:
        attention = model.layers[i].self_attn

        def before(module, args, kwargs, i=i):
            seen[i]["kwargs"] = dict(kwargs)

        def after(module, args, kwargs, output, i=i):
            seen[i]["out"] = output[0]

        hooks += [
            attention.register_forward_pre_hook(before, with_kwargs=True),
            attention.register_forward_hook(after, with_kwargs=True),
        ]
    try:
        with float64_math(), torch.no_grad():
            model(**model_kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


@functools.cache
def hf_forward(layer_idx: int) -> tuple[Any, ...]:
    """The attention called on a fresh input with the mask the model built, and differentiated:
    x, dout, key_padding_mask, out, dx and every parameter's gradient by name."""
    _, model, _ = built()
    rng = np.random.default_rng(SEED)
    embeds, attention_mask = inputs(rng, RIGHT_PAD)
    seen = record_attention_calls(model, inputs_embeds=embeds, attention_mask=attention_mask)
    mask = seen[layer_idx]["kwargs"]["attention_mask"]
    assert torch.equal(mask, attention_mask)  # the 2-D padding mask, as the layer reads it
    x = rng.standard_normal((B, N, C))
    dout = rng.standard_normal(x.shape)
    x_t = to_torch(x, requires_grad=True)
    attention = model.layers[layer_idx].self_attn
    attention.zero_grad()
    with float64_math():
        out, _ = attention(hidden_states=x_t, position_embeddings=None, attention_mask=mask)
    out.backward(to_torch(dout))
    grads = {key: to_numpy(param.grad) for key, param in attention.named_parameters()}
    padding = to_numpy(mask) == 0
    return x, dout, padding, to_numpy(out), to_numpy(x_t.grad), grads


@functools.cache
def hf_decode() -> tuple[list, dict[int, np.ndarray]]:
    """The model decoding with its MiniMaxCache, prefill then one token at a time: per call and
    lightning layer (its input, its output), the padding of the call; the final states."""
    _, model, _ = built()
    embeds, attention_mask = inputs(np.random.default_rng(SEED))
    hf_cache = MiniMaxCache()
    steps = []
    for start, stop in [(0, PREFILL)] + [(i, i + 1) for i in range(PREFILL, N)]:
        seen = record_attention_calls(
            model, inputs_embeds=embeds[:, start:stop], attention_mask=attention_mask[:, :stop],
            past_key_values=hf_cache, use_cache=True,
        )  # fmt: skip
        calls = {i: (to_numpy(seen[i]["kwargs"]["hidden_states"]), to_numpy(seen[i]["out"]))
                 for i in LAYERS}  # fmt: skip
        steps.append((calls, to_numpy(attention_mask[:, :stop]) == 0))  # (B, M): all so far
    return steps, {i: to_numpy(hf_cache.linear_cache[i]) for i in LAYERS}


def run_layer(layer, x, *, dout=None, cache=None, key_padding_mask=None):
    """Output (and with ``dout`` dx and every parameter's gradient by name) as NumPy arrays."""
    if isinstance(layer, torch.nn.Module):
        x_t = to_torch(x, requires_grad=dout is not None)
        mask = None if key_padding_mask is None else to_torch(key_padding_mask)
        out = layer(x_t, key_padding_mask=mask, cache=cache)
        if dout is None:
            return to_numpy(out)
        out.backward(to_torch(dout))
        grads = {name: to_numpy(param.grad) for name, param in layer.named_parameters()}
        return to_numpy(out), to_numpy(x_t.grad), grads
    out = layer(x, key_padding_mask=key_padding_mask, cache=cache)
    if dout is None:
        return out
    return out, layer.backward(dout), layer.named_grads()


def new_cache(package, kind):
    """Contiguous, or a pool of 5 state rows where sequence b lives in row (3, 1)[b]."""
    module, dtype = (torch_cache, torch.float64) if package == "torch" else (np_cache, np.float64)
    if kind == "paged":
        slots = np.array([3, 1]) if package == "numpy" else torch.tensor([3, 1])
        return module.PagedLinearStateCache(slots, 5, H, D, D, dtype=dtype)
    return module.LinearStateCache(B, H, D, D, dtype=dtype)


RUNS = [("numpy", "chunk"), ("numpy", "recurrent"), ("torch", "chunk")]


@pytest.mark.parametrize(("package", "form"), RUNS, ids=["-".join(run) for run in RUNS])
@pytest.mark.parametrize("layer_idx", LAYERS)
def test_forward_and_every_gradient_match_transformers(layer_idx, package, form):
    x, dout, padding, expected, expected_dx, expected_grads = hf_forward(layer_idx)
    layer = convert_layer(layer_idx, package, form)

    out, dx, grads = run_layer(layer, x, dout=dout, key_padding_mask=padding)

    assert_close(out, expected, name="out")
    assert_close(dx, expected_dx, name="dx")
    assert set(grads) == set(expected_grads)
    for name, grad in expected_grads.items():
        assert_close(grads[name], grad, name=name)


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
@pytest.mark.parametrize("package", ["numpy", "torch"])
@pytest.mark.parametrize("layer_idx", LAYERS)
def test_decoding_matches_minimax_cache_and_its_final_state(layer_idx, package, kind):
    """A left-padded batch: prefill 6 tokens, then one at a time; then the states."""
    steps, final_states = hf_decode()
    layer = convert_layer(layer_idx, package)
    cache = new_cache(package, kind)

    outs = [run_layer(layer, calls[layer_idx][0], cache=cache, key_padding_mask=padding)
            for calls, padding in steps]  # fmt: skip

    for out, (calls, _) in zip(outs, steps, strict=True):
        assert_close(out, calls[layer_idx][1], name=f"decode step of {out.shape[1]} tokens")
    assert cache.length == N
    assert final_states[layer_idx].shape == (B, H, D, D)
    assert_close(to_numpy(cache.read()[1]) if package == "torch" else cache.read()[1],
                 final_states[layer_idx], name="final state")  # fmt: skip


@pytest.mark.parametrize("layer_idx", LAYERS)
def test_slopes_are_the_models(layer_idx):
    _, model, _ = built()
    layer = convert_layer(layer_idx, "numpy")

    expected = to_numpy(model.layers[layer_idx].self_attn.slope_rate).reshape(H)
    assert_close(layer.slope_rate, expected, name="slope_rate")


def test_the_softmax_layer_is_refused_naming_its_reader():
    config, _, state = built()
    with pytest.raises(ValueError, match="layer 2 is 'full_attention'.*grouped_from_hf"):
        convert.lightning_from_hf(config, state, 2)


def test_a_model_built_in_float32_and_cast_is_float32_close():
    """Its slopes and decay tables are float32 roundings (computed at init in the default
    dtype, then cast): the float64 layer read from its state dict agrees with it to float32's
    tolerance, not float64's."""
    x, _, padding, _, _, _ = hf_forward(1)
    config, model, state = built(torch.float32)
    layer = convert.lightning_from_hf(config, state, 1)
    mask = to_torch((~padding).astype(np.int64))
    with float64_math(), torch.no_grad():
        expected = model.layers[1].self_attn(
            hidden_states=to_torch(x), position_embeddings=None, attention_mask=mask
        )[0]

    out = run_layer(layer, x, key_padding_mask=padding)

    assert rel_error(out, to_numpy(expected)) > FLOAT64_RTOL
    assert_close(out, to_numpy(expected), dtype=np.float32, name="out against a cast model")
