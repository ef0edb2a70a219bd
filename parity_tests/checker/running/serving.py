"""One serving call, made: a kernel with its spec's signature (``ServingSpec.call``) on copies of
a serving case's inputs, every failure an ``Outcome`` (``running.calls.run_protected``); its
results checked for their shapes and mapped onto the golden's names (``ServingSpec.results``:
out, lse, a merge's v and s, and vLLM's cache after the call, judged slot by slot); an "inplace"
row for every argument the kernel changed. Then the same call again on fresh copies
(``running.calls.repeated``): its results must be the first call's bit for bit, unless the
kernel is declared nondeterministic. Forward only: a serving kernel has no backward.

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

from typing import Any

import torch

from ..golden import to64
from ..golden.serving import serving_inputs
from ..report.rows import KernelRow
from .calls import BadResult, Kernel, Outcome, Request, changed_inputs, repeated, run_protected


def run_serving(spec: Any, kernel: Kernel, request: Request) -> Outcome:
    """One case and dtype of ``kernel`` (``spec`` a ``specs._serving.ServingSpec``): the call,
    the in-place checks, the call again; every failure of the kernel is an ``Outcome``."""
    changed: list[KernelRow] = []
    value, failure = run_protected(lambda: _call(spec, kernel, request, changed), changed)
    if failure is not None:
        return failure
    arrays, dtypes = value
    outcome = Outcome("ok", arrays, dtypes, changed)
    return repeated(outcome, request, lambda: _call(spec, kernel, request, changed)[0])


def _call(spec: Any, kernel: Kernel, request: Request, changed: list[KernelRow]) -> tuple:
    case, dtype = request.case, request.dtype
    inputs = serving_inputs(case, dtype, request.device, request.seed)
    given = {name: t.clone() for name, t in inputs.items()}
    with torch.no_grad():
        result = spec.call(kernel, case, given, request.want_lse, request.options)
    results = spec.results(case, result, given, request.want_lse)
    for name, (tensor, shape) in results.items():
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
            got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise BadResult(f"kernel returned {name} {got}, expected a tensor of shape {shape}")
    originals = {name: inputs[name] for name in inputs}
    changed += changed_inputs(case.name, dtype, given, originals, "call", changed)
    arrays = {name: to64(tensor) for name, (tensor, _) in results.items()}
    dtypes = {name: str(tensor.dtype).removeprefix("torch.")
              for name, (tensor, _) in results.items()}  # fmt: skip
    return arrays, dtypes
