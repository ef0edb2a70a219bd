"""The kernel checker: any function with the signature of ``F.scaled_dot_product_attention``,
judged case by case against the float64 NumPy golden.

For each case and dtype the kernel runs forward and backward (with a random upstream gradient) and
each of ``out, dq, dk, dv`` is judged by

    max|K - G| <= c * max|Bl - G| + floor(dtype) * max|G|

where G is the float64 golden (``numpy_attention.functional``) computed on the inputs *after*
their cast to the kernel's dtype (input rounding is not charged to the kernel), Bl is plain torch
math in the kernel's dtype without upcasting (``checker.reference.plain_attention``), and K the
kernel (``checker.judge`` applies the inequality). The bound is relative to what the dtype can
do at all, as in flash-attention's and PyTorch's own SDPA tests. The constants (c, the floors)
live in ``parity_tests.tolerances`` and were set by measurement: ``python -m parity_tests
--calibrate 60``, docs/kernel-verification.md.

The checker also refuses what no correct kernel does, as failing verdicts rather than exceptions:
NaN or inf where the golden is finite, a result of another dtype than the inputs, inputs changed
in place (the kernel gets copies; the golden is computed from the originals), an exception
(``SystemExit`` included: a kernel that calls ``sys.exit`` gets an "error" verdict, it does not
end the run; ``KeyboardInterrupt`` is left to propagate, so that Ctrl-C still stops a run).

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value width.

Tests: tests/checker/test_kernels.py
"""

from __future__ import annotations

import functools
import math
import traceback
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from numpy_attention.functional import attention_backward, attention_forward

from .battery import Case, make_inputs, resolve
from .judge import judge_keep, judge_tensor, unmeasured, wrong_dtype
from .reference import plain_attention
from .report import KernelError, KernelReport, KernelRow, KernelUnsupported

Kernel = Callable[..., torch.Tensor]

TENSORS = ("out", "dq", "dk", "dv")
INPUTS = ("q", "k", "v", "attn_mask")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# What torch.manual_seed and NumPy's SeedSequence both accept.
SEED_LIMIT = 2**64


def check_kernel(
    kernel: Kernel,
    *,
    device: str | torch.device = "cpu",
    dtypes: Sequence[torch.dtype | str] = (torch.float32, torch.float16, torch.bfloat16),
    cases: str | Sequence[Case | str] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> KernelReport:
    """Run ``kernel`` on every case and dtype and judge it against the float64 golden.

    Args:
        kernel: ``kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
            scale=None)`` with query (B, H, N, D), key (B, H, M, D), value (B, H, M, Dv),
            returning (B, H, N, Dv) in the inputs' dtype, differentiable by autograd. ``scale``
            None means 1 / sqrt(D). Dropout must draw from torch's default generator (the
            checker reads the keep-mask back under a fixed seed).
        device: where the inputs live.
        dtypes: torch dtypes or their names ("float32", "float16", "bfloat16").
        cases: None (the default battery), "quick", "stress", or a sequence of cases or names
            (see ``parity_tests.checker.battery``).
        seed: an integer in [0, 2**64): draws the inputs and seeds torch around each kernel
            call; the same seed gives the same verdict.
        progress: called with a short message before each case.

    Returns:
        A ``KernelReport`` with one row per (case, dtype, tensor); a case where the kernel raised
        has one "error" or "skip" row (the exception, once per distinct one, in
        ``report.errors``); a dropout case has one more row "keep" for the kept fraction; an input
        changed in place adds an "inplace" row naming it.

    Raises:
        TypeError: ``kernel`` is not callable, or ``seed`` is not an integer.
        ValueError: an unknown dtype or case, an empty list of either, or ``seed`` out of range.
    """
    if not callable(kernel):
        raise TypeError(f"kernel must be callable, got {type(kernel).__name__}")
    check_seed(seed)
    names = [_dtype_name(dtype) for dtype in dtypes]
    if not names:
        raise ValueError("dtypes is empty")
    battery = resolve(cases)
    device = torch.device(device)
    report = KernelReport(
        getattr(kernel, "__name__", repr(kernel)),
        str(device),
        cases={case.name: case for case in battery},
    )
    for case in battery:
        for name in names:
            if progress is not None:
                progress(f"{report.kernel} {case.name} {name}")
            report.rows.extend(_check_case(kernel, case, name, device, seed, report.errors))
    return report


def check_seed(seed: object) -> int:
    """``seed`` if it is an integer in [0, 2**64), the range both torch and NumPy accept."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return int(seed)


class _Reference(NamedTuple):
    inputs: tuple  # q, k, v, attn_mask, dout as torch tensors in the kernel's dtype
    golden: tuple[np.ndarray, ...] | None  # out, dq, dk, dv; None for dropout cases
    baseline: tuple[np.ndarray, ...] | None


@functools.lru_cache(maxsize=64)
def _reference(case: Case, dtype: str, device: torch.device, seed: int) -> _Reference:
    """The cast inputs, golden and baseline of a case: shared by every kernel checked. The
    kernel only ever gets copies of these inputs."""
    inputs = tuple(
        None if a is None else _cast(a, DTYPES[dtype], device) for a in make_inputs(case, seed)
    )
    if case.dropout_p:
        return _Reference(inputs, None, None)
    return _Reference(inputs, *_expected(case, inputs, seed, None))


def _expected(case: Case, inputs: tuple, seed: int, keep: torch.Tensor | None) -> tuple:
    """Golden (NumPy float64 on the cast inputs) and baseline (``plain_attention``) results."""
    q, k, v, attn_mask, dout = (None if t is None else _to64(t) for t in inputs)
    forward = attention_forward(
        q,
        k,
        v,
        causal=case.causal,
        attn_mask=attn_mask,
        scale=case.scale,
        dropout_p=case.dropout_p,
        dropout_mask=None if keep is None else _to64(keep),
    )
    grads = attention_backward(dout, forward.ctx)
    golden = (forward.out, grads.dq, grads.dk, grads.dv)
    baseline = _run(plain_attention, case, inputs, seed, keep=keep)
    return golden, tuple(_to64(t) for t in baseline)


class _BadResult(Exception):
    """The kernel returned something that is not a tensor of the expected shape."""


def _check_case(
    kernel: Kernel,
    case: Case,
    dtype: str,
    device: torch.device,
    seed: int,
    errors: list[KernelError],
) -> list[KernelRow]:
    reference = _reference(case, dtype, device, seed)
    rows: list[KernelRow] = []
    changed: list[KernelRow] = []  # filled by _run as it goes, kept if the backward raises
    try:
        golden, baseline = reference.golden, reference.baseline
        if case.dropout_p:
            keep = _read_keep_mask(kernel, case, DTYPES[dtype], device, seed)
            rows.append(judge_keep(case.name, dtype, case.dropout_p, _to64(keep)))
            golden, baseline = _expected(case, reference.inputs, seed, keep)
        results = _run(kernel, case, reference.inputs, seed, changed=changed, dtype=dtype)
    except _BadResult as exc:
        return rows + changed + [unmeasured(case.name, dtype, "error", str(exc))]
    except KernelUnsupported as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "KernelUnsupported"
        return rows + changed + [unmeasured(case.name, dtype, "skip", reason)]
    except (Exception, SystemExit) as exc:  # a failing kernel is a verdict; Ctrl-C still stops
        number = _record(errors, exc, case.name, dtype)
        error = unmeasured(case.name, dtype, "error", _first_line(exc), number)
        return rows + changed + [error]
    rows += changed
    for tensor, result, gold, base in zip(TENSORS, results, golden, baseline, strict=True):
        row = judge_tensor(case.name, dtype, tensor, _to64(result), gold, base)
        got = str(result.dtype).removeprefix("torch.")
        rows.append(row if got == dtype else wrong_dtype(row, got))
    return rows


def _first_line(exc: BaseException) -> str:
    message = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if isinstance(exc, SystemExit):
        message += " (the kernel called sys.exit)"
    return message


def _record(errors: list[KernelError], exc: BaseException, case: str, dtype: str) -> int:
    """The number of ``exc`` in ``errors``, adding it if no equal exception (same type, message
    and frames) was seen before; the kernel's traceback starts below the checker's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    for entry in errors:
        if entry.traceback == text:
            entry.where.append((case, dtype))
            return entry.number
    message = str(exc).splitlines()[0] if str(exc) else ""
    errors.append(KernelError(len(errors) + 1, type(exc).__name__, message, text, [(case, dtype)]))
    return len(errors)


def _run(
    kernel: Kernel,
    case: Case,
    inputs: tuple,
    seed: int,
    *,
    keep: torch.Tensor | None = None,
    changed: list[KernelRow] | None = None,
    dtype: str = "",
) -> tuple[torch.Tensor, ...]:
    """Forward and backward of ``kernel`` on copies of the inputs, as fresh leaves: (out, dq, dk,
    dv). An "inplace" row is appended to ``changed`` for each copy the kernel changed, checked
    after the forward and again after the backward."""
    q, k, v, attn_mask, dout = inputs
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    mask = None if attn_mask is None else attn_mask.clone()
    kwargs = {
        "attn_mask": mask,
        "dropout_p": case.dropout_p,
        "is_causal": case.causal,
        "scale": case.scale,
    }
    if keep is not None:
        kwargs["keep"] = keep
    with torch.random.fork_rng(devices=_rng_devices(q.device)):
        torch.manual_seed(seed)
        out = kernel(*leaves, **kwargs)
    given, originals = (*leaves, mask), (q, k, v, attn_mask)
    changed = [] if changed is None else changed
    changed += _changed(case.name, dtype, given, originals, "forward", changed)
    if not isinstance(out, torch.Tensor) or out.shape != dout.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise _BadResult(f"kernel returned {shape}, expected a tensor of shape {tuple(dout.shape)}")
    upstream = dout.to(out.dtype) if out.is_floating_point() else dout
    try:
        grads = torch.autograd.grad(out, leaves, upstream, allow_unused=True)
    finally:
        changed += _changed(case.name, dtype, given, originals, "backward", changed)
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads, strict=True)]
    return (out.detach(), *grads)


def _changed(case, dtype, given, originals, when: str, known: list[KernelRow]) -> list[KernelRow]:
    """An "inplace" row for each input whose copy no longer equals its original (and has no row
    in ``known`` yet): error = max|after - before| (inf where NaN or inf appeared; the count of
    flipped entries for a bool mask), bound 0."""
    rows = []
    seen = {row.tensor for row in known}
    for name, after, before in zip(INPUTS, given, originals, strict=True):
        if before is None or name in seen or torch.equal(after.detach(), before):
            continue
        if before.dtype == torch.bool:
            error = float((after != before).sum())
        else:
            error = (after.detach().double() - before.double()).abs().max().item()
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
        raise _BadResult(f"kernel returned {what} for the keep-mask probe, expected {(b, h, n, m)}")
    return weights.detach() != 0


def _cast(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.to(device) if tensor.dtype == torch.bool else tensor.to(device, dtype)


def _to64(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bool:
        return tensor.cpu().numpy()
    return tensor.detach().to("cpu", torch.float64).numpy()


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
