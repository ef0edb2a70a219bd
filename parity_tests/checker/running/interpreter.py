"""Triton's interpreter and the dtypes it cannot run: with ``TRITON_INTERPRET=1`` a Triton kernel
runs its programs with NumPy on CPU, and NumPy has no bfloat16, so the interpreter computes
bfloat16 wrongly, without an error (docs/triton-on-cpu.md). A check of a Triton kernel there
skips bfloat16, said once, instead of reporting every bfloat16 group as a failure.

Which kernels are Triton code: the environment variable alone cannot say, since it holds for the
whole process (the test suite sets it for every test, to run the project's Triton kernels); a
kernel is Triton code when the module defining it, or the package holding that module, imports
Triton (``triton_code``): a kernel behind an adapter in the same package, such as
``torch_attention.triton:flash_attn_func``, is found through its package.

Tests: tests/checker/running/test_interpreter.py
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

INTERPRETER_BFLOAT16 = "Triton's interpreter mishandles bfloat16 (docs/triton-on-cpu.md)"


class InterpreterWarning(UserWarning):
    """A check left out dtypes that Triton's interpreter cannot run (``interpreter_skips``)."""


def interpreter_skips(
    kernel: Callable[..., Any],
    dtypes: Sequence[str],
    environ: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """The dtypes of ``dtypes`` that a check of ``kernel`` skips, each with why: bfloat16 when
    ``TRITON_INTERPRET=1`` and the kernel is Triton code; none otherwise."""
    if environ.get("TRITON_INTERPRET") != "1" or "bfloat16" not in dtypes:
        return {}
    return {"bfloat16": INTERPRETER_BFLOAT16} if triton_code(kernel) else {}


def skip_warning(skipped: Mapping[str, str]) -> str:
    """The one line that says so: "Triton's interpreter mishandles bfloat16 (...): bfloat16
    skipped"."""
    reasons: dict[str, list[str]] = {}
    for dtype, why in skipped.items():
        reasons.setdefault(why, []).append(dtype)
    return "; ".join(f"{why}: {', '.join(names)} skipped" for why, names in reasons.items())


def triton_code(kernel: Callable[..., Any]) -> bool:
    """Whether ``kernel`` (through ``functools.partial`` and ``__wrapped__``) is defined in a
    module that imports Triton, or in a package that does (its ``__init__``, or a submodule it
    has imported): the module ``triton``, one of its submodules, or an object of Triton's
    (a ``@triton.jit`` function, an autotuner) among their names."""
    function = kernel
    while isinstance(function, functools.partial):
        function = function.func
    function = inspect.unwrap(function)
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    if module is None:
        return False
    places = [module]
    package = sys.modules.get(module.__name__.rpartition(".")[0])
    if package is not None:
        prefix = package.__name__ + "."
        places.append(package)
        submodules = [value for value in vars(package).values() if isinstance(value, ModuleType)]
        places += [value for value in submodules if value.__name__.startswith(prefix)]
    return any(_imports_triton(place) for place in places)


def _imports_triton(module: ModuleType) -> bool:
    for value in list(vars(module).values()):
        name = value.__name__ if isinstance(value, ModuleType) else str(type(value).__module__)
        if name == "triton" or name.startswith("triton."):
            return True
    return False
