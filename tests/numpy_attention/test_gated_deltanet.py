"""GatedDeltaNet (numpy_attention.gated_deltanet): gradcheck of x and every parameter in both
projection layouts and both core forms (with padding, and dx of a cached call), the L2 norm's
pair, the chunk form equal to the recurrent one, float32 following float64, the fused rows read
as Qwen3-Next lays them out, left padding equal to no padding, decoding over either cache equal
to the full forward (and their states equal), and bad input refused; ``gated_deltanet_from_hf``'s
errors. Against transformers (and the torch twin): tests/parity/test_hf_gated_deltanet.py.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from numpy_attention import gradcheck, no_grad
from numpy_attention.gated_deltanet import GatedDeltaNet
from numpy_attention.hf.gated_deltanet import gated_deltanet_from_hf
from numpy_attention.linear_attention import FORMS_RTOL
from numpy_attention.linear_cache import LinearStateCache, PagedLinearStateCache
from numpy_attention.norms import l2norm_backward, l2norm_forward
from parity_tests.tolerances import rel_error

from ..conftest import assert_close, assert_gradcheck

# C, Hk, Hv, Dk, Dv, W: two value heads per key head; T = 7 crosses the chunk edge at 4
B, T, C, HK, HV, DK, DV, W, CHUNK = 2, 7, 8, 1, 2, 3, 2, 3, 4
F = 2 * HK * DK + HV * DV  # the convolved width


def make(projections="fused", form="chunk", seed=0):
    """A float64 layer with gates away from 1 and 0 (A_log, dt_bias drawn, not the init's)."""
    layer = GatedDeltaNet(
        C, HK, HV, DK, DV, conv_kernel_size=W, projections=projections, form=form,
        chunk_size=CHUNK, rng=seed,
    ).astype(np.float64)  # fmt: skip
    rng = np.random.default_rng(seed + 1)
    layer.A_log[...] = rng.uniform(-1.0, 1.0, HV)
    layer.dt_bias[...] = rng.standard_normal(HV)
    layer.norm.weight[...] = 1 + 0.5 * rng.standard_normal(DV)
    return layer


def new_cache(paged, batch=B):
    sizes = {"conv_dim": F, "conv_width": W, "dtype": np.float64}
    if paged:  # the sequences in rows 3 and 0 of a pool of 5
        return PagedLinearStateCache(np.array([3, 0][:batch]), 5, HV, DK, DV, **sizes)
    return LinearStateCache(batch, HV, DK, DV, **sizes)


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
@pytest.mark.parametrize("projections", ["fused", "split"])
def test_gradcheck_on_x_and_every_parameter(rng, projections, form):
    layer = make(projections, form)
    x = rng.standard_normal((B, T, C))

    report = gradcheck(layer, x)

    assert_gradcheck(report)
    assert {row.name for row in report.rows} == {"input0", *layer.named_parameters()}


def test_gradcheck_with_left_padding(rng):
    layer = make()
    x = rng.standard_normal((B, T, C))
    padding = np.zeros((B, T), dtype=bool)
    padding[1, :3] = True

    report = gradcheck(layer, x, key_padding_mask=padding)

    assert_gradcheck(report)


def test_gradcheck_of_dx_through_a_cached_call(rng):
    """A call after a prefill: the states read from the cache are constants; each evaluation
    starts from a copy of the same prefilled cache."""
    layer = make("split")
    prefilled = new_cache(paged=False)
    with no_grad():
        layer(rng.standard_normal((B, 3, C)), cache=prefilled)
    x = rng.standard_normal((B, 2, C))

    def forward(x):
        return layer(x, cache=copy.deepcopy(prefilled)), None

    report = gradcheck(forward, x, backward=lambda dout, ctx: layer.backward(dout))

    assert_gradcheck(report)


def test_gradcheck_of_the_l2_norm(rng):
    x = rng.standard_normal((3, 2, 4))
    x[0, 0] *= 0.02  # a short vector: eps under the root weighs 1e-4 of its square

    report = gradcheck(l2norm_forward, x, backward=l2norm_backward)

    assert_gradcheck(report)


@pytest.mark.parametrize("projections", ["fused", "split"])
def test_chunk_form_equals_recurrent_form(rng, projections):
    x = rng.standard_normal((B, T, C))
    dout = rng.standard_normal((B, T, C))
    results = {}
    for form in ("chunk", "recurrent"):
        layer = make(projections, form)
        out = layer(x)
        results[form] = {"out": out, "dx": layer.backward(dout), **layer.named_grads()}

    for name, value in results["recurrent"].items():
        error = rel_error(results["chunk"][name], value)
        assert error <= FORMS_RTOL, f"{name}: chunk vs recurrent {error:.3e}"


def test_float32_follows_float64(rng):
    """A float32 layer computes in float32 (the core's state too) within FLOAT32_RTOL."""
    layer = make()
    x = rng.standard_normal((B, T, C))
    expected = layer(x)

    out = layer.astype(np.float32)(x.astype(np.float32))

    assert out.dtype == np.float32
    assert_close(out, expected, dtype=np.float32, name="float32 out")


def test_fused_rows_are_read_grouped_per_key_head(rng):
    """Qwen3-Next's ``in_proj_qkvz`` holds per key head [q | k | its value heads' v | their z],
    ``in_proj_ba`` per key head [b | a]; the same weights laid out per kind, in head order, give
    the split layer the same outputs."""
    hk, hv = 2, 4
    fused = GatedDeltaNet(C, hk, hv, DK, DV, conv_kernel_size=W, rng=0).astype(np.float64)
    split = GatedDeltaNet(C, hk, hv, DK, DV, conv_kernel_size=W, projections="split")
    split.astype(np.float64)
    r = hv // hk
    qkvz = fused.in_proj_qkvz.weight.reshape(hk, 2 * DK + 2 * r * DV, C)  # per key head
    ba = fused.in_proj_ba.weight.reshape(hk, 2 * r, C)
    q, k = qkvz[:, :DK], qkvz[:, DK : 2 * DK]
    v, z = qkvz[:, 2 * DK : 2 * DK + r * DV], qkvz[:, 2 * DK + r * DV :]
    state = {
        name: value
        for name, value in fused.state_dict().items()
        if not name.startswith(("in_proj_qkvz", "in_proj_ba"))
    }
    state["in_proj_qkv.weight"] = np.concatenate([part.reshape(-1, C) for part in (q, k, v)])
    state["in_proj_z.weight"] = z.reshape(-1, C)
    state["in_proj_b.weight"] = ba[:, :r].reshape(-1, C)
    state["in_proj_a.weight"] = ba[:, r:].reshape(-1, C)
    split.load_state_dict(state)
    x = rng.standard_normal((B, T, C))

    assert_close(fused(x), split(x), name="fused vs split")


def test_left_padding_changes_nothing_on_the_real_tokens(rng):
    """Padded tokens zeroed project to q = k = 0 (L2 norm of 0 is 0), so they write nothing into
    a state still at 0, and their convolution inputs are the zeros of the left padding."""
    layer = make()
    x = rng.standard_normal((B, T, C))
    padding = np.zeros((B, T), dtype=bool)
    padding[1, :3] = True

    out = layer(x, key_padding_mask=padding)

    alone = layer(x[1:, 3:])
    assert_close(out[1, 3:], alone[0], name="padded row")
    assert_close(out[0], layer(x[:1])[0], name="unpadded row")
    np.testing.assert_array_equal(out[1, :3], 0.0)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("projections", ["fused", "split"])
def test_decoding_equals_the_full_forward(rng, projections, paged):
    """Prefill 3 tokens, then one at a time; the states left equal one call's over all T."""
    layer = make(projections)
    x = rng.standard_normal((B, T, C))
    full = layer(x)
    whole = new_cache(paged)
    layer(x, cache=whole)
    cache = new_cache(paged)

    outs = [layer(x[:, :3], cache=cache)]
    outs += [layer(x[:, t : t + 1], cache=cache) for t in range(3, T)]

    assert cache.length == T
    assert_close(np.concatenate(outs, axis=1), full, name="decoded")
    conv, state = cache.read()
    conv_whole, state_whole = whole.read()
    assert_close(state, state_whole, name="recurrent state")
    assert_close(conv, conv_whole, name="conv state")
    np.testing.assert_array_equal(conv, x_conv_inputs(layer, x)[:, :, -(W - 1) :])


def x_conv_inputs(layer, x):
    """The convolution's inputs [q | k | v] of x, (B, F, T): what its state keeps the end of."""
    if layer.projections == "split":
        return layer.in_proj_qkv(x).transpose(0, 2, 1)
    from numpy_attention.gated_deltanet import fused_orders

    order = fused_orders(HK, HV, DK, DV)[0][:F]
    return layer.in_proj_qkvz(x)[..., order].transpose(0, 2, 1)


def test_decoding_with_padding_in_the_prefill(rng):
    """The mask covers every token so far (M = cache.length + T): left padding in the prefill
    gives the padded sequence's own outputs, as without padding."""
    layer = make()
    x = rng.standard_normal((B, T, C))
    padding = np.zeros((B, T), dtype=bool)
    padding[1, :2] = True
    full = layer(x, key_padding_mask=padding)
    cache = new_cache(paged=False)

    outs = [layer(x[:, :4], cache=cache, key_padding_mask=padding[:, :4])]
    outs += [
        layer(x[:, t : t + 1], cache=cache, key_padding_mask=padding[:, : t + 1])
        for t in range(4, T)
    ]

    assert_close(np.concatenate(outs, axis=1), full, name="decoded with padding")


def test_no_grad_forward_keeps_nothing(rng):
    layer = make()
    with no_grad():
        layer(rng.standard_normal((B, T, C)))

    with pytest.raises(RuntimeError, match="needs a forward first"):
        layer.backward(np.zeros((B, T, C)))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_v_heads": 3}, ValueError, "multiple of num_k_heads"),
        ({"projections": "qkvz"}, ValueError, "projections must be one of"),
        ({"form": "parallel"}, ValueError, "form must be one of"),
        ({"conv_kernel_size": 1}, ValueError, "conv_kernel_size must be >= 2"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
    ],
)
def test_bad_construction_is_refused(kwargs, error, match):
    args = {"hidden_size": C, "num_k_heads": 2, "num_v_heads": 4, "head_k_dim": DK,
            "head_v_dim": DV} | kwargs  # fmt: skip
    with pytest.raises(error, match=match):
        GatedDeltaNet(**args)


@pytest.mark.parametrize(
    ("forward", "error", "match"),
    [
        ({"x": np.zeros((B, T, C + 1))}, ValueError, "last axis"),
        ({"x": np.zeros((B, T, C), np.float32)}, TypeError, "dtype float32"),
        ({"key_padding_mask": np.zeros((B, T + 1), bool)}, ValueError, "key_padding_mask is"),
        ({"key_padding_mask": np.zeros((B, T))}, TypeError, "key_padding_mask"),
        ({"cache": object()}, TypeError, "LinearStateCache"),
        ({"cache": LinearStateCache(B, HV, DK, DV + 1, conv_dim=F, conv_width=W)}, ValueError,
         r"value_dim 3 \(the layer's call has 2\)"),
        ({"cache": LinearStateCache(B + 1, HV, DK, DV, conv_dim=F, conv_width=W)}, ValueError,
         "batch 3"),
        ({"cache": LinearStateCache(B, HV, DK, DV)}, ValueError, "conv_dim None"),
    ],
)  # fmt: skip
def test_bad_forward_input_is_refused(rng, forward, error, match):
    layer = make()
    forward = {"x": rng.standard_normal((B, T, C))} | forward

    with pytest.raises(error, match=match):
        layer(**forward)


# -- the reader's errors (NumPy alone; its parity with transformers: tests/parity/) --


def config(**changes):
    """A qwen3_next config.json: layer 0 gated DeltaNet, layer 1 softmax attention."""
    return {
        "model_type": "qwen3_next", "hidden_size": C, "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": HK,
        "linear_num_value_heads": HV, "linear_key_head_dim": DK, "linear_value_head_dim": DV,
        "linear_conv_kernel_dim": W,
    } | changes  # fmt: skip


def state(projections="fused", prefix="model.layers.0.linear_attn."):
    layer = make(projections)
    return {prefix + name: value for name, value in layer.state_dict().items()}


def test_the_reader_loads_a_layer_under_any_prefix(rng):
    x = rng.standard_normal((B, T, C))
    expected = make()(x)

    for prefix in ("model.layers.0.linear_attn.", "layers.0.linear_attn.", ""):
        layer = gated_deltanet_from_hf(config(), state(prefix=prefix), 0)
        assert_close(layer(x), expected, name=prefix or "no prefix")


def test_the_reader_reads_the_default_layer_pattern_and_a_wrapper(rng):
    """Without layer_types every 4th layer is softmax attention; qwen3_5 reads its text_config
    (split projections), its weights under model.language_model."""
    text = config(model_type="qwen3_5_text", num_hidden_layers=8) | {"layer_types": None}
    wrapper = {"model_type": "qwen3_5", "text_config": text}
    weights = state("split", "model.language_model.layers.2.linear_attn.")

    layer = gated_deltanet_from_hf(wrapper, weights, 2)

    assert layer.projections == "split"
    with pytest.raises(ValueError, match=r"layer 3 of this qwen3_5_text model is 'full_attention'"):
        gated_deltanet_from_hf(wrapper, weights, 3)


@pytest.mark.parametrize(
    ("changes", "weights", "layer_idx", "error", "match"),
    [
        ({"model_type": "kimi_linear"}, None, 0, ValueError, "'kimi_linear' is not supported"),
        ({}, None, 1, ValueError, r"layer 1 of this qwen3_next model is 'full_attention'.*\[0\]"),
        ({}, None, 2, ValueError, "layer_idx is 2 but this qwen3_next model has 2 layers"),
        ({"hidden_act": "gelu"}, None, 0, ValueError, "hidden_act is 'gelu'"),
        ({"linear_num_key_heads": 2, "linear_num_value_heads": 3}, None, 0, ValueError,
         "multiple of linear_num_key_heads"),
        ({"linear_value_head_dim": DV + 1}, None, 0, ValueError,
         "in_proj_qkvz.weight has shape .* but the config's"),
        ({"model_type": "qwen3_5_text"}, None, 0, KeyError, "missing keys"),
        ({}, {"model.layers.0.self_attn.q_proj.weight": np.zeros(2)}, 0, KeyError, "no 'A_log'"),
        ({}, "two", 0, KeyError, "holds 2 gated DeltaNet layers"),
    ],
)  # fmt: skip
def test_the_reader_refuses_by_name(changes, weights, layer_idx, error, match):
    if weights is None:
        weights = state()
    elif weights == "two":  # layers 2 and 3, neither numbered 0
        weights = state(prefix="model.layers.2.linear_attn.") | state(
            prefix="model.layers.3.linear_attn."
        )

    with pytest.raises(error, match=match):
        gated_deltanet_from_hf(config(**changes), weights, layer_idx)
