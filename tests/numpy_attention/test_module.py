"""The Module base: parameters, gradient accumulation, state dicts, modes, dtypes, no_grad, the
upstream gradient's checks, and constructor arguments, on every layer of the package.

``LAYERS`` builds each public layer small, with non-default arguments; test_state.py reuses it.
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest
import torch

import numpy_attention
from numpy_attention import Linear, Module, ModuleList, no_grad
from numpy_attention.grad_mode import is_grad_enabled

from ..conftest import to_torch

B, N, M, C = 2, 3, 5, 4

# name -> (constructor arguments, keyword arguments, shapes of the forward's inputs); every
# argument that has a default is given another value, so a lost argument shows.
LAYERS = {
    "Linear": ((C, 6), {"bias": False}, [(B, N, C)]),
    "Dropout": ((), {"p": 0.25}, [(B, N, C)]),
    "SimpleSelfAttention": ((), {}, [(B, N, C)]),
    "SelfAttentionV1": ((C, 5), {}, [(B, N, C)]),
    "SelfAttentionV2": ((C, 5), {"qkv_bias": True}, [(B, N, C)]),
    "CausalAttention": ((C, 5, 6, 0.25), {"qkv_bias": True}, [(B, N, C)]),
    "MultiHeadAttentionWrapper": ((C, 3, 6, 0.25, 2), {"qkv_bias": True}, [(B, N, C)]),
    "MultiHeadAttention": ((C, 6, 6, 0.25, 2), {"qkv_bias": True}, [(B, N, C)]),
    "SingleHeadAttention": ((8,), {"bias": False}, [(B, N, 8)]),
    "BidirectionalAttention": ((C, 2), {"attn_drop": 0.2, "out_drop": 0.3, "bias": False},
                               [(B, N, C)]),
    "CausalSelfAttention": ((C, 2, 6), {"attn_drop": 0.2, "out_drop": 0.3, "bias": False},
                            [(B, N, C)]),
    "CrossAttention": ((C, 2), {"attn_drop": 0.2, "out_drop": 0.3, "bias": False,
                                "causal": True}, [(B, N, C), (B, M, C)]),
    "RMSNorm": ((C,), {"eps": 1e-5}, [(B, N, C)]),
    "LayerNorm": ((C,), {"eps": 1e-5, "weight_offset": 1.0}, [(B, N, C)]),
    "WeightlessRMSNorm": ((C,), {"eps": 1e-5}, [(B, N, C)]),
    "GroupedQueryAttention": ((C, 2, 1), {"head_dim": 2, "bias": True, "out_bias": True,
                               "rope_theta": 500.0, "inv_freq": None, "rope_attention_factor": 1.1,
                               "rope_interleaved": True, "qk_norm": True, "norm_eps": 1e-5,
                               "window": (3, 0), "softcap": 2.0, "sinks": True, "scaling": 0.5,
                               "dropout": 0.25, "qk_norm_position": "after_rope",
                               "query_temperature": {"kind": "power", "exponent": 0.1,
                                                     "length": 3.0, "offset": 1.0}},
                              [(B, N, C)]),
    "MultiHeadLatentAttention": ((C, 2), {"kv_lora_rank": 3, "qk_nope_head_dim": 2,
                                  "qk_rope_head_dim": 2, "v_head_dim": 3, "q_lora_rank": 5,
                                  "bias": True, "rope_theta": 500.0, "inv_freq": None,
                                  "rope_attention_factor": 1.1, "rope_interleave": False,
                                  "scaling": 0.5, "latent_scale": 1.5,
                                  "query_temperature": (0.1, 4.0), "norm_eps": 1e-5,
                                  "dropout": 0.25}, [(B, N, C)]),
    "GatedDeltaNet": ((C, 1, 2, 2, 3), {"conv_kernel_size": 3, "projections": "split",
                       "norm_eps": 1e-5, "form": "recurrent", "chunk_size": 2}, [(B, N, C)]),
    "KimiDeltaAttention": ((C, 2, 2), {"conv_kernel_size": 3, "norm_eps": 1e-6,
                            "form": "recurrent", "chunk_size": 2}, [(B, N, C)]),
    "KimiForgetGate": ((C, 2, 2), {}, [(B, N, C)]),
    "LightningAttention": ((C, 2), {"head_dim": 3, "layer_idx": 1, "num_hidden_layers": 3,
                            "slope_rate": [0.5, 0.25], "norm_eps": 1e-5, "form": "recurrent",
                            "chunk_size": 2}, [(B, N, C)]),
}  # fmt: skip


def build(name, rng):
    """Layer ``name`` of LAYERS in eval mode (no random keep-masks) and float32 inputs for it."""
    args, kwargs, shapes = LAYERS[name]
    cls = getattr(numpy_attention, name)
    if "rng" in inspect.signature(cls).parameters:  # all but the weight-free SimpleSelfAttention
        kwargs = {**kwargs, "rng": rng}
    layer = cls(*args, **kwargs).eval()
    return layer, [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


class TwoLinears(Module):
    """A composite: x feeds both children and the outputs are summed (dx = dx_a + dx_b)."""

    def __init__(self, rng):
        super().__init__()
        self.a = Linear(3, 2, rng=rng)
        self.pair = ModuleList([Linear(3, 2, bias=False, rng=rng), Linear(3, 2, rng=rng)])

    def forward(self, x):
        return self.a(x) + self.pair[0](x) + self.pair[1](x)

    def backward(self, dout):
        return self.a.backward(dout) + self.pair[0].backward(dout) + self.pair[1].backward(dout)


def test_names_follow_torch_state_dict_keys(rng):
    module = TwoLinears(rng)

    assert list(module.state_dict()) == [
        "a.weight",
        "a.bias",
        "pair.0.weight",
        "pair.1.weight",
        "pair.1.bias",
    ]
    assert list(module.named_grads()) == list(module.named_parameters())


def test_backward_adds_into_grads_and_zero_grad_clears(rng):
    module = TwoLinears(rng).astype(np.float64)
    x = rng.standard_normal((4, 3))
    dout = rng.standard_normal((4, 2))

    module(x)
    module.backward(dout)
    once = {name: grad.copy() for name, grad in module.named_grads().items()}
    module(x)
    module.backward(dout)

    for name, grad in module.named_grads().items():
        np.testing.assert_array_equal(grad, 2 * once[name])  # g + g == 2g exactly
        assert np.any(grad != 0)
    module.zero_grad()
    assert all(np.all(grad == 0) for grad in module.named_grads().values())


def test_backward_needs_a_fresh_forward(rng):
    layer = Linear(3, 2, rng=rng)
    x = rng.standard_normal((4, 3)).astype(np.float32)

    with pytest.raises(RuntimeError, match="forward first"):
        layer.backward(np.ones((4, 2), dtype=np.float32))
    layer(x)
    layer.backward(np.ones((4, 2), dtype=np.float32))
    with pytest.raises(RuntimeError, match="forward first"):
        layer.backward(np.ones((4, 2), dtype=np.float32))


def test_no_grad_caches_nothing(rng):
    layer = Linear(3, 2, rng=rng)
    x = rng.standard_normal((4, 3)).astype(np.float32)

    with no_grad():
        assert not is_grad_enabled()
        layer(x)
    assert is_grad_enabled()

    assert layer._ctx is None
    with pytest.raises(RuntimeError):
        layer.backward(np.ones((4, 2), dtype=np.float32))


def test_load_state_dict_from_torch_and_errors(rng):
    module = TwoLinears(rng)
    torch_state = {
        name: to_torch(value * 2).double() for name, value in module.state_dict().items()
    }

    module.load_state_dict(torch_state)

    np.testing.assert_array_equal(
        module.a.weight, torch_state["a.weight"].numpy().astype(np.float32)
    )
    assert module.a.weight.dtype == np.float32  # cast to the module's dtype, as torch does
    missing = dict(torch_state)
    del missing["a.bias"]
    with pytest.raises(KeyError, match="a.bias"):
        module.load_state_dict(missing)
    with pytest.raises(KeyError, match="extra"):
        module.load_state_dict({**torch_state, "extra": np.zeros(1)})
    before = module.a.weight.copy()
    with pytest.raises(ValueError, match=r"pair.0.weight.*\(3, 2\)"):
        module.load_state_dict(
            {**torch_state, "a.weight": np.zeros((2, 3)), "pair.0.weight": np.zeros((3, 2))}
        )
    np.testing.assert_array_equal(module.a.weight, before)  # nothing changed on error
    module.load_state_dict({"a.bias": np.ones(2)}, strict=False)
    np.testing.assert_array_equal(module.a.bias, np.ones(2, dtype=np.float32))


def test_load_state_dict_takes_bfloat16_tensors(rng):
    layer = Linear(3, 2, rng=rng)

    layer.load_state_dict(
        {k: torch.ones(v.shape, dtype=torch.bfloat16) for k, v in layer.state_dict().items()}
    )

    np.testing.assert_array_equal(layer.weight, np.ones((2, 3), dtype=np.float32))


def test_astype_train_eval(rng):
    module = TwoLinears(rng)

    assert module.astype(np.float64) is module
    assert all(p.dtype == np.float64 for p in module.named_parameters().values())
    assert all(g.dtype == np.float64 for g in module.named_grads().values())
    assert not module.eval().training and not module.pair[1].training
    assert module.train().pair[1].training
    with pytest.raises(TypeError, match="floating"):
        module.astype(np.int32)


def test_input_dtype_must_match_parameters(rng):
    layer = Linear(3, 2, rng=rng)

    with pytest.raises(TypeError, match="float64.*float32"):
        layer(rng.standard_normal((4, 3)))
    with pytest.raises(TypeError, match="floating"):
        layer(np.ones((4, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\(4, 5\)"):
        layer(np.ones((4, 5), dtype=np.float32))


# -- the upstream gradient: checked before the context is taken -------------------------------


def _grads(result):
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize(
    ("wrong", "error"),
    [("shape", ValueError), ("integer", TypeError)],
)
def test_a_rejected_dout_leaves_the_context_for_a_corrected_retry(rng, name, wrong, error):
    layer, inputs = build(name, rng)
    twin = build(name, np.random.default_rng(0))[0]
    twin.load_state_dict(layer.state_dict())
    out = layer(*inputs)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    bad = (
        np.ones(out.shape[:-1] + (out.shape[-1] + 1,), np.float32)
        if wrong == "shape"
        else (np.ones(out.shape, dtype=np.int64))
    )

    with pytest.raises(error, match="dout"):
        layer.backward(bad)
    retried = _grads(layer.backward(dout))

    twin(*inputs)
    expected = _grads(twin.backward(dout))
    for actual, reference in zip(retried, expected, strict=True):
        np.testing.assert_array_equal(actual, reference)
    for key, grad in twin.named_grads().items():
        np.testing.assert_array_equal(layer.named_grads()[key], grad, err_msg=key)


# -- load_state_dict: what it casts, what it refuses ------------------------------------------


def test_load_state_dict_casts_integer_arrays(rng):
    layer = Linear(3, 2, rng=rng)

    layer.load_state_dict({"weight": np.arange(6).reshape(2, 3), "bias": [1, 2]})

    assert layer.weight.dtype == np.float32
    np.testing.assert_array_equal(layer.weight, np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(layer.bias, np.array([1, 2], dtype=np.float32))


@pytest.mark.parametrize(
    "value",
    [
        np.ones(2, dtype=np.complex128),  # casting would drop the imaginary part
        np.array(["1.0", "2.0"]),  # strings cast to floats by NumPy, silently
        np.array([1.0, None], dtype=object),
        np.array([b"ab", b"cd"]),
    ],
    ids=["complex", "str", "object", "bytes"],
)
def test_load_state_dict_refuses_arrays_that_are_not_real_numbers(rng, value):
    layer = Linear(3, 2, rng=rng)
    before = layer.state_dict()
    state = {"weight": np.zeros((2, 3)), "bias": value}

    with pytest.raises(TypeError, match=f"'bias'.*{value.dtype}"):
        layer.load_state_dict(state)

    for key, array in before.items():  # all or nothing: the valid weight was not loaded either
        np.testing.assert_array_equal(layer.state_dict()[key], array)


@pytest.mark.parametrize(
    "name", ["CausalAttention", "MultiHeadAttention", "MultiHeadAttentionWrapper"]
)
def test_load_state_dict_refuses_a_mask_buffer_that_is_not_causal(rng, name):
    layer, _ = build(name, rng)
    state = layer.state_dict()
    key = next(key for key in state if key.endswith("mask"))
    holed = state[key].copy()
    holed[0, 2] = 0.0  # query 0 may now see key 2, a future token

    with pytest.raises(ValueError, match=f"{key}.*future tokens"):
        layer.load_state_dict({**state, key: holed})

    np.testing.assert_array_equal(layer.state_dict()[key], state[key])


@pytest.mark.parametrize("dtype", [np.float64, np.bool_, np.int64])
def test_load_state_dict_takes_the_causal_buffer_in_any_real_dtype(rng, dtype):
    layer, _ = build("CausalAttention", rng)
    state = layer.state_dict()

    layer.load_state_dict({**state, "mask": state["mask"].astype(dtype)})

    assert layer.mask.dtype == np.float32
    np.testing.assert_array_equal(layer.mask, state["mask"])


# -- constructor arguments, recorded by the base for every layer ------------------------------


@pytest.mark.parametrize("name", list(LAYERS))
def test_constructor_args_name_every_argument_and_rebuild_the_layer(rng, name):
    layer, _ = build(name, rng)
    args, kwargs, _ = LAYERS[name]

    recorded = layer.constructor_args()
    rebuilt = type(layer)(**recorded)

    assert list(recorded.values())[: len(args)] == list(args)
    assert {key: recorded[key] for key in kwargs} == kwargs
    assert "rng" not in recorded
    assert rebuilt.constructor_args() == recorded
    assert copy.deepcopy(layer).constructor_args() == recorded
    shapes = {key: value.shape for key, value in layer.state_dict().items()}
    assert {key: value.shape for key, value in rebuilt.state_dict().items()} == shapes


def test_constructor_args_fill_defaults_and_take_numpy_scalars_as_python_ones():
    layer = numpy_attention.MultiHeadAttention(np.int64(4), 6, 5, np.float32(0.5), np.int32(2))

    recorded = layer.constructor_args()

    assert recorded == {
        "d_in": 4, "d_out": 6, "context_length": 5, "dropout": 0.5, "num_heads": 2,
        "qkv_bias": False,
    }  # fmt: skip
    assert type(recorded["d_in"]) is int and type(recorded["dropout"]) is float


def test_repr_shows_the_constructor_arguments_then_the_children(rng):
    layer = numpy_attention.SelfAttentionV2(3, 2, rng=rng)

    assert repr(layer) == (
        "SelfAttentionV2(\n"
        "  d_in=3, d_out=2, qkv_bias=False\n"
        "  (W_query): Linear(in_features=3, out_features=2, bias=False)\n"
        "  (W_key): Linear(in_features=3, out_features=2, bias=False)\n"
        "  (W_value): Linear(in_features=3, out_features=2, bias=False)\n"
        ")"
    )
