"""One kernel call to make and what it gave, as plain data that crosses processes (a child of
``running.isolation``, a rank of ``running.ranks``): the ``Request`` (everything needed to rebuild
a case's inputs) and its ``Outcome``.

Tests: tests/checker/running/test_calls.py
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from ..report.rows import KernelRow


class Request(NamedTuple):
    """One kernel call to make: everything needed to rebuild its inputs (in a child process
    too)."""

    spec: str
    case: Any
    dtype: str
    device: torch.device
    seed: int
    forward_only: bool
    want_lse: bool
    options: dict[str, Any] = {}  # the spec's own arguments (``Spec.options``)
    # The kernel claims "deterministic": its backward runs twice too (flash-attn's signature
    # gets deterministic=True).
    deterministic: bool = False
    # KernelLimits(nondeterministic=True): the kernel runs once, nothing compared.
    nondeterministic: bool = False


class Outcome(NamedTuple):
    """What one kernel call gave, as plain data (it crosses processes): ``kind`` "ok" (arrays
    out, dq, dk, dv, lse in the canonical layout, float64), "skip", "refused" or "error"
    (``message``; for an exception ``error`` = (type, first line, traceback)); ``keep`` the
    keep-mask read back through SDPA's signature, ``draws`` the outputs at dropout_p through
    flash-attn's; ``backward`` (kind, message, error) when the forward returned and the backward
    failed: the arrays then hold the forward's only. ``differences``: max|second - first| of
    each result that a second call on identical inputs did not give bit for bit (empty when it
    gave every one; ``running.calls.repeated``), ``repeat`` (kind, message, error) when that
    call failed."""

    kind: str
    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]
    changed: list[KernelRow]
    keep: np.ndarray | None = None
    message: str = ""
    error: tuple[str, str, str] | None = None
    draws: np.ndarray | None = None
    backward: tuple[str, str, tuple[str, str, str] | None] | None = None
    differences: dict[str, float] = {}
    repeat: tuple[str, str, tuple[str, str, str] | None] | None = None
