"""One sparse call, made: a kernel with its spec's signature (``SparseSpec.call``) on copies of a
sparse case's inputs, every failure an ``Outcome`` (``running.calls.run_protected``); its results
checked for their shapes and mapped onto the golden's names (``SparseSpec.results``); then, for
a spec with a backward, ``out.backward(dout)`` through the kernel, giving dq, dk, dv (none when V
is K's latent) and dsinks; an "inplace" row for every argument the kernel changed. Then the same
forward again on fresh copies (``running.calls.repeated``): its results must be the first call's
bit for bit, unless the kernel is declared nondeterministic.

Shape legend: S_q query tokens, S_kv key tokens, H query heads, H_kv key heads, D head width,
Dv value width, topk entries per list.

Tests: tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

from typing import Any

import torch

from ..golden import to64
from ..golden.sparse import GRADIENTS, sparse_inputs
from ..report.rows import KernelRow
from .calls import BadResult, Kernel, Outcome, Request, changed_inputs, repeated, run_protected


def run_sparse(spec: Any, kernel: Kernel, request: Request) -> Outcome:
    """One case and dtype of ``kernel`` (``spec`` a ``specs._sparse.SparseSpec``): the forward,
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
    inputs = sparse_inputs(case, dtype, request.device, request.seed)
    given = {name: t.detach().clone() for name, t in inputs.items() if name != "dout"}
    grads = not request.forward_only
    for name in GRADIENTS:
        if name in given and grads:
            given[name].requires_grad_(True)
    result = spec.call(kernel, case, given, request.want_lse)
    results = spec.results(case, result, request.want_lse)
    for name, (tensor, shape) in results.items():
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
            got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise BadResult(f"kernel returned {name} {got}, expected a tensor of shape {shape}")
    originals = {name: inputs[name] for name in given}
    changed += changed_inputs(case.name, dtype, given, originals, "forward", changed)
    found.update(given=given, inputs=inputs, out=results["out"][0])
    arrays = {name: to64(tensor) for name, (tensor, _) in results.items()}
    dtypes = {name: str(tensor.dtype).removeprefix("torch.") for name, (tensor, _) in
              results.items()}  # fmt: skip
    return arrays, dtypes


def _backward(request: Request, changed: list[KernelRow], found: dict) -> tuple[dict, dict]:
    given, inputs, out = found["given"], found["inputs"], found["out"]
    leaves = [name for name in GRADIENTS if name in given]
    upstream = inputs["dout"].to(out.dtype)
    try:
        grads = torch.autograd.grad(out, [given[name] for name in leaves], upstream,
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
