"""The source dicts of the layout converters (``convert.py``), read and checked once, by the
rules every converter shares: each value read as an array (NumPy arrays, lists, or torch
tensors through ``.detach().cpu()``, torch never imported); a missing required key, or an
unexpected one, a ``KeyError`` naming it (ignoring it would drop weights silently); a parameter
of the wrong shape a ``ValueError``; a bias the source lacks becomes zeros where the target needs
one, and a value the target cannot hold is dropped only when it is all zeros.

Tests: tests/numpy_attention/test_convert.py (through the converters).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from . import validation
from .module import _to_numpy

__all__ = ["all_or_none", "bias_or_zeros", "drop_zero", "matrix", "param", "read"]


def read(
    source: Mapping[str, Any], fn: str, required: Iterable[str], optional: Iterable[str] = ()
) -> dict[str, np.ndarray]:
    """The source as arrays, after the missing/unexpected key checks."""
    arrays = {name: _to_numpy(value) for name, value in source.items()}
    required, optional = list(required), list(optional)
    missing = [name for name in required if name not in arrays]
    if missing:
        raise KeyError(f"{fn}: missing keys {missing}")
    unexpected = sorted(set(arrays) - set(required) - set(optional))
    if unexpected:
        raise KeyError(f"{fn}: unexpected keys {unexpected}; expected {required + optional}")
    return arrays


def all_or_none(arrays: Mapping[str, np.ndarray], fn: str, names: list[str]) -> bool:
    """Whether a group of keys that belong together (e.g. the q, k and v biases) is present."""
    present = [name in arrays for name in names]
    if any(present) and not all(present):
        missing = [name for name, here in zip(names, present, strict=True) if not here]
        raise KeyError(f"{fn}: missing keys {missing} (the rest of their group is present)")
    return all(present)


def param(
    arrays: Mapping[str, np.ndarray], fn: str, name: str, shape: tuple[int, ...]
) -> np.ndarray:
    """A floating parameter of exactly ``shape``, as a fresh C-contiguous copy."""
    array = validation.float_array(f"{fn}: {name}", arrays[name])
    if array.shape != shape:
        raise ValueError(f"{fn}: {name} has shape {array.shape}, expected {shape}")
    return array.copy()


def matrix(arrays: Mapping[str, np.ndarray], fn: str, name: str) -> np.ndarray:
    """A floating 2-D parameter of any shape; its shape then fixes the others."""
    array = validation.float_array(f"{fn}: {name}", arrays[name])
    if array.ndim != 2:
        raise ValueError(f"{fn}: {name} must be a matrix, got shape {array.shape}")
    return array.copy()


def bias_or_zeros(
    arrays: Mapping[str, np.ndarray], fn: str, name: str, size: int, dtype: np.dtype
) -> np.ndarray:
    """The bias ``name`` if present, else zeros: the same layer for a target that needs a bias."""
    if name in arrays:
        return param(arrays, fn, name, (size,))
    return np.zeros(size, dtype=dtype)


def drop_zero(fn: str, name: str, array: np.ndarray, target: str) -> None:
    """A value the target cannot hold may only be dropped when it is all zeros."""
    if np.any(array != 0):
        raise ValueError(
            f"{fn}: {name} is non-zero but {target} has no place for it; converting would "
            "change the layer"
        )
