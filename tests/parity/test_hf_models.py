"""Hugging Face as the real client: every supported model's attention layer, converted by
``numpy_attention.convert.grouped_from_hf`` from the whole model's state dict, against
transformers' own attention module, in float64 within FLOAT64_RTOL; the torch twin the same way.

Each model is built from a tiny random config in code (no download): 2 layers, hidden 32, 4 query
heads over 2 key/value heads of width 8, a sliding window of 4 keys against sequences of 11
tokens, eager attention, float64 weights, the attention's parameters redrawn at a scale where
softmax is neither flat nor one-hot (the models' own init of std 0.02 would make it flat). Layer
0 and layer 1 of each model cover its full and sliding layers as its config assigns them.

Hugging Face's side is the model's own code: ``model(inputs_embeds=..., attention_mask=...,
position_ids=...)`` runs, and hooks on ``model.layers[i].self_attn`` record the attention's input,
the 4-D mask and the (cos, sin) the model built for it (its mask functions, its rotary embedding,
its choice of sliding layers); the attention module is then called on a fresh input with those,
and differentiated. Decoding runs the model with a ``DynamicCache``, prefill then one token at a
time, and compares each step's attention output with the converted layer fed the same input and a
``KVCache``.

How Hugging Face's math is kept in float64: its eager path upcasts to float32 in places (the
rotary embedding computes ``position_ids.float() * inv_freq.float()``, cos and sin in float32;
softmax runs with ``dtype=torch.float32``; RMSNorm casts with ``.to(torch.float32)``), which
would put float32 rounding (~1e-7) into a float64 comparison. ``Float64Math`` below is a
``torch.overrides.TorchFunctionMode`` active while Hugging Face's code runs: every torch call
that asks for float32 (``Tensor.float()``, ``dtype=torch.float32``, ``.to(torch.float32)``) is
given float64 instead, so the same operations run in float64. The rotary embedding's
``inv_freq`` buffer, computed in float32 when the model was built (outside the mode), keeps
its float32 values (upcast exactly): that is the model's own frequencies, and the converter gets
the same buffer through ``inv_freq=`` (it uses it as given). The converter's own frequencies,
computed from the config without the buffer, are compared with the buffer separately, per
element to float32 rounding (``test_frequencies_and_attention_factor_match_the_models``).

Left padding, as ``generate`` makes it: Hugging Face's ``attention_mask`` is 1 = keep and its
``position_ids`` are ``cumsum(mask) - 1`` (1 on the padding); the layer gets
``numpy_attention.hf.padding_from_hf(attention_mask)``, its ``key_padding_mask`` (True = padding)
and its positions. A left-padded query row sees no key; Hugging Face's eager softmax spreads it
uniformly over its masked scores (a value nobody reads), the layer's edge rule gives 0: the outputs
are compared on the real tokens, and the upstream gradient is 0 on the padded rows.

What it proves: the conversion (numpy_attention/hf.py) and the layers (numpy_attention/grouped.py,
torch_attention/grouped.py) as Hugging Face's models use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import torch_attention
from numpy_attention import convert
from numpy_attention.grouped import KVCache
from numpy_attention.hf import hf_inv_freq, hf_rope_attention_factor, padding_from_hf

from ..conftest import assert_close, to_numpy, to_torch

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402

B, N, PREFILL, PAD = 2, 11, 6, 3  # batch, tokens, prefill length, left padding of element 1
WINDOW = 4  # Hugging Face's sliding_window: 4 keys, the query included
SIZES = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_hidden_layers": 2,
    "intermediate_size": 16,
    "vocab_size": 11,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}


class Float64Math(TorchFunctionMode):
    """Every float32 request of the torch calls made inside becomes float64 (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            return args[0].to(torch.float64)
        args = tuple(torch.float64 if arg is torch.float32 else arg for arg in args)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


@dataclass(frozen=True)
class ModelCase:
    """One layer of one model: its config class, base model class, config keywords, the layer."""

    name: str
    model: str  # the transformers class prefix: "Llama", "Qwen2", ...
    layer_idx: int
    sliding: bool  # what the model's code makes of this layer (checked against its module)
    config: dict[str, Any] = field(default_factory=dict)

    def build(self) -> tuple[Any, Any]:
        """The config and the base model in float64, eager, attention weights redrawn."""
        torch.manual_seed(sum(map(ord, self.name)))
        config = getattr(transformers, f"{self.model}Config")(**SIZES, **self.config)
        config._attn_implementation = "eager"
        config._experts_implementation = "eager"  # GPT-OSS's grouped_mm has no float64
        model = getattr(transformers, f"{self.model}Model")(config).double().eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if ".self_attn." in name:
                    scale = 1.5 / param.shape[1] ** 0.5 if param.ndim == 2 else 0.5
                    param.normal_(0.0, scale)
        return config, model


CASES = [
    ModelCase("llama-bias", "Llama", 0, False, {"attention_bias": True}),
    ModelCase("llama-llama3-rope", "Llama", 1, False, {"rope_parameters": LLAMA3_ROPE}),
    ModelCase("mistral-sliding", "Mistral", 1, True, {"sliding_window": WINDOW}),
    *(
        ModelCase(
            f"{model.lower()}-{kind}",
            model,
            layer,
            layer == 1,
            {
                "use_sliding_window": True,
                "sliding_window": WINDOW,
                "max_window_layers": 1,
                "rms_norm_eps": 1e-5,  # Qwen3's QK-norm eps, not the layer's default
            },
        )
        for model in ("Qwen2", "Qwen3")
        for layer, kind in ((0, "full"), (1, "sliding"))
    ),
    *(
        ModelCase(
            f"gemma2-{kind}",
            "Gemma2",
            layer,
            layer == 0,
            {"sliding_window": WINDOW, "attn_logit_softcapping": 5.0, "query_pre_attn_scalar": 24},
        )
        for layer, kind in ((0, "sliding"), (1, "full"))
    ),
    *(
        ModelCase(
            f"gpt_oss-{kind}",
            "GptOss",
            layer,
            layer == 0,
            {"sliding_window": WINDOW, "num_local_experts": 2, "num_experts_per_tok": 1},
        )
        for layer, kind in ((0, "sliding"), (1, "full"))
    ),
]
IDS = [case.name for case in CASES]


def inputs(rng, padded):
    """inputs_embeds (B, N, C), Hugging Face's attention_mask (1 = keep) and position ids."""
    embeds = torch.from_numpy(rng.standard_normal((B, N, SIZES["hidden_size"])))
    attention_mask = torch.ones(B, N, dtype=torch.long)
    if padded:
        attention_mask[1, :PAD] = 0
    positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)  # generate's
    return embeds, attention_mask, positions


def record_attention_call(model, layer_idx, **model_kwargs):
    """Run the model; return the keywords and output of layer ``layer_idx``'s attention call."""
    seen = {}
    attention = model.layers[layer_idx].self_attn

    def before(module, args, kwargs):
        seen["kwargs"] = dict(kwargs)

    def after(module, args, kwargs, output):
        seen["out"] = output[0]

    hooks = [
        attention.register_forward_pre_hook(before, with_kwargs=True),
        attention.register_forward_hook(after, with_kwargs=True),
    ]
    try:
        with Float64Math(), torch.no_grad():
            model(**model_kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen["kwargs"], seen["out"]


def convert_layer(case, config, model, package):
    """The converted layer from the whole model's state dict, with the model's inv_freq; for
    "torch", the twin built from the NumPy layer's arguments and state."""
    layer = convert.grouped_from_hf(
        config.to_dict(),
        model.state_dict(),
        layer_idx=case.layer_idx,
        inv_freq=model.rotary_emb.inv_freq,
    )
    if package == "numpy":
        return layer
    twin = torch_attention.GroupedQueryAttention(**layer.constructor_args()).double().eval()
    return torch_attention.from_numpy(twin, layer)


def forward_backward(layer, x, dout, positions, padding):
    """Output, input gradient and parameter gradients by name, as NumPy arrays."""
    if isinstance(layer, torch.nn.Module):
        x_t = to_torch(x, requires_grad=True)
        out = layer(x_t, positions=to_torch(positions), key_padding_mask=to_torch(padding))
        out.backward(to_torch(dout))
        grads = {name: to_numpy(param.grad) for name, param in layer.named_parameters()}
        return to_numpy(out), to_numpy(x_t.grad), grads
    out = layer(x, positions=positions, key_padding_mask=padding)
    dx = layer.backward(dout)
    return out, dx, layer.named_grads()


def decode_step(layer, x, positions, padding, cache):
    if isinstance(layer, torch.nn.Module):
        out = layer(
            to_torch(x),
            positions=to_torch(positions),
            key_padding_mask=to_torch(padding),
            cache=cache,
        )
        return to_numpy(out)
    return layer(x, positions=positions, key_padding_mask=padding, cache=cache)


def new_cache(layer):
    if isinstance(layer, torch.nn.Module):
        return torch_attention.KVCache(B, layer.num_kv_heads, N, layer.head_dim, torch.float64)
    return KVCache(B, layer.num_kv_heads, N, layer.head_dim, np.float64)


@pytest.mark.parametrize("package", ["numpy", "torch"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_every_gradient_match_transformers(rng, case, padded, package):
    config, model = case.build()
    embeds, attention_mask, positions = inputs(rng, padded)
    kwargs, _ = record_attention_call(
        model,
        case.layer_idx,
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        position_ids=positions,
    )
    attention = model.layers[case.layer_idx].self_attn
    layer = convert_layer(case, config, model, package)
    padding, ours = padding_from_hf(attention_mask)  # key_padding_mask, positions (B, N)
    real = attention_mask.numpy() == 1  # (B, N)
    x = rng.standard_normal((B, N, SIZES["hidden_size"]))
    dout = rng.standard_normal(x.shape) * real[..., None]  # nothing flows from padded rows

    x_t = to_torch(x, requires_grad=True)
    with Float64Math():
        expected, _ = attention(
            hidden_states=x_t,
            position_embeddings=kwargs["position_embeddings"],
            attention_mask=kwargs["attention_mask"],
        )
    expected.backward(to_torch(dout))
    out, dx, grads = forward_backward(layer, x, dout, ours, padding)

    assert layer.window == ((WINDOW - 1, 0) if case.sliding else None)
    hf_window = getattr(attention, "sliding_window", getattr(config, "sliding_window", None))
    assert case.sliding == (hf_window is not None)  # the model's own reading of its config
    assert_close(out[real], to_numpy(expected)[real], name="out")
    assert_close(dx, x_t.grad, name="dx")
    assert set(grads) == {name for name, _ in attention.named_parameters()}
    for name, param in attention.named_parameters():
        assert_close(grads[name], param.grad, name=name)


@pytest.mark.parametrize("package", ["numpy", "torch"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_decoding_with_the_cache_matches_transformers_dynamic_cache(rng, case, package):
    """A left-padded batch: prefill 6 tokens, then one at a time, Hugging Face with its own
    DynamicCache, the layer with a KVCache fed the very input Hugging Face's attention got."""
    config, model = case.build()
    embeds, attention_mask, positions = inputs(rng, padded=True)
    layer = convert_layer(case, config, model, package)
    hf_cache, cache = DynamicCache(config=config), new_cache(layer)
    real = attention_mask.numpy() == 1

    for start, stop in [(0, PREFILL)] + [(i, i + 1) for i in range(PREFILL, N)]:
        kwargs, expected = record_attention_call(
            model,
            case.layer_idx,
            inputs_embeds=embeds[:, start:stop],
            attention_mask=attention_mask[:, :stop],
            position_ids=positions[:, start:stop],
            past_key_values=hf_cache,
            use_cache=True,
        )
        padding, ours = padding_from_hf(attention_mask[:, :stop], stop - start)
        out = decode_step(layer, to_numpy(kwargs["hidden_states"]), ours, padding, cache)

        rows = real[:, start:stop]
        assert_close(out[rows], to_numpy(expected)[rows], name=f"tokens {start}:{stop}")
    assert cache.length == N


# -- the frequencies and the attention factor the converter computes itself ---------------------

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "default-theta-1e6": {"rope_type": "default", "rope_theta": 1e6},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": LLAMA3_ROPE | {"original_max_position_embeddings": 8192},
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 16.0,
        "original_max_position_embeddings": 2048,
    },
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "attention_factor": 0.8,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "original_max_position_embeddings": 8192,
    },
    "yarn-gpt-oss": {  # GPT-OSS's defaults: truncate false keeps the ramp's ends fractional
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 1024,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
        "original_max_position_embeddings": 4096,
    },
    "yarn-no-factor": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": None,
        "original_max_position_embeddings": 1024,
    },
}


@pytest.mark.parametrize("head_dim", [8, 256])  # at 256 torch's pow rounds some bits apart
@pytest.mark.parametrize("rope", ROPES.values(), ids=ROPES.keys())
def test_frequencies_and_attention_factor_match_the_models(rope, head_dim):
    """hf_inv_freq repeats Hugging Face's float32 arithmetic in NumPy: each frequency within
    float32 rounding of the model's buffer (torch's vectorized pow may round the last bit
    differently; pass the buffer as ``inv_freq=`` for exactly the model's), and the attention
    factor the model multiplies cos and sin by, which is Python float arithmetic on both sides."""
    config = transformers.LlamaConfig(
        **(SIZES | {"head_dim": head_dim, "max_position_embeddings": 32768}),
        rope_parameters=rope,
    )
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    expected = to_numpy(rotary.inv_freq)

    freqs = hf_inv_freq(config.to_dict())

    assert freqs.dtype == np.float32 and expected.dtype == np.float32
    assert_close(freqs / expected, np.ones_like(expected), name="inv_freq / model's")
    assert_close(hf_rope_attention_factor(config.to_dict()), rotary.attention_scaling)


def test_gpt_oss_defaults_to_yarn_with_an_attention_factor():
    """GPT-OSS's config defaults to YaRN; its factor above 1 multiplies cos and sin."""
    config, model = next(case for case in CASES if case.model == "GptOss").build()

    layer = convert.grouped_from_hf(config.to_dict(), model.state_dict())

    assert layer.rope_attention_factor == model.rotary_emb.attention_scaling > 1.0
