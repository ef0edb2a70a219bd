"""torch_attention.grouped, the torch twin of today's decoder attention (RoPE and RMSNorm are in
test_rope.py and test_norms.py): the layer's state dict, gradcheck on every option and
backend, decoding with the cache equal to the full forward on every backend, the cache's
refusals (nothing written), and bad input. The layer against its NumPy twin, every option and
backend, is the parity registry's (tests/parity/test_run.py); against transformers,
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention.decode.cache as np_caches
import numpy_attention.grouped as np_grouped
import torch_attention.grouped as torch_grouped
from torch_attention import from_numpy
from torch_attention.decode.cache import KVCache, PagedKVCache
from torch_attention.grouped import GroupedQueryAttention

from ..conftest import assert_close, to_numpy, to_torch

C, H, H_KV, D = 16, 4, 2, 6
# Every option that changes the math, each alone; "all" together (with GQA everywhere).
OPTIONS = {
    "plain": {},
    "bias": {"bias": True, "out_bias": True},
    "qk_norm": {"qk_norm": True, "norm_eps": 1e-5},
    "window": {"window": (2, 0)},
    "softcap": {"softcap": 1.5},
    "sinks": {"sinks": True},
    "scaling": {"scaling": 0.7},
    "yarn-factor": {"rope_attention_factor": 1.3},
    "interleaved": {"rope_interleaved": True},
    "gate": {"output_gate": "element"},
    "clip_output_norm": {"clip_qkv": 2.0, "bias": True, "output_norm": True},  # a third clamped
    "qk_norm_layer_bias": {  # Persimmon's: a LayerNorm with a bias per head, half rotated
        "qk_norm": True,
        "qk_norm_type": "layer_bias",
        "rotary_dim": 2,
        "bias": True,
    },
    "qk_norm_after_rope_temperature": {  # Hunyuan's norm, Ministral 3's temperature
        "qk_norm": True,
        "qk_norm_position": "after_rope",
        "query_temperature": {"kind": "log_floor", "beta": 0.5, "length": 2.0, "offset": 0.0},
    },
    "alibi": {"alibi_slopes": [0.5, 0.25, 0.125, 1.5], "rotary_dim": 0},  # MPT's, no RoPE
    "value_width_scale": {"v_head_dim": 4, "value_scale": 0.7},  # MiMo-V2-Flash's values
    "value_width_sinks_gate": {"v_head_dim": 8, "value_scale": -1.3, "sinks": True}
    | {"window": (2, 0), "output_gate": "head", "bias": True},
    # DiffLlama's: values twice as wide reach the backend (the two halves side by side)
    "differential": {"differential": True, "lambda_init": 0.3, "bias": True, "window": (3, 0)},
    "chunk": {  # Llama 4's RoPE layers: chunks of 3, interleaved RoPE, the L2 norm after it
        "chunk_size": 3,
        "rope_interleaved": True,
        "qk_norm": True,
        "qk_norm_type": "rms_weightless",
        "qk_norm_position": "after_rope",
    },
    "all": {
        "bias": True,
        "qk_norm": True,
        "window": (3, 0),
        "softcap": 2.0,
        "sinks": True,
        "scaling": 0.5,
        "rope_attention_factor": 1.2,
        "output_gate": "element",
    },
}
# The options of the projections, norms and RoPE that later families need (they never reach the
# attention backend, so they run on "math" alone): compared with the NumPy twin.
FAMILY_OPTIONS = {
    "partial_rotary": {"rotary_dim": 2, "rope_interleaved": True},
    "nope": {"rotary_dim": 0},
    "long_rope": {"long_inv_freq": [0.5, 0.2, 0.01], "original_max_positions": 6},
    "qk_norm_all": {"qk_norm": True, "qk_norm_shape": "all"},
    "qk_norm_layer_per_head_offset": {
        "qk_norm": True,
        "qk_norm_type": "layer",
        "qk_norm_shape": "per_head",
        "norm_weight_offset": 1.0,
    },
    "gate_head_softplus_bias": {
        "output_gate": "head",
        "gate_activation": "softplus",
        "gate_bias": True,
    },
    "gate_element_softplus": {"output_gate": "element", "gate_activation": "softplus"},
    "gate_head": {"output_gate": "head"},
    "clip_after_norm": {  # OLMoE's order
        "qk_norm": True,
        "qk_norm_shape": "all",
        "clip_qkv": 1.0,
        "clip_after_norm": True,
    },
    "clip_before_layer_norm": {"qk_norm": True, "qk_norm_type": "layer", "clip_qkv": 2.0},
    "output_norm_eps": {"output_norm": True, "output_norm_eps": 0.5},
    "qk_norm_weightless_after_rope": {  # nanochat
        "qk_norm": True,
        "qk_norm_type": "rms_weightless",
        "qk_norm_position": "after_rope",
    },
    "qk_norm_weightless_all_after_rope": {
        "qk_norm": True,
        "qk_norm_type": "rms_weightless",
        "qk_norm_shape": "all",
        "qk_norm_position": "after_rope",
    },
    "qk_norm_layer_per_head_after_rope": {
        "qk_norm": True,
        "qk_norm_type": "layer",
        "qk_norm_shape": "per_head",
        "qk_norm_position": "after_rope",
    },
    "qk_norm_layer_bias_all_partial": {
        "qk_norm": True,
        "qk_norm_type": "layer_bias",
        "qk_norm_shape": "all",
        "rotary_dim": 2,
    },
    "alibi_qk_norm_layer_bias_all_clip": {  # MPT's attention, half the head rotated here
        "alibi_slopes": [0.5, 0.25, 0.125, 1.5],
        "qk_norm": True,
        "qk_norm_type": "layer_bias",
        "qk_norm_shape": "all",
        "clip_qkv": 2.0,
        "rotary_dim": 2,
    },
    "temperature_cache_nope": {  # Llama 4's NoPE layers: t(p) of the cache's positions
        "rotary_dim": 0,
        "query_temperature": {"kind": "log_floor", "beta": 0.5, "length": 2.0, "offset": 1.0}
        | {"positions": "cache"},
    },
    "value_norm_qk_norm": {"value_norm": True, "qk_norm": True, "norm_eps": 0.1},  # Gemma 3n
    "values_from_keys_value_norm": {"values_from_keys": True, "value_norm": True},  # Gemma 4
    "temperature_power_nope": {  # Beam's NoPE layers
        "rotary_dim": 0,
        "query_temperature": {"kind": "power", "exponent": 0.7, "length": 3.0, "offset": 1.0},
    },
    "value_width_scale_gate_element": {"v_head_dim": 4, "value_scale": 0.7}  # MiMo-V2-Flash's
    | {"output_gate": "element", "sinks": True},
    "value_width_output_norm_clip": {"v_head_dim": 8, "output_norm": True, "clip_qkv": 2.0},
    "differential_qk_norm_sinks": {
        "differential": True,
        "lambda_init": 0.7,
        "differential_eps": 0.1,
        "qk_norm": True,
        "sinks": True,
        "softcap": 1.5,
        "rotary_dim": 2,
    },
}
# The options SDPA computes (no softcap, no sinks): which layer options each backend applies to.
# FlexAttention takes every option but has no backward on CPU: it runs the decode tests (no grad).
SDPA_REFUSES = ("softcap", "sinks")
BACKENDS = ["auto", "sdpa", "math", "manual", "flex"]


def applies(backend, options):
    return backend != "sdpa" or not any(options.get(name) for name in SDPA_REFUSES)


RUNS = [
    pytest.param(name, backend, id=f"{name}-{backend}")
    for name, options in OPTIONS.items()
    for backend in BACKENDS
    if applies(backend, options)
]


def twins(rng, options, backend="math"):
    """A float64 NumPy layer with random weights (norm weights and sinks too) and its torch twin
    holding the same state."""
    np_layer = np_grouped.GroupedQueryAttention(C, H, H_KV, head_dim=D, **options, rng=0)
    np_layer.astype(np.float64)
    np_layer.load_state_dict(
        {name: rng.standard_normal(value.shape) for name, value in np_layer.state_dict().items()}
    )
    torch_layer = GroupedQueryAttention(**np_layer.constructor_args(), backend=backend).double()
    return np_layer, from_numpy(torch_layer, np_layer)


def left_padded(rng, b=2, n=9, pad=3):
    """x (B, N, C), a key padding mask whose last element is left-padded by ``pad`` tokens, and
    the positions a tokenizer's left padding gives (0 at the first real token)."""
    x = rng.standard_normal((b, n, C))
    padding = np.zeros((b, n), dtype=bool)
    padding[-1, :pad] = True
    positions = np.maximum(np.cumsum(~padding, axis=1) - 1, 0)
    return x, padding, positions


# -- the layer ------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_state_dict_keys_and_shapes_are_the_numpy_twins(options):
    np_layer = np_grouped.GroupedQueryAttention(C, H, H_KV, head_dim=D, **options, rng=0)
    torch_layer = GroupedQueryAttention(C, H, H_KV, head_dim=D, **options)

    np_state = np_layer.state_dict()
    torch_state = torch_layer.state_dict()

    assert list(torch_state) == list(np_state)  # names, in the order of creation
    assert {k: tuple(v.shape) for k, v in torch_state.items()} == {
        k: v.shape for k, v in np_state.items()
    }


@pytest.mark.parametrize("backend", ["math", "sdpa", "manual"])
def test_a_wider_input_matches_numpy(rng, backend):
    """input_size = 2C (Zamba's shared attention): q, k, v and g read 2C features, o_proj
    writes C; out, dx (B, N, 2C) and every parameter's gradient against the NumPy twin."""
    np_layer, torch_layer = twins(rng, {"input_size": 2 * C, "output_gate": "head"}, backend)
    _, padding, positions = left_padded(rng)
    x = rng.standard_normal((2, 9, 2 * C))
    dout = rng.standard_normal((2, 9, C))

    expected = np_layer(x, positions=positions, key_padding_mask=padding)
    dx = np_layer.backward(dout)
    x_t = to_torch(x, requires_grad=True)
    out = torch_layer(x_t, positions=to_torch(positions), key_padding_mask=to_torch(padding))
    out.backward(to_torch(dout))

    assert f"input_size={2 * C}" in repr(torch_layer)
    assert_close(out, expected, name="out")
    assert_close(x_t.grad, dx, name="dx")
    for name, param in torch_layer.named_parameters():
        assert_close(param.grad, np_layer.named_grads()[name], name=name)


@pytest.mark.parametrize("backend", ["math", "sdpa", "manual"])
def test_differential_attention_matches_numpy(rng, backend):
    """The values twice as wide as the keys through each backend with a backward: out, dx and
    every parameter's gradient (the four lambdas too) against the NumPy twin."""
    np_layer, torch_layer = twins(rng, OPTIONS["differential"], backend)
    x, padding, positions = left_padded(rng)
    dout = rng.standard_normal(x.shape)

    expected = np_layer(x, positions=positions, key_padding_mask=padding)
    dx = np_layer.backward(dout)
    x_t = to_torch(x, requires_grad=True)
    out = torch_layer(x_t, positions=to_torch(positions), key_padding_mask=to_torch(padding))
    out.backward(to_torch(dout))

    assert "differential=True, lambda_init=0.3" in repr(torch_layer)
    assert_close(out, expected, name="out")
    assert_close(x_t.grad, dx, name="dx")
    assert {"lambda_q1", "lambda_k2"} <= set(np_layer.named_grads())
    for name, param in torch_layer.named_parameters():
        assert_close(param.grad, np_layer.named_grads()[name], name=name)


def test_layer_matches_numpy_on_left_padding_with_every_option(rng):
    """Per-batch positions and a left-padded element (the registry has no (B, N) positions)."""
    np_layer, torch_layer = twins(rng, OPTIONS["all"])
    x, padding, positions = left_padded(rng)
    dout = rng.standard_normal(x.shape)

    expected = np_layer(x, positions=positions, key_padding_mask=padding)
    dx = np_layer.backward(dout)
    x_t = to_torch(x, requires_grad=True)
    out = torch_layer(x_t, positions=to_torch(positions), key_padding_mask=to_torch(padding))
    out.backward(to_torch(dout))

    assert_close(out, expected, name="out")
    assert_close(x_t.grad, dx, name="dx")
    for name, param in torch_layer.named_parameters():
        assert_close(param.grad, np_layer.named_grads()[name], name=name)


@pytest.mark.parametrize("backend", ["math", "sdpa", "manual"])
def test_chunks_match_numpy_on_left_padding(rng, backend):
    """Chunks of 3 on a batch whose last element is left-padded by 4: its chunks start at its
    first real token, on every backend that takes a backward on CPU."""
    np_layer, torch_layer = twins(rng, OPTIONS["chunk"], backend)
    x, padding, positions = left_padded(rng, pad=4)
    dout = rng.standard_normal(x.shape)

    expected = np_layer(x, positions=positions, key_padding_mask=padding)
    dx = np_layer.backward(dout)
    x_t = to_torch(x, requires_grad=True)
    out = torch_layer(x_t, positions=to_torch(positions), key_padding_mask=to_torch(padding))
    out.backward(to_torch(dout))

    assert "chunk_size=3" in repr(torch_layer)
    assert_close(out, expected, name="out")
    assert_close(x_t.grad, dx, name="dx")
    for name, param in torch_layer.named_parameters():
        assert_close(param.grad, np_layer.named_grads()[name], name=name)


@pytest.mark.parametrize("options", FAMILY_OPTIONS.values(), ids=FAMILY_OPTIONS.keys())
def test_family_options_match_numpy_with_their_state_dict(rng, options):
    """Left-padded positions reach 8: past original_max_positions, the long frequencies."""
    np_layer, torch_layer = twins(rng, options)
    x, padding, positions = left_padded(rng)
    dout = rng.standard_normal(x.shape)

    expected = np_layer(x, positions=positions, key_padding_mask=padding)
    dx = np_layer.backward(dout)
    x_t = to_torch(x, requires_grad=True)
    out = torch_layer(x_t, positions=to_torch(positions), key_padding_mask=to_torch(padding))
    out.backward(to_torch(dout))

    assert {k: tuple(v.shape) for k, v in torch_layer.state_dict().items()} == {
        k: v.shape for k, v in np_layer.state_dict().items()
    }
    assert_close(out, expected, name="out")
    assert_close(x_t.grad, dx, name="dx")
    for name, param in torch_layer.named_parameters():
        assert_close(param.grad, np_layer.named_grads()[name], name=name)


def test_long_rope_decoding_switches_where_numpy_does(rng):
    """Prefill 5 tokens (positions 0..4, within 6), then one at a time: the steps at positions
    6 and 7 rotate with the long frequencies, as the NumPy twin's per-call rule says."""
    np_layer, torch_layer = twins(rng, FAMILY_OPTIONS["long_rope"])
    x = rng.standard_normal((1, 8, C))
    np_cache = np_caches.KVCache(1, H_KV, 8, D, np.float64)
    cache = KVCache(1, H_KV, 8, D, torch.float64)

    for start, stop in [(0, 5), (5, 6), (6, 7), (7, 8)]:
        expected = np_layer(x[:, start:stop], cache=np_cache)
        out = torch_layer(to_torch(x[:, start:stop]), cache=cache)
        assert_close(out, expected, name=f"tokens {start}:{stop}")


def test_flex_runs_inference_and_refuses_a_backward_on_cpu(rng):
    np_layer, layer = twins(rng, OPTIONS["all"], "flex")
    x = rng.standard_normal((2, 5, C))

    with torch.no_grad():
        out = layer(to_torch(x))

    assert_close(out, np_layer(x), name="out")
    with pytest.raises(ValueError, match="backend='flex' cannot compute"):
        layer(to_torch(x, requires_grad=True))


@pytest.mark.parametrize("backend", ["math", "manual"])
def test_layer_passes_gradcheck_with_every_option(rng, backend):
    _, layer = twins(rng, OPTIONS["all"], backend)
    x, padding, positions = left_padded(rng, n=5, pad=2)
    kwargs = {"positions": to_torch(positions), "key_padding_mask": to_torch(padding)}

    # fast_mode: the Jacobian against random vectors, not column by column (torch's option)
    assert torch.autograd.gradcheck(
        lambda t: layer(t, **kwargs), (to_torch(x, requires_grad=True),), fast_mode=True
    )


@pytest.mark.parametrize(("name", "backend"), RUNS)
def test_decode_with_the_cache_equals_the_full_forward(rng, name, backend):
    """Prefill 5 tokens, then one at a time, on a left-padded batch: every step's output is the
    full forward's rows."""
    _, layer = twins(rng, OPTIONS[name], backend)
    layer.eval()
    x, padding, positions = left_padded(rng)
    x, padding, positions = to_torch(x), to_torch(padding), to_torch(positions)
    with torch.no_grad():
        expected = layer(x, positions=positions, key_padding_mask=padding)
    cache = KVCache(2, H_KV, 12, D, torch.float64, v_head_dim=layer.v_head_dim)

    steps = [(0, 5)] + [(i, i + 1) for i in range(5, 9)]
    outs = [
        layer(
            x[:, start:stop],
            positions=positions[:, start:stop],
            key_padding_mask=padding[:, :stop],
            cache=cache,
        )
        for start, stop in steps
    ]

    assert cache.length == 9
    assert_close(torch.cat(outs, dim=1), expected, name="decoded")


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        ("all", "math"),
        ("plain", "auto"),
        ("value_width_sinks_gate", "math"),
        ("differential", "auto"),
        ("chunk", "sdpa"),
    ],
)
def test_decode_over_pages_equals_the_contiguous_cache(rng, name, backend):
    """The same decode with a PagedKVCache of pages of 2 (the two sequences' pages interleave
    in the pool from the first decode step on): the same outputs as with the KVCache."""
    _, layer = twins(rng, OPTIONS[name], backend)
    layer.eval()
    x, padding, positions = (to_torch(t) for t in left_padded(rng))
    dv = layer.v_head_dim
    caches = (
        KVCache(2, H_KV, 12, D, torch.float64, v_head_dim=dv),
        PagedKVCache(12, 2, H_KV, D, v_head_dim=dv, dtype=torch.float64),
    )

    steps = [(0, 5)] + [(i, i + 1) for i in range(5, 9)]
    outs = [
        [
            layer(
                x[:, start:stop],
                positions=positions[:, start:stop],
                key_padding_mask=padding[:, :stop],
                cache=cache,
            )
            for start, stop in steps
        ]
        for cache in caches
    ]

    assert caches[1].length == 9 and caches[1].block_table.tolist() == [
        [0, 1, 2, 3, 4],
        [6, 7, 8, 9, 10],
    ]
    assert_close(torch.cat(outs[1], dim=1), torch.cat(outs[0], dim=1), name="paged")


def test_decode_defaults_positions_to_the_cache_length(rng):
    _, layer = twins(rng, OPTIONS["plain"])
    x = to_torch(rng.standard_normal((1, 6, C)))
    with torch.no_grad():
        expected = layer(x)
    cache = KVCache(1, H_KV, 6, D, torch.float64)

    outs = [
        layer(x[:, :4], cache=cache),
        layer(x[:, 4:5], cache=cache),
        layer(x[:, 5:], cache=cache),
    ]

    assert_close(torch.cat(outs, dim=1), expected, name="decoded")


def test_a_forward_with_the_cache_builds_no_graph(rng):
    _, layer = twins(rng, OPTIONS["plain"])
    x = to_torch(rng.standard_normal((1, 3, C)), requires_grad=True)

    out = layer(x, cache=KVCache(1, H_KV, 4, D, torch.float64))

    assert not out.requires_grad


def test_frequencies_stay_float64_when_the_layer_is_cast(rng):
    hf_like = torch.tensor([1.0, 0.1, 0.01], dtype=torch.float32)  # a model's float32 inv_freq
    layer = GroupedQueryAttention(C, H, H_KV, head_dim=D, inv_freq=hf_like).float()

    assert layer.inv_freq.dtype == torch.float64
    assert torch.equal(layer.inv_freq, hf_like.double())  # used as given
    assert "inv_freq" not in layer.state_dict()


def test_sdpa_refuses_sinks_and_softcap_by_name(rng):
    for option in SDPA_REFUSES:
        _, layer = twins(rng, OPTIONS[option], "sdpa")
        with pytest.raises(ValueError, match=option):
            layer(to_torch(rng.standard_normal((1, 3, C))))


def test_train_mode_uses_the_explicit_keep_mask(rng):
    np_layer, torch_layer = twins(rng, {"dropout": 0.3})
    x = rng.standard_normal((2, 5, C))
    keep = rng.random((2, H, 5, 5)) > 0.3

    expected = np_layer.train()(x, attn_dropout_mask=keep)
    out = torch_layer.train()(to_torch(x), attn_dropout_mask=to_torch(keep))

    assert_close(out, expected, name="out")
    with pytest.raises(ValueError, match=r"attn_dropout_mask must have shape \(2, 4, 5, 5\)"):
        torch_layer(to_torch(x), attn_dropout_mask=to_torch(keep[:, :, :4]))


# -- the cache ----------------------------------------------------------------------------------


def test_a_cache_too_short_names_max_len_and_the_length_needed_and_writes_nothing(rng):
    _, layer = twins(rng, OPTIONS["plain"])
    cache = KVCache(1, H_KV, 5, D, torch.float64)
    layer(to_torch(rng.standard_normal((1, 4, C))), cache=cache)
    before = cache.k.clone(), cache.v.clone()

    with pytest.raises(
        ValueError, match="max_len = 5, but 4 cached \\+ 2 new tokens need a length of 6"
    ):
        layer(to_torch(rng.standard_normal((1, 2, C))), cache=cache)

    assert cache.length == 4
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])


def test_append_refuses_before_writing(rng):
    cache = KVCache(1, H_KV, 3, D, torch.float64)
    cache.append(*(to_torch(rng.standard_normal((1, H_KV, 2, D))) for _ in range(2)))
    before = cache.k.clone()

    with pytest.raises(ValueError, match="need a length of 4"):
        cache.append(*(to_torch(rng.standard_normal((1, H_KV, 2, D))) for _ in range(2)))

    assert cache.length == 2 and torch.equal(cache.k, before)


@pytest.mark.parametrize(
    ("cache", "error", "message"),
    [
        (KVCache(2, H_KV, 8, D, torch.float32), TypeError, "the cache holds torch.float32"),
        (KVCache(3, H_KV, 8, D, torch.float64), ValueError, r"must be \(3, 2, N, 6\)"),
        (KVCache(2, 1, 8, D, torch.float64), ValueError, r"must be \(2, 1, N, 6\)"),
        (
            KVCache(2, H_KV, 8, D, torch.float64, v_head_dim=D - 2),
            ValueError,
            "the cache holds values of width 4, but this layer's v_head_dim is 6",
        ),
    ],
    ids=["dtype", "batch", "heads", "value_width"],
)
def test_a_cache_of_another_dtype_batch_or_heads_is_refused_before_any_work(
    rng, cache, error, message
):
    _, layer = twins(rng, OPTIONS["plain"])

    with pytest.raises(error, match=message):
        layer(to_torch(rng.standard_normal((2, 3, C))), cache=cache)

    assert cache.length == 0


def test_a_cache_on_another_device_is_refused():
    cache = KVCache(1, H_KV, 4, D, torch.float64)

    with pytest.raises(ValueError, match="the cache lives on cpu, got keys and values on meta"):
        cache.check_append((1, H_KV, 1, D), torch.float64, torch.device("meta"))


def test_cache_reset_starts_a_new_sequence(rng):
    _, layer = twins(rng, OPTIONS["plain"])
    x = to_torch(rng.standard_normal((1, 3, C)))
    cache = KVCache(1, H_KV, 3, D, torch.float64)
    first = layer(x, cache=cache)

    cache.reset()

    assert_close(layer(x, cache=cache), first, name="after reset")
    assert "length=3" in repr(cache)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_kv_heads": 3}, ValueError, r"num_heads \(4\) must be a multiple of num_kv_heads"),
        ({"head_dim": 5}, ValueError, "head_dim must be even"),
        ({"head_dim": None, "hidden_size": 18}, ValueError, "divisible by num_heads"),
        ({"inv_freq": np.ones(4)}, ValueError, r"inv_freq must be \(rotary_dim / 2,\) = \(3,\)"),
        ({"inv_freq": np.array([1.0, np.nan, 1.0])}, ValueError, "inv_freq must be finite"),
        ({"window": (-1, 0)}, ValueError, "window"),
        ({"window": 3}, TypeError, "window must be"),
        ({"softcap": -1.0}, ValueError, "softcap must be >= 0"),
        ({"dropout": 1.0}, ValueError, "dropout"),
        ({"backend": "flash"}, ValueError, "backend must be one of"),
        ({"rotary_dim": 3}, ValueError, "rotary_dim must be even"),
        ({"long_inv_freq": np.ones(3)}, ValueError, "go together"),
        ({"qk_norm": True, "qk_norm_type": "l2"}, ValueError, "qk_norm_type must be one of"),
        ({"qk_norm_shape": "all"}, ValueError, "but qk_norm is False"),
        ({"output_gate": "channel"}, ValueError, "output_gate must be None or one of"),
        ({"output_gate": "head", "gate_activation": "silu"}, ValueError, "gate_activation must"),
        ({"gate_bias": True}, ValueError, "but output_gate is None"),
        ({"clip_qkv": 0.0}, ValueError, "clip_qkv must be > 0"),
        ({"clip_qkv": 8.0, "clip_after_norm": True}, ValueError, "qk_norm is False"),
        ({"alibi_slopes": np.ones(2)}, ValueError, r"alibi_slopes must be \(H,\) = \(4,\)"),
        ({"alibi_slopes": [1, 2, 3, 4]}, TypeError, "alibi_slopes must be a floating-point"),
        ({"alibi_slopes": [0.5, np.nan, 0.1, 0.2]}, ValueError, "alibi_slopes must be finite"),
        ({"output_norm_eps": 1e-5}, ValueError, "but output_norm is False"),
        ({"output_norm": True, "output_gate": "head"}, ValueError, "output_norm and output_gate"),
        ({"qk_norm_position": "after_rope"}, ValueError, "but qk_norm is False"),
        ({"qk_norm": True, "qk_norm_position": "late"}, ValueError, "qk_norm_position must be"),
        (
            {"qk_norm": True, "qk_norm_type": "rms_weightless", "qk_norm_shape": "per_head"},
            ValueError,
            "has no weight",
        ),
        ({"query_temperature": ("power", 0.1)}, TypeError, "query_temperature must be"),
        (
            {"query_temperature": {"kind": "power", "exponent": 0.1, "length": 2}},
            ValueError,
            r"takes \['exponent', 'length', 'offset'\]",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_constructor_arguments_are_refused(kwargs, error, message):
    arguments = {"hidden_size": C, "num_heads": H, "num_kv_heads": H_KV, "head_dim": D} | kwargs

    with pytest.raises(error, match=message):
        GroupedQueryAttention(**arguments)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"positions": np.arange(4)}, ValueError, r"positions must be \(N,\) = \(5,\)"),
        ({"positions": np.zeros((3, 5), int)}, ValueError, r"or \(B, N\) = \(2, 5\)"),
        ({"key_padding_mask": np.zeros((2, 4), bool)}, ValueError, r"expected \(2, 5\)"),
        ({"key_padding_mask": np.zeros((2, 5))}, TypeError, "key_padding_mask"),
        ({"cache": "cache"}, TypeError, "cache must be a KVCache"),
    ],
    ids=["positions-N", "positions-B", "padding-shape", "padding-dtype", "cache-type"],
)
def test_bad_forward_arguments_are_refused(rng, kwargs, error, message):
    _, layer = twins(rng, OPTIONS["plain"])

    with pytest.raises(error, match=message):
        layer(to_torch(rng.standard_normal((2, 5, C))), **kwargs)


def test_a_gate_of_the_other_kind_is_refused_on_load():
    """A per-head g_proj (H, C) into a per-element layer (H*D, C): torch's own size mismatch,
    naming the key and both shapes."""
    state = GroupedQueryAttention(C, H, H_KV, head_dim=D, output_gate="head").state_dict()
    layer = GroupedQueryAttention(C, H, H_KV, head_dim=D, output_gate="element")

    with pytest.raises(RuntimeError, match=r"g_proj\.weight.*\[4, 16\].*\[24, 16\]"):
        layer.load_state_dict(state)


def test_an_input_of_another_dtype_names_both(rng):
    layer = GroupedQueryAttention(C, H, H_KV, head_dim=D)

    with pytest.raises(TypeError, match="float64 but the layer's parameters are torch.float32"):
        layer(torch.ones(1, 2, C, dtype=torch.float64))


def test_repr_names_the_options():
    temperature = {"kind": "power", "exponent": 0.1, "length": 2048, "offset": 1}
    layer = GroupedQueryAttention(
        C, H, H_KV, head_dim=D, window=(3, 0), sinks=True, output_gate="head"
    )
    after = GroupedQueryAttention(
        C,
        H,
        H_KV,
        head_dim=D,
        qk_norm=True,
        qk_norm_type="rms_weightless",
        qk_norm_position="after_rope",
        query_temperature=temperature,
    )

    text = repr(layer)

    assert "window=(3, 0)" in text and "sinks=True" in text and "(q_proj): Linear" in text
    assert "output_gate='head' (sigmoid)" in text
    clipped = GroupedQueryAttention(
        C, H, H_KV, head_dim=D, qk_norm=True, clip_qkv=8, clip_after_norm=True, output_norm=True
    )
    assert "clip_qkv=8.0 after the QK-norm" in repr(clipped) and "output_norm=True" in repr(clipped)
    assert "WeightlessRMSNorm" in repr(after) and "qk_norm_position='after_rope'" in repr(after)
    assert "query_temperature={'kind': 'power'" in repr(after)
    assert to_numpy(layer.sinks).tolist() == [0.0] * H


def test_the_option_checks_are_the_numpy_twins() -> None:
    """One set of rules: the torch layer imports numpy_attention.grouped_options."""
    from numpy_attention import grouped_options

    assert torch_grouped.grouped_options is grouped_options
