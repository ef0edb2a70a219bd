"""One linear-attention call, made: a kernel with its spec's signature (``LinearSpec.call``) on
copies of a linear case's inputs, every failure an ``Outcome`` (``running.calls.run_protected``);
its results (o and the final state, always asked for) checked for their shapes and mapped onto
the golden's names (``LinearSpec.results``); then the backward through both, with random upstream
gradients for o and for the final state, giving dq, dk, dv, dg, dbeta and, when an initial state
was given, dinitial_state; an "inplace" row for every argument the kernel changed. Then the same
forward again on fresh copies (``running.calls.repeated``): its results must be the first call's
bit for bit, unless the kernel is declared nondeterministic.

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

from typing import Any

import torch

from ..golden import to64
from ..golden.linear import GRADIENTS, linear_inputs
from ..report.rows import KernelRow
from .calls import BadResult, Kernel, Outcome, Request, changed_inputs, repeated, run_protected

UPSTREAM = {"out": "dout", "final_state": "dfinal_state"}


def run_linear(spec: Any, kernel: Kernel, request: Request) -> Outcome:
    """One case and dtype of ``kernel`` (``spec`` a ``specs._linear.LinearSpec``): the forward,
    the backward (unless forward-only), the in-place checks, the forward again; every failure
    of the kernel is an ``Outcome``."""
    changed: list[KernelRow] = []
    found: dict[str, Any] = {}
    value, failure = run_protected(lambda: _forward(spec, kernel, request, changed, found),
                                   changed)  # fmt: skip
    if failure is not None:
        return failure
    arrays, dtypes = value
    outcome = Outcome("ok", arrays, dtypes, changed)
    if not request.forward_only:
        grads, failure = run_protected(lambda: _backward(request, changed, found), changed)
        if failure is not None:
            outcome = outcome._replace(backward=(failure.kind, failure.message, failure.error))
        else:
            outcome = outcome._replace(arrays={**arrays, **grads[0]}, dtypes={**dtypes, **grads[1]})
    return repeated(outcome, request,
                    lambda: _forward(spec, kernel, request, changed, {})[0])  # fmt: skip


def _forward(
    spec: Any, kernel: Kernel, request: Request, changed: list[KernelRow], found: dict
) -> tuple[dict, dict]:
    case, dtype = request.case, request.dtype
    inputs = linear_inputs(case, dtype, request.device, request.seed)
    given = {name: t.detach().clone() for name, t in inputs.items() if name not in
             ("dout", "dfinal_state")}  # fmt: skip
    if not request.forward_only:
        for name in GRADIENTS:
            if name in given:
                given[name].requires_grad_(True)
    result = spec.call(kernel, case, given)
    results = spec.results(case, result)
    for name, (tensor, shape) in results.items():
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
            got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise BadResult(f"kernel returned {name} {got}, expected a tensor of shape {shape}")
    originals = {name: inputs[name] for name in given}
    changed += changed_inputs(case.name, dtype, given, originals, "forward", changed)
    found.update(given=given, inputs=inputs, results={n: t for n, (t, _) in results.items()})
    arrays = {name: to64(tensor) for name, (tensor, _) in results.items()}
    dtypes = {name: str(tensor.dtype).removeprefix("torch.") for name, (tensor, _) in
              results.items()}  # fmt: skip
    return arrays, dtypes


def _backward(request: Request, changed: list[KernelRow], found: dict) -> tuple[dict, dict]:
    """The gradients of every leaf through o and the final state (a result that does not
    require grad, a kernel's detached final state, passes no gradient on)."""
    given, inputs, results = found["given"], found["inputs"], found["results"]
    leaves = [name for name in GRADIENTS if name in given]
    outputs = [t for t in results.values() if t.requires_grad]
    upstream = [inputs[UPSTREAM[n]].to(t.dtype) for n, t in results.items() if t.requires_grad]
    try:
        if not outputs:
            raise BadResult("neither o nor the final state requires grad: no backward to judge")
        grads = torch.autograd.grad(outputs, [given[name] for name in leaves], upstream,
                                    allow_unused=True)  # fmt: skip
    finally:
        originals = {name: inputs[name] for name in given}
        case, dtype = request.case.name, request.dtype
        changed.extend(changed_inputs(case, dtype, given, originals, "backward", changed))
    arrays, dtypes = {}, {}
    for name, grad in zip(leaves, grads, strict=True):
        grad = torch.zeros_like(given[name]) if grad is None else grad
        arrays[GRADIENTS[name]] = to64(grad)
        dtypes[GRADIENTS[name]] = str(grad.dtype).removeprefix("torch.")
    return arrays, dtypes
