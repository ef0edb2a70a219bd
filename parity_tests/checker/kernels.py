"""The kernel checker: a kernel with a real library's signature (``checker.specs``), judged case by
case against the float64 NumPy golden.

For each case and dtype the kernel runs forward and backward (with a random upstream gradient)
and each of ``out, dq, dk, dv`` (and lse, where the kernel claims the feature) is judged by

    max|K - G| <= c * max|Bl - G| + floor(dtype) * max|G|

beside the bias statistic ``rms(K - G) <= BIAS_FACTOR * rms(Bl - G) + BIAS_FLOOR * rms(G)``,
where G is the float64 golden (``numpy_attention``'s core, or its varlen form, with the case's
options) computed on the inputs *after* their cast to the kernel's dtype (input rounding is not
charged to the kernel), Bl is plain torch math in the kernel's dtype without upcasting
(``checker.reference``), and K the kernel (``checker.judge`` applies the inequalities). The
constants live in ``parity_tests.tolerances`` and were set by measurement: ``python -m
parity_tests --calibrate 60``, docs/kernel-verification.md.

The checker also refuses what no correct kernel does, as failing verdicts rather than exceptions:
NaN or inf where the golden is finite, a result of another dtype than the inputs (lse: float32
for half-precision inputs), a result of another shape or layout, inputs changed in place (the
kernel gets copies; the golden is computed from the originals), an exception (``SystemExit``
included; ``KeyboardInterrupt`` is left to propagate, so that Ctrl-C still stops a run). With
``isolate=True`` every call runs in a child process (``checker.isolation``): a crash or a hang is
an "error" verdict naming the signal or the time limit. ``forward_only=True`` judges out (and
lse) with no backward, on inputs that do not require grad.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T_q, T_k packed token counts.

Tests: tests/checker/test_kernels.py, tests/checker/test_options.py
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from . import specs
from .battery import Case, resolve
from .expected import DTYPES, Inputs, case_inputs, reference, to64
from .judge import judge_keep, judge_lse, judge_tensor, unmeasured, wrong_dtype
from .report import KernelError, KernelReport, KernelRow, KernelUnsupported

Kernel = Callable[..., Any]

TENSORS = ("out", "dq", "dk", "dv")
DEFAULT_DTYPES = ("float32", "float16", "bfloat16")
# What torch.manual_seed and NumPy's SeedSequence both accept.
SEED_LIMIT = 2**64
_CHECKER_DIR = os.path.dirname(os.path.abspath(__file__))


def check_kernel(
    kernel: Kernel | str,
    *,
    spec: str = "sdpa",
    features: Iterable[str] | None = None,
    device: str | torch.device = "cpu",
    dtypes: Sequence[torch.dtype | str] = DEFAULT_DTYPES,
    cases: str | Sequence[Case | str] | None = None,
    forward_only: bool = False,
    isolate: bool | float = False,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    world_size: int | None = None,
) -> KernelReport:
    """Run ``kernel`` on every case and dtype and judge it against the float64 golden.

    Args:
        kernel: a callable with the signature of ``spec`` (``checker.specs``), or the string
            "module:function" (the robust form for ``isolate`` and the ring spec, whose child
            processes import it). For "sdpa": ``kernel(query, key, value, attn_mask=None,
            dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)`` with query
            (B, H, N, D), returning (B, H, N, Dv) in the inputs' dtype, differentiable by
            autograd (``enable_gqa`` is passed only to cases with fewer KV heads). Dropout must
            draw from torch's default generator (the checker reads the keep-mask back).
        spec: "sdpa", "flash", "flash_varlen", "flex" or "ring".
        features: the options the kernel claims (``specs.FEATURES``); None is the spec's
            default set. A case needing an undeclared feature is "not run"; "lse" asks the
            kernel for lse and judges it.
        device: where the inputs live.
        dtypes: torch dtypes or their names ("float64", "float32", "float16", "bfloat16").
        cases: None (the spec's default battery), "quick", "stress", "ring", or a sequence of
            cases or names (``checker.battery``); the named batteries keep the cases the spec can
            express, a case named explicitly that it cannot is a ValueError.
        forward_only: judge out (and lse) only, with inputs that do not require grad.
        isolate: run every kernel call in a child process; True uses ISOLATE_TIME_LIMIT_S per
            call, a number is the limit in seconds. The kernel must pickle (a module-level
            function, or "module:function").
        seed: an integer in [0, 2**64): draws the inputs and seeds torch around each kernel
            call; the same seed gives the same verdict.
        progress: called with a short message before each case.
        world_size: ranks of the "ring" spec (default 2); only for that spec.

    Returns:
        A ``KernelReport`` with one row per (case, dtype, tensor); a case where the kernel raised
        has one "error" or "skip" row (the exception, once per distinct one, in
        ``report.errors``), a case not run one "not-run" row; a dropout case has one more row
        "keep" for the kept fraction; an input changed in place adds an "inplace" row naming it.

    Raises:
        TypeError: ``kernel`` is neither callable nor "module:function", ``seed`` is not an
            integer, or an isolated kernel does not pickle.
        ValueError: an unknown spec, feature, dtype or case, a case the spec cannot express, an
            empty list of dtypes or cases, ``seed`` out of range, or ``world_size`` outside the
            ring spec.
    """
    kernel = load_kernel(kernel)
    spec = specs.check_spec(spec)
    claimed = specs.resolve_features(spec, features)
    check_seed(seed)
    if not isinstance(forward_only, bool):
        raise TypeError(f"forward_only must be a bool, got {type(forward_only).__name__}")
    names = [_dtype_name(dtype) for dtype in dtypes]
    if not names:
        raise ValueError("dtypes is empty")
    battery = battery_for(spec, cases)
    device = torch.device(device)
    if spec == "ring":
        from .ring import check_ring

        world = 2 if world_size is None else world_size
        return check_ring(
            kernel, claimed, device, names, battery, forward_only, seed, world, progress
        )
    if world_size is not None:
        raise ValueError(f"world_size is for the ring spec only, not {spec!r}")
    report = KernelReport(
        getattr(kernel, "__name__", repr(kernel)),
        str(device),
        cases={case.name: case for case in battery},
    )
    call = _isolated_runner(kernel, isolate) if isolate is not False else None
    try:
        for case in battery:
            for name in names:
                if progress is not None:
                    progress(f"{report.kernel} {case.name} {name}")
                missing = case.needs - claimed
                if missing:
                    detail = f"needs {', '.join(sorted(missing))}, not in the kernel's features"
                    report.rows.append(unmeasured(case.name, name, "not-run", detail))
                    continue
                request = Request(spec, case, name, device, seed, forward_only, "lse" in claimed)
                outcome = call(request) if call is not None else run_case(kernel, request)
                report.rows.extend(judge_outcome(request, outcome, report.errors))
    finally:
        if call is not None:
            call.close()
    return report


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


def battery_for(spec: str, cases: str | Sequence[Case | str] | None) -> tuple[Case, ...]:
    """The cases ``spec`` runs: a named battery keeps those it can express (the ring spec's
    default is the ring battery); explicitly named cases must all be expressible."""
    if cases is None or isinstance(cases, str):
        if spec == "ring" and cases in (None, "default", "quick"):
            cases = "ring"
        kept = tuple(c for c in resolve(cases) if specs.cannot_express(spec, c) is None)
        if not kept:
            raise ValueError(f"the {cases or 'default'} battery has no case the {spec} spec runs")
        return kept
    battery = resolve(cases)
    for case in battery:
        reason = specs.cannot_express(spec, case)
        if reason is not None:
            raise ValueError(f"the {spec} spec cannot run case {case.name!r}: {reason}")
    return battery


def check_seed(seed: object) -> int:
    """``seed`` if it is an integer in [0, 2**64), the range both torch and NumPy accept."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return int(seed)


class Request(NamedTuple):
    """One kernel call to make: everything needed to rebuild its inputs (in a child process
    too)."""

    spec: str
    case: Case
    dtype: str
    device: torch.device
    seed: int
    forward_only: bool
    want_lse: bool


class Outcome(NamedTuple):
    """What one kernel call gave, as plain data (it crosses processes): ``kind`` "ok" (arrays
    out, dq, dk, dv, lse in the canonical layout, float64), "skip" or "error" (``message``; for
    an exception ``error`` = (type, first line, traceback))."""

    kind: str
    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]
    changed: list[KernelRow]
    keep: np.ndarray | None = None
    message: str = ""
    error: tuple[str, str, str] | None = None


class BadResult(Exception):
    """The kernel returned something that is not what its spec's library returns."""


def run_case(kernel: Kernel, request: Request) -> Outcome:
    """One case and dtype of ``kernel``: forward, backward (unless forward-only), the in-place
    checks; every failure of the kernel is an ``Outcome``, never an exception (but Ctrl-C)."""
    spec, case, dtype, device, seed = request[:5]
    inputs = case_inputs(case, dtype, device, seed)
    changed: list[KernelRow] = []  # filled as it goes, kept if the backward raises
    found: dict[str, Any] = {}

    def call() -> tuple:
        if case.dropout_p:
            found["keep"] = _read_keep_mask(kernel, case, DTYPES[dtype], device, seed)
        return _run(kernel, request, inputs, changed)

    value, failure = run_protected(call, changed)
    keep = found.get("keep")
    keep = None if keep is None else to64(keep)
    if failure is not None:
        return failure._replace(keep=keep)
    arrays, dtypes = value
    return Outcome("ok", arrays, dtypes, changed, keep)


def run_protected(call: Callable[[], Any], changed: list[KernelRow]) -> tuple[Any, Outcome | None]:
    """``(call(), None)``, or ``(None, outcome)`` for a kernel that failed: a ``BadResult`` or
    any exception is an "error", ``KernelUnsupported`` a "skip" (``KeyboardInterrupt``
    propagates)."""
    try:
        return call(), None
    except BadResult as exc:
        return None, Outcome("error", {}, {}, changed, None, str(exc))
    except KernelUnsupported as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "KernelUnsupported"
        return None, Outcome("skip", {}, {}, changed, None, reason)
    except (Exception, SystemExit) as exc:  # a failing kernel is a verdict; Ctrl-C still stops
        return None, Outcome("error", {}, {}, changed, None, _first_line(exc), _describe(exc))


def judge_outcome(request: Request, outcome: Outcome, errors: list[KernelError]) -> list[KernelRow]:
    """The rows of one case and dtype from what the kernel gave."""
    case, dtype = request.case, request.dtype
    rows: list[KernelRow] = []
    keep = None
    if outcome.keep is not None:
        rows.append(judge_keep(case.name, dtype, case.dropout_p, outcome.keep))
        keep = torch.from_numpy(outcome.keep).to(request.device)
    rows += outcome.changed
    if outcome.kind == "skip":
        return rows + [unmeasured(case.name, dtype, "skip", outcome.message)]
    if outcome.kind == "error":
        number = 0
        if outcome.error is not None:
            number = _record(errors, outcome.error, case.name, dtype)
        return rows + [unmeasured(case.name, dtype, "error", outcome.message, number)]
    golden, baseline = reference(case, dtype, request.device, request.seed, keep)
    names = ("out",) if request.forward_only else TENSORS
    for tensor in names:
        row = judge_tensor(
            case.name, dtype, tensor, outcome.arrays[tensor], golden[tensor], baseline[tensor]
        )
        rows.append(_dtype_checked(row, outcome.dtypes[tensor], dtype))
    if request.want_lse:
        row = judge_lse(
            case.name,
            dtype,
            outcome.arrays["lse"],
            golden["lse"],
            baseline["lse"],
            golden.get("lse_shifted"),
        )
        expected = "float32" if dtype in ("float16", "bfloat16") else dtype
        rows.append(_dtype_checked(row, outcome.dtypes["lse"], expected))
    return rows


def _dtype_checked(row: KernelRow, got: str, expected: str) -> KernelRow:
    if got == expected:
        return row
    return wrong_dtype(row, got) if row.tensor != "lse" else _wrong_lse_dtype(row, got, expected)


def _wrong_lse_dtype(row: KernelRow, got: str, expected: str) -> KernelRow:
    detail = f"lse is {got}, the libraries return {expected} for inputs of {row.dtype}"
    return dataclasses.replace(row, verdict="dtype", detail=detail)


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


def _run(
    kernel: Kernel, request: Request, inputs: Inputs, changed: list[KernelRow]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Forward and backward of ``kernel`` on copies of the inputs in the spec's layout, as fresh
    leaves; results back in the canonical layout, float64. An "inplace" row is appended to
    ``changed`` for each copy the kernel changed, checked after the forward and again after the
    backward."""
    spec, case, dtype, device, seed, forward_only, want_lse = request
    originals = {
        name: specs.layout(spec, case, t)
        for name, t in zip("qkv", (inputs.q, inputs.k, inputs.v), strict=True)
    }
    originals.update(specs.extras(spec, case, inputs.attn_mask, inputs.alibi_slopes, device))
    given = {
        name: t.detach().clone(memory_format=torch.contiguous_format)
        for name, t in originals.items()
    }
    leaves = [given[name].requires_grad_(not forward_only) for name in "qkv"]
    with torch.random.fork_rng(devices=_rng_devices(device)):
        torch.manual_seed(seed)
        result = specs.invoke(spec, kernel, case, *leaves, given, want_lse)
    changed += _changed(case.name, dtype, given, originals, "forward", changed)
    try:
        out, lse = specs.split_result(spec, result, want_lse)
    except TypeError as exc:
        raise BadResult(str(exc)) from exc
    expected = tuple(specs.layout(spec, case, inputs.dout).shape)
    _check_tensor("out", out, expected)
    arrays = {"out": specs.unlayout(spec, case, out, case.heads)}
    dtypes = {"out": _name(out.dtype)}
    if want_lse:
        _check_tensor("lse", lse, specs.lse_shape(spec, case))
        arrays["lse"], dtypes["lse"] = specs.unlayout_lse(spec, case, lse), _name(lse.dtype)
    if not forward_only:
        upstream = specs.layout(spec, case, inputs.dout)
        upstream = upstream.to(out.dtype) if out.is_floating_point() else upstream
        try:
            grads = torch.autograd.grad(out, leaves, upstream, allow_unused=True)
        finally:
            changed += _changed(case.name, dtype, given, originals, "backward", changed)
        for name, leaf, grad in zip(TENSORS[1:], leaves, grads, strict=True):
            grad = torch.zeros_like(leaf) if grad is None else grad
            heads = case.heads if name == "dq" else case.kv_heads
            arrays[name], dtypes[name] = specs.unlayout(spec, case, grad, heads), _name(grad.dtype)
    return {name: to64(t) for name, t in arrays.items()}, dtypes


def _check_tensor(name: str, value: Any, shape: tuple[int, ...]) -> None:
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise BadResult(f"kernel returned {name} {got}, expected a tensor of shape {shape}")


def _changed(case, dtype, given, originals, when: str, known: list[KernelRow]) -> list[KernelRow]:
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


def _read_keep_mask(
    kernel: Kernel, case: Case, dtype: torch.dtype, device: torch.device, seed: int
) -> torch.Tensor:
    """The kernel's dropout keep-mask (B, H, N, M) for ``seed``, read back from its output.

    With q = k = 0 every weight is 1/M before dropout, and with V the identity (Dv = M) the
    output is the weight matrix itself: its nonzero entries are the kept ones. The real inputs
    then run under the same torch seed, so a kernel that draws its mask from torch's generator
    (as SDPA does) draws the same mask again.
    """
    b, h, n, m = case.batch, case.heads, case.n, case.m
    q = torch.zeros(b, h, n, case.d, dtype=dtype, device=device, requires_grad=True)
    k = torch.zeros(b, h, m, case.d, dtype=dtype, device=device, requires_grad=True)
    v = torch.eye(m, dtype=dtype, device=device).expand(b, h, m, m).clone().requires_grad_(True)
    with torch.random.fork_rng(devices=_rng_devices(device)):
        torch.manual_seed(seed)
        weights = kernel(
            q, k, v, attn_mask=None, dropout_p=case.dropout_p, is_causal=False, scale=case.scale
        )
    if not isinstance(weights, torch.Tensor) or weights.shape != (b, h, n, m):
        what = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise BadResult(f"kernel returned {what} for the keep-mask probe, expected {(b, h, n, m)}")
    return weights.detach() != 0


def _isolated_runner(kernel: Kernel, isolate: bool | float) -> Any:
    from ..tolerances import ISOLATE_TIME_LIMIT_S
    from .isolation import IsolatedKernel

    if isolate is True:
        limit = ISOLATE_TIME_LIMIT_S
    elif isinstance(isolate, (int, float)) and not isinstance(isolate, bool) and isolate > 0:
        limit = float(isolate)
    else:
        raise ValueError(f"isolate must be a bool or a time limit in seconds > 0, got {isolate!r}")
    return IsolatedKernel(kernel, limit)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _rng_devices(device: torch.device) -> list[int]:
    """The CUDA devices whose generator state ``fork_rng`` saves and restores around a call."""
    if device.type != "cuda":
        return []
    return [torch.cuda.current_device() if device.index is None else device.index]


def _dtype_name(dtype: torch.dtype | str) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return name
