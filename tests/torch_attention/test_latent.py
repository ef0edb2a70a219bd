"""torch_attention.latent, the torch twin of multi-head latent attention: the state dict and weight
transfer both ways, autograd gradcheck of both computations, the absorbed form equal to the
expanded one, decoding with the cache equal to the full forward on every backend and over pages
equal to the contiguous cache, the cache's refusals through the layer (nothing written), and bad
input; the caches themselves: test_latent_cache.py. The layer against its NumPy twin on every
option and backend is the parity registry's (tests/parity/test_run.py); against
transformers, tests/parity/test_hf_latent.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention.latent as np_latent
from parity_tests.tolerances import LATENT_FORMS_RTOL, rel_error
from torch_attention import from_numpy, to_numpy
from torch_attention.latent import MultiHeadLatentAttention
from torch_attention.latent_cache import LatentCache, PagedLatentCache

from ..conftest import assert_close, to_torch

C, H = 12, 3
SIZES = {"kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 5}
L, R = SIZES["kv_lora_rank"], SIZES["qk_rope_head_dim"]
EVERYTHING = {
    "q_lora_rank": 5,
    "bias": True,
    "rope_attention_factor": 1.2,
    "scaling": 0.6,
    "latent_scale": 1.3,
    "query_temperature": (0.3, 3),
    "output_gate": "head",
    "gate_activation": "softplus",
    "gate_bias": True,
}


def twins(rng, options, backend="math"):
    """A float64 NumPy layer with random weights (norms too) and its torch twin holding the same
    state."""
    np_layer = np_latent.MultiHeadLatentAttention(C, H, **SIZES, **options, rng=0)
    np_layer.astype(np.float64)
    np_layer.load_state_dict(
        {name: rng.standard_normal(value.shape) for name, value in np_layer.state_dict().items()}
    )
    torch_layer = MultiHeadLatentAttention(**np_layer.constructor_args(), backend=backend)
    return np_layer, from_numpy(torch_layer.double(), np_layer)


def left_padded(rng, b=2, n=9, pad=3):
    """x (B, N, C), a key padding mask whose last element is left-padded by ``pad`` tokens, and
    the positions a tokenizer's left padding gives."""
    x = rng.standard_normal((b, n, C))
    padding = np.zeros((b, n), dtype=bool)
    padding[-1, :pad] = True
    return x, padding, np.maximum(np.cumsum(~padding, axis=1) - 1, 0)


# -- the layer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("q_lora_rank", [None, 5])
@pytest.mark.parametrize("gate", [None, "head", "element"])
def test_state_dict_is_the_numpy_twins_and_transfers_both_ways(rng, q_lora_rank, gate):
    options = {"q_lora_rank": q_lora_rank, "bias": True, "output_gate": gate}
    np_layer, torch_layer = twins(rng, options)
    fresh = np_latent.MultiHeadLatentAttention(C, H, **SIZES, **options)

    torch_state = to_numpy(torch_layer)
    fresh.astype(np.float64).load_state_dict(torch_state)

    assert list(torch_state) == list(np_layer.state_dict())  # names, in the order of creation
    for name, value in np_layer.state_dict().items():
        np.testing.assert_array_equal(torch_state[name], value)
        np.testing.assert_array_equal(fresh.state_dict()[name], value)


@pytest.mark.parametrize("absorb", [False, True])
def test_gradcheck_on_every_option(rng, absorb):
    _, layer = twins(rng, EVERYTHING)
    x, padding, positions = left_padded(rng, n=4, pad=1)
    params = tuple(layer.parameters())

    def forward(x_t, *weights):
        return layer(x_t, positions=to_torch(positions), key_padding_mask=to_torch(padding),
                     absorb=absorb)  # fmt: skip

    assert torch.autograd.gradcheck(
        forward, (to_torch(x, requires_grad=True), *params), fast_mode=True
    )


def test_absorbed_equals_expanded_and_numpy_on_left_padding(rng):
    np_layer, layer = twins(rng, EVERYTHING)
    x, padding, positions = left_padded(rng)
    dout = rng.standard_normal(x.shape)
    expected = np_layer(x, positions=positions, key_padding_mask=padding)
    runs = {}
    for absorb in (False, True):
        layer.zero_grad()
        x_t = to_torch(x, requires_grad=True)
        out = layer(x_t, positions=to_torch(positions), key_padding_mask=to_torch(padding),
                    absorb=absorb)  # fmt: skip
        out.backward(to_torch(dout))
        grads = {name: param.grad.clone() for name, param in layer.named_parameters()}
        runs[absorb] = (out.detach(), x_t.grad, grads)

    assert_close(runs[True][0], expected, name="out")
    for name, a, e in [
        ("out", runs[True][0], runs[False][0]),
        ("dx", runs[True][1], runs[False][1]),
    ]:
        assert rel_error(a.numpy(), e.numpy()) <= LATENT_FORMS_RTOL, name
    for name, grad in runs[False][2].items():
        assert rel_error(runs[True][2][name].numpy(), grad.numpy()) <= LATENT_FORMS_RTOL, name


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "manual"])
def test_decode_with_the_cache_equals_the_full_forward(rng, backend):
    """Prefill 4 tokens of a left-padded batch, then one at a time (absorbed steps)."""
    np_layer, layer = twins(rng, EVERYTHING, backend)
    x, padding, positions = left_padded(rng, n=7)
    cache = LatentCache(2, 7, L, R, torch.float64)

    with torch.no_grad():
        expected = layer(to_torch(x), positions=to_torch(positions),
                         key_padding_mask=to_torch(padding))  # fmt: skip
    outs = [
        layer(
            to_torch(x[:, start:stop]),
            cache=cache,
            positions=to_torch(positions[:, start:stop]),
            key_padding_mask=to_torch(padding[:, :stop]),
        )  # fmt: skip
        for start, stop in [(0, 4), (4, 5), (5, 6), (6, 7)]
    ]

    assert cache.length == 7 and not outs[-1].requires_grad
    assert_close(torch.cat(outs, dim=1), expected, name="decoded")


@pytest.mark.parametrize("absorb", [False, True], ids=["expanded", "absorbed"])
def test_decoding_over_pages_equals_the_contiguous_cache(rng, absorb):
    """Three sequences, the last left-padded, in pages of 2 that interleave in the pool; steps of
    3, 2, 1 and 1 tokens (the NumPy twin's test, on the "math" backend)."""
    _, layer = twins(rng, EVERYTHING)
    x, padding, positions = left_padded(rng, b=3, n=7)
    caches = [LatentCache(3, 7, L, R, torch.float64), PagedLatentCache(12, 2, L, R, torch.float64)]

    outs = [
        torch.cat([
            layer(to_torch(x[:, start:stop]), cache=cache, absorb=absorb,
                  positions=to_torch(positions[:, start:stop]),
                  key_padding_mask=to_torch(padding[:, :stop]))
            for start, stop in [(0, 3), (3, 5), (5, 6), (6, 7)]
        ], dim=1)
        for cache in caches
    ]  # fmt: skip

    assert caches[1].block_table.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert_close(outs[1], outs[0], name="paged")


def test_frequencies_stay_float64_when_the_layer_is_cast():
    model_freqs = torch.tensor([1.0, 0.01], dtype=torch.float32)
    layer = MultiHeadLatentAttention(C, H, **SIZES, inv_freq=model_freqs).float()

    assert layer.inv_freq.dtype == torch.float64
    assert torch.equal(layer.inv_freq, model_freqs.double())
    assert "inv_freq" not in layer.state_dict()


def test_train_mode_uses_the_explicit_keep_mask(rng):
    np_layer, layer = twins(rng, {"dropout": 0.3})
    x = rng.standard_normal((2, 5, C))
    keep = rng.random((2, H, 5, 5)) > 0.3

    expected = np_layer.train()(x, attn_dropout_mask=keep, absorb=True)
    out = layer.train()(to_torch(x), attn_dropout_mask=to_torch(keep), absorb=True)

    assert_close(out, expected, name="out")


# -- the cache ----------------------------------------------------------------------------------


def test_the_cache_holds_views_and_refuses_a_wrong_width_before_writing(rng):
    _, layer = twins(rng, {})
    cache = LatentCache(1, 5, L, R, torch.float64)
    layer(to_torch(rng.standard_normal((1, 4, C))), cache=cache)
    before = cache.latent.clone()
    narrow = LatentCache(1, 5, L - 2, R, torch.float64)

    with pytest.raises(ValueError, match="max_len = 5, but 4 cached \\+ 2 new tokens"):
        layer(to_torch(rng.standard_normal((1, 2, C))), cache=cache)
    with pytest.raises(ValueError, match="kv_lora_rank 6 does not fit its 4"):
        layer(to_torch(rng.standard_normal((1, 1, C))), cache=narrow)
    with pytest.raises(TypeError, match="the cache holds torch.float32"):
        layer(
            to_torch(rng.standard_normal((1, 1, C))), cache=LatentCache(1, 5, L, R, torch.float32)
        )

    assert cache.length == 4 and torch.equal(cache.latent, before) and narrow.length == 0
    assert cache.c_kv.data_ptr() == cache.latent.data_ptr() and cache.k_rope.shape == (1, 5, R)


def test_bad_construction_and_input_are_refused(rng):
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even, got 3"):
        MultiHeadLatentAttention(C, H, **(SIZES | {"qk_rope_head_dim": 3}))
    with pytest.raises(TypeError, match="LatentCache needs a floating torch dtype"):
        LatentCache(1, 4, L, R, torch.int64)
    layer = MultiHeadLatentAttention(C, H, **SIZES)
    with pytest.raises(TypeError, match="cache must be a LatentCache or a PagedLatentCache"):
        layer(torch.zeros(1, 2, C), cache="cache")
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        layer(torch.zeros(1, 2, C, dtype=torch.float64))


def test_repr_names_the_sizes_and_options():
    layer = MultiHeadLatentAttention(C, H, **SIZES, q_lora_rank=5, latent_scale=2.0,
                                     output_gate="head")  # fmt: skip

    assert "kv_lora_rank=6" in repr(layer) and "latent_scale=2.0" in repr(layer)
    assert "output_gate='head' (sigmoid)" in repr(layer)
    assert "(g_proj): Linear(in_features=12, out_features=3" in repr(layer)
    assert "(q_a_layernorm): RMSNorm(dim=5" in repr(layer)


DSA = {"q_lora_rank": 5, "index_n_heads": 2, "index_head_dim": 6, "index_topk": 3}


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_dsa_decoding_caches_the_indexer_keys_and_equals_the_full_forward(rng, paged):
    """DeepSeek-V3.2's DSA (3 of up to 7 keys per query): prefill 3 tokens of a left-padded
    batch, then one at a time; the indexer's keys cached beside the latents (in pages under the
    same block table), equal to the NumPy twin's cache."""
    np_layer, layer = twins(rng, DSA)
    x, padding, positions = left_padded(rng, n=7)
    if paged:
        cache = PagedLatentCache(8, 2, L, R, torch.float64, index_head_dim=6)
    else:
        cache = LatentCache(2, 7, L, R, torch.float64, index_head_dim=6)
    np_cache = np_latent.LatentCache(2, 7, L, R, np.float64, index_head_dim=6)

    with torch.no_grad():
        expected = layer(to_torch(x), positions=to_torch(positions),
                         key_padding_mask=to_torch(padding))  # fmt: skip
    outs = []
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 6), (6, 7)]:
        step = {"positions": positions[:, start:stop], "key_padding_mask": padding[:, :stop]}
        outs.append(layer(to_torch(x[:, start:stop]), cache=cache,
                          **{key: to_torch(value) for key, value in step.items()}))  # fmt: skip
        np_layer(x[:, start:stop], cache=np_cache, **step)

    assert cache.length == 7
    assert_close(torch.cat(outs, dim=1), expected, name="decoded")
    if not paged:
        assert_close(cache.index_keys, np_cache.index_keys, name="indexer keys")


def test_no_gradient_reaches_the_dsa_indexer(rng):
    """The selection is piecewise constant: the indexer's parameters get no .grad (what
    transformers' no_grad indexer gives), every other parameter one."""
    _, layer = twins(rng, DSA)
    x, padding, positions = left_padded(rng, n=6)

    layer(
        to_torch(x), positions=to_torch(positions), key_padding_mask=to_torch(padding)
    ).sum().backward()

    for name, param in layer.named_parameters():
        assert (param.grad is None) == name.startswith(layer.NO_GRADIENT), name
