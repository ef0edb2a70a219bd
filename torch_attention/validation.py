"""Input checks shared by the public functions and layers: clear errors before any work.

The twin of ``numpy_attention.validation``: the same checks with the same messages, on tensors.
Every check raises ``TypeError`` (wrong kind of data) or ``ValueError`` (wrong shape or value)
naming the argument and the shapes involved. No ``assert``: checks must also run under
``python -O``.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch


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


def dropout_p(p: Any, name: str = "dropout_p") -> float:
    """A dropout probability in [0, 1); 1.0 (which ``nn.Dropout`` accepts) would divide by zero."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"{name} must be a number in [0, 1), got {p!r}")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)


def scale(value: Any) -> float:
    """A real scale factor (``None`` is handled by the caller)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {value!r}")
    return float(value)


def broadcasts_to(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    """``ValueError`` unless ``tensor`` broadcasts to ``shape`` without growing it."""
    try:
        result = tuple(torch.broadcast_shapes(tensor.shape, shape))
    except RuntimeError:
        result = None
    if result != tuple(shape):
        raise ValueError(
            f"{name} of shape {tuple(tensor.shape)} does not broadcast to {tuple(shape)}"
        )


def layer_input(
    name: str, x: Any, width: int, ranks: tuple[int, ...], param_dtype: torch.dtype | None
) -> torch.Tensor:
    """Check a layer's input: float, of an allowed rank, last axis ``width``, the layer's dtype."""
    x = float_tensor(name, x)
    if x.ndim not in ranks:
        allowed = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name} must have rank {allowed}, got shape {tuple(x.shape)}")
    if x.shape[-1] != width:
        raise ValueError(
            f"{name} has last axis {x.shape[-1]} (shape {tuple(x.shape)}), expected {width}"
        )
    if param_dtype is not None and x.dtype != param_dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but the layer's parameters are {param_dtype}; "
            f"cast one with module.to(...) or x.to(...)"
        )
    return x
