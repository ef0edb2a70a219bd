"""One decode call, made: a kernel with its spec's signature (``Spec.call``) on copies of a
decode case's inputs, with torch seeded by the request's seed, every failure an ``Outcome``
(``running.calls.run_protected``); out (and lse) checked for their shapes, the caches kept
before and after when new tokens were written (judged slot by slot), and an "inplace" row for
every other argument the kernel changed. Then the same call again on fresh copies
(``running.calls.repeated``): out, lse and the caches it wrote must be the first call's bit for
bit, unless the kernel is declared nondeterministic.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/running/test_decode.py
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ..golden import to64
from ..golden.decode import CACHES, decode_inputs
from ..report.rows import KernelRow
from .calls import BadResult, Kernel, Outcome, Request, repeated, run_protected

if TYPE_CHECKING:
    from ..spec import Spec


def run_decode(spec: Spec, kernel: Kernel, request: Request) -> Outcome:
    """One case and dtype of ``kernel``: the call on copies of the inputs, the in-place checks,
    the call again; every failure of the kernel is an ``Outcome``, never an exception (but
    Ctrl-C)."""
    changed: list[KernelRow] = []
    value, failure = run_protected(lambda: _call(spec, kernel, request, changed), changed)
    if failure is not None:
        return failure
    arrays, dtypes = value
    outcome = Outcome("ok", arrays, dtypes, changed)

    def again() -> dict:
        found = _call(spec, kernel, request, changed)[0]
        return {name: found[name] for name in ("out", "lse", *CACHES) if name in found}

    return repeated(outcome, request, again)


def _call(
    spec: Spec, kernel: Kernel, request: Request, changed: list[KernelRow]
) -> tuple[dict, dict]:
    case, dtype, device, seed = request.case, request.dtype, request.device, request.seed
    want_lse = request.want_lse
    inputs = decode_inputs(case, dtype, device, seed)
    given = {name: t.clone() for name, t in inputs.items()}
    cuda = [] if device.type != "cuda" else [device.index or torch.cuda.current_device()]
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        result = spec.call(kernel, case, given, want_lse, request.options)
    appended = case.s_new > 0
    seen = {row.tensor for row in changed}  # an input changed by the first call has its row
    for name, before in inputs.items():
        if (appended and name in CACHES) or name in seen:
            continue  # the caches with new tokens are judged slot by slot
        if not torch.equal(given[name], before):
            changed.append(_inplace_row(case.name, dtype, name, given[name], before))
    if spec.always_lse or want_lse:
        if not isinstance(result, (tuple, list)) or len(result) < 2:
            what = f"{type(result).__name__}"
            raise BadResult(f"the kernel returned {what}, the {spec.name} spec expects (out, lse)")
        out, lse = result[0], result[1]
    else:
        out, lse = (result[0] if isinstance(result, (tuple, list)) else result), None
    _check_tensor("out", out, (case.batch, case.s_q, case.heads, case.dv))
    arrays, dtypes = {"out": to64(out)}, {"out": _name(out.dtype)}
    if want_lse:
        _check_tensor("lse", lse, (case.batch, case.heads, case.s_q))
        arrays["lse"], dtypes["lse"] = to64(lse), _name(lse.dtype)
    if appended:
        for name in CACHES:
            arrays[name], arrays[f"{name}_before"] = to64(given[name]), to64(inputs[name])
    return arrays, dtypes


def _check_tensor(name: str, value: Any, shape: tuple[int, ...]) -> None:
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise BadResult(f"kernel returned {name} {got}, expected a tensor of shape {shape}")


def _inplace_row(case: str, dtype: str, name: str, after: torch.Tensor, before: torch.Tensor):
    if not before.is_floating_point():
        error = float((after != before).sum())
    else:
        error = (after.double() - before.double()).abs().max().item()
        error = error if math.isfinite(error) else math.inf
    nan = math.nan
    detail = f"{name} changed in place by the kernel"
    return KernelRow(case, dtype, name, error, nan, nan, 0.0, "inplace", detail)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
