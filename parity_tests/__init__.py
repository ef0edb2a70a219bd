"""parity_tests: weight transfer, NumPy vs torch parity, tolerance policy, kernel checker.

``check_kernel``, ``KernelReport``, ``KernelRow`` and ``KernelUnsupported`` (from
``parity_tests.checker``), ``Case`` (a case of the checker's battery) and ``SPECS`` and
``FEATURES`` (the signatures the checker calls kernels with, and the options a kernel may claim)
are loaded on first use, so that importing the package (the tolerance constants, say) does not
import torch.

Tests: tests/parity/, tests/checker/
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Case": "battery",
    "FEATURES": "specs",
    "KernelReport": "report",
    "KernelRow": "report",
    "KernelUnsupported": "report",
    "SPECS": "specs",
    "check_kernel": "kernels",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f".checker.{_EXPORTS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'parity_tests' has no attribute {name!r}")
