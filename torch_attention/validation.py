"""Input checks shared by every public function and layer: clear errors before any work.

The twin of ``numpy_attention.validation``: the same checks under the same names and with the
same messages, on tensors instead of arrays (``float_tensor`` / ``bool_tensor`` are the twins of
``float_array`` / ``bool_array``); the scalar checks (``flag``, ``positive_int``, ``finite_real``,
``window``, ``dropout_p``, ...) are the NumPy twin's own, re-exported. The bottom floor of the
package: it imports torch and ``numpy_attention.validation`` alone.
Every check raises ``TypeError`` (the wrong kind of data) or ``ValueError`` (the wrong shape or
value) naming the argument and the shapes involved, and each check is written once, here. No
``assert``: checks must also run under ``python -O``. ``grad_output`` has no twin: autograd
checks the upstream gradient of a torch backward itself.

Tests: tests/torch_attention/test_validation.py.
"""

from __future__ import annotations

from typing import Any

import torch

# The scalar checks are pure Python: one copy, the NumPy twin's, under the same names.
from numpy_attention.validation import (
    dropout_p,
    finite_real,
    flag,
    integer,
    non_negative_int,
    positive_int,
    window,
)

__all__ = [
    "bool_tensor",
    "broadcasts_to",
    "dropout_p",
    "finite_real",
    "flag",
    "float_tensor",
    "integer",
    "keep_mask",
    "layer_input",
    "non_negative_int",
    "positive_int",
    "same_dtype",
    "window",
]


def float_tensor(name: str, value: Any) -> torch.Tensor:
    """Return ``value`` if it is a floating-point tensor, or raise ``TypeError`` naming ``name``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def bool_tensor(name: str, value: Any, device: torch.device) -> torch.Tensor:
    """``value`` as a bool tensor on ``device`` (array-likes are converted), else ``TypeError``."""
    tensor = torch.as_tensor(value, device=device)
    if tensor.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got dtype {tensor.dtype}")
    return tensor


def same_dtype(**tensors: torch.Tensor) -> torch.dtype:
    """The one dtype that all ``tensors`` share; ``TypeError`` naming each dtype otherwise."""
    dtypes = {name: tensor.dtype for name, tensor in tensors.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
        raise TypeError(f"inputs must share one dtype, got {listed}")
    return next(iter(dtypes.values()))


def broadcasts_to(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    """``ValueError`` unless ``tensor`` broadcasts to ``shape`` without growing it."""
    try:
        result: tuple[int, ...] | None = tuple(torch.broadcast_shapes(tensor.shape, shape))
    except RuntimeError:
        result = None
    if result != tuple(shape):
        raise ValueError(
            f"{name} of shape {tuple(tensor.shape)} does not broadcast to {tuple(shape)}"
        )


def keep_mask(
    name: str,
    mask: Any,
    p: float,
    shape: tuple[int, ...],
    device: torch.device,
    *,
    exact: bool = False,
) -> torch.Tensor:
    """An explicit dropout keep-mask (bool, True = kept) for a dropout of probability ``p``, on
    ``device``.

    A mask with ``p == 0`` is a ``ValueError`` (nothing would be rescaled: the caller meant
    something else). The mask must broadcast to ``shape``, or equal it when ``exact``.
    """
    mask = bool_tensor(name, mask, device)
    if p == 0.0:
        raise ValueError(f"{name} was given but the dropout probability is 0; set it above 0")
    if exact and tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    broadcasts_to(name, mask, shape)
    return mask


def layer_input(
    name: str,
    x: Any,
    width: int,
    ranks: tuple[int, ...] | None,
    param_dtype: torch.dtype | None,
    layer: str = "the layer",
) -> torch.Tensor:
    """Check a layer's input: float, of an allowed rank (None: any rank >= 1), last axis
    ``width``, the dtype of ``layer``'s parameters."""
    x = float_tensor(name, x)
    if ranks is None and x.ndim < 1:
        raise ValueError(f"{name} must have at least one axis, got shape {tuple(x.shape)}")
    if ranks is not None and x.ndim not in ranks:
        allowed = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name} must have rank {allowed}, got shape {tuple(x.shape)}")
    if x.shape[-1] != width:
        raise ValueError(
            f"{name} has last axis {x.shape[-1]} (shape {tuple(x.shape)}), expected {width}"
        )
    if param_dtype is not None and x.dtype != param_dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but {layer}'s parameters are {param_dtype}; "
            f"cast one with module.to(...) or x.to(...)"
        )
    return x
