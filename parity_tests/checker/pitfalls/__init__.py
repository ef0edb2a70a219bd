"""Broken kernels, one mistake each, to prove that the checker has teeth: one module per spec, named
as the spec (``sdpa``: the tutorials' classic mistakes and GQA's; ``flash``: today's options through
flash-attn's signature; ``flash_varlen``, ``ring``, ``flash_kvcache``, ``flash_mla``), and ``tiled``
(the bugs real tiled kernels have, through flash-attn's signature), each with a ``PITFALLS`` table
naming, for every broken kernel, its spec, a case of that spec's default (and quick) battery and a
tensor that flag it in every dtype (``all_pitfalls`` finds every module's table). Each is the
checker's own plain baseline with one step broken, computing half precision in float32 where its
library does, so that only its mistake is wrong. The tests assert exactly that
(tests/checker/pitfalls/), and ``python -m parity_tests --calibrate 60`` measures the margin over
seeds on the whole default battery (docs/pitfalls.md).

``PITFALLS`` (every spec's, by name: the names are disjoint) and each broken kernel by its name
are attributes of this package, so that ``--kernel parity_tests.checker.pitfalls:alibi_sign
--spec flash`` checks one.

Tests: tests/checker/pitfalls/
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Kernel = Callable[..., Any]
ALL_DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Pitfall:
    """A broken kernel, its spec, and the (case, tensor) of the default and quick batteries that
    flags it (for "clobbers_inputs" the tensor is the input changed in place, for
    "ignores_dropout" the "keep" row of the draws, for an error "-"), in the dtypes where its
    mistake is one."""

    kernel: Kernel
    case: str
    tensor: str
    spec: str = "sdpa"
    dtypes: tuple[str, ...] = ALL_DTYPES


@functools.cache
def all_pitfalls() -> dict[str, Pitfall]:
    """Every spec module's ``PITFALLS`` (this package's modules, found by walking it; a module
    whose name starts with ``_`` is a shared builder, not a spec's), by name."""
    found: dict[str, Pitfall] = {}
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("_"):
            continue
        table = importlib.import_module(f"{__name__}.{module.name}").PITFALLS
        for name, pitfall in table.items():
            if name in found:
                raise RuntimeError(f"two pitfalls are named {name!r}")
            found[name] = pitfall
    return found


def __getattr__(name: str) -> Any:
    """``PITFALLS``, and each broken kernel by its name (a submodule's name is left to the
    import system)."""
    if name.startswith("_") or name in {module.name for module in pkgutil.iter_modules(__path__)}:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found = all_pitfalls()
    if name == "PITFALLS":
        return found
    if name in found:
        return found[name].kernel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
