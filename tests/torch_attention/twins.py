"""The layers of both packages side by side, for the layer tests of torch_attention.

Not a test module: ``test_attention.py``, ``test_fused.py`` and ``test_transfer.py`` share the
table of layers, their NumPy twins and one set of forward inputs.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from torch_attention import from_numpy

from ..conftest import assert_close, to_torch

BACKENDS = ["auto", "sdpa", "math", "manual"]

# name -> (family, constructor args); small sizes, every option that changes the state dict on.
LAYERS = {
    "SimpleSelfAttention": ("attention", ()),
    "SelfAttentionV1": ("attention", (5, 4)),
    "SelfAttentionV2": ("attention", (5, 4, True)),
    "CausalAttention": ("attention", (5, 4, 9, 0.2, True)),
    "MultiHeadAttentionWrapper": ("attention", (5, 4, 9, 0.2, 3, True)),
    "MultiHeadAttention": ("attention", (5, 6, 9, 0.2, 3)),
    "SingleHeadAttention": ("fused", (8,)),
    "BidirectionalAttention": ("fused", (12, 3, 0.2, 0.3)),
    "CausalSelfAttention": ("fused", (12, 3, 9, 0.2, 0.3)),
    "CrossAttention": ("fused", (12, 3, 0.2, 0.3, True, True)),
}


def family(name: str) -> list[str]:
    """The names of the layers of one family ("attention" or "fused")."""
    return [layer for layer, (fam, _) in LAYERS.items() if fam == name]


def numpy_layer(name, *args, seed=None):
    """The NumPy twin; ``seed`` goes to ``rng=`` (SimpleSelfAttention has no weights to draw)."""
    layer = getattr(importlib.import_module(f"numpy_attention.{LAYERS[name][0]}"), name)
    return layer(*args) if seed is None or not LAYERS[name][1] else layer(*args, rng=seed)


def torch_layer(name, *args, **kwargs):
    module = importlib.import_module(f"torch_attention.{LAYERS[name][0]}")
    return getattr(module, name)(*args, **kwargs)


def forward_inputs(rng, name, b=2, n=7, m=5):
    """Float64 forward arguments for ``name`` in train mode, with every explicit keep-mask the
    layer takes (shared by both packages) and a padding mask that empties one batch element."""
    x = rng.standard_normal((b, n, 5 if LAYERS[name][0] == "attention" else 12))
    padding = np.zeros((b, n), dtype=bool)
    padding[-1] = True
    keep_out = rng.random((b, n, 12)) > 0.3
    if name in ("SimpleSelfAttention", "SelfAttentionV1", "SelfAttentionV2"):
        return (x,), {}
    if name == "CausalAttention":
        return (x,), {"attn_dropout_mask": rng.random((b, n, n)) > 0.2}
    if name in ("MultiHeadAttentionWrapper", "MultiHeadAttention"):
        return (x,), {"attn_dropout_mask": rng.random((b, 3, n, n)) > 0.2}
    if name == "SingleHeadAttention":
        return (rng.standard_normal((b, n, 8)),), {}
    if name == "CrossAttention":
        y = rng.standard_normal((b, m, 12))
        padding_y = np.zeros((b, m), dtype=bool)
        padding_y[0, -2:] = True
        keep_attn = rng.random((b, 3, n, m)) > 0.2
        masks = {"attn_dropout_mask": keep_attn, "out_dropout_mask": keep_out}
        return (x, y, padding_y), masks
    keep_attn = rng.random((b, 3, n, n)) > 0.2
    return (x, padding), {"attn_dropout_mask": keep_attn, "out_dropout_mask": keep_out}


def as_torch(value):
    return to_torch(value) if isinstance(value, np.ndarray) else value


def normal(*shape, dtype=np.float32):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def ones(*shape, dtype=bool):
    return np.ones(shape, dtype=dtype)


# -- checks every layer test file runs on its own family ----------------------------------------


def assert_state_dict_matches_the_numpy_twin(name):
    args = LAYERS[name][1]

    expected = numpy_layer(name, *args, seed=0).state_dict()
    actual = torch_layer(name, *args).state_dict()

    assert list(actual) == list(expected)
    assert [tuple(t.shape) for t in actual.values()] == [a.shape for a in expected.values()]
    assert all(t.dtype == torch.float32 for t in actual.values())


def assert_train_forward_matches_numpy(rng, backend, name):
    """A float64 layer loaded from its NumPy twin, in train mode with every explicit keep-mask,
    computes what the twin computes."""
    args = LAYERS[name][1]
    source = numpy_layer(name, *args, seed=2).astype(np.float64)
    layer = from_numpy(torch_layer(name, *args, backend=backend).double(), source)
    inputs, masks = forward_inputs(rng, name)

    out = layer(*map(as_torch, inputs), **{key: as_torch(v) for key, v in masks.items()})

    assert out.dtype == torch.float64
    assert_close(out, source(*inputs, **masks), name=name)


def assert_eval_forward_matches_numpy(rng, backend, name):
    args = LAYERS[name][1]
    source = numpy_layer(name, *args, seed=2).astype(np.float64).eval()
    layer = from_numpy(torch_layer(name, *args, backend=backend).double(), source).eval()
    inputs, _ = forward_inputs(rng, name)

    out = layer(*map(as_torch, inputs))

    assert_close(out, source(*inputs), name=name)


def assert_train_mode_draws_dropout(rng, backend, name):
    """Without keep-masks, train mode draws dropout from torch's generator: seeded, not eval."""
    inputs, _ = forward_inputs(rng, name)
    inputs = [to_torch(v.astype(np.float32) if v.dtype == np.float64 else v) for v in inputs]
    layer = torch_layer(name, *LAYERS[name][1], backend=backend)
    torch.manual_seed(5)
    dropped = layer(*inputs)

    torch.manual_seed(5)
    again = layer(*inputs)

    assert torch.equal(dropped, again)
    assert not torch.equal(dropped, layer.eval()(*inputs))


def assert_construction_raises_like_numpy(name, args, error, match):
    with pytest.raises(error, match=match):
        numpy_layer(name, *args)
    with pytest.raises(error, match=match):
        torch_layer(name, *args)


def assert_forward_raises_like_numpy(name, args, training, inputs, masks, error, match):
    numpy_module = numpy_layer(name, *args).train(training)
    torch_module = torch_layer(name, *args).train(training)

    with pytest.raises(error, match=match):
        numpy_module(*inputs, **masks)
    with pytest.raises(error, match=match):
        torch_module(*map(as_torch, inputs), **{key: as_torch(v) for key, v in masks.items()})
