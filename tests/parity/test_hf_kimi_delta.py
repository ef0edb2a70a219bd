"""Hugging Face as the real client of Kimi Delta Attention: Kimi Linear's ``"linear_attention"``
layer, converted by ``numpy_attention.convert.kimi_delta_from_hf`` from the whole model's state
dict, against transformers' own ``KimiLinearDeltaAttention`` in float64 within FLOAT64_RTOL: the
forward, dx and every parameter's gradient, and decoding (prefill, then one token at a time) with
the final convolution and recurrent states against transformers' cache; the NumPy layer (both
forms of the core) and its torch twin.

Each model is built from a tiny random config in code (no download): hidden 32, 2 KDA heads of
width 8, a convolution of 4 taps, two layers, the KDA one and an MLA one (transformers' model
builds the full-attention mask from its cache's length, which a cache of linear layers alone
cannot give: a Kimi Linear of KDA layers alone does not decode there), eager attention, float64
weights, the KDA layer's parameters redrawn where the layer is neither linear nor saturated
(dt_bias ~ N(0, 1), A_log ~ N(0, 0.5), o_norm's weight around 1). Batch element 1 is
left-padded by 3 tokens (transformers' 2-D ``attention_mask``, 0 = padding, which its
``apply_mask_to_padding_states`` applies to the layer's input; the layer's
``key_padding_mask``). The case "softplus-past-20" puts dt_bias around 20 with exp(A_log) ~
0.05: pre-activations on both sides of transformers' softplus shortcut (softplus(z) = z past
20) with gates that still matter; a softplus without the shortcut misses f_b_proj's gradient by
~1e-9 (numpy_attention/kimi_delta.py's docstring), which this case catches.

As in test_hf_latent.py, transformers' code runs under ``Float64Math`` (its ``.float()`` and
``.to(torch.float32)`` calls, which its KDA fallbacks, forget gate and gated RMSNorm make, run in
float64), and the parity conftest makes it take its torch fallbacks (``chunk_kimi_delta_attention``
for the prefill, ``recurrent_kimi_delta_attention`` for single tokens). transformers' conv state is
the last W inputs (B, 3HK, W); the layer keeps the W - 1 that the next token reads, compared with
the last W - 1 of transformers'. Its recurrent state is fla's (B, H, K, V), as the layer's.

What it proves: the conversion (numpy_attention/hf/kimi_delta.py) and the layers
(numpy_attention/kimi_delta.py, torch_attention/kimi_delta.py) as transformers' model uses them.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from numpy_attention import convert
from numpy_attention.linear_cache import LinearStateCache, PagedLinearStateCache
from torch_attention import from_numpy
from torch_attention.kimi_delta import KimiDeltaAttention as TorchKimiDeltaAttention
from torch_attention.linear_cache import LinearStateCache as TorchLinearStateCache

from ..conftest import SEED, assert_close, to_numpy, to_torch
from .test_hf_latent import float64_math

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402

B, N, PREFILL, PAD = 2, 9, 6, 3  # batch, tokens, prefill length, left padding of element 1
C, H, K, W = 32, 2, 8, 4  # hidden, KDA heads, head width, conv taps
SIZES = {
    "hidden_size": C,
    "linear_num_heads": H,
    "linear_head_dim": K,
    "linear_conv_kernel_dim": W,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "mlp_layer_types": ["dense", "dense"],
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 6,
    "qk_rope_head_dim": 4,
    "v_head_dim": 5,
    "intermediate_size": 16,
    "vocab_size": 11,
    "pad_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
}


@dataclass(frozen=True)
class KdaCase:
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    layer_idx: int = 0
    dt_bias: tuple[float, float] = (0.0, 1.0)  # mean, std
    a_log: tuple[float, float] = (0.0, 0.5)


CASES = [
    KdaCase("kimi_linear"),
    KdaCase("kimi_linear-after-mla", {
        "layer_types": ["full_attention", "linear_attention"], "rms_norm_eps": 1e-6}, 1),
    KdaCase("kimi_linear-softplus-past-20", dt_bias=(20.0, 1.0), a_log=(-3.0, 0.1)),
]  # fmt: skip
IDS = [case.name for case in CASES]


@functools.cache
def built(name: str) -> tuple[Any, Any]:
    """The case's config and base model in float64, the KDA layer's parameters redrawn."""
    case = next(case for case in CASES if case.name == name)
    torch.manual_seed(zlib.crc32(name.encode()))
    config = transformers.KimiLinearConfig(**(SIZES | case.config))
    config._attn_implementation = "eager"
    model = transformers.AutoModel.from_config(config).double().eval()
    prefix = f"layers.{case.layer_idx}.self_attn."
    with torch.no_grad():
        for key, param in model.named_parameters():
            if not key.startswith(prefix):
                continue
            if key.endswith("dt_bias"):
                param.normal_(*case.dt_bias)
            elif key.endswith("A_log"):
                param.normal_(*case.a_log)
            elif key.endswith("o_norm.weight"):
                param.normal_(1.0, 0.5)
            elif param.ndim == 2:
                param.normal_(0.0, 1.5 / param.shape[1] ** 0.5)
            else:  # the convolution's taps
                param.normal_(0.0, 0.5)
    return config, model


def convert_layer(case, package, form="chunk"):
    """The converted layer from the whole model's state dict; "torch": its twin."""
    config, model = built(case.name)
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    layer = convert.kimi_delta_from_hf(config.to_dict(), state, case.layer_idx, form=form)
    if package == "numpy":
        return layer
    twin = TorchKimiDeltaAttention(**layer.constructor_args()).double().eval()
    return from_numpy(twin, layer)


def attention_mask() -> torch.Tensor:
    """transformers' (B, N) mask, 1 = keep: element 1 left-padded by PAD tokens."""
    mask = torch.ones(B, N, dtype=torch.long)
    mask[1, :PAD] = 0
    return mask


@functools.cache
def hf_forward(name: str) -> tuple[Any, ...]:
    """transformers' KDA module on a random input, differentiated by a random upstream
    gradient: x, dout, out, dx and each parameter's gradient by name."""
    case = next(case for case in CASES if case.name == name)
    _, model = built(name)
    attention = model.layers[case.layer_idx].self_attn
    rng = np.random.default_rng(SEED)
    x, dout = rng.standard_normal((B, N, C)), rng.standard_normal((B, N, C))
    x_t = to_torch(x, requires_grad=True)
    attention.zero_grad()
    with float64_math():
        out = attention(hidden_states=x_t, attention_mask=attention_mask())
    out.backward(to_torch(dout))
    grads = {key: to_numpy(param.grad) for key, param in attention.named_parameters()}
    return x, dout, to_numpy(out), to_numpy(x_t.grad), grads


@functools.cache
def hf_decode(name: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """The model decoding with its DynamicCache, prefill then one token at a time: per call the
    KDA module's input and output; then its cache's conv state (B, 3HK, W) and state."""
    case = next(case for case in CASES if case.name == name)
    _, model = built(name)
    attention = model.layers[case.layer_idx].self_attn
    embeds = torch.from_numpy(np.random.default_rng(SEED + 1).standard_normal((B, N, C)))
    mask = attention_mask()
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # generate's
    hf_cache = DynamicCache(config=model.config)
    steps = []
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        attention.register_forward_pre_hook(
            lambda module, args, kwargs: seen.update(x=kwargs["hidden_states"]), with_kwargs=True
        ),
        attention.register_forward_hook(lambda module, args, out: seen.update(out=out)),
    ]
    try:
        for start, stop in [(0, PREFILL)] + [(i, i + 1) for i in range(PREFILL, N)]:
            with float64_math(), torch.no_grad():
                model(
                    inputs_embeds=embeds[:, start:stop],
                    attention_mask=mask[:, :stop],
                    position_ids=positions[:, start:stop],
                    past_key_values=hf_cache,
                    use_cache=True,
                )
            steps.append((to_numpy(seen["x"]), to_numpy(seen["out"])))
    finally:
        for hook in hooks:
            hook.remove()
    layer: Any = hf_cache.layers[case.layer_idx]  # a LinearAttentionLayer
    return steps, to_numpy(layer.conv_states[0]), to_numpy(layer.recurrent_states[0])


def run_layer(layer, x, dout=None, cache=None):
    """Output (and with ``dout`` dx and every parameter's gradient by name) as NumPy arrays,
    the padding mask of the tokens seen so far given."""
    padding = to_numpy(attention_mask() == 0)[
        :, : x.shape[1] + (0 if cache is None else cache.length)
    ]
    if isinstance(layer, torch.nn.Module):
        x_t = to_torch(x, requires_grad=dout is not None)
        out = layer(x_t, key_padding_mask=to_torch(padding), cache=cache)
        if dout is None:
            return to_numpy(out)
        out.backward(to_torch(dout))
        grads = {name: to_numpy(param.grad) for name, param in layer.named_parameters()}
        return to_numpy(out), to_numpy(x_t.grad), grads
    out = layer(x, key_padding_mask=padding, cache=cache)
    if dout is None:
        return out
    return out, layer.backward(dout), layer.named_grads()


RUNS = [("numpy", "chunk"), ("numpy", "recurrent"), ("torch", "chunk")]


@pytest.mark.parametrize(("package", "form"), RUNS, ids=["-".join(run) for run in RUNS])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_every_gradient_match_transformers(case, package, form):
    x, dout, expected, expected_dx, expected_grads = hf_forward(case.name)
    layer = convert_layer(case, package, form)

    out, dx, grads = run_layer(layer, x, dout)

    assert_close(out, expected, name="out")
    assert_close(dx, expected_dx, name="dx")
    assert set(grads) == set(expected_grads)
    for name, grad in expected_grads.items():
        assert_close(grads[name], grad, name=name)


def new_cache(package, paged):
    """A cache for the layer: contiguous, or rows 2 and 0 of a pool of 3 (NumPy)."""
    shapes = {"conv_dim": 3 * H * K, "conv_width": W}
    if package == "torch":
        return TorchLinearStateCache(B, H, K, K, dtype=torch.float64, **shapes)
    if paged:
        return PagedLinearStateCache(np.array([2, 0]), 3, H, K, K, dtype=np.float64, **shapes)
    return LinearStateCache(B, H, K, K, dtype=np.float64, **shapes)


DECODES = [("numpy", False), ("numpy", True), ("torch", False)]


@pytest.mark.parametrize(("package", "paged"), DECODES, ids=["numpy", "numpy-paged", "torch"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_decoding_matches_transformers_cache_and_states(case, package, paged):
    """Prefill 6 tokens, then one at a time, each call fed the KDA module's own input; then the
    states: the conv state's last W - 1 inputs and the recurrent state."""
    steps, hf_conv, hf_state = hf_decode(case.name)
    layer = convert_layer(case, package)
    cache = new_cache(package, paged)

    outs = [run_layer(layer, x, cache=cache) for x, _ in steps]

    for out, (_, expected) in zip(outs, steps, strict=True):
        assert_close(out, expected, name=f"decode step of {out.shape[1]} tokens")
    assert cache.length == N
    conv, state = (to_numpy(part) if isinstance(part, torch.Tensor) else part
                   for part in cache.read())  # fmt: skip
    assert hf_conv.shape == (B, 3 * H * K, W) and hf_state.shape == (B, H, K, K)
    assert_close(conv, hf_conv[..., 1:], name="conv state")
    assert_close(state, hf_state, name="recurrent state")
