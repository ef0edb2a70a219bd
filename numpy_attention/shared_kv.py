"""Keys and values shared across layers (Gemma 3n, Gemma 4: the last ``num_kv_shared_layers``
layers attend with the keys and values of an earlier layer instead of computing their own).

A layer built with ``kv_shared=True`` has no ``k_proj``, ``v_proj``, ``k_norm`` or value norm;
its forward takes ``shared_kv=``: the source layer's ``kv`` (a ``SharedKV`` of the keys and
values its last forward attended with, after their norms and RoPE) on the training path, or the
source layer's cache (read, never appended to) when decoding. The source is an ordinary layer:
after each forward without a cache its ``kv`` holds what it attended with, and its backward takes
``dkv=``, the gradient of that ``kv`` from the layers that shared it, added to its own before its
key and value chains run backward. The shared layer's backward leaves that gradient in its
``dkv``. A model's backward is then, for one source and its consumers c:
``dx_c = c.backward(dout_c)`` for each c, and ``source.backward(dout, dkv=sum of c.dkv)``.

Shape legend: B batch, H_kv key/value heads, M keys, D head width.

Derivation: docs/derivations/shared-kv.md.
Tests: tests/numpy_attention/test_shared_kv.py; the layer's use of it,
tests/numpy_attention/test_grouped.py; against transformers, tests/parity/test_hf_models.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation
from .decode.cache import KVCache, PagedKVCache

__all__ = ["SharedKV", "check_shared", "check_shared_grad", "check_shared_shapes", "read_shared_kv"]


class SharedKV(NamedTuple):
    """The keys and values one layer attended with, (B, H_kv, M, D) each, or their gradients."""

    k: np.ndarray
    v: np.ndarray


def check_shared(
    value_norm: Any, kv_shared: Any, clip: float | None, values_from_keys: Any = False
) -> tuple[bool, bool, bool]:
    """The layer's ``value_norm``, ``kv_shared`` and ``values_from_keys`` as flags (pure Python,
    shared with the torch twin): a KV-shared layer has no values of its own to norm or take
    from its keys, nor keys and values to clamp, and values taken from the keys are not clamped
    by any model (where the clamp would sit is a guess), so each of those is refused by name."""
    value_norm = validation.flag("value_norm", value_norm)
    kv_shared = validation.flag("kv_shared", kv_shared)
    values_from_keys = validation.flag("values_from_keys", values_from_keys)
    if kv_shared and value_norm:
        raise ValueError(
            "value_norm with kv_shared: a KV-shared layer's values are another layer's, "
            "normed there (build the source layer with value_norm)"
        )
    if kv_shared and values_from_keys:
        raise ValueError(
            "values_from_keys with kv_shared: a KV-shared layer has no key projection to take "
            "its values from (build the source layer with values_from_keys)"
        )
    if kv_shared and clip is not None:
        raise ValueError(
            f"clip_qkv={clip} with kv_shared: a KV-shared layer's keys and values are another "
            "layer's, and no model clamps only its queries"
        )
    if values_from_keys and clip is not None:
        raise ValueError(
            f"clip_qkv={clip} with values_from_keys: no model clamps values taken from the "
            "keys, so whether the clamp comes before or after the sharing would be a guess"
        )
    return value_norm, kv_shared, values_from_keys


def check_shared_shapes(
    k_shape: tuple[int, ...], v_shape: tuple[int, ...], shape: tuple[int, int, int], n: int
) -> None:
    """The shared keys' and values' shapes against the consumer's (B, H_kv, D) and its N
    queries (pure Python: the torch twin checks its tensors' shapes here too)."""
    batch, heads, width = shape
    for name, got in (("k", tuple(k_shape)), ("v", tuple(v_shape))):
        if len(got) != 4 or (got[0], got[1], got[3]) != shape:
            raise ValueError(
                f"shared_kv.{name} must be (B, H_kv, M, D) = ({batch}, {heads}, M, {width}), "
                f"the layer's, got {got}"
            )
    if tuple(k_shape) != tuple(v_shape):
        raise ValueError(
            f"shared_kv's k and v must have one shape, got {tuple(k_shape)} and {tuple(v_shape)}"
        )
    if k_shape[2] < n:
        raise ValueError(
            f"shared_kv holds M = {k_shape[2]} keys but x has N = {n} tokens: the queries are "
            "the last N positions of the shared keys, so M must be at least N"
        )


def read_shared_kv(
    shared: Any, shape: tuple[int, int, int], n: int, dtype: np.dtype
) -> tuple[SharedKV, bool]:
    """The keys and values a KV-shared layer attends with, checked, and whether they are a
    cache's (inference: no backward follows).

    Args:
        shared: a ``SharedKV`` or a (k, v) pair of arrays (B, H_kv, M, D), or a ``KVCache`` /
            ``PagedKVCache`` whose cached keys and values are read (nothing is appended).
        shape: the consumer's (B, H_kv, D).
        n: N, the consumer's query count: M must be at least N (its queries are the last N
            positions of the key axis).
        dtype: the consumer's dtype.
    """
    cached = isinstance(shared, (KVCache, PagedKVCache))
    if isinstance(shared, KVCache):
        k, v = shared.k[:, :, : shared.length], shared.v[:, :, : shared.length]
    elif isinstance(shared, PagedKVCache):
        k, v = shared.gather()
    elif isinstance(shared, tuple) and len(shared) == 2:
        k, v = (
            validation.float_array("shared_kv.k", shared[0]),
            validation.float_array("shared_kv.v", shared[1]),
        )
    else:
        raise TypeError(
            "shared_kv must be the source layer's kv (a SharedKV or (k, v) pair) or its "
            f"KVCache / PagedKVCache, got {type(shared).__name__}"
        )
    check_shared_shapes(k.shape, v.shape, shape, n)
    if k.dtype != dtype or v.dtype != dtype:
        raise TypeError(f"shared_kv holds {k.dtype} and {v.dtype}, but the layer is {dtype}")
    return SharedKV(k, v), cached


def check_shared_grad(dkv: Any, kv: SharedKV) -> SharedKV:
    """A source layer's ``dkv`` checked against the ``kv`` its last forward shared: the
    gradient of each, of its shape, cast to its dtype."""
    if not (isinstance(dkv, tuple) and len(dkv) == 2):
        raise TypeError(f"dkv must be a SharedKV or a (dk, dv) pair, got {type(dkv).__name__}")
    dk = validation.grad_output(dkv[0], kv.k.shape, kv.k.dtype, name="dkv.k")
    dv = validation.grad_output(dkv[1], kv.v.shape, kv.v.dtype, name="dkv.v")
    return SharedKV(dk, dv)
