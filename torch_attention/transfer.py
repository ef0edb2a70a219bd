"""Weights across the two packages: a torch module's state as NumPy arrays, and back.

State-dict keys are identical in ``numpy_attention`` and ``torch_attention`` (docs/design.md), so no
renaming happens here; layout changes between layer families live in
``numpy_attention.convert``. This is the one module of the package that imports
``numpy_attention``.

Tests: tests/torch_attention/test_transfer.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

import numpy_attention


def to_numpy(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's ``state_dict()`` as NumPy arrays (copies, on the CPU).

    bfloat16 entries, which NumPy has no dtype for, come back as float32.
    """
    state = {}
    for name, tensor in module.state_dict().items():
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        state[name] = tensor.numpy().copy()
    return state


def from_numpy(module: nn.Module, state: Mapping[str, Any] | numpy_attention.Module) -> nn.Module:
    """Load NumPy weights into ``module`` in place, on its device and in its dtypes; return it.

    Args:
        module: the torch layer to fill.
        state: a mapping of state-dict name -> array-like (a NumPy ``state_dict()``, a ``.npz``
            file's contents, ...), or a ``numpy_attention`` module, whose ``state_dict()`` is used.

    Raises:
        KeyError: naming the missing and unexpected keys, if the key sets differ.
        ValueError: naming the key and both shapes, if an entry has the wrong shape.
    """
    if isinstance(state, numpy_attention.Module):
        state = state.state_dict()
    current = module.state_dict()
    missing = sorted(set(current) - set(state))
    unexpected = sorted(set(state) - set(current))
    if missing or unexpected:
        raise KeyError(f"from_numpy: missing keys {missing}, unexpected keys {unexpected}")
    converted = {}
    for name, target in current.items():
        value = torch.as_tensor(np.asarray(state[name]))
        if value.shape != target.shape:
            raise ValueError(
                f"from_numpy: {name!r} has shape {tuple(value.shape)}, "
                f"the module expects {tuple(target.shape)}"
            )
        converted[name] = value.to(device=target.device)  # load_state_dict casts, or refuses
    module.load_state_dict(converted)
    return module
