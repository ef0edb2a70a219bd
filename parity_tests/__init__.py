"""parity_tests: weight transfer, NumPy vs torch parity, tolerance policy, kernel checker.

``check_kernel`` and ``KernelReport`` (from ``parity_tests.checker.kernels``) are loaded on first use, so
that importing the package (the tolerance constants, say) does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KernelReport", "check_kernel"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .checker import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module 'parity_tests' has no attribute {name!r}")
