"""Hugging Face as the real client of gated DeltaNet: the linear-attention layer of qwen3_next,
qwen3_5 and qwen3_5_moe, converted by ``numpy_attention.convert.gated_deltanet_from_hf`` from the
whole model's state dict, against transformers' own module in float64 within FLOAT64_RTOL; the
NumPy layer (both core forms) and its torch twin.

Each model is built from a tiny random config in code (no download): hidden 32, two layers
(layer 0 gated DeltaNet, layer 1 softmax attention), 2 key heads of width 4 serving 4 value heads
of width 3 (two each: transformers' ``repeat_interleave``), a convolution of 4 taps, float64
weights, the layer's parameters redrawn at a scale where every gate is neither 0 nor 1 (the
models' init leaves dt_bias at 1 and the norm's weight at ones). qwen3_5 and qwen3_5_moe are
multimodal wrappers: their language model is built alone (``AutoModel`` of the text config) and
its state dict keyed under ``model.language_model.``, as the wrapper's is; the converter reads
the wrapper's config.

As in test_hf_models.py (whose ``Float64Math`` runs here: transformers' gated delta rule casts
its inputs to float32, its gated RMSNorm computes in float32), the model runs with a hook on
``layers[0].linear_attn`` that records the keywords the model passes it (its 2-D padding mask);
the module is then called on a fresh input with them, and differentiated. Batch element 1 is
left-padded by 3 tokens; the layer gets ``padding_from_hf``'s key padding mask (padded tokens'
inputs zeroed, as ``apply_mask_to_padding_states`` does).

Decoding runs the model with its ``DynamicCache``, a prefill of 6 tokens then one at a time,
against the layer with a ``LinearStateCache`` or ``PagedLinearStateCache`` fed the module's own
inputs; afterwards the states are compared: transformers keeps the convolution's last W inputs
(B, F, W), the layer's cache the last W - 1 (the oldest is never read again), and the recurrent
state (B, Hv, Dk, Dv) alike.

What it proves: the conversion (numpy_attention/hf/gated_deltanet.py) and the layers
(numpy_attention/gated_deltanet.py, torch_attention/gated_deltanet.py) as transformers' models
use them.
"""

from __future__ import annotations

import contextlib
import functools
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import torch_attention
from numpy_attention import convert
from numpy_attention.hf import padding_from_hf
from numpy_attention.linear_cache import LinearStateCache, PagedLinearStateCache
from torch_attention import linear_cache as torch_cache

from ..conftest import SEED, assert_close, to_numpy, to_torch
from .test_hf_models import Float64Math

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402

B, N, PREFILL, PAD = 2, 9, 6, 3  # batch, tokens, prefill length, left padding of element 1
C, HK, HV, DK, DV, W = 32, 2, 4, 4, 3, 4
F = 2 * HK * DK + HV * DV  # the convolved width
SIZES = {
    "hidden_size": C,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": HK,
    "linear_num_value_heads": HV,
    "linear_key_head_dim": DK,
    "linear_value_head_dim": DV,
    "linear_conv_kernel_dim": W,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "intermediate_size": 16,
    "vocab_size": 11,
    "pad_token_id": None,
    "rms_norm_eps": 1e-5,
}
MOE = {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8,
       "shared_expert_intermediate_size": 8}  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One model: its text config class prefix, config keywords, its multimodal wrapper's."""

    name: str
    text: str  # "Qwen3Next", "Qwen3_5Text", "Qwen3_5MoeText"
    config: dict[str, Any]
    wrapper: str | None = None  # the wrapper's config class prefix, if any


CASES = [
    Case("qwen3_next", "Qwen3Next", SIZES | {"num_experts": 0}),  # a dense MLP: cheaper
    Case("qwen3_5", "Qwen3_5Text", SIZES, "Qwen3_5"),
    Case("qwen3_5_moe", "Qwen3_5MoeText", SIZES | MOE, "Qwen3_5Moe"),
]
IDS = [case.name for case in CASES]
RUNS = [("numpy", "chunk"), ("numpy", "recurrent"), ("torch", "chunk")]


@contextlib.contextmanager
def float64_math():
    """Hugging Face's float32 requests as float64, float64 as torch's default dtype."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with Float64Math():
            yield
    finally:
        torch.set_default_dtype(default)


@functools.cache
def built(name: str) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """The config the converter reads (the wrapper's, for qwen3_5*), the language model in
    float64 with its gated DeltaNet's weights redrawn, and the state dict as a converter finds
    it."""
    case = next(case for case in CASES if case.name == name)
    torch.manual_seed(zlib.crc32(name.encode()))
    text = getattr(transformers, f"{case.text}Config")(**case.config)
    text._attn_implementation = "eager"
    text._experts_implementation = "eager"  # grouped_mm has no float64
    model = transformers.AutoModel.from_config(text).double().eval()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if ".linear_attn." in key:
                scale = 1.5 / param.shape[-1] ** 0.5 if param.ndim >= 2 else 0.5
                param.normal_(0.0, scale)
                if key.endswith("norm.weight"):
                    param.add_(1.0)
    state = model.state_dict()
    config = text.to_dict()
    if case.wrapper is not None:
        wrapper = getattr(transformers, f"{case.wrapper}Config")(text_config=config)
        config = wrapper.to_dict()
        state = {f"model.language_model.{key}": value for key, value in state.items()}
    return config, model, state


def convert_layer(name, package, form="chunk"):
    """The converted layer; for "torch", the twin built from the NumPy layer's arguments."""
    config, _, state = built(name)
    layer = convert.gated_deltanet_from_hf(config, state, 0, form=form)
    if package == "numpy":
        return layer
    twin = torch_attention.GatedDeltaNet(**layer.constructor_args()).double().eval()
    return torch_attention.from_numpy(twin, layer)


def inputs(rng):
    """inputs_embeds (B, N, C) and Hugging Face's attention_mask (1 = keep), left-padded."""
    embeds = torch.from_numpy(rng.standard_normal((B, N, C)))
    attention_mask = torch.ones(B, N, dtype=torch.long)
    attention_mask[1, :PAD] = 0
    return embeds, attention_mask


def record_call(model, **model_kwargs):
    """Run the model; return the keywords and output of its layer 0's ``linear_attn`` call."""
    module = model.layers[0].linear_attn
    seen = {}

    def before(module, args, kwargs):
        seen["kwargs"] = dict(kwargs)

    def after(module, args, kwargs, output):
        seen["out"] = output

    hooks = [
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True),
    ]
    try:
        with float64_math(), torch.no_grad():
            model(**model_kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen["kwargs"], seen["out"]


@functools.cache
def hf_forward(name: str) -> dict[str, Any]:
    """The module called on a fresh input with the padding mask the model gave it, and
    differentiated: x, dout, the layer's key padding mask, out, dx and every gradient."""
    _, model, _ = built(name)
    rng = np.random.default_rng(SEED)
    embeds, attention_mask = inputs(rng)
    kwargs, _ = record_call(model, inputs_embeds=embeds, attention_mask=attention_mask)
    assert torch.equal(kwargs["attention_mask"], attention_mask)  # the 2-D mask, as it is
    module = model.layers[0].linear_attn
    x = rng.standard_normal((B, N, C))
    dout = rng.standard_normal(x.shape)
    x_t = to_torch(x, requires_grad=True)
    module.zero_grad()
    with float64_math():
        out = module(x_t, attention_mask=kwargs["attention_mask"])
    out.backward(to_torch(dout))
    grads = {key: to_numpy(param.grad) for key, param in module.named_parameters()}
    padding = padding_from_hf(attention_mask)[0]
    return {"x": x, "dout": dout, "padding": padding, "out": to_numpy(out),
            "dx": to_numpy(x_t.grad), "grads": grads}  # fmt: skip


@functools.cache
def hf_decode(name: str) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], Any, Any]:
    """The model decoding with its DynamicCache, prefill then one token at a time: per call
    (the module's input, its output, the layer's key padding mask), then transformers' final
    convolution state (B, F, W) and recurrent state (B, Hv, Dk, Dv)."""
    _, model, _ = built(name)
    embeds, attention_mask = inputs(np.random.default_rng(SEED))
    hf_cache = DynamicCache(config=model.config)
    steps = []
    for start, stop in [(0, PREFILL)] + [(i, i + 1) for i in range(PREFILL, N)]:
        kwargs, out = record_call(
            model, inputs_embeds=embeds[:, start:stop], attention_mask=attention_mask[:, :stop],
            past_key_values=hf_cache, use_cache=True,
        )  # fmt: skip
        padding = padding_from_hf(attention_mask[:, :stop], stop - start)[0]
        steps.append((to_numpy(kwargs["hidden_states"]), to_numpy(out), padding))
    layer: Any = hf_cache.layers[0]  # a LinearAttentionLayer: its states by index
    return steps, to_numpy(layer.conv_states[0]), to_numpy(layer.recurrent_states[0])


def run_layer(layer, x, *, dout=None, **forward):
    """Output (and with ``dout`` dx and every parameter's gradient by name) as NumPy arrays."""
    if isinstance(layer, torch.nn.Module):
        x_t = to_torch(x, requires_grad=dout is not None)
        padding = forward.pop("key_padding_mask", None)
        out = layer(x_t, key_padding_mask=None if padding is None else to_torch(padding), **forward)
        if dout is None:
            return to_numpy(out)
        layer.zero_grad()
        out.backward(to_torch(dout))
        grads = {name: to_numpy(param.grad) for name, param in layer.named_parameters()}
        return to_numpy(out), to_numpy(x_t.grad), grads
    out = layer(x, **forward)
    if dout is None:
        return out
    layer.zero_grad()
    return out, layer.backward(dout), layer.named_grads()


def new_cache(package, paged):
    """A cache for the layer: contiguous, or the sequences in rows 2 and 0 of a pool of 3."""
    sizes = {"conv_dim": F, "conv_width": W}
    if package == "torch":
        if paged:
            return torch_cache.PagedLinearStateCache([2, 0], 3, HV, DK, DV, **sizes)
        return torch_cache.LinearStateCache(B, HV, DK, DV, **sizes)
    if paged:
        return PagedLinearStateCache(np.array([2, 0]), 3, HV, DK, DV, **sizes)
    return LinearStateCache(B, HV, DK, DV, **sizes)


@pytest.mark.parametrize(("package", "form"), RUNS, ids=["-".join(run) for run in RUNS])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_every_gradient_match_transformers(case, package, form):
    expected = hf_forward(case.name)
    layer = convert_layer(case.name, package, form)

    out, dx, grads = run_layer(
        layer, expected["x"], dout=expected["dout"], key_padding_mask=expected["padding"]
    )

    assert_close(out, expected["out"], name="out")
    assert_close(dx, expected["dx"], name="dx")
    assert set(grads) == set(expected["grads"])
    for name, grad in expected["grads"].items():
        assert_close(grads[name], grad, name=name)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("package", ["numpy", "torch"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_decoding_matches_dynamic_cache_and_its_states(case, package, paged):
    """A left-padded batch: prefill 6 tokens, then one at a time; then the states."""
    steps, conv_state, state = hf_decode(case.name)
    layer = convert_layer(case.name, package)
    cache = new_cache(package, paged)

    outs = [run_layer(layer, x, cache=cache, key_padding_mask=mask) for x, _, mask in steps]

    for out, (_, expected, _) in zip(outs, steps, strict=True):
        assert_close(out, expected, name=f"decode step of {out.shape[1]} tokens")
    assert cache.length == N
    ours_conv, ours_state = (np.asarray(to_numpy(t) if torch.is_tensor(t) else t)
                             for t in cache.read())  # fmt: skip
    assert conv_state.shape == (B, F, W) and state.shape == (B, HV, DK, DV)
    assert_close(ours_conv, conv_state[..., 1:], name="conv state (the last W - 1 inputs)")
    assert_close(ours_state, state, name="recurrent state")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_numpy_backward_of_a_cached_call_matches_torch_autograd(case):
    """After a prefill through each package's cache, a 3-token call differentiated: the NumPy
    layer's hand-derived backward against autograd through the twin, every parameter by name
    (the states read from the caches are constants in both)."""
    rng = np.random.default_rng(SEED)
    prefill, x = rng.standard_normal((B, 4, C)), rng.standard_normal((B, 3, C))
    dout = rng.standard_normal(x.shape)
    results = {}
    for package in ("numpy", "torch"):
        layer = convert_layer(case.name, package)
        cache = new_cache(package, paged=False)
        run_layer(layer, prefill, cache=cache)
        results[package] = run_layer(layer, x, dout=dout, cache=cache)

    (out, dx, grads), (out_t, dx_t, grads_t) = results["numpy"], results["torch"]
    assert_close(out, out_t, name="out")
    assert_close(dx, dx_t, name="dx")
    assert set(grads) == set(grads_t)
    for name, grad in grads_t.items():
        assert_close(grads[name], grad, name=name)
