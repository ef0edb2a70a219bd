"""Keys and values shared across layers in torch (torch_attention.shared_kv, the layer's
``kv_shared``) against the NumPy twin: a source and a KV-shared layer run as a model, out and
every gradient (autograd through the source's ``kv`` against NumPy's explicit ``dkv``), every
backend; decoding over the source's cache; the NumPy twin's refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_attention.decode.cache as np_caches
import numpy_attention.grouped as np_grouped
from torch_attention import from_numpy
from torch_attention.decode.cache import KVCache, PagedKVCache
from torch_attention.grouped import GroupedQueryAttention

from ..conftest import assert_close, to_torch

B, N, C, H, H_KV, D = 2, 7, 16, 4, 2, 6
SOURCE = {"qk_norm": True, "value_norm": True, "scaling": 1.0, "window": (3, 0)}  # Gemma 3n
SHARED = {"qk_norm": True, "scaling": 1.0, "window": (3, 0), "kv_shared": True}


def twins(rng, options, backend):
    np_layer = np_grouped.GroupedQueryAttention(C, H, H_KV, head_dim=D, **options, rng=0)
    np_layer.astype(np.float64)
    np_layer.load_state_dict(
        {name: rng.standard_normal(value.shape) for name, value in np_layer.state_dict().items()}
    )
    torch_layer = GroupedQueryAttention(**np_layer.constructor_args(), backend=backend).double()
    return np_layer, from_numpy(torch_layer, np_layer)


@pytest.mark.parametrize("backend", ["math", "sdpa", "manual"])
def test_a_source_and_its_shared_layer_match_numpy(rng, backend):
    np_source, source = twins(rng, SOURCE, backend)
    np_shared, shared = twins(rng, SHARED, backend)
    x0, x1 = rng.standard_normal((2, B, N, C))
    dout0, dout1 = rng.standard_normal((2, B, N, C))

    expected0 = np_source(x0)
    expected1 = np_shared(x1, shared_kv=np_source.kv)
    dx1 = np_shared.backward(dout1)
    dx0 = np_source.backward(dout0, dkv=np_shared.dkv)
    x0_t, x1_t = to_torch(x0, requires_grad=True), to_torch(x1, requires_grad=True)
    out0 = source(x0_t)
    out1 = shared(x1_t, shared_kv=source.kv)
    (out0 * to_torch(dout0) + out1 * to_torch(dout1)).sum().backward()

    assert_close(out0, expected0, name="source out")
    assert_close(out1, expected1, name="shared out")
    assert_close(x0_t.grad, dx0, name="dx0")
    assert_close(x1_t.grad, dx1, name="dx1")
    for layer, np_layer in ((source, np_source), (shared, np_shared)):
        assert sorted(dict(layer.named_parameters())) == sorted(np_layer.named_grads())
        for name, param in layer.named_parameters():
            assert_close(param.grad, np_layer.named_grads()[name], name=name)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decoding_over_the_sources_cache_matches_numpy(rng, paged):
    np_source, source = twins(rng, SOURCE, "math")
    np_shared, shared = twins(rng, SHARED, "math")
    x0, x1 = rng.standard_normal((2, B, N, C))
    np_cache = np_caches.KVCache(B, H_KV, N, D, np.float64)
    cache: KVCache | PagedKVCache = KVCache(B, H_KV, N, D, torch.float64)
    if paged:
        cache = PagedKVCache(B * 4, 2, H_KV, D, dtype=torch.float64)

    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 7)]:
        np_source(x0[:, start:stop], cache=np_cache)
        expected = np_shared(x1[:, start:stop], shared_kv=np_cache)
        source(to_torch(x0[:, start:stop]), cache=cache)
        out = shared(to_torch(x1[:, start:stop]), shared_kv=cache)
        assert_close(out, expected, name=f"tokens {start}:{stop}")
    assert not out.requires_grad  # read from a cache: inference


def test_the_shared_layer_has_the_numpy_twins_state_dict_and_repr():
    layer = GroupedQueryAttention(C, H, H_KV, head_dim=D, **SHARED)

    assert list(layer.state_dict()) == ["q_proj.weight", "o_proj.weight", "q_norm.weight"]
    assert list(layer.state_dict()) == list(
        np_grouped.GroupedQueryAttention(C, H, H_KV, head_dim=D, **SHARED).state_dict()
    )
    assert "kv_shared=True" in repr(layer)
    assert "value_norm=True" in repr(GroupedQueryAttention(C, H, H_KV, head_dim=D, **SOURCE))


def _kv(m=N, heads=H_KV, dtype=torch.float64):
    return torch.zeros(B, heads, m, D, dtype=dtype), torch.zeros(B, heads, m, D, dtype=dtype)


@pytest.mark.parametrize(
    ("options", "forward", "error", "match"),
    [
        (SHARED, {}, ValueError, "shared_kv is missing"),
        (
            SHARED,
            {"shared_kv": _kv(), "cache": KVCache(B, H_KV, N, D, torch.float64)},
            ValueError,
            "cache: a KV-shared layer appends",
        ),
        (SOURCE, {"shared_kv": _kv()}, ValueError, "kv_shared=False"),
        (SHARED, {"shared_kv": _kv(m=N - 1)}, ValueError, "M must be"),
        (SHARED, {"shared_kv": _kv(heads=1)}, ValueError, "H_kv"),
        (SHARED, {"shared_kv": _kv(dtype=torch.float32)}, TypeError, "shared_kv holds"),
        (SHARED, {"shared_kv": np.zeros(3)}, TypeError, "shared_kv must be"),
    ],
)
def test_bad_forward_input_is_refused(options, forward, error, match):
    layer = GroupedQueryAttention(C, H, H_KV, head_dim=D, **options).double()

    with pytest.raises(error, match=match):
        layer(torch.zeros(B, N, C, dtype=torch.float64), **forward)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"value_norm": True}, "value_norm with kv_shared"), ({"clip_qkv": 1.0}, "clip_qkv=1.0")],
)
def test_contradictory_construction_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GroupedQueryAttention(C, H, H_KV, head_dim=D, kv_shared=True, **kwargs)
