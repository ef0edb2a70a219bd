"""Tests of numpy_attention/kimi_delta.py (Kimi Linear's KDA layer) and of the errors of its
reader, numpy_attention/hf/kimi_delta.py: finite differences of x and every parameter in float64,
the chunked core against the recurrent one, decoding over both caches against the full forward,
bad input. Against transformers: tests/parity/test_hf_kimi_delta.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import kimi_delta
from numpy_attention.gradcheck import gradcheck
from numpy_attention.hf.kimi_delta import kimi_delta_from_hf
from numpy_attention.kimi_delta import (
    KimiDeltaAttention,
    forget_gate_backward,
    forget_gate_forward,
)
from numpy_attention.linear_attention import kda_forward
from numpy_attention.linear_cache import LinearStateCache, PagedLinearStateCache

from ..conftest import assert_close, assert_gradcheck

B, T, C, H, K, W = 2, 7, 8, 2, 4, 3  # batch, tokens, hidden, heads, head width, conv taps


def make_layer(form="chunk", chunk_size=3, seed=0):
    """A float64 layer with every parameter away from its initial value (o_norm's ones, the
    gates' narrow range), so no gradient term hides behind a special value."""
    layer = KimiDeltaAttention(
        C, H, K, conv_kernel_size=W, form=form, chunk_size=chunk_size, rng=seed
    ).astype(np.float64)
    rng = np.random.default_rng(seed + 1)
    state = {name: value + 0.3 * rng.standard_normal(value.shape)
             for name, value in layer.state_dict().items()}  # fmt: skip
    layer.load_state_dict(state)
    return layer


def new_cache(paged):
    """A cache for make_layer's layer and batch B: contiguous, or rows 3 and 1 of a pool of 5."""
    shapes = {"conv_dim": 3 * H * K, "conv_width": W, "dtype": np.float64}
    if paged:
        return PagedLinearStateCache(np.array([3, 1]), 5, H, K, K, **shapes)
    return LinearStateCache(B, H, K, K, **shapes)


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_gradcheck_of_x_and_every_parameter(rng, form):
    """chunk_size 3 over 7 tokens: three chunks, the last one short."""
    layer = make_layer(form)
    x = rng.standard_normal((B, T, C))

    report = gradcheck(layer, x)

    assert {row.name for row in report.rows} == {"input0"} | set(layer.named_parameters())
    assert_gradcheck(report)


def test_gradcheck_of_x_with_a_cache(rng):
    """A call that continues a cache is differentiable, the states it reads constants: each
    evaluation starts from the same prefilled cache."""
    layer = make_layer()
    prefix, x = rng.standard_normal((B, 4, C)), rng.standard_normal((B, 3, C))

    def forward(x):
        cache = new_cache(paged=False)
        layer.forward(prefix, cache=cache)
        return layer.forward(x, cache=cache), None

    report = gradcheck(forward, x, backward=lambda dout, _: layer.backward(dout))

    assert_gradcheck(report)


def left_padding(pad=3, tokens=T):
    """Batch element 1 left-padded by ``pad`` tokens: bool (B, tokens), True = padding."""
    mask = np.zeros((B, tokens), dtype=bool)
    mask[1, :pad] = True
    return mask


def test_gradcheck_of_x_with_left_padding(rng):
    """Padded tokens' inputs are zeroed: their dx is 0, and the real tokens' is unchanged."""
    layer = make_layer()
    x, mask = rng.standard_normal((B, T, C)), left_padding()

    def forward(x):
        return layer.forward(x, key_padding_mask=mask), None

    report = gradcheck(forward, x, backward=lambda dout, _: layer.backward(dout))

    layer(x, key_padding_mask=mask)
    assert not layer.backward(rng.standard_normal((B, T, C)))[mask].any()
    assert_gradcheck(report)


def test_a_left_padded_sequence_equals_its_real_tokens_alone(rng):
    """Zeroed inputs leave the state at 0 and the convolution's window at zeros, so the real
    tokens of a left-padded element come out as if they were alone."""
    layer = make_layer()
    x = rng.standard_normal((B, T, C))

    padded = layer(x, key_padding_mask=left_padding())
    alone = layer(x[1:, 3:])

    assert_close(padded[1, 3:], alone[0])
    assert not padded[1, :3].any()


def test_forget_gate_past_the_softplus_threshold(rng):
    """transformers' softplus is z itself past 20 (module docstring): values and slopes on both
    sides of it (no z within the finite difference's step of 20)."""
    z = np.array([-30.0, -1.0, 0.5, 19.0, 21.0, 35.0])
    pre = np.broadcast_to(z, (1, 1, 2, 6)).copy()
    dt_bias, a_log = np.zeros(12), np.array([0.3, -0.2]).reshape(1, 1, 2, 1)

    g, _ = forget_gate_forward(pre, dt_bias, a_log)
    report = gradcheck(
        lambda p, d, a: forget_gate_forward(p, d, a),
        pre, dt_bias, a_log,
        backward=forget_gate_backward,
    )  # fmt: skip

    softplus = -g / np.exp(a_log)
    assert_close(softplus[0, 0, 0], np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20)))))
    assert softplus[0, 0, 0, 4] == 21.0  # the shortcut, not 21 + 7.6e-10
    assert_gradcheck(report)


def test_chunk_form_equals_recurrent_form(rng, monkeypatch):
    """The layer's form reaches the core (recorded), and both give the same numbers."""
    x, dout = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
    chunked, recurrent = make_layer("chunk"), make_layer("recurrent")
    forms = []

    def recording(*args, **kwargs):
        forms.append((kwargs["form"], kwargs["chunk_size"]))
        return kda_forward(*args, **kwargs)

    monkeypatch.setattr(kimi_delta, "kda_forward", recording)

    out_c, out_r = chunked(x), recurrent(x)
    dx_c, dx_r = chunked.backward(dout), recurrent.backward(dout)

    assert forms == [("chunk", 3), ("recurrent", 3)]
    assert_close(out_c, out_r, name="out")
    assert_close(dx_c, dx_r, name="dx")
    grads = recurrent.named_grads()
    for name, grad in chunked.named_grads().items():
        assert_close(grad, grads[name], name=name)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decoding_equals_the_full_forward(rng, paged):
    """Prefill 4 tokens (element 1 left-padded by 3), then one at a time: every output equals
    the full forward's, and the states left equal one call's over the whole sequence."""
    layer = make_layer()
    x, mask = rng.standard_normal((B, T, C)), left_padding()
    expected = layer(x, key_padding_mask=mask)
    whole = new_cache(paged)
    layer(x, key_padding_mask=mask, cache=whole)
    cache = new_cache(paged)

    steps = [layer(x[:, start:stop], key_padding_mask=mask[:, :stop], cache=cache)
             for start, stop in [(0, 4)] + [(i, i + 1) for i in range(4, T)]]  # fmt: skip

    assert_close(np.concatenate(steps, axis=1), expected, name="decoded")
    assert cache.length == T
    (conv, state), (conv_whole, state_whole) = cache.read(), whole.read()
    assert conv.shape == (B, 3 * H * K, W - 1) and state.shape == (B, H, K, K)
    assert_close(conv, conv_whole, name="conv state")
    assert_close(state, state_whole, name="state")


def test_the_paged_cache_touches_only_its_rows(rng):
    layer = make_layer()
    cache = new_cache(paged=True)

    layer(rng.standard_normal((B, 3, C)), cache=cache)

    convs, states = cache.pool
    untouched = [0, 2, 4]
    assert not convs[untouched].any() and not states[untouched].any()
    assert states[[3, 1]].any()


# -- bad input ----------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors(rng):
    layer = make_layer()
    with pytest.raises(ValueError, match="last axis 5"):
        layer(rng.standard_normal((B, T, 5)))
    with pytest.raises(TypeError, match="LinearStateCache or a PagedLinearStateCache"):
        layer(rng.standard_normal((B, T, C)), cache={})
    wrong = LinearStateCache(B, H + 1, K, K, conv_dim=3 * H * K, conv_width=W)
    with pytest.raises(ValueError, match="heads 3"):
        layer(rng.standard_normal((B, T, C)), cache=wrong)
    with pytest.raises(ValueError, match="batch 2"):
        layer(rng.standard_normal((B + 1, T, C)), cache=new_cache(paged=False))
    with pytest.raises(ValueError, match=r"M = x's T: expected \(2, 7\)"):
        layer(rng.standard_normal((B, T, C)), key_padding_mask=np.zeros((B, T + 1), bool))
    with pytest.raises(ValueError, match=r"M = the cache's length after this call"):
        layer(rng.standard_normal((B, T, C)), key_padding_mask=np.zeros((B, 2), bool),
              cache=new_cache(paged=False))  # fmt: skip
    with pytest.raises(ValueError, match="form must be"):
        KimiDeltaAttention(C, H, K, form="scan")
    with pytest.raises(RuntimeError, match="needs a forward first"):
        make_layer().backward(np.zeros((B, T, C)))


def kimi_config(**changes):
    config = {
        "model_type": "kimi_linear", "hidden_size": C, "linear_num_heads": H,
        "linear_head_dim": K, "linear_conv_kernel_dim": W, "num_hidden_layers": 3,
        "layer_types": ["linear_attention", "full_attention", "linear_attention"],
        "rms_norm_eps": 1e-5, "hidden_act": "silu",
    }  # fmt: skip
    return config | changes


def model_state(layer_idx=2):
    return {f"model.layers.{layer_idx}.self_attn.{name}": value
            for name, value in make_layer().state_dict().items()}  # fmt: skip


def test_the_reader_loads_a_layer_from_a_whole_models_state_dict(rng):
    layer = make_layer()
    x = rng.standard_normal((B, T, C))

    loaded = kimi_delta_from_hf(kimi_config(), model_state(2), 2)

    assert loaded.dtype == np.float64 and not loaded.training
    assert_close(loaded(x), layer(x))


def test_the_reader_reads_a_checkpoints_linear_attn_config():
    config = {key: value for key, value in kimi_config().items()
              if key not in ("linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim",
                             "layer_types")}  # fmt: skip
    config["linear_attn_config"] = {
        "num_heads": H, "head_dim": K, "short_conv_kernel_size": W,
        "full_attn_layers": [2], "kda_layers": [1, 3],
    }  # fmt: skip

    layer = kimi_delta_from_hf(config, model_state(2), 2)

    assert (layer.num_heads, layer.head_dim, layer.conv_kernel_size) == (H, K, W)


@pytest.mark.parametrize(
    ("config", "state", "layer_idx", "error", "match"),
    [
        (kimi_config(model_type="qwen3_next"), model_state(), 2, ValueError, "kimi_linear"),
        (kimi_config(), model_state(1), 1, ValueError, r"'full_attention' \(MLA.*latent_from_hf"),
        (kimi_config(), model_state(), 5, ValueError, "has 3 layers"),
        (kimi_config(hidden_act="gelu"), model_state(), 2, ValueError, "hidden_act is 'gelu'"),
        (kimi_config(linear_head_dim=8), model_state(), 2, ValueError,
         r"q_proj.weight has shape \(8, 8\).*\(16, 8\)"),
        (kimi_config(), model_state(0), 2, KeyError, r"KDA layers \[0\].*not layer_idx 2"),
        (kimi_config(), {k: v for k, v in model_state().items() if "b_proj" not in k}, 2,
         KeyError, "missing keys.*b_proj.weight"),
        (kimi_config(), {"model.layers.2.self_attn.q_proj.weight": 0}, 2, KeyError, "no KDA"),
    ],
    ids=["model_type", "mla-layer", "layer_idx", "hidden_act", "shape", "wrong-layer",
         "missing", "no-kda"],
)  # fmt: skip
def test_the_reader_refuses_with_a_clear_error(config, state, layer_idx, error, match):
    with pytest.raises(error, match=match):
        kimi_delta_from_hf(config, state, layer_idx)
