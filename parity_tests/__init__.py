"""parity_tests: weight transfer, NumPy vs torch parity, tolerance policy, kernel checker.

``check_kernel``, ``KernelReport``, ``KernelRow`` and ``KernelUnsupported`` (from
``parity_tests.checker``) are loaded on first use, so that importing the package (the tolerance
constants, say) does not import torch.

Tests: tests/parity/, tests/checker/
"""

from __future__ import annotations

from typing import Any

__all__ = ["KernelReport", "KernelRow", "KernelUnsupported", "check_kernel"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .checker import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module 'parity_tests' has no attribute {name!r}")
