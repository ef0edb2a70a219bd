"""The base of every torch_attention layer: an ``nn.Module`` whose ``load_state_dict`` vets what it
would load, by the rules of ``numpy_attention.module.Module``'s.

torch casts whatever it is given to each parameter's dtype; a complex tensor loses its imaginary
part with a warning. The contract (docs/design.md, "Edge rules") is the NumPy twin's: tensors of
the dtypes that twin casts (bool, signed and unsigned integers, float16, bfloat16, float32,
float64) are cast; any other dtype (complex, float8, the sub-byte and quantized dtypes) is a
``TypeError`` naming the key; a buffer registered with a ``check`` runs it on the incoming tensor
(the book's causal ``mask``); and nothing is copied unless every entry passes. Missing and
unexpected keys, wrong shapes and entries that are not tensors stay torch's ``RuntimeError``.

Tests: tests/torch_attention/test_module.py (every layer of the package).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

# The torch dtypes whose NumPy twins have kind "b", "i", "u" or "f" (bfloat16, which NumPy lacks,
# the NumPy twin reads as float32): exactly what numpy_attention's load_state_dict casts.
_REAL_DTYPES = frozenset(
    {
        torch.bool,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    }
)

BufferCheck = Callable[[str, torch.Tensor], None]


class Module(nn.Module):
    """``nn.Module`` with the NumPy twin's loading rules; the base of every layer of the package.

    Buffers registered with ``check`` (``register_buffer(name, tensor, check=...)``) have every
    tensor ``load_state_dict`` would put there vetted by it, as in NumPy.
    """

    def register_buffer(
        self,
        name: str,
        tensor: torch.Tensor | None,
        persistent: bool = True,
        *,
        check: BufferCheck | None = None,
    ) -> None:
        """torch's ``register_buffer``; ``check(key, tensor)``, if given, vets every tensor
        ``load_state_dict`` would put there (raising ``ValueError``)."""
        super().register_buffer(name, tensor, persistent)
        if check is not None:
            vars(self).setdefault("_buffer_checks", {})[name] = check

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        # torch calls this on a module before its children, so vetting the whole subtree here
        # refuses a bad entry before the first tensor of this module or a child is copied.
        for key, check in _slots(self, prefix):
            value = state_dict.get(key)
            if not isinstance(value, torch.Tensor):
                continue  # absent, or not a tensor: torch's own error, after this
            if value.dtype not in _REAL_DTYPES:
                raise TypeError(
                    f"load_state_dict: {key!r} has dtype {value.dtype}; a parameter or buffer "
                    "takes real numbers (bool, integer or float)"
                )
            if check is not None:
                check(key, value)
        super()._load_from_state_dict(state_dict, prefix, *args)


def _slots(module: nn.Module, prefix: str) -> Iterator[tuple[str, BufferCheck | None]]:
    """The state-dict keys that ``module`` and its children load, as torch finds them (parameters
    and persistent buffers that are not None), each with its buffer's check, if any."""
    named = module.named_modules(prefix=prefix.removesuffix("."), remove_duplicate=False)
    for name, child in named:
        child_prefix = f"{name}." if name else ""
        checks = vars(child).get("_buffer_checks", {})
        for local, value in child._parameters.items():
            if value is not None:
                yield child_prefix + local, None
        for local, value in child._buffers.items():
            if value is not None and local not in child._non_persistent_buffers_set:
                yield child_prefix + local, checks.get(local)
