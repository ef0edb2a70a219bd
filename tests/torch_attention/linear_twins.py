"""The linear-attention layers of both packages side by side, for the twin tests of
torch_attention.gated_deltanet, kimi_delta and lightning (test_gated_deltanet.py,
test_kimi_delta.py, test_lightning.py), without transformers.

Not a test module: each test module parametrizes these checks over its own rows of ``LAYERS``.
Each check builds the NumPy layer in float64 with its weights redrawn around the scale the
models use, loads its twin from it, and holds the twin to it: the forward and autograd's
gradients of x and every parameter against the hand-derived backward (a left-padded batch),
decoding over the torch caches (contiguous and paged) equal to the full forward with the NumPy
caches' states, and the same words for a bad padding mask.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention
import torch_attention
from numpy_attention import linear_cache as np_cache
from torch_attention import linear_cache as torch_cache

from ..conftest import assert_close, to_numpy, to_torch

KINDS = ["contiguous", "paged"]  # the caches decoded over
B, T, PREFILL, PAD, C = 2, 7, 4, 2, 12
LAYERS = {  # name -> (class name, constructor arguments, the cache's (H, K, V, conv dim, W))
    "gated_deltanet_fused": ("GatedDeltaNet", {"hidden_size": C, "num_k_heads": 1,
                             "num_v_heads": 2, "head_k_dim": 4, "head_v_dim": 3,
                             "conv_kernel_size": 3, "chunk_size": 4}, (2, 4, 3, 14, 3)),
    "gated_deltanet_split": ("GatedDeltaNet", {"hidden_size": C, "num_k_heads": 2,
                             "num_v_heads": 2, "head_k_dim": 3, "head_v_dim": 3,
                             "projections": "split", "chunk_size": 4}, (2, 3, 3, 18, 4)),
    "kimi_delta": ("KimiDeltaAttention", {"hidden_size": C, "num_heads": 2, "head_dim": 3,
                   "conv_kernel_size": 3, "chunk_size": 4}, (2, 3, 3, 18, 3)),
    "lightning": ("LightningAttention", {"hidden_size": C, "num_heads": 2, "head_dim": 3,
                  "layer_idx": 1, "num_hidden_layers": 3, "chunk_size": 4}, (2, 3, 3, None, None)),
}  # fmt: skip


def build(name, rng):
    """The NumPy layer in float64 with its weights redrawn around the scale the models use, and
    its twin loaded from it."""
    cls, kwargs, _ = LAYERS[name]
    layer = getattr(numpy_attention, cls)(**kwargs, rng=rng).astype(np.float64)
    for key, value in layer.named_parameters().items():
        value[...] = rng.normal(
            0.0, 0.5 if value.ndim < 2 else value.shape[-1] ** -0.5, value.shape
        )
        if key.endswith("norm.weight"):
            value += 1.0
    twin = getattr(torch_attention, cls)(**layer.constructor_args()).double()
    return layer, torch_attention.from_numpy(twin, layer)


def padding():
    mask = np.zeros((B, T), dtype=bool)
    mask[1, :PAD] = True  # batch element 1 left-padded
    return mask


def caches(name, kind):
    _, _, (h, k, v, conv_dim, width) = LAYERS[name]
    shapes = {"conv_dim": conv_dim, "conv_width": width}
    if kind == "contiguous":
        return (np_cache.LinearStateCache(B, h, k, v, **shapes),
                torch_cache.LinearStateCache(B, h, k, v, **shapes))  # fmt: skip
    return (np_cache.PagedLinearStateCache([3, 1], 4, h, k, v, **shapes),
            torch_cache.PagedLinearStateCache([3, 1], 4, h, k, v, **shapes))  # fmt: skip


def check_backward(name, rng):
    """The forward, dx and every parameter's gradient: autograd through the twin against the
    NumPy layer's hand-derived backward (float64, a left-padded batch), by parameter name."""
    layer, twin = build(name, rng)
    x, dout = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
    x_t = to_torch(x, requires_grad=True)

    out_t = twin(x_t, key_padding_mask=to_torch(padding()))
    out_t.backward(to_torch(dout))
    out = layer(x, key_padding_mask=padding())
    dx = layer.backward(dout)

    assert set(dict(twin.named_parameters())) == set(layer.named_parameters())
    assert_close(out_t, out, name="out")
    assert_close(x_t.grad, dx, name="dx")
    grads = layer.named_grads()
    for key, param in twin.named_parameters():
        assert_close(param.grad, grads[key], name=key)


def check_decoding(name, kind, rng):
    """A prefill then one token at a time over the torch cache (``kind``) equals the twin's full
    forward, and leaves the states the NumPy layer leaves in its cache."""
    layer, twin = build(name, rng)
    x, mask = rng.standard_normal((B, T, C)), padding()
    np_states, torch_states = caches(name, kind)
    with torch.no_grad():
        full = twin(to_torch(x), key_padding_mask=to_torch(mask))
        steps = [twin(to_torch(x[:, :PREFILL]), key_padding_mask=to_torch(mask[:, :PREFILL]),
                      cache=torch_states)]  # fmt: skip
        steps += [twin(to_torch(x[:, t : t + 1]), key_padding_mask=to_torch(mask[:, : t + 1]),
                       cache=torch_states) for t in range(PREFILL, T)]  # fmt: skip
    with numpy_attention.no_grad():
        layer(x[:, :PREFILL], key_padding_mask=mask[:, :PREFILL], cache=np_states)
        for t in range(PREFILL, T):
            layer(x[:, t : t + 1], key_padding_mask=mask[:, : t + 1], cache=np_states)

    assert_close(torch.cat(steps, dim=1), full, name="decoded")
    assert torch_states.length == np_states.length == T
    for mine, theirs in zip(torch_states.read(), np_states.read(), strict=True):
        if theirs is None:
            assert mine is None
        else:
            assert_close(to_numpy(mine), theirs, name="state")


def check_padding_error(name, rng):
    """A padding mask of the wrong length: the same ValueError words as the NumPy layer."""
    layer, twin = build(name, rng)
    x = rng.standard_normal((B, T, C))
    wrong = np.zeros((B, T + 1), dtype=bool)

    with pytest.raises(ValueError) as numpy_error:
        layer(x, key_padding_mask=wrong)
    with pytest.raises(ValueError) as torch_error:
        twin(to_torch(x), key_padding_mask=to_torch(wrong))

    assert str(torch_error.value) == str(numpy_error.value)
