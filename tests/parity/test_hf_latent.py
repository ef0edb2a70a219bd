"""Hugging Face as the real client of latent attention: every supported model_type's MLA layer,
converted by ``numpy_attention.convert.latent_from_hf`` from the whole model's state dict, against
transformers' own attention module in float64 within FLOAT64_RTOL, both computations (expanded
and absorbed), the NumPy layer and its torch twin.

Each model is built from a tiny random config in code (no download): hidden 32, 4 heads,
one layer (two for layer 1 of DeepSeek-V3 and Kimi K2.5, six for Bailing-hybrid's layer 5 after
five KDA layers; LongCat's sublayer 1 is in its first),
kv_lora_rank 8, qk_nope_head_dim 6, qk_rope_head_dim 4, v_head_dim 5 (q_lora_rank 12 where the
case has one), eager attention, float64 weights, the attention's parameters redrawn at a scale
where softmax is neither flat nor one-hot, the norms' weights around 1. The RoPE of each case is
the model's kind: YaRN with mscale_all_dim (DeepSeek-V2/V3, Mistral 4, whose Llama-4 query scale
is on from position 4), DeepSeek's interleaved pairs or ``rotate_half``, none (Kimi Linear).

As in test_hf_models.py (whose ``Float64Math`` runs here, its docstring says why), the model runs
with hooks on the attention module, which is then called on a fresh input with the mask and (cos,
sin) the model built, and differentiated; the layer gets ``padding_from_hf``'s key padding mask and
positions. Batch element 1 is left-padded by 3 tokens; outputs are compared on the real tokens.
While Hugging Face's code runs, torch's default dtype is float64 too: Mistral 4 divides integer
positions by a length, which gives the default dtype.

Decoding runs the model with its ``DynamicCache``, prefill then one token at a time, against the
layer with a ``LatentCache`` fed the attention's own input; afterwards the two caches are compared
on the real tokens: transformers 5 caches (keys, values) = (the normed latent c, the rotated k_pe),
(B, 1, T, L) and (B, 1, T, R), which is what ``LatentCache`` holds (DeepSeek-V2's k_pe with its
rope pairs in place, the layer's gathered into halves: the same numbers permuted).

What it proves: the conversion (numpy_attention/hf/latent.py) and the layers
(numpy_attention/latent.py, torch_attention/latent.py) as transformers' models use them.
"""

from __future__ import annotations

import contextlib
import functools
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import torch_attention
from numpy_attention import convert
from numpy_attention.hf import padding_from_hf
from numpy_attention.hf.latent import REFUSED, SUPPORTED_MODEL_TYPES
from numpy_attention.latent_cache import LatentCache, PagedLatentCache
from numpy_attention.rope import deinterleave

from ..conftest import SEED, assert_close, to_numpy, to_torch
from .test_hf_models import Float64Math

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402

B, N, PREFILL, PAD = 2, 9, 6, 3  # batch, tokens, prefill length, left padding of element 1
C, H, L, R, Q = 32, 4, 8, 4, 12  # hidden, heads, kv_lora_rank, qk_rope_head_dim, q_lora_rank
SIZES = {
    "hidden_size": C,
    "num_attention_heads": H,
    "num_key_value_heads": H,
    "kv_lora_rank": L,
    "qk_nope_head_dim": 6,
    "qk_rope_head_dim": R,
    "v_head_dim": 5,
    "num_hidden_layers": 1,
    "intermediate_size": 16,
    "vocab_size": 11,
    "pad_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
}
# Dense MLPs where the model lets the config choose (its MoE's index_add_ costs far more than the
# attention): the MoE sizes are still given, small.
MOE = {"moe_intermediate_size": 8, "n_routed_experts": 2, "num_experts_per_tok": 1}
DENSE = MOE | {"n_group": 1, "topk_group": 1, "first_k_dense_replace": 2}
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 4,
    "mscale": 1.0,
    "mscale_all_dim": 0.7,
}
MISTRAL4_ROPE = YARN | {
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.1,
    "partial_rotary_factor": R / (6 + R),
}


@dataclass(frozen=True)
class LatentCase:
    """One MLA layer of one model: its transformers class prefix, config keywords, the layer."""

    name: str
    model: str  # "DeepseekV3", ...; "Kimi_K25": a DeepSeek-V3 language model in a K2.5 config
    config: dict[str, Any] = field(default_factory=dict)
    layer_idx: int = 0


CASES = [
    LatentCase("deepseek_v3-yarn-q_lora", "DeepseekV3", SIZES | DENSE | {
        "num_hidden_layers": 2, "q_lora_rank": Q, "rope_parameters": YARN,
        "max_position_embeddings": 16}, 1),
    LatentCase("deepseek_v2-yarn", "DeepseekV2", SIZES | MOE | {"first_k_dense_replace": 1,
        "q_lora_rank": None, "rope_parameters": YARN, "max_position_embeddings": 16}),
    LatentCase("kimi_k25", "Kimi_K25", SIZES | DENSE | {
        "num_hidden_layers": 2, "q_lora_rank": Q}, 1),
    LatentCase("glm4_moe_lite", "Glm4MoeLite", SIZES | MOE | {
        "n_group": 1, "topk_group": 1, "mlp_layer_types": ["dense"], "q_lora_rank": Q}),
    LatentCase("youtu-rotate_half-bias", "Youtu", SIZES | {
        "q_lora_rank": None, "rope_interleave": False, "attention_bias": True}),
    LatentCase("axk1", "AXK1", SIZES | MOE | {
        "n_group": 1, "topk_group": 1, "mlp_layer_types": ["dense"], "q_lora_rank": Q}),
    LatentCase("minicpm3-v_head_dim_default", "MiniCPM3", SIZES | {
        "q_lora_rank": Q, "v_head_dim": None}),
    LatentCase("mistral4-llama4_scaling", "Mistral4", SIZES | DENSE | {
        "q_lora_rank": Q, "rope_parameters": MISTRAL4_ROPE, "max_position_embeddings": 16}),
    LatentCase("longcat_flash-sublayer_1", "LongcatFlash", {
        key: value for key, value in SIZES.items() if key != "num_hidden_layers"} | {
        "num_layers": 1, "q_lora_rank": Q, "head_dim": R, "ffn_hidden_size": 16,
        "expert_ffn_hidden_size": 8, "n_routed_experts": 2, "moe_topk": 2,
        "zero_expert_num": 1}, 1),
    LatentCase("kimi_linear-nope", "KimiLinear", SIZES | {
        "layer_types": ["full_attention"], "mlp_layer_types": ["dense"], "q_lora_rank": None}),
    # bailing_hybrid (Ling 3.0): the output gate per head; KDA layers (head_dim their width)
    LatentCase("bailing_hybrid-gate-bias", "BailingHybrid", SIZES | {
        "layer_types": ["full_attention"], "mlp_layer_types": ["dense"], "head_dim": 8,
        "attention_bias": True}),
    # deepseek_v32 (DSA): 4 indexer heads of width 8 keep 4 of up to 9 keys per query
    LatentCase("deepseek_v32-dsa-yarn", "DeepseekV32", SIZES | DENSE | {
        "q_lora_rank": Q, "rope_parameters": YARN, "max_position_embeddings": 16,
        "index_n_heads": 4, "index_head_dim": 8, "index_topk": 4}),
    # glm_moe_dsa (GLM-5): the indexer's RoPE interleaved; layer 1 "shared" reuses layer 0's keys
    *(LatentCase(f"glm_moe_dsa-{kind}", "GlmMoeDsa", SIZES | DENSE | {
        "num_hidden_layers": 2, "q_lora_rank": Q, "indexer_types": ["full", "shared"],
        "index_n_heads": 4, "index_head_dim": 8, "index_topk": 4}, layer)
      for kind, layer in (("full", 0), ("shared", 1))),
    # hy_v4: sinks, a sigmoid gate per element (gate_proj), rotate_half; its indexer rotates
    # the last R dims of each head; layer 1 "shared". 8 indexer heads: with 4, a decode step's
    # scores tied at 0 (every head's relu 0) across the top-k boundary, where torch.topk's
    # pick is unspecified and the layer's is the lower index (docs/derivations/indexer.md)
    *(LatentCase(f"hy_v4-{kind}", "HYV4", SIZES | {
        "num_hidden_layers": 2, "q_lora_rank": Q, "indexer_types": ["full", "shared"],
        "mlp_layer_types": ["dense", "dense"], "index_n_heads": 8, "index_head_dim": 8,
        "index_topk": 4, "rms_norm_eps": 1e-5}, layer)
      for kind, layer in (("full", 0), ("shared", 1))),
    # axk2: q_gate_proj of [q_resid, q_a] gives the queries and a sigmoid gate per element
    LatentCase("axk2-query-gate", "AXK2", SIZES | {
        "q_lora_rank": Q, "mlp_layer_types": ["dense"], "n_group": 1, "topk_group": 1,
        "index_n_heads": 8, "index_head_dim": 8, "index_topk": 4}),
    LatentCase("bailing_hybrid-ling3-shaped", "BailingHybrid", SIZES | {
        "num_hidden_layers": 6, "layer_group_size": 6, "mlp_layer_types": ["dense"] * 6,
        "head_dim": 8, "rope_theta": 6e6}, 5),  # Ling 3.0's pattern: MLA closes each 6
]  # fmt: skip
IDS = [case.name for case in CASES]
RENAMED = {"gate_proj.weight": "g_proj.weight"}  # HY-V4's gate, the layer's g_proj
FORMS = {"expanded": False, "absorbed": True}


@contextlib.contextmanager
def float64_math():
    """Hugging Face's float32 requests as float64, and float64 as torch's default dtype."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with Float64Math():
            yield
    finally:
        torch.set_default_dtype(default)


@functools.cache
def built(name: str) -> tuple[Any, Any, dict[str, Any]]:
    """The case's config (what the converter reads), base model in float64 (its attention's
    weights redrawn) and the model's state dict as a converter finds it."""
    case = next(case for case in CASES if case.name == name)
    torch.manual_seed(zlib.crc32(name.encode()))
    if case.model == "Kimi_K25":  # its language model is AutoModel of its text_config
        config = transformers.Kimi_K25Config(
            text_config=transformers.DeepseekV3Config(**case.config).to_dict()
        )
        text = config.text_config
    else:
        config = text = getattr(transformers, f"{case.model}Config")(**case.config)
    text._attn_implementation = "eager"
    text._experts_implementation = "eager"  # grouped_mm has no float64
    model = transformers.AutoModel.from_config(text).double().eval()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if ".self_attn." in key:
                param.normal_(0.0, 1.5 / param.shape[1] ** 0.5 if param.ndim == 2 else 0.5)
                if "layernorm" in key:
                    param.add_(1.0)
    state = model.state_dict()
    if case.model == "Kimi_K25":
        state = {f"model.language_model.{key}": value for key, value in state.items()}
    return config, model, state


def attention_of(case, model):
    """The model's attention module that ``case.layer_idx`` names (LongCat: sublayer 2i + j)."""
    if case.model == "LongcatFlash":
        return model.layers[case.layer_idx // 2].self_attn[case.layer_idx % 2]
    return model.layers[case.layer_idx].self_attn


def convert_layer(case, package):
    """The converted layer from the whole model's state dict and the model's own frequencies;
    for "torch", the twin built from the NumPy layer's arguments and state."""
    config, model, state = built(case.name)
    rotary = getattr(model, "rotary_emb", None)
    layer = convert.latent_from_hf(
        config.to_dict(),
        state,
        layer_idx=case.layer_idx,
        inv_freq=None if rotary is None else rotary.inv_freq,
    )
    if package == "numpy":
        return layer
    twin = torch_attention.MultiHeadLatentAttention(**layer.constructor_args()).double().eval()
    return torch_attention.from_numpy(twin, layer)


def inputs(rng):
    """inputs_embeds (B, N, C), Hugging Face's attention_mask (1 = keep) and position ids."""
    embeds = torch.from_numpy(rng.standard_normal((B, N, C)))
    attention_mask = torch.ones(B, N, dtype=torch.long)
    attention_mask[1, :PAD] = 0
    positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)  # generate's
    return embeds, attention_mask, positions


def record_attention_call(model, attention, **model_kwargs):
    """Run the model; return the keywords and output of ``attention``'s call."""
    seen = {}

    def before(module, args, kwargs):
        seen["kwargs"] = dict(kwargs)

    def after(module, args, kwargs, output):
        seen["out"] = output[0]
        seen["topk"] = output[2] if len(output) > 2 else None  # GLM-5's DSA: its top-k keys

    hooks = [
        attention.register_forward_pre_hook(before, with_kwargs=True),
        attention.register_forward_hook(after, with_kwargs=True),
    ]
    try:
        with float64_math(), torch.no_grad():
            model(**model_kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen["kwargs"], seen["out"], seen["topk"]


@dataclass
class Expected:
    """Hugging Face's side of the forward test, NumPy arrays: the input and upstream gradient,
    the layer's keywords, the real tokens (B, N), the output, dx and each parameter's gradient."""

    x: np.ndarray
    dout: np.ndarray
    forward: dict[str, np.ndarray]
    real: np.ndarray
    out: np.ndarray
    dx: np.ndarray
    grads: dict[str, np.ndarray]
    selection: np.ndarray | None  # a DSA layer's top-k keys, where the model returns them


@functools.cache
def hf_forward(name: str) -> Expected:
    """The model's attention module called on a fresh input with the mask and (cos, sin) the
    model built for it, and differentiated: once per case, for every package and form."""
    case = next(case for case in CASES if case.name == name)
    _, model, _ = built(name)
    rng = np.random.default_rng(SEED)
    embeds, attention_mask, positions = inputs(rng)
    attention = attention_of(case, model)
    kwargs, _, _ = record_attention_call(
        model, attention, inputs_embeds=embeds, attention_mask=attention_mask,
        position_ids=positions, use_cache=False,
    )  # fmt: skip
    padding, ours = padding_from_hf(attention_mask)  # key_padding_mask, positions (B, N)
    real = attention_mask.numpy() == 1  # (B, N)
    x = rng.standard_normal((B, N, C))
    dout = rng.standard_normal(x.shape) * real[..., None]  # nothing flows from padded rows
    x_t = to_torch(x, requires_grad=True)
    call = {key: kwargs[key] for key in ("position_embeddings", "attention_mask", "position_ids",
                                         "prev_topk_indices") if key in kwargs}  # fmt: skip
    attention.zero_grad()
    with float64_math():
        out, *rest = attention(hidden_states=x_t, **call)
    out.backward(to_torch(dout))
    topk = rest[1] if len(rest) > 1 else None  # GLM-5's DSA layers return their top-k keys
    grads = {  # DSA's indexer selects under no_grad: no gradient reaches it, zero
        RENAMED.get(key, key): np.zeros(tuple(param.shape))
        if key.startswith("indexer.") and param.grad is None
        else to_numpy(param.grad)
        for key, param in attention.named_parameters()
    }
    forward = {"positions": ours, "key_padding_mask": padding}
    if call.get("prev_topk_indices") is not None:  # a shared DSA layer: the keys given to it
        forward["index_selection"] = selection_of(call["prev_topk_indices"], N)
    selection = None if topk is None else selection_of(topk, N)
    return Expected(x, dout, forward, real, to_numpy(out), to_numpy(x_t.grad), grads, selection)


def selection_of(indices, m):
    """transformers' top-k key indices (B, N, topk) as a (B, N, M) bool selection. Where a
    query sees fewer keys than topk the model lists future keys too (its mask hides them)."""
    indices = to_numpy(indices).astype(np.int64)
    selection = np.zeros(indices.shape[:2] + (m,), dtype=bool)
    np.put_along_axis(selection, indices, True, axis=-1)
    return selection


@functools.cache
def hf_decode(name: str) -> tuple[Any, ...]:
    """The model decoding with its DynamicCache, prefill then one token at a time, once per
    case: per call (the attention's input, its output, the layer's keywords, the real rows), the
    real tokens (B, N), and the cache's keys and values at the end (DeepSeek-V2's k_pe gathered
    into halves as the layer lays it out), and a DSA layer's cached indexer keys (else None)."""
    case = next(case for case in CASES if case.name == name)
    _, model, _ = built(name)
    embeds, attention_mask, positions = inputs(np.random.default_rng(SEED))
    attention = attention_of(case, model)
    hf_cache = DynamicCache(config=model.config)
    real = attention_mask.numpy() == 1
    steps = []
    for start, stop in [(0, PREFILL)] + [(i, i + 1) for i in range(PREFILL, N)]:
        kwargs, expected, _ = record_attention_call(
            model, attention, inputs_embeds=embeds[:, start:stop],
            attention_mask=attention_mask[:, :stop], position_ids=positions[:, start:stop],
            past_key_values=hf_cache, use_cache=True,
        )  # fmt: skip
        padding, ours = padding_from_hf(attention_mask[:, :stop], stop - start)
        forward = {"positions": ours, "key_padding_mask": padding}
        if kwargs.get("prev_topk_indices") is not None:  # a shared DSA layer
            forward["index_selection"] = selection_of(kwargs["prev_topk_indices"], stop)
        steps.append((to_numpy(kwargs["hidden_states"]), to_numpy(expected), forward,
                      real[:, start:stop]))  # fmt: skip
    hf_layer = hf_cache.layers[attention.layer_idx]
    c_kv, k_pe = to_numpy(hf_layer.keys), to_numpy(hf_layer.values)
    if case.model == "DeepseekV2":  # pairs in place -> gathered into halves
        k_pe = deinterleave(k_pe)
    index_keys = getattr(hf_layer, "indexer_keys", None)  # DSA: (B, T, DI)
    return steps, real, c_kv, k_pe, None if index_keys is None else to_numpy(index_keys)


def run_layer(layer, x, *, dout=None, cache=None, **forward):
    """Output (and with ``dout`` dx and every parameter's gradient by name) as NumPy arrays."""
    if isinstance(layer, torch.nn.Module):
        x_t = to_torch(x, requires_grad=dout is not None)
        kwargs = {key: to_torch(value) for key, value in forward.items() if key != "absorb"}
        out = layer(x_t, cache=cache, absorb=forward.get("absorb"), **kwargs)
        if dout is None:
            return to_numpy(out)
        out.backward(to_torch(dout))
        grads = {  # DSA's indexer selects under no_grad: no gradient reaches it, zero
            name: np.zeros(tuple(param.shape))
            if name.startswith("indexer.") and param.grad is None
            else to_numpy(param.grad)
            for name, param in layer.named_parameters()
        }
        return to_numpy(out), to_numpy(x_t.grad), grads
    out = layer(x, cache=cache, **forward)
    if dout is None:
        return out
    return out, layer.backward(dout), layer.named_grads()


def new_cache(package, layer, paged=False):
    """A cache for the layer: contiguous, or pages of 4 tokens (DSA's indexer keys too)."""
    index = layer.indexer.head_dim if layer.index_topk is not None else None
    if package == "torch":
        if paged:
            return torch_attention.PagedLatentCache(8, 4, L, R, torch.float64, index_head_dim=index)
        return torch_attention.LatentCache(B, N, L, R, torch.float64, index_head_dim=index)
    if paged:
        return PagedLatentCache(8, 4, L, R, np.float64, index_head_dim=index)
    return LatentCache(B, N, L, R, np.float64, index_head_dim=index)


# NumPy's both forms; the torch twin's absorbed one (the registry holds it to NumPy's in both).
RUNS = [("numpy", "expanded"), ("numpy", "absorbed"), ("torch", "absorbed")]


@pytest.mark.parametrize(("package", "form"), RUNS, ids=["-".join(run) for run in RUNS])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_every_gradient_match_transformers(case, package, form):
    expected = hf_forward(case.name)
    layer = convert_layer(case, package)

    out, dx, grads = run_layer(
        layer, expected.x, dout=expected.dout, absorb=FORMS[form], **expected.forward
    )

    real = expected.real
    assert_close(out[real], expected.out[real], name="out")
    assert_close(dx, expected.dx, name="dx")
    if expected.selection is not None and not layer.index_shared:  # the same top-k keys
        seen = np.tril(np.ones((N, N), bool)) & ~expected.forward["key_padding_mask"][:, None]
        np.testing.assert_array_equal(
            np.asarray(layer.selection)[real], (expected.selection & seen)[real]
        )
    assert set(grads) == set(expected.grads)
    for name, grad in expected.grads.items():
        assert_close(grads[name], grad, name=name)


@pytest.mark.parametrize("package", ["numpy", "torch"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_decoding_matches_dynamic_cache_and_caches_what_it_caches(case, package):
    """A left-padded batch: prefill 6 tokens, then one at a time (``absorb=None``: the prefill
    expanded, the steps absorbed); then the caches themselves, on the real tokens."""
    steps, real, c_kv, k_pe, index_keys = hf_decode(case.name)
    layer = convert_layer(case, package)
    cache = new_cache(package, layer)

    outs = [run_layer(layer, x, cache=cache, **forward) for x, _, forward, _ in steps]

    for out, (_, expected, _, rows) in zip(outs, steps, strict=True):
        assert_close(out[rows], expected[rows], name=f"decode step of {out.shape[1]} tokens")
    assert cache.length == N
    assert c_kv.shape == (B, 1, N, L) and k_pe.shape == (B, 1, N, R)
    assert_close(np.asarray(cache.c_kv)[real], c_kv[:, 0][real], name="c_kv")
    assert_close(np.asarray(cache.k_rope)[real], k_pe[:, 0][real], name="k_pe")
    if index_keys is None:
        assert cache.index_keys is None
    else:  # DSA: the indexer's rotated keys, as transformers' update_indexer holds them
        assert_close(np.asarray(cache.index_keys)[real], index_keys[real], name="indexer keys")


DSA_CASES = [case for case in CASES if "index_topk" in case.config]


@pytest.mark.parametrize("package", ["numpy", "torch"])
@pytest.mark.parametrize("case", DSA_CASES, ids=[case.name for case in DSA_CASES])
def test_dsa_decoding_over_pages_matches_dynamic_cache(case, package):
    """The DSA layer decoding over pages of 4 tokens (its latents and indexer keys under one
    block table), prefill then one token at a time, against transformers' DynamicCache."""
    steps, _, _, _, _ = hf_decode(case.name)
    layer = convert_layer(case, package)
    cache = new_cache(package, layer, paged=True)

    outs = [run_layer(layer, x, cache=cache, **forward) for x, _, forward, _ in steps]

    for out, (_, expected, _, rows) in zip(outs, steps, strict=True):
        assert_close(out[rows], expected[rows], name=f"paged step of {out.shape[1]} tokens")
    assert cache.length == N


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_scale_frequencies_and_factors_are_the_models(case):
    """What the converter reads from the config alone (no ``inv_freq=``) against the module's
    and the rotary embedding's own numbers: frequencies within float32 rounding (torch's pow may
    round the last bit apart), the scale, YaRN's attention factor, LongCat's scales."""
    config, model, state = built(case.name)
    attention = attention_of(case, model)

    layer = convert.latent_from_hf(config.to_dict(), state, layer_idx=case.layer_idx)

    rotary = getattr(model, "rotary_emb", None)
    if rotary is None:  # Kimi Linear: no RoPE, a rotation by angle 0
        assert not layer.inv_freq.any() and layer.rope_attention_factor == 1.0
    else:
        freqs = to_numpy(rotary.inv_freq)
        assert_close(layer.inv_freq / freqs, np.ones_like(freqs), dtype=np.float32)
        assert_close(layer.rope_attention_factor, rotary.attention_scaling)
    q_scale = getattr(attention, "mla_scale_q_lora", 1.0)  # LongCat's, folded into the scale
    assert_close(layer.scale, attention.scaling * q_scale, name="scale")
    assert layer.latent_scale == getattr(attention, "mla_scale_kv_lora", 1.0)
    if case.model == "Mistral4":
        parameters = config.rope_parameters
        expected = (
            parameters["llama_4_scaling_beta"],
            parameters["original_max_position_embeddings"],
        )
        assert layer.query_temperature == expected


def test_every_transformers_model_with_mla_weights_is_supported_or_refused():
    """transformers' model files that build ``kv_a_proj_with_mqa``: each one's model_type is
    supported or refused with a reason (a new one fails here until it is read)."""
    models = Path(transformers.__file__).parent / "models"
    with_mla = {
        path.parent.name
        for path in models.glob("*/modeling_*.py")
        if "kv_a_proj_with_mqa" in path.read_text(encoding="utf-8")
    }

    assert with_mla <= set(SUPPORTED_MODEL_TYPES) | set(REFUSED), with_mla - set(
        SUPPORTED_MODEL_TYPES
    )
    assert {"deepseek_v2", "deepseek_v3", "longcat_flash", "mistral4"} <= with_mla
