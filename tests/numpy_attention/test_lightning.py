"""numpy_attention.lightning and numpy_attention.hf.lightning: MiniMax's lightning attention layer
against the chain written out token by token, every gradient by central differences in float64
(also through a cached call), the chunk and recurrent forms equal to FORMS_RTOL, decoding over
either cache equal to the full forward (outputs and the final state), left padding equal to the
unpadded sequence, and one clear error per bad input and per bad checkpoint.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from numpy_attention.grad_mode import no_grad
from numpy_attention.gradcheck import gradcheck
from numpy_attention.hf.grouped import grouped_from_hf
from numpy_attention.hf.lightning import lightning_from_hf, minimax_layer_types
from numpy_attention.lightning import LightningAttention, slope_rates
from numpy_attention.linear_attention import FORMS_RTOL
from numpy_attention.linear_cache import LinearStateCache, PagedLinearStateCache
from parity_tests.tolerances import rel_error

from ..conftest import assert_close, assert_gradcheck

B, T, C, H, D = 2, 7, 12, 3, 4  # batch, tokens, hidden, heads, head width
FORMS = ("chunk", "recurrent")


def make_layer(form="chunk", *, chunk_size=3, layer_idx=1, layers=3, rng=0):
    """A float64 layer whose norm weight is not all ones (its gradient would hide a swap)."""
    layer = LightningAttention(
        C, H, head_dim=D, layer_idx=layer_idx, num_hidden_layers=layers, form=form,
        chunk_size=chunk_size, rng=rng,
    ).astype(np.float64)  # fmt: skip
    layer.norm.weight = 1.0 + 0.3 * np.random.default_rng(rng).standard_normal(H * D)
    return layer


def padding(batch=B, tokens=T, pad=2):
    """Batch element 1 left-padded by ``pad`` tokens, element 0 right-padded by one (True =
    padding): a right-padded token's query meets a state that is not zero."""
    mask = np.zeros((batch, tokens), dtype=bool)
    mask[1, :pad] = True
    mask[0, -1] = True
    return mask


def reference(layer, x, key_padding_mask=None, state=None):
    """The module docstring's chain, one (batch, head) and one token at a time: silu, split
    per head into q, k, v, S = exp(-slope) S + k v^T, o = S^T q, RMSNorm over H*D, sigmoid gate.
    Returns the output and the final states (B, H, D, D)."""
    b, t, _ = x.shape
    u = x @ layer.qkv_proj.weight.T
    u = u / (1 + np.exp(-u))
    if key_padding_mask is not None:
        u = u * ~key_padding_mask[..., None]
    u = u.reshape(b, t, H, 3 * D)
    o = np.zeros((b, t, H, D))
    finals = np.zeros((b, H, D, D)) if state is None else state.copy()
    for i in range(b):
        for h in range(H):
            s = finals[i, h]
            for j in range(t):
                q, k, v = u[i, j, h, :D], u[i, j, h, D : 2 * D], u[i, j, h, 2 * D :]
                s = np.exp(-layer.slope_rate[h]) * s + np.outer(k, v)
                o[i, j, h] = s.T @ q
            finals[i, h] = s
    o = o.reshape(b, t, H * D)
    o = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + 1e-6) * layer.norm.weight
    gate = 1 / (1 + np.exp(-(x @ layer.output_gate.weight.T)))
    return (o * gate) @ layer.out_proj.weight.T, finals


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_forward_is_the_chain_token_by_token(form, padded, rng):
    layer = make_layer(form)
    x = rng.standard_normal((B, T, C))
    mask = padding() if padded else None

    out = layer(x, key_padding_mask=mask)

    expected, _ = reference(layer, x, mask)
    assert_close(out, expected, name="out")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_gradcheck_on_the_input_and_every_parameter(form, padded, rng):
    layer = make_layer(form)
    x = rng.standard_normal((B, T, C))

    report = gradcheck(layer, x, key_padding_mask=padding() if padded else None)

    assert {row.name for row in report.rows} == {
        "input0", "norm.weight", "qkv_proj.weight", "out_proj.weight", "output_gate.weight",
    }  # fmt: skip
    assert_gradcheck(report)


@pytest.mark.parametrize("form", FORMS)
def test_gradcheck_through_a_cached_call(form, rng):
    """A call after a cached state is differentiable; the state it read is a constant."""
    layer = make_layer(form)
    state = rng.standard_normal((B, H, D, D))
    x = rng.standard_normal((B, 4, C))

    def cached_call(x):
        cache = LinearStateCache(B, H, D, D, dtype=np.float64)
        cache.write(None, state, 5)
        return layer(x, cache=cache), None

    report = gradcheck(cached_call, x, backward=lambda dout, ctx: layer.backward(dout))

    assert_gradcheck(report)
    expected, _ = reference(layer, x, state=state)
    assert_close(cached_call(x)[0], expected, name="out after a cached state")


def test_chunk_and_recurrent_forms_agree_on_output_and_every_gradient(rng):
    x = rng.standard_normal((B, 13, C))
    dout = rng.standard_normal((B, 13, C))
    results = {}
    for form in FORMS:
        layer = make_layer(form, chunk_size=4)
        out = layer(x, key_padding_mask=padding(tokens=13, pad=5))
        results[form] = (out, layer.backward(dout), layer.named_grads())

    (out_c, dx_c, grads_c), (out_r, dx_r, grads_r) = results["chunk"], results["recurrent"]
    assert rel_error(out_c, out_r) <= FORMS_RTOL
    assert rel_error(dx_c, dx_r) <= FORMS_RTOL
    for name, grad in grads_c.items():
        assert rel_error(grad, grads_r[name]) <= FORMS_RTOL, name


def new_cache(kind):
    """A contiguous cache, or a pool of 4 state rows where sequence b lives in row (2, 0)[b]."""
    if kind == "paged":
        return PagedLinearStateCache(np.array([2, 0]), 4, H, D, D, dtype=np.float64)
    return LinearStateCache(B, H, D, D, dtype=np.float64)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_prefill_then_token_by_token_equals_the_full_forward(kind, form, rng):
    """A padded batch: 5 tokens, then one at a time; the outputs and the final state
    against one call over all 9 tokens (and the state against the chain's)."""
    layer = make_layer(form)
    x = rng.standard_normal((B, 9, C))
    mask = padding(tokens=9, pad=3)
    with no_grad():
        full = layer(x, key_padding_mask=mask)
    cache = new_cache(kind)

    steps = [layer(x[:, :5], key_padding_mask=mask[:, :5], cache=cache)]
    steps += [layer(x[:, i : i + 1], key_padding_mask=mask[:, : i + 1], cache=cache)
              for i in range(5, 9)]  # fmt: skip (the mask covers every token so far: (B, M))

    assert_close(np.concatenate(steps, axis=1), full, name="decoded outputs")
    assert cache.length == 9
    conv_state, state = cache.read()
    assert conv_state is None
    if kind == "paged":  # the pool rows of other requests are never written
        assert not cache.pool[1][[1, 3]].any()
    _, expected = reference(layer, x, mask)
    assert_close(state, expected, name="final state")


def test_left_padding_changes_nothing_on_the_real_tokens(rng):
    """A padded token writes and reads nothing and the zero state decays to zero: the real
    tokens of a left-padded row give what they give alone; padded rows give exactly 0."""
    layer = make_layer()
    x = rng.standard_normal((1, T, C))

    padded = layer(x, key_padding_mask=np.arange(T)[None] < 3)  # (1, T)
    alone = layer(x[:, 3:])

    assert_close(padded[:, 3:], alone, name="real tokens")
    assert not padded[:, :3].any()


def test_slopes_follow_the_layer_and_a_given_slope_rate_is_used(rng):
    first, last = slope_rates(H, 0, 3), slope_rates(H, 2, 3)
    assert np.all(np.diff(first) < 0)  # later heads decay slower
    assert np.all(last < first)  # deeper layers decay slower
    x = rng.standard_normal((B, T, C))
    layer = make_layer(layer_idx=0)
    given = make_layer(layer_idx=2)
    given.slope_rate = first  # the decays of layer 0 in the weights of layer 2's constructor

    np.testing.assert_array_equal(layer(x), given(x))


def test_a_float32_layer_computes_in_float32(rng):
    layer = LightningAttention(C, H, head_dim=D, rng=0)
    x = rng.standard_normal((B, T, C)).astype(np.float32)

    out = layer(x)
    dx = layer.backward(rng.standard_normal(out.shape).astype(np.float32))

    assert out.dtype == dx.dtype == np.float32
    expected, _ = reference(copy.deepcopy(layer).astype(np.float64), x.astype(np.float64))
    assert_close(out, expected, dtype=np.float32, name="float32 out")


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"head_dim": None, "num_heads": 5}, ValueError, "not divisible by num_heads"),
        ({"layer_idx": 3}, ValueError, "below num_hidden_layers"),
        ({"slope_rate": np.ones(2)}, ValueError, "slope_rate must hold num_heads = 3"),
        ({"slope_rate": -np.ones(H)}, ValueError, "decays > 0"),
        ({"form": "blocks"}, ValueError, "form must be one of"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
    ],
)
def test_bad_constructor_arguments_are_refused(kwargs, error, match):
    options = {"num_heads": H, "head_dim": D, "num_hidden_layers": 3} | kwargs
    with pytest.raises(error, match=match):
        LightningAttention(C, rng=0, **options)


def test_bad_forward_inputs_are_refused(rng):
    layer = make_layer()
    x = rng.standard_normal((B, T, C))
    with pytest.raises(ValueError, match="last axis"):
        layer(x[..., :-1])
    with pytest.raises(ValueError, match="rank 3"):
        layer(x[0])
    with pytest.raises(TypeError, match="float32"):
        layer(x.astype(np.float32))
    with pytest.raises(ValueError, match=r"key_padding_mask is \(B, M\), M = x's T"):
        layer(x, key_padding_mask=np.zeros((B, T + 1), dtype=bool))
    with pytest.raises(TypeError, match="LinearStateCache"):
        layer(x, cache={})
    with pytest.raises(ValueError):  # the cache's own check names the mismatch
        layer(x, cache=LinearStateCache(B, H + 1, D, D, dtype=np.float64))
    with pytest.raises(RuntimeError, match="needs a forward first"):
        make_layer().backward(np.zeros((B, T, C)))


# -- the reader -----------------------------------------------------------------------------------

CONFIG = {
    "model_type": "minimax",
    "hidden_size": C,
    "num_attention_heads": H,
    "head_dim": D,
    "num_hidden_layers": 4,
    "hidden_act": "silu",
    "block_size": 4,
}


def hf_state(layers=(1, 3), prefix="model.layers.{}.self_attn.", buffers=True):
    """A state dict shaped like a MiniMax model's lightning layers (weights drawn at random)."""
    rng = np.random.default_rng(0)
    state = {}
    for i in layers:
        entries = {
            "qkv_proj.weight": (3 * H * D, C), "output_gate.weight": (H * D, C),
            "norm.weight": (H * D,), "out_proj.weight": (C, H * D),
        }  # fmt: skip
        if buffers:
            entries |= {"slope_rate": (H, 1, 1), "query_decay": (H, 4, 1),
                        "key_decay": (H, 4, 1), "diagonal_decay": (1, H, 4, 4)}  # fmt: skip
        state |= {prefix.format(i) + k: rng.standard_normal(s) for k, s in entries.items()}
    return state


@pytest.mark.parametrize("buffers", [True, False], ids=["with-buffers", "weights-only"])
def test_the_reader_loads_the_layer_and_reads_its_slopes(buffers):
    state = hf_state(buffers=buffers)

    layer = lightning_from_hf(CONFIG, state, 3, form="recurrent")

    assert (layer.layer_idx, layer.num_hidden_layers, layer.chunk_size) == (3, 4, 4)
    assert layer.form == "recurrent" and layer.dtype == np.float64 and not layer.training
    np.testing.assert_array_equal(layer.slope_rate, slope_rates(H, 3, 4))
    for name, value in layer.state_dict().items():
        np.testing.assert_array_equal(value, state[f"model.layers.3.self_attn.{name}"])


def test_without_layer_types_the_odd_layers_are_lightning():
    assert minimax_layer_types(CONFIG) == ["full_attention", "linear_attention"] * 2
    kinds = ["linear_attention"] * 4
    assert minimax_layer_types(CONFIG | {"layer_types": kinds}) == kinds


@pytest.mark.parametrize(
    ("config", "state", "layer", "error", "match"),
    [
        ({"model_type": "mixtral"}, None, 1, ValueError, "model_type 'mixtral' is not supported"),
        ({}, None, 2, ValueError, "'full_attention'.*grouped_from_hf.*are: \\[1, 3\\]"),
        ({}, None, 4, ValueError, "has 4 layers"),
        ({"hidden_act": "gelu"}, None, 1, ValueError, "hidden_act is 'gelu'"),
        ({"layer_types": ["linear_attention"]}, None, 0, ValueError, "each of the 4 layers"),
        ({"num_attention_heads": None}, None, 1, ValueError, "'num_attention_heads'"),
        (
            {},
            {k.replace("qkv_proj", "qkv"): v for k, v in hf_state().items()},
            1,
            KeyError,
            "no 'qkv_proj.weight'",
        ),
        ({}, hf_state(layers=(1,)), 3, ValueError, "holds layer 1"),
        (
            {"layer_types": ["linear_attention"] * 4},
            None,
            2,
            KeyError,
            "holds 2 lightning layers .* 0 of them for layer_idx 2",
        ),
        ({"hidden_size": C + 1}, None, 1, ValueError, r"qkv_proj.weight has shape"),
        ({"block_size": 8}, None, 1, ValueError, r"query_decay has shape"),
    ],
)
def test_the_reader_refuses_with_a_clear_message(config, state, layer, error, match):
    with pytest.raises(error, match=match):
        lightning_from_hf(CONFIG | config, hf_state() if state is None else state, layer)


def test_the_reader_names_missing_and_unexpected_keys():
    state = hf_state()
    del state["model.layers.1.self_attn.norm.weight"]
    state["model.layers.1.self_attn.bias"] = np.zeros(3)

    with pytest.raises(KeyError, match=r"missing keys \['model.layers.1.self_attn.norm.weight'\]"
                       r", unexpected keys \['model.layers.1.self_attn.bias'\]"):  # fmt: skip
        lightning_from_hf(CONFIG, state, 1)


def test_the_softmax_reader_names_this_reader_for_a_lightning_layer():
    config = CONFIG | {"num_key_value_heads": H, "rope_parameters": {"rope_type": "default",
                                                                    "rope_theta": 1e4}}  # fmt: skip
    with pytest.raises(ValueError, match="lightning_from_hf"):
        grouped_from_hf(config, hf_state(), layer_idx=1)
