"""One kernel call, made and judged: the ``Request`` (everything needed to rebuild a case's inputs,
in a child process or on a rank too), its ``Outcome`` (what the kernel gave, as plain data that
crosses processes), ``run_case`` (forward, backward unless forward-only, the in-place checks) and
``judge_outcome`` (the rows of one case and dtype); ``load_kernel`` imports a "module:function".
``checker.pipeline`` makes the calls in this process, ``checker.running.isolation`` in a child
process, ``checker.running.ranks`` on each rank (through ``run_protected``).

The kernel gets copies of the inputs in its spec's layout, laid out in memory as the case says
(``checker.running.memory``: contiguous, views of one fused buffer, k and v with different strides,
a storage offset), as fresh leaves, with torch seeded by the request's seed (the caller's generator
state is restored after); the golden is computed from the originals, and a copy the kernel changed
is an "inplace" row. Every failure of the kernel is an ``Outcome``, never an exception, of one of
three kinds never mixed (``checker.report``): a ``ValueError``, ``NotImplementedError``,
``AssertionError`` or ``TypeError`` is "refused" (the kernel's own refusal); a ``BadResult`` (a
result its spec's library would not return) or any other exception, ``SystemExit`` included, is an
"error"; ``KernelUnsupported`` is a "skip"; wrong numbers are judged. ``KeyboardInterrupt``
propagates, so that Ctrl-C still stops a run. The forward and the backward are protected apart: when
the backward fails, the forward's out (and lse) are judged all the same, beside a row for what the
backward raised. For a dropout case through SDPA's signature the kernel's keep-mask is read back
first (``dropout.read_keep_mask``), and the golden applies that mask; through flash-attn's, the
kernel is judged at p = 0 like any case, and its outputs at p (``dropout.draw_outputs``, part of the
forward) are judged statistically (``judge.judge_draws``).

Then the call is made a second time on identical inputs (``repeated``: fresh copies, the same
torch seed, so that dropout draws the same keep-mask), forward only unless the kernel claims
"deterministic" (then its backward too), and each result must be what the first call gave, bit
for bit: a race that only some launches lose changes them from call to call (xformers #1392), and
a difference is a "nondeterministic" row. A kernel declared nondeterministic
(``KernelLimits(nondeterministic=True)``) runs once. The read-back probes and the draws are not
made again.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T_q, T_k packed token counts.

Tests: tests/checker/running/test_calls.py
"""

from __future__ import annotations

import importlib
import math
import os
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..golden import to64
from ..golden.attention import Inputs, case_inputs
from ..judge.policy import difference, judge_repeat, unmeasured
from ..report.rows import KernelError, KernelRow, KernelUnsupported
from . import dropout, memory
from .request import Outcome, Request

if TYPE_CHECKING:
    from ..spec import Spec

Kernel = Callable[..., Any]

TENSORS = ("out", "dq", "dk", "dv")
# What a kernel raises to refuse a call (its own checks of what it takes, or a keyword it has
# no argument for): the verdict "refused", apart from wrong numbers and from errors.
REFUSALS = (ValueError, NotImplementedError, AssertionError, TypeError)
_CHECKER_DIR = os.path.dirname(os.path.abspath(__file__))


class BadResult(Exception):
    """The kernel returned something that is not what its spec's library returns."""


def load_kernel(kernel: Kernel | str) -> Kernel:
    """``kernel`` itself if callable; "module:function" (dots allowed in both parts) imported."""
    if isinstance(kernel, str) and ":" in kernel:
        module_name, _, attribute = kernel.partition(":")
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
        kernel = found
    if not callable(kernel):
        raise TypeError(
            f"kernel must be callable or 'module:function', got {type(kernel).__name__}"
        )
    return kernel


def run_case(spec: Spec, kernel: Kernel, request: Request) -> Outcome:
    """One case and dtype of ``kernel``: the forward (with dropout's read-back or draws), then
    the backward (unless forward-only), the in-place checks, then the call again (``repeated``);
    every failure of the kernel is an ``Outcome``, never an exception (but Ctrl-C). A backward
    that fails leaves the forward's results in the outcome, to be judged."""
    case, dtype, device, seed = request.case, request.dtype, request.device, request.seed
    inputs = case_inputs(case, dtype, device, seed)
    changed: list[KernelRow] = []  # filled as it goes, kept if the backward raises
    found: dict[str, Any] = {}

    def forward() -> tuple:
        if case.dropout_p and spec.dropout == "readback":
            found["keep"] = dropout.read_keep_mask(spec, kernel, case, inputs, device, seed)
        judged = request._replace(case=spec.judged_case(case))
        called = _forward(spec, kernel, judged, inputs, changed)
        if case.dropout_p and spec.dropout == "draws":
            given = spec.extras(case, inputs.attn_mask, inputs.alibi_slopes, device)
            found["draws"] = dropout.draw_outputs(kernel, spec, case, inputs, given, seed)
        return called

    called, failure = run_protected(forward, changed)
    keep = found.get("keep")
    keep = None if keep is None else to64(keep)
    if failure is not None:
        return failure._replace(keep=keep)
    arrays, dtypes, backward = called
    outcome = Outcome("ok", arrays, dtypes, changed, keep, draws=found.get("draws"))
    if not request.forward_only:
        grads, failure = run_protected(backward, changed)
        if failure is not None:
            outcome = outcome._replace(backward=(failure.kind, failure.message, failure.error))
        else:
            arrays, dtypes = {**arrays, **grads[0]}, {**dtypes, **grads[1]}
            outcome = outcome._replace(arrays=arrays, dtypes=dtypes)
    # The second call is forward only, unless the kernel claims "deterministic" and its
    # backward ran: then the gradients are compared too.
    twice = request.deterministic and not request.forward_only and outcome.backward is None
    again = request._replace(case=spec.judged_case(case), forward_only=not twice)
    return repeated(outcome, request, lambda: _results(spec, kernel, again, inputs, changed))


def repeated(
    outcome: Outcome, request: Request, call: Callable[[], dict[str, np.ndarray]]
) -> Outcome:
    """``outcome`` (of a call that returned) compared with what ``call``, the same call made
    again on identical inputs, gives (``compared``); ``outcome`` itself for a kernel declared
    nondeterministic (no second call)."""
    if outcome.kind != "ok" or request.nondeterministic:
        return outcome
    arrays, failure = run_protected(call, outcome.changed)
    return compared(outcome, failure or Outcome("ok", arrays, {}, outcome.changed))


def compared(outcome: Outcome, second: Outcome) -> Outcome:
    """``outcome`` with ``differences``: each result of ``second``, the second call's, that is
    not the first's bit for bit, with max|second - first| (``judge.policy.difference``); or,
    when the second call failed, ``repeat``: its kind, message and error."""
    if second.kind != "ok":
        return outcome._replace(repeat=(second.kind, second.message, second.error))
    first = outcome.arrays
    gaps = {name: difference(first[name], array) for name, array in second.arrays.items()}
    return outcome._replace(differences={name: gap for name, gap in gaps.items() if gap})


def repeat_rows(
    case: str, dtype: str, outcome: Outcome, errors: list[KernelError]
) -> list[KernelRow]:
    """The rows of the second call (``repeated``): a "nondeterministic" row per result it did not
    repeat bit for bit, or the row of its failure ("refused", "error" or "skip"), saying so."""
    rows = [judge_repeat(case, dtype, tensor, gap) for tensor, gap in outcome.differences.items()]
    if outcome.repeat is not None:
        kind, message, error = outcome.repeat
        rows.append(failed_row(case, dtype, kind, f"the second call: {message}", error, errors))
    return rows


def run_protected(call: Callable[[], Any], changed: list[KernelRow]) -> tuple[Any, Outcome | None]:
    """``(call(), None)``, or ``(None, outcome)`` for a kernel that failed: one of ``REFUSALS``
    is "refused", ``KernelUnsupported`` a "skip", a ``BadResult`` or any other exception an
    "error" (``KeyboardInterrupt`` propagates)."""
    try:
        return call(), None
    except (BadResult, dropout.ProbeError) as exc:
        return None, Outcome("error", {}, {}, changed, None, str(exc))
    except KernelUnsupported as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "KernelUnsupported"
        return None, Outcome("skip", {}, {}, changed, None, reason)
    except REFUSALS as exc:
        return None, Outcome("refused", {}, {}, changed, None, _first_line(exc), _describe(exc))
    except (Exception, SystemExit) as exc:  # a failing kernel is a verdict; Ctrl-C still stops
        return None, Outcome("error", {}, {}, changed, None, _first_line(exc), _describe(exc))


def failed_row(
    case: str,
    dtype: str,
    kind: str,
    message: str,
    error: tuple[str, str, str] | None,
    errors: list[KernelError],
) -> KernelRow:
    """The row of a call that gave nothing to measure: "skip", "refused" or "error", with the
    number of its exception in ``errors`` (added there if new)."""
    number = 0 if error is None or kind == "skip" else _record(errors, error, case, dtype)
    return unmeasured(case, dtype, kind, message, number)


def _first_line(exc: BaseException) -> str:
    message = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if isinstance(exc, SystemExit):
        message += " (the kernel called sys.exit)"
    return message


def _describe(exc: BaseException) -> tuple[str, str, str]:
    """(type, first line of the message, traceback); the traceback starts at the kernel's own
    frames (the checker's are left out)."""
    tb = exc.__traceback__
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == _CHECKER_DIR:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    message = str(exc).splitlines()[0] if str(exc) else ""
    return type(exc).__name__, message, text


def _record(errors: list[KernelError], error: tuple[str, str, str], case: str, dtype: str) -> int:
    """The number of ``error`` in ``errors``, adding it if no equal exception (same type, message
    and frames) was seen before."""
    kind, message, text = error
    for entry in errors:
        if entry.traceback == text:
            entry.where.append((case, dtype))
            return entry.number
    errors.append(KernelError(len(errors) + 1, kind, message, text, [(case, dtype)]))
    return len(errors)


def _forward(
    spec: Spec, kernel: Kernel, request: Request, inputs: Inputs, changed: list[KernelRow]
) -> tuple[dict[str, np.ndarray], dict[str, str], Callable[[], tuple[dict, dict]]]:
    """The forward of ``kernel`` on copies of the inputs in the spec's layout, as fresh leaves:
    out (and lse) back in the canonical layout, float64, their dtypes, and the backward to run
    next (it gives dq, dk, dv the same way). An "inplace" row is appended to ``changed`` for
    each copy the kernel changed, checked after the forward and again after the backward."""
    case, dtype, device, seed = request.case, request.dtype, request.device, request.seed
    forward_only, want_lse = request.forward_only, request.want_lse
    originals = {
        name: spec.layout(case, t)
        for name, t in zip("qkv", (inputs.q, inputs.k, inputs.v), strict=True)
    }
    placed = memory.place(case.memory, *originals.values(), spec.heads_first(case))
    extras = spec.extras(case, inputs.attn_mask, inputs.alibi_slopes, device)
    originals.update(extras)
    given = dict(zip("qkv", placed, strict=True))
    given.update(
        (name, t.detach().clone(memory_format=torch.contiguous_format))
        for name, t in extras.items()
    )
    leaves = [given[name].requires_grad_(not forward_only) for name in "qkv"]
    with torch.random.fork_rng(devices=dropout.rng_devices(device)):
        torch.manual_seed(seed)
        result = spec.invoke(kernel, case, *leaves, given, want_lse,
                             deterministic=request.deterministic)  # fmt: skip
    changed += changed_inputs(case.name, dtype, given, originals, "forward", changed)
    try:
        out, lse = spec.split_result(result, want_lse)
    except TypeError as exc:
        raise BadResult(str(exc)) from exc
    expected = tuple(spec.layout(case, inputs.dout).shape)
    _check_tensor("out", out, expected)
    arrays = {"out": spec.unlayout(case, out, case.heads)}
    dtypes = {"out": _name(out.dtype)}
    if want_lse:
        _check_tensor("lse", lse, spec.lse_shape(case))
        arrays["lse"], dtypes["lse"] = spec.unlayout_lse(case, lse), _name(lse.dtype)

    def backward() -> tuple[dict[str, np.ndarray], dict[str, str]]:
        upstream = spec.layout(case, inputs.dout)
        upstream = upstream.to(out.dtype) if out.is_floating_point() else upstream
        try:
            grads = torch.autograd.grad(out, leaves, upstream, allow_unused=True)
        finally:
            changed.extend(changed_inputs(case.name, dtype, given, originals, "backward", changed))
        found, types = {}, {}
        for name, leaf, grad in zip(TENSORS[1:], leaves, grads, strict=True):
            grad = torch.zeros_like(leaf) if grad is None else grad
            heads = case.heads if name == "dq" else case.kv_heads
            found[name] = to64(spec.unlayout(case, grad, heads))
            types[name] = _name(grad.dtype)
        return found, types

    return {name: to64(t) for name, t in arrays.items()}, dtypes, backward


def _results(
    spec: Spec, kernel: Kernel, request: Request, inputs: Inputs, changed: list[KernelRow]
) -> dict[str, np.ndarray]:
    """What ``_forward`` (and the backward, unless ``request`` is forward-only) gives: out (and
    lse, dq, dk, dv) by name."""
    arrays, _, backward = _forward(spec, kernel, request, inputs, changed)
    return arrays if request.forward_only else {**arrays, **backward()[0]}


def _check_tensor(name: str, value: Any, shape: tuple[int, ...]) -> None:
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise BadResult(f"kernel returned {name} {got}, expected a tensor of shape {shape}")


def changed_inputs(
    case, dtype, given, originals, when: str, known: list[KernelRow]
) -> list[KernelRow]:
    """An "inplace" row for each input whose copy no longer equals its original (and has no row
    in ``known`` yet): error = max|after - before| (inf where NaN or inf appeared; the count of
    changed entries for a bool or integer tensor), bound 0."""
    rows = []
    seen = {row.tensor for row in known}
    for name, before in originals.items():
        after = given[name].detach()
        if name in seen or torch.equal(after, before):
            continue
        if not before.is_floating_point():
            error = float((after != before).sum())
        else:
            error = (after.double() - before.double()).abs().max().item()
            error = error if math.isfinite(error) else math.inf
        detail = f"{name} changed in place by the kernel's {when}"
        nan = math.nan
        rows.append(KernelRow(case, dtype, name, error, nan, nan, 0.0, "inplace", detail))
    return rows


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
