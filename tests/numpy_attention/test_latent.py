"""MultiHeadLatentAttention (numpy_attention.latent): gradcheck of both computations on inputs
and every parameter (the output gate's g_proj too), torch autograd by name, the absorbed form
equal to the expanded one, float32,
decoding with the cache equal to the full sequence, over pages equal to the contiguous cache,
``absorb=None``'s choice, Hugging Face's names, and bad input (a wrong cache of either kind
included) refused before any work. The caches themselves: test_latent_cache.py.

The torch oracle is the layer written in torch ops from its definition, expanded: ``F.linear``,
torch's ``F.rms_norm``, ``test_rope.torch_rope`` (DeepSeek's interleaved pairs as complex numbers
rotated in place, DeepSeek-V2's form, not the layer's gathered halves: the scores are the same),
and the attention of ``oracle.py``.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numpy_attention import gradcheck, no_grad
from numpy_attention.latent import MultiHeadLatentAttention
from numpy_attention.latent_cache import LatentCache, PagedLatentCache
from parity_tests.tolerances import LATENT_FORMS_RTOL, rel_error

from ..conftest import assert_close, assert_gradcheck, to_torch
from .oracle import attention as oracle_attention
from .test_grouped import left_padded
from .test_rope import torch_rope

B, N, C, H = 2, 5, 6, 2
SIZES = {"kv_lora_rank": 4, "qk_nope_head_dim": 2, "qk_rope_head_dim": 4, "v_head_dim": 3}
L, P, R, DV = (SIZES[key] for key in SIZES)
DROPOUT = 0.3

OPTIONS = {
    "plain": {},
    "everything": {
        "q_lora_rank": 3,
        "bias": True,
        "rope_attention_factor": 1.2,
        "rope_theta": 100.0,
        "scaling": 0.8,
        "latent_scale": 1.4,
        "query_temperature": (0.5, 2),  # positions 0..4: t = 1, 1, 1 + .5 log 2, ...
        "norm_eps": 0.1,
        "dropout": DROPOUT,
        "output_gate": "head",
        "gate_activation": "softplus",
        "gate_bias": True,
    },
    "rotate_half": {"rope_interleave": False, "q_lora_rank": 3},
    "gate_head": {"output_gate": "head"},  # Bailing-hybrid (Ling 3.0)
    "gate_element_bias": {"output_gate": "element", "gate_bias": True},
    # DeepSeek-V3.2's DSA: 2 indexer heads of width 6 (R = 4 rotated) keep 3 of up to 5 keys
    "dsa": {"q_lora_rank": 3, "index_n_heads": 2, "index_head_dim": 6, "index_topk": 3},
    # HY-V4's: the indexer rotates its heads' last R dims, its own norm eps; sinks, a gate
    "dsa_hy": {
        "q_lora_rank": 3,
        "index_n_heads": 2,
        "index_head_dim": 6,
        "index_topk": 3,
        "index_rope_position": "last",
        "index_norm_eps": 1e-5,
        "sinks": True,
        "rope_interleave": False,
        "output_gate": "element",
    },
    # AXK2's: one projection of [q_resid, q_a] gives the queries and a gate per element
    "dsa_axk2": {
        "q_lora_rank": 3,
        "index_n_heads": 2,
        "index_head_dim": 6,
        "index_topk": 3,
        "query_gate": True,
        "bias": True,
    },
}
FORMS = {"expanded": False, "absorbed": True}


def make_layer(rng, **options):
    """A float64 layer; the norms' weights random (their initial ones would hide a wrong
    gradient); train mode only with dropout (whose keep-masks the tests give)."""
    layer = MultiHeadLatentAttention(C, H, **SIZES, rng=rng, **options)
    layer.astype(np.float64).train(options.get("dropout", 0.0) > 0)
    state = layer.state_dict()
    for name in state:
        if "layernorm" in name:
            state[name] = 1.0 + 0.5 * rng.standard_normal(state[name].shape)
        if name == "sinks":  # zeros at first: a wrong gradient would hide there too
            state[name] = rng.standard_normal(state[name].shape)
    layer.load_state_dict(state)
    return layer


def forward_inputs(rng, layer, *, padded, n=N):
    """x and the forward's keywords: left padding (element 0: 2 tokens) with per-batch positions
    when ``padded``, a keep-mask when the layer is in train mode."""
    x = rng.standard_normal((B, n, C))
    options = {}
    if padded:
        options["key_padding_mask"], options["positions"] = left_padded(B, n, [2, 0])
    if layer.training:
        options["attn_dropout_mask"] = rng.random((B, H, n, n)) >= DROPOUT
    return x, options


def torch_layer(x, params, args, *, positions=None, key_padding_mask=None,
                attn_dropout_mask=None):  # fmt: skip
    """The layer in torch ops, expanded, from its constructor arguments ``args``.

    x (B, N, C) and ``params`` (state-dict name -> tensor) are torch tensors; the others NumPy.
    """
    b, n, _ = x.shape
    heads, rank = args["num_heads"], args["kv_lora_rank"]
    p, r = args["qk_nope_head_dim"], args["qk_rope_head_dim"]
    eps = args["norm_eps"]
    if args["q_lora_rank"] is None:
        q = F.linear(x, params["q_proj.weight"])
    else:
        q_a = F.linear(x, params["q_a_proj.weight"], params.get("q_a_proj.bias"))
        q_resid = F.rms_norm(q_a, (args["q_lora_rank"],), params["q_a_layernorm.weight"], eps)
        if args["query_gate"]:  # AXK2: [q | gate] per head from [q_resid, q_a]
            fused = F.linear(torch.cat([q_resid, q_a], -1), params["q_gate_proj.weight"])
            fused = fused.reshape(b, n, heads, -1)
            q, gate_pre = fused[..., : p + r], fused[..., p + r :].reshape(b, n, -1)
        else:
            q = F.linear(q_resid, params["q_b_proj.weight"])
    q = q.reshape(b, n, heads, p + r).transpose(1, 2)  # (B, H, N, P+R)
    latent = F.linear(x, params["kv_a_proj_with_mqa.weight"], params.get("kv_a_proj_with_mqa.bias"))
    c = F.rms_norm(latent[..., :rank], (rank,), params["kv_a_layernorm.weight"], eps)
    c = c * args["latent_scale"]
    k_pe = latent[:, None, :, rank:]  # (B, 1, N, R)
    theta = args["rope_theta"]
    inv_freq = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    pos = torch.arange(n) if positions is None else to_torch(positions)
    rope = {"interleaved": args["rope_interleave"], "factor": args["rope_attention_factor"]}
    q_pe = torch_rope(q[..., p:], pos, inv_freq, **rope)
    k_pe = torch_rope(k_pe, pos, inv_freq, **rope)
    q = torch.cat([q[..., :p], q_pe], dim=-1)
    if args["query_temperature"] is not None:
        beta, length = args["query_temperature"]
        t = 1 + beta * torch.log(1 + torch.floor(pos.to(torch.float64) / length))
        q = q * (t[:, None, :, None] if t.dim() == 2 else t[:, None])
    kv = F.linear(c, params["kv_b_proj.weight"]).reshape(b, n, heads, -1).transpose(1, 2)
    k = torch.cat([kv[..., :p], k_pe.expand(b, heads, n, r)], dim=-1)  # (B, H, N, P+R)
    scale = args["scaling"] if args["scaling"] is not None else (p + r) ** -0.5
    allowed = None
    if args["index_topk"] is not None:  # DSA: the keys the indexer keeps, (B, 1, N, N)
        allowed = torch_selection(x, q_resid, params, args, pos, inv_freq, key_padding_mask)
    out, _ = oracle_attention(
        q, k, kv[..., p:], causal=True, scale=scale, attn_mask=allowed, sinks=params.get("sinks"),
        key_padding_mask=None if key_padding_mask is None else to_torch(key_padding_mask),
        dropout_p=args["dropout"],
        dropout_mask=None if attn_dropout_mask is None else to_torch(attn_dropout_mask),
    )  # fmt: skip
    out = out.transpose(1, 2).reshape(b, n, -1)  # (B, H, N, Dv) -> (B, N, H*Dv)
    if args["output_gate"] is not None:  # act(x W_g + b_g): (B, N, H*Dv) or (B, N, H)
        pre = F.linear(x, params["g_proj.weight"], params.get("g_proj.bias"))
        gate = torch.sigmoid(pre) if args["gate_activation"] == "sigmoid" else F.softplus(pre)
        if args["output_gate"] == "head":
            gate = gate.repeat_interleave(args["v_head_dim"], dim=-1)  # one per head's Dv
        out = out * gate
    if args["query_gate"]:
        out = out * torch.sigmoid(gate_pre)
    return F.linear(out, params["o_proj.weight"], params.get("o_proj.bias"))


@torch.no_grad()
def torch_selection(x, q_resid, params, args, pos, inv_freq, key_padding_mask):
    """DSA's selection in torch ops: the indexer's RoPE on each head's first (or last) R dims,
    relu scores summed with the per-token head weights, each row's top-k visible keys (ties to
    the lower index, by a stable sort), as a bool mask (B, 1, N, N)."""
    b, n, _ = x.shape
    heads, width, r = args["index_n_heads"], args["index_head_dim"], args["qk_rope_head_dim"]
    q = F.linear(q_resid, params["indexer.wq_b.weight"]).reshape(b, n, heads, width)
    norm = params["indexer.k_norm.weight"], params["indexer.k_norm.bias"]
    k = F.layer_norm(
        F.linear(x, params["indexer.wk.weight"]), (width,), *norm, args["index_norm_eps"]
    )[:, None]  # (B, 1, N, DI); fmt: skip
    rot = {"interleaved": args["index_rope_interleave"], "factor": args["rope_attention_factor"]}
    lo = 0 if args["index_rope_position"] == "first" else width - r  # the rotated dims

    def rotate(t):
        turned = torch_rope(t[..., lo : lo + r], pos, inv_freq, **rot)
        return torch.cat([t[..., :lo], turned, t[..., lo + r :]], dim=-1)

    q, k = rotate(q.transpose(1, 2)), rotate(k)  # (B, HI, N, DI), (B, 1, N, DI)
    weights = F.linear(x, params["indexer.weights_proj.weight"]) * heads**-0.5  # (B, N, HI)
    relu = torch.relu((q @ k.transpose(-1, -2)) * width**-0.5)  # (B, HI, N, N)
    scores = torch.einsum("bhts,bth->bts", relu, weights)
    hidden = torch.ones(n, n, dtype=torch.bool).triu(1)
    if key_padding_mask is not None:
        hidden = hidden | to_torch(key_padding_mask)[:, None, :]
    scores = scores.masked_fill(hidden, -torch.inf)
    order = torch.sort(-scores, dim=-1, stable=True).indices[..., : args["index_topk"]]
    kept = torch.gather(scores, -1, order) > -torch.inf
    allowed = torch.zeros(b, n, n, dtype=torch.bool)
    allowed.scatter_(-1, order, kept)
    return allowed[:, None]


def torch_grads(layer, x, dout, **forward):
    """Output and gradients (dx and every parameter's, by name) of ``torch_layer``, as NumPy."""
    tx = to_torch(x, requires_grad=True)
    params = {name: to_torch(v, requires_grad=True) for name, v in layer.state_dict().items()}
    out = torch_layer(tx, params, layer.constructor_args(), **forward)
    out.backward(to_torch(dout))
    grads = {  # DSA's indexer selects without a gradient: zero
        name: np.zeros(tensor.shape)
        if name.startswith("indexer.") and tensor.grad is None
        else tensor.grad.numpy()
        for name, tensor in params.items()
    }
    return out.detach().numpy(), tx.grad.numpy(), grads


def run(layer, x, dout, **forward):
    """The layer's output, dx and every parameter's gradient, from zeroed gradients."""
    layer.zero_grad()
    out = layer(x, **forward)
    dx = layer.backward(dout)
    return out, dx, {name: grad.copy() for name, grad in layer.named_grads().items()}


# -- gradients and values ---------------------------------------------------------------------


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("option", list(OPTIONS))
def test_matches_torch_autograd_on_every_parameter_by_name(rng, option, form):
    layer = make_layer(rng, **OPTIONS[option])
    x, forward = forward_inputs(rng, layer, padded=option != "plain")
    dout = rng.standard_normal((B, N, C))

    out, dx, grads = run(layer, x, dout, absorb=FORMS[form], **forward)
    out_expected, dx_expected, grads_expected = torch_grads(layer, x, dout, **forward)

    assert_close(out, out_expected, name="out")
    assert_close(dx, dx_expected, name="dx")
    assert sorted(grads) == sorted(grads_expected)
    for name, grad in grads_expected.items():
        assert_close(grads[name], grad, name=name)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize(
    "option", ["plain", "everything", "gate_element_bias", "dsa", "dsa_hy", "dsa_axk2"]
)
def test_gradcheck_on_inputs_and_every_parameter(rng, option, form):
    layer = make_layer(rng, **OPTIONS[option])
    x, forward = forward_inputs(rng, layer, padded=option == "everything", n=4)

    report = gradcheck(layer, x, absorb=FORMS[form], **forward)

    assert {row.name for row in report.rows} == {"input0", *layer.named_parameters()}
    assert_gradcheck(report)


def test_absorbed_equals_expanded_in_float64(rng):
    """Output, dx and every parameter's gradient to LATENT_FORMS_RTOL, padding and dropout on."""
    layer = make_layer(rng, **OPTIONS["everything"])
    x, forward = forward_inputs(rng, layer, padded=True)
    dout = rng.standard_normal((B, N, C))

    expanded = run(layer, x, dout, absorb=False, **forward)
    absorbed = run(layer, x, dout, absorb=True, **forward)

    for name, a, e in [("out", absorbed[0], expanded[0]), ("dx", absorbed[1], expanded[1])] + [
        (key, absorbed[2][key], expanded[2][key]) for key in expanded[2]
    ]:
        assert rel_error(a, e) <= LATENT_FORMS_RTOL, name


def test_the_shared_rope_key_gets_the_sum_over_heads(rng):
    """k_pe feeds every head: its gradient, through kv_a_proj_with_mqa's last R rows, is the
    sum of each head's own (one head at a time: the other heads' o_proj columns zeroed)."""
    layer = make_layer(rng)
    x = rng.standard_normal((B, N, C))
    dout = rng.standard_normal((B, N, C))
    rows = slice(L, L + R)

    total = run(layer, x, dout)[2]["kv_a_proj_with_mqa.weight"][rows]
    per_head = []
    for h in range(H):
        alone = copy.deepcopy(layer)
        weight = alone.o_proj.weight.reshape(C, H, DV).copy()
        weight[:, np.arange(H) != h] = 0.0
        alone.o_proj.weight = weight.reshape(C, H * DV)
        per_head.append(run(alone, x, dout)[2]["kv_a_proj_with_mqa.weight"][rows])

    assert_close(total, sum(per_head), name="dk_pe rows")
    assert min(np.abs(g).max() for g in per_head) > 1e-3  # every head contributes


@pytest.mark.parametrize("form", list(FORMS))
def test_float32_follows_float64(rng, form):
    layer64 = make_layer(rng, **OPTIONS["everything"])
    layer32 = copy.deepcopy(layer64).astype(np.float32)
    x, forward = forward_inputs(rng, layer64, padded=True)
    dout = rng.standard_normal((B, N, C))

    out32, dx32, grads32 = run(layer32, x.astype(np.float32), dout.astype(np.float32),
                               absorb=FORMS[form], **forward)  # fmt: skip
    out64, dx64, grads64 = run(layer64, x, dout, absorb=FORMS[form], **forward)

    assert out32.dtype == dx32.dtype == np.float32
    assert_close(out32, out64, dtype=np.float32, name="out")
    assert_close(dx32, dx64, dtype=np.float32, name="dx")
    for name, grad in grads64.items():
        assert grads32[name].dtype == np.float32
        assert_close(grads32[name], grad, dtype=np.float32, name=name)


# -- decoding with the cache ------------------------------------------------------------------


@pytest.mark.parametrize("absorb", [None, False, True])
@pytest.mark.parametrize(
    "option", ["plain", "everything", "gate_head", "dsa", "dsa_hy", "dsa_axk2"]
)
def test_decoding_with_the_cache_gives_the_full_sequence(rng, option, absorb):
    """Left padding (elements: 2 and 4 padding tokens); prefill 3 tokens, then one at a time
    (DSA: the indexer's keys cached beside the latents)."""
    n, prefill = 7, 3
    layer = make_layer(rng, **OPTIONS[option]).eval()
    x = rng.standard_normal((B, n, C))
    padding, positions = left_padded(B, n, [2, 4])
    index = OPTIONS[option].get("index_head_dim")
    cache = LatentCache(B, n + 1, L, R, np.float64, index_head_dim=index)

    full = layer(x, key_padding_mask=padding, positions=positions)
    outs = [
        layer(
            x[:, start:stop],
            cache=cache,
            absorb=absorb,
            positions=positions[:, start:stop],
            key_padding_mask=padding[:, :stop],
        )
        for start, stop in [(0, prefill), *((t, t + 1) for t in range(prefill, n))]
    ]

    assert cache.length == n
    assert_close(np.concatenate(outs, axis=1), full, name="decoded rows")


@pytest.mark.parametrize("option", ["everything", "dsa", "dsa_hy", "dsa_axk2"])
@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
def test_decoding_over_pages_equals_the_contiguous_cache(rng, absorb, option):
    """Three left-padded sequences (0, 2 and 3 padding tokens) in pages of 2, each sequence's pages
    one run in its region of the pool (read in place); steps of 3, 2, 1 and 2 tokens (s_q 1 and
    > 1).
    Exactly the contiguous cache's numbers: per sequence, the same products on the same rows
    (DSA: the indexer's keys in pages under the same block table)."""
    n, b = 8, 3
    layer = make_layer(rng, **OPTIONS[option]).eval()
    x = rng.standard_normal((b, n, C))
    padding, positions = left_padded(b, n, [0, 2, 3])
    index = {"index_head_dim": OPTIONS[option].get("index_head_dim")}
    caches = [
        LatentCache(b, n, L, R, np.float64, **index),
        PagedLatentCache(4 * b, 2, L, R, np.float64, **index),
    ]

    outs = [
        np.concatenate([
            layer(x[:, start:stop], cache=cache, absorb=absorb,
                  positions=positions[:, start:stop], key_padding_mask=padding[:, :stop])
            for start, stop in [(0, 3), (3, 5), (5, 6), (6, 8)]
        ], axis=1)
        for cache in caches
    ]  # fmt: skip

    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(caches[1].block_table, [[0, 1, 2, 3], [4, 5, 6, 7],
                                                          [8, 9, 10, 11]])  # fmt: skip
    assert_close(outs[0], layer(x, key_padding_mask=padding, positions=positions), name="full")


def test_absorb_none_absorbs_decoding_steps_and_expands_the_rest(rng, monkeypatch):
    """The rule on DeepSeek-V2-Lite's shapes, and what runs: kv_b_proj expands the cache only
    where the rule says so (the absorbed form reads its weight, never calls it)."""
    lite = MultiHeadLatentAttention(
        64, 16, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128
    )
    layer = make_layer(rng)
    calls = []
    forward = layer.kv_b_proj.forward
    monkeypatch.setattr(layer.kv_b_proj, "forward", lambda c: calls.append(c.shape) or forward(c))
    cache = LatentCache(B, 9, L, R, np.float64)

    layer(rng.standard_normal((B, 4, C)))  # no cache: expanded
    layer(rng.standard_normal((B, 4, C)), cache=cache)  # prefill: cheaper expanded
    layer(rng.standard_normal((B, 1, C)), cache=cache)  # a step over 5 keys: absorbed

    assert lite.absorbs(1, 4096) and lite.absorbs(16, 4096)
    assert not lite.absorbs(4096, 4096) and not lite.absorbs(1, 1)
    assert not layer.absorbs(4, 4) and layer.absorbs(1, 5)
    assert calls == [(B, 4, L), (B, 4, L)]


def test_the_cache_holds_the_normed_latent_and_the_rotated_shared_key(rng):
    """What transformers 5 caches: c = kv_a_layernorm(latent) * latent_scale and k_pe after
    RoPE, one head, per token (here from the layer's own parts)."""
    layer = make_layer(rng, latent_scale=1.5).eval()
    x = rng.standard_normal((B, 3, C))
    cache = LatentCache(B, 4, L, R, np.float64)

    layer(x, cache=cache)
    latent = layer.kv_a_proj_with_mqa(x)
    with no_grad():
        c = layer.kv_a_layernorm(latent[..., :L]) * 1.5
    inv_freq = layer.inv_freq
    angles = np.arange(3)[:, None] * inv_freq  # (N, R/2)
    a, b = latent[..., L::2], latent[..., L + 1 :: 2]  # DeepSeek's pairs
    rotated = np.concatenate([a * np.cos(angles) - b * np.sin(angles),
                              b * np.cos(angles) + a * np.sin(angles)], axis=-1)  # fmt: skip

    assert_close(cache.c_kv[:, :3], c, name="c_kv")
    assert_close(cache.k_rope[:, :3], rotated, name="k_rope")
    assert np.shares_memory(cache.c_kv, cache.latent) and cache.latent.shape == (B, 4, L + R)


def test_backward_after_a_cached_forward_is_refused(rng):
    layer = make_layer(rng)
    layer(rng.standard_normal((B, 3, C)), cache=LatentCache(B, 3, L, R, np.float64))

    with pytest.raises(RuntimeError, match="last forward appended to a LatentCache"):
        layer.backward(np.ones((B, 3, C)))


def test_no_grad_forward_keeps_nothing(rng):
    layer = make_layer(rng)

    with no_grad():
        layer(rng.standard_normal((B, N, C)), absorb=True)

    with pytest.raises(RuntimeError, match="forward first"):
        layer.backward(np.ones((B, N, C)))


# -- the layer's contract: parameters, module files, bad input --------------------------------


def test_parameters_are_named_like_hugging_face(rng):
    lora = MultiHeadLatentAttention(C, H, **SIZES, q_lora_rank=3, bias=True, rng=rng)
    plain = MultiHeadLatentAttention(C, H, **SIZES, rng=rng)

    assert {name: value.shape for name, value in lora.state_dict().items()} == {
        "q_a_proj.weight": (3, C),
        "q_a_proj.bias": (3,),
        "q_a_layernorm.weight": (3,),
        "q_b_proj.weight": (H * (P + R), 3),
        "kv_a_proj_with_mqa.weight": (L + R, C),
        "kv_a_proj_with_mqa.bias": (L + R,),
        "kv_a_layernorm.weight": (L,),
        "kv_b_proj.weight": (H * (P + DV), L),
        "o_proj.weight": (C, H * DV),
        "o_proj.bias": (C,),
    }
    assert list(plain.state_dict())[:2] == ["q_proj.weight", "kv_a_proj_with_mqa.weight"]
    assert plain.scale == (P + R) ** -0.5 and plain.dtype == np.float32
    for kind, rows in [("element", H * DV), ("head", H)]:  # Bailing-hybrid: per head, H rows
        gated = MultiHeadLatentAttention(C, H, **SIZES, output_gate=kind, gate_bias=True, rng=rng)
        shapes = {name: value.shape for name, value in gated.state_dict().items()}
        assert list(shapes)[-2:] == ["g_proj.weight", "g_proj.bias"]  # created last, as in HF
        assert shapes["g_proj.weight"] == (rows, C) and shapes["g_proj.bias"] == (rows,)


def test_constructor_args_survive_json(rng):
    layer = make_layer(rng, inv_freq=np.array([1.0, 0.25], np.float32), query_temperature=[0.1, 8],
                       output_gate="head", gate_activation="softplus")  # fmt: skip

    rebuilt = MultiHeadLatentAttention(**json.loads(json.dumps(layer.constructor_args())))

    assert rebuilt.constructor_args() == layer.constructor_args()
    assert layer.constructor_args()["query_temperature"] == (0.1, 8)
    np.testing.assert_array_equal(rebuilt.inv_freq, [1.0, 0.25])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"qk_rope_head_dim": 3}, ValueError, "qk_rope_head_dim must be even, got 3"),
        ({"kv_lora_rank": 0}, ValueError, "kv_lora_rank must be a positive int"),
        ({"q_lora_rank": 0}, ValueError, "q_lora_rank must be a positive int"),
        ({"inv_freq": np.ones(3)}, ValueError, r"\(qk_rope_head_dim / 2,\) = \(2,\)"),
        ({"scaling": np.inf}, ValueError, "scaling must be finite"),
        ({"query_temperature": 0.1}, TypeError, r"query_temperature must be \(beta, length\)"),
        ({"query_temperature": (0.1, 0)}, ValueError, r"query_temperature\[1\].*must be > 0"),
        ({"norm_eps": 0.0}, ValueError, "norm_eps must be > 0"),
        ({"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
        ({"rope_interleave": 1}, TypeError, "rope_interleave must be a bool"),
        ({"output_gate": "channel"}, ValueError, "output_gate must be None or one of"),
        ({"output_gate": "head", "gate_activation": "silu"}, ValueError,
         "gate_activation must be one of .*'silu'"),
        ({"gate_activation": "softplus"}, ValueError, "but output_gate is None"),
        ({"gate_bias": True}, ValueError, "but output_gate is None"),
        ({"output_gate": "head", "gate_bias": 1}, TypeError, "gate_bias must be a bool"),
        ({"q_lora_rank": 3, "index_topk": 2}, ValueError,
         "index_n_heads, index_head_dim missing: DSA's indexer needs"),
        ({"index_n_heads": 2, "index_head_dim": 6, "index_topk": 2}, ValueError,
         "reads the query latent .* needs q_lora_rank"),
        ({"q_lora_rank": 3, "index_n_heads": 2, "index_head_dim": 2, "index_topk": 2},
         ValueError, r"index_head_dim \(2\) must be at least qk_rope_head_dim \(4\)"),
        ({"q_lora_rank": 3, "index_n_heads": 2, "index_head_dim": 6, "index_topk": 0},
         ValueError, "index_topk must be a positive int"),
        ({"q_lora_rank": 3, "index_n_heads": 2, "index_head_dim": 6, "index_topk": 2,
          "index_rope_interleave": 1}, TypeError, "index_rope_interleave must be a bool"),
        ({"q_lora_rank": 3, "index_n_heads": 2, "index_head_dim": 6, "index_topk": 2,
          "index_rope_position": "middle"}, ValueError,
         "index_rope_position must be 'first' or 'last', got 'middle'"),
        ({"q_lora_rank": 3, "index_n_heads": 2, "index_head_dim": 6, "index_topk": 2,
          "index_norm_eps": 0.0}, ValueError, "index_norm_eps must be > 0"),
        ({"index_shared": True, "q_lora_rank": 3, "index_n_heads": 2, "index_head_dim": 6,
          "index_topk": 2}, ValueError, "index_shared reads the selection of the layer before"),
        ({"sinks": 1}, TypeError, "sinks must be a bool"),
        ({"query_gate": True}, ValueError, "query_gate projects .* it needs q_lora_rank"),
        ({"query_gate": True, "q_lora_rank": 3, "output_gate": "head"}, ValueError,
         "query_gate is the layer's output gate"),
    ],
)  # fmt: skip
def test_bad_construction_is_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadLatentAttention(C, H, **(SIZES | kwargs))


@pytest.mark.parametrize(
    ("forward", "error", "match"),
    [
        ({"positions": np.arange(4)}, ValueError, r"positions must be \(N,\) = \(3,\)"),
        ({"key_padding_mask": np.zeros((B, 3), bool)}, ValueError, r"cache's length.*\(2, 5\)"),
        ({"absorb": 1}, TypeError, "absorb must be a bool"),
        ({"cache": LatentCache(B, 2, L, R, np.float64)}, ValueError, "max_len = 2.*length of 3"),
        ({"cache": LatentCache(B, 8, L + 1, R, np.float64)}, ValueError,
         r"kv_lora_rank 4 does not fit its 5"),
        ({"cache": LatentCache(B, 8, L, R + 2, np.float64)}, ValueError,
         r"qk_rope_head_dim 4 does not fit its 6"),
        ({"cache": LatentCache(B + 1, 8, L, R, np.float64)}, ValueError, "batch 2 does not fit"),
        ({"cache": LatentCache(B, 8, L, R, np.float32)}, TypeError, "holds float32.*float64"),
        ({"cache": "cache"}, TypeError, "must be a LatentCache or a PagedLatentCache, got str"),
        ({"cache": PagedLatentCache(8, 2, L + 1, R, np.float64)}, ValueError,
         r"kv_lora_rank 4 does not fit its 5"),
        ({"cache": PagedLatentCache(8, 2, L, R + 2, np.float64)}, ValueError,
         r"qk_rope_head_dim 4 does not fit its 6"),
        ({"cache": PagedLatentCache(8, 2, L, R, np.float32)}, TypeError, "holds float32.*float64"),
        ({"cache": "3 sequences"}, ValueError, "3 sequences of .*; batch 2 does not fit its 3"),
        ({"cache": PagedLatentCache(3, 2, L, R, np.float64)}, ValueError,
         "cache is full: 2 sequences of 0 tokens need 4 more pages of 2 for 3 new tokens, 3"),
        ({"cache": LatentCache(B, 8, L, R, np.float64, index_head_dim=6)}, ValueError,
         r"holds indexer keys \(index_head_dim=6\), but the layer has no indexer"),
    ],
)  # fmt: skip
def test_bad_forward_input_is_refused_before_any_work(rng, monkeypatch, forward, error, match):
    """Nothing is projected and nothing is written to any cache."""
    layer = make_layer(rng)
    cache = LatentCache(B, 8, L, R, np.float64)
    layer(rng.standard_normal((B, 2, C)), cache=cache)  # 2 tokens cached
    given = forward.get("cache")
    if given is None:
        forward = {**forward, "cache": cache}
    elif given == "3 sequences":  # a paged cache already holding another batch
        given = PagedLatentCache(8, 2, L, R, np.float64)
        given.append(np.zeros((3, 1, L)), np.zeros((3, 1, R)))
        forward = {**forward, "cache": given}
    caches = [c for c in (cache, given) if isinstance(c, (LatentCache, PagedLatentCache))]
    before = [(c.length, c.latent.copy()) for c in caches]

    def projected(x):
        raise AssertionError("kv_a_proj_with_mqa ran before the input was checked")

    monkeypatch.setattr(layer.kv_a_proj_with_mqa, "forward", projected)
    with pytest.raises(error, match=match):
        layer(rng.standard_normal((B, 3, C)), **forward)

    for c, (length, latent) in zip(caches, before, strict=True):
        assert c.length == length
        np.testing.assert_array_equal(c.latent, latent)


@pytest.mark.parametrize(
    ("index_head_dim", "match"),
    [
        (None, r"index_head_dim=6, but the cache holds none \(build it with index_head_dim=6\)"),
        (5, "index_head_dim=6, but the cache holds 5"),
    ],
)
def test_a_dsa_layer_needs_a_cache_of_its_indexer_keys(rng, index_head_dim, match):
    """Refused before any work: nothing written, the cache still empty."""
    layer = make_layer(rng, **OPTIONS["dsa"]).eval()
    cache = LatentCache(B, 8, L, R, np.float64, index_head_dim=index_head_dim)

    with pytest.raises(ValueError, match=match):
        layer(rng.standard_normal((B, 2, C)), cache=cache)
    assert cache.length == 0


def test_a_shared_dsa_layer_reads_the_selection_it_is_given_and_only_it(rng):
    """GLM-5's and HY-V4's "shared" layers: the previous layer's ``.selection`` is required,
    checked for shape, and attended exactly (a full layer handed the same mask as
    ``index_selection`` would refuse it: it selects its own)."""
    full = make_layer(rng, **OPTIONS["dsa"]).eval()
    shared = make_layer(rng, q_lora_rank=3, index_shared=True).eval()
    x, forward = forward_inputs(rng, full, padded=True)
    full(x, **forward)

    out = shared(x, index_selection=full.selection, **forward)

    assert np.array_equal(shared.selection, full.selection)
    with pytest.raises(ValueError, match="reads the keys the layer before it selected"):
        shared(x, **forward)
    with pytest.raises(ValueError, match=r"must be \(B, N, M\) = \(2, 5, 5\).*got \(2, 5, 4\)"):
        shared(x, index_selection=full.selection[..., :4], **forward)
    with pytest.raises(ValueError, match="is for a shared DSA layer"):
        full(x, index_selection=full.selection, **forward)
    everything = shared.selection | True  # every key given: the layer is plain causal MLA
    plain = make_layer(rng, q_lora_rank=3).eval()
    plain.load_state_dict(shared.state_dict())
    assert_close(shared(x, index_selection=everything, **forward), plain(x, **forward))
    assert not np.allclose(out, plain(x, **forward))  # the given selection did hide keys
