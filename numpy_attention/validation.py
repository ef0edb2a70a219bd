"""Input checks shared by the public functions and layers: clear errors before any work.

Every check raises ``TypeError`` (wrong kind of data) or ``ValueError`` (wrong shape or value)
with a message that names the argument and the shapes involved. No ``assert``: checks must also
run under ``python -O``.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def float_array(name: str, value: Any) -> np.ndarray:
    """Return ``value`` as a floating ndarray, or raise ``TypeError`` naming ``name``."""
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {array.dtype}")
    return array


def bool_array(name: str, value: Any) -> np.ndarray:
    """Return ``value`` as a bool ndarray, or raise ``TypeError`` naming ``name``."""
    array = np.asarray(value)
    if array.dtype != np.bool_:
        raise TypeError(f"{name} must be a bool array, got dtype {array.dtype}")
    return array


def same_dtype(**arrays: np.ndarray) -> np.dtype:
    """The one dtype that all ``arrays`` share; ``TypeError`` naming each dtype otherwise."""
    dtypes = {name: array.dtype for name, array in arrays.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
        raise TypeError(f"inputs must share one dtype, got {listed}")
    return next(iter(dtypes.values()))


def dropout_p(p: Any, name: str = "dropout_p") -> float:
    """A dropout probability in [0, 1); 1.0 would divide by zero in the inverted rescale."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number in [0, 1), got {p!r}")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)


def broadcasts_to(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    """``ValueError`` unless ``array`` broadcasts to ``shape`` without growing it."""
    try:
        result = np.broadcast_shapes(array.shape, shape)
    except ValueError:
        result = None
    if result != tuple(shape):
        raise ValueError(f"{name} of shape {array.shape} does not broadcast to {tuple(shape)}")


def layer_input(
    name: str, x: Any, width: int, ranks: tuple[int, ...], param_dtype: Any
) -> np.ndarray:
    """Check a layer's input: float, of an allowed rank, last axis ``width``, the layer's dtype."""
    x = float_array(name, x)
    if x.ndim not in ranks:
        allowed = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name} must have rank {allowed}, got shape {x.shape}")
    if x.shape[-1] != width:
        raise ValueError(f"{name} has last axis {x.shape[-1]} (shape {x.shape}), expected {width}")
    if param_dtype is not None and x.dtype != param_dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but the layer's parameters are {param_dtype}; "
            f"cast one with module.astype(...) or x.astype(...)"
        )
    return x
