"""Keys and values shared across layers, in torch: the twin of ``numpy_attention.shared_kv``.

A layer built with ``kv_shared=True`` attends with the source layer's ``kv`` (a ``SharedKV`` of
tensors of the autograd graph, so the consumers' gradients reach the source's keys and values by
themselves: no ``dkv`` here) or, decoding, with the source layer's cache (read, never appended
to). The construction rules are NumPy's (``check_shared``, pure Python).

Shape legend: B batch, H_kv key/value heads, M keys, D head width.

Derivation: docs/derivations/shared-kv.md.
Tests: tests/torch_attention/test_shared_kv.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from numpy_attention.shared_kv import (  # the rules are pure Python, shared
    check_shared,
    check_shared_shapes,
)

from . import validation
from .decode.cache import KVCache, PagedKVCache

__all__ = ["SharedKV", "check_shared", "read_shared_kv"]


class SharedKV(NamedTuple):
    """The keys and values one layer attended with, (B, H_kv, M, D) each."""

    k: torch.Tensor
    v: torch.Tensor


def read_shared_kv(
    shared: Any, shape: tuple[int, int, int], n: int, dtype: torch.dtype, device: torch.device
) -> tuple[SharedKV, bool]:
    """The keys and values a KV-shared layer attends with, checked, and whether they are a
    cache's (inference); the NumPy twin's rules, plus the layer's device."""
    cached = isinstance(shared, (KVCache, PagedKVCache))
    if isinstance(shared, KVCache):
        k, v = shared.k[:, :, : shared.length], shared.v[:, :, : shared.length]
    elif isinstance(shared, PagedKVCache):
        k, v = shared.gather()
    elif isinstance(shared, tuple) and len(shared) == 2:
        k = validation.float_tensor("shared_kv.k", shared[0])
        v = validation.float_tensor("shared_kv.v", shared[1])
    else:
        raise TypeError(
            "shared_kv must be the source layer's kv (a SharedKV or (k, v) pair) or its "
            f"KVCache / PagedKVCache, got {type(shared).__name__}"
        )
    check_shared_shapes(tuple(k.shape), tuple(v.shape), shape, n)
    if k.dtype != dtype or v.dtype != dtype:
        raise TypeError(f"shared_kv holds {k.dtype} and {v.dtype}, but the layer is {dtype}")
    if k.device != device or v.device != device:
        raise ValueError(f"shared_kv is on {k.device}, but x is on {device}")
    return SharedKV(k, v), cached
