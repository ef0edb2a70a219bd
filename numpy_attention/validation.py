"""Input checks shared by every public function and layer: clear errors before any work.

The bottom floor of the package: it imports NumPy alone. Every check raises ``TypeError`` (the
wrong kind of data) or ``ValueError`` (the wrong shape or value) with a message that names the
argument and the shapes involved, and each check is written once, here. No ``assert``: checks
must also run under ``python -O``.

Tests: tests/numpy_attention/test_validation.py.
"""

from __future__ import annotations

import math
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


def flag(name: str, value: Any) -> bool:
    """A Python or NumPy bool; anything else (``"no"``, 1, None) is a ``TypeError``: a truthy
    string or number would otherwise switch an option on silently."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def integer(name: str, value: Any) -> int:
    """A Python or NumPy integer (not a bool), as int; ``TypeError`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def positive_int(name: str, value: Any) -> int:
    """An integer >= 1 (``TypeError`` for a non-integer, ``ValueError`` for one below 1)."""
    value = integer(name, value)
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def non_negative_int(name: str, value: Any) -> int:
    """An integer >= 0 (``TypeError`` for a non-integer, ``ValueError`` for a negative one)."""
    value = integer(name, value)
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value}")
    return value


def window(value: Any, name: str = "window") -> tuple[int | None, int | None]:
    """A sliding window ``(left, right)``, each side a non-negative int or None (unbounded);
    None is no window, ``(None, None)``."""
    if value is None:
        return None, None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be (left, right) or None, got {value!r}")
    left, right = (
        None if side is None else non_negative_int(f"{name}[{i}]", side)
        for i, side in enumerate(value)
    )
    return left, right


def finite_real(name: str, value: Any) -> float:
    """A finite real number, as float: ``TypeError`` for anything else, ``ValueError`` for NaN
    and inf (a NaN scale would turn every output into NaN, or into 0 on some torch backends)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def dropout_p(p: Any, name: str = "dropout_p") -> float:
    """A dropout probability in [0, 1); 1.0 would divide by zero in the inverted rescale."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number in [0, 1), got {p!r}")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)


def broadcasts_to(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    """``ValueError`` unless ``array`` broadcasts to ``shape`` without growing it."""
    try:
        result: tuple[int, ...] | None = np.broadcast_shapes(array.shape, shape)
    except ValueError:
        result = None
    if result != tuple(shape):
        raise ValueError(f"{name} of shape {array.shape} does not broadcast to {tuple(shape)}")


def keep_mask(
    name: str, mask: Any, p: float, shape: tuple[int, ...], *, exact: bool = False
) -> np.ndarray:
    """An explicit dropout keep-mask (bool, True = kept) for a dropout of probability ``p``.

    A mask with ``p == 0`` is a ``ValueError`` (nothing would be rescaled: the caller meant
    something else). The mask must broadcast to ``shape``, or equal it when ``exact``.
    """
    mask = bool_array(name, mask)
    if p == 0.0:
        raise ValueError(f"{name} was given but the dropout probability is 0; set it above 0")
    if exact and mask.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {mask.shape}")
    broadcasts_to(name, mask, shape)
    return mask


def grad_output(
    dout: Any, shape: tuple[int, ...], dtype: np.dtype | None = None, name: str = "dout"
) -> np.ndarray:
    """A backward's upstream gradient: floating, exactly the forward output's ``shape``, cast to
    ``dtype`` when given. Checked before anything is consumed, so a rejected call can be retried."""
    dout = float_array(name, dout)
    if dout.shape != tuple(shape):
        raise ValueError(f"{name} must have the output's shape {tuple(shape)}, got {dout.shape}")
    return dout if dtype is None else dout.astype(dtype, copy=False)


def layer_input(
    name: str,
    x: Any,
    width: int,
    ranks: tuple[int, ...] | None,
    param_dtype: Any,
    layer: str = "the layer",
) -> np.ndarray:
    """Check a layer's input: float, of an allowed rank (None: any rank >= 1), last axis
    ``width``, the dtype of ``layer``'s parameters."""
    x = float_array(name, x)
    if ranks is None and x.ndim < 1:
        raise ValueError(f"{name} must have at least one axis, got shape {x.shape}")
    if ranks is not None and x.ndim not in ranks:
        allowed = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name} must have rank {allowed}, got shape {x.shape}")
    if x.shape[-1] != width:
        raise ValueError(f"{name} has last axis {x.shape[-1]} (shape {x.shape}), expected {width}")
    if param_dtype is not None and x.dtype != param_dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but {layer}'s parameters are {param_dtype}; "
            f"cast one with module.astype(...) or x.astype(...)"
        )
    return x
