"""The kernel checker: any function with the signature of ``F.scaled_dot_product_attention``,
judged case by case against the float64 NumPy golden.

For each case and dtype the kernel runs forward and backward (with a random upstream gradient) and
each of ``out, dq, dk, dv`` is judged by

    max|K - G| <= c * max|Bl - G| + floor(dtype) * max|G|

where G is the float64 golden (``numpy_attention.functional``) computed on the inputs *after*
their cast to the kernel's dtype (input rounding is not charged to the kernel), Bl is plain torch
math in the kernel's dtype without upcasting (``plain_attention``), and K the kernel. The bound is
relative to what the dtype can do at all, as in flash-attention's and PyTorch's own SDPA tests.
A NaN or inf where the golden is finite fails at once. The constants below were set by measurement:
``python -m parity_tests --calibrate 60`` and docs/kernel-verification.md.

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value width.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from numpy_attention.functional import attention_backward, attention_forward

from .battery import Case, make_inputs, resolve

Kernel = Callable[..., torch.Tensor]

TENSORS = ("out", "dq", "dk", "dv")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# c in the bound: how many times the plain same-dtype baseline's error a kernel may make.
OUTPUT_FACTOR = 2.0
GRAD_FACTOR = 3.0
# The floor, relative to max|G| of the tensor judged. See docs/kernel-verification.md for the
# measured worst cases of correct kernels and the smallest error of each pitfall.
FLOOR = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}
# A kernel's dropout keep-fraction must lie within this many binomial standard deviations of
# 1 - dropout_p (about one false alarm in 5e8 for a correct kernel).
DROPOUT_SIGMAS = 6.0


class KernelUnsupported(Exception):
    """Raised by a kernel for a case outside its scope (a forced SDPA backend that refuses a
    configuration, say): the case gets the verdict "skip" with the message, not a failure."""


FAILING = ("fail", "nonfinite", "error")


@dataclass(frozen=True)
class KernelRow:
    """One judged tensor of one case and dtype.

    ``error = max|K - G|``, ``baseline = max|Bl - G|``, ``golden_max = max|G|`` and
    ``bound = c * baseline + floor * golden_max``. ``verdict`` is "pass", "fail" (error above
    bound), "nonfinite" (NaN or inf where the golden is finite), "error" (the kernel raised;
    ``detail`` has the message) or "skip" (the kernel raised ``KernelUnsupported``).
    """

    case: str
    dtype: str
    tensor: str
    error: float
    baseline: float
    golden_max: float
    bound: float
    verdict: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING


@dataclass
class KernelReport:
    """The rows of one ``check_kernel`` run.

    ``passed`` is True when no row failed and at least one row passed (skips alone prove
    nothing); ``failures`` lists the failed rows.
    """

    kernel: str
    device: str
    rows: list[KernelRow] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures and any(row.verdict == "pass" for row in self.rows)

    @property
    def failures(self) -> list[KernelRow]:
        return [row for row in self.rows if row.failed]


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
            returning (B, H, N, Dv), differentiable by autograd. Dropout must draw from torch's
            default generator (the checker reads the keep-mask back under a fixed seed).
        device: where the inputs live.
        dtypes: torch dtypes or their names ("float32", "float16", "bfloat16").
        cases: None (the default battery), "quick", "stress", or a sequence of cases or names
            (see ``parity_tests.battery``).
        seed: draws the inputs and seeds torch around each kernel call; the same seed gives the
            same verdict.
        progress: called with a short message before each case.

    Returns:
        A ``KernelReport`` with one row per (case, dtype, tensor); a case where the kernel raised
        has one "error" or "skip" row, and a dropout case has one more row "keep" for the kept
        fraction.
    """
    if not callable(kernel):
        raise TypeError(f"kernel must be callable, got {type(kernel).__name__}")
    names = [_dtype_name(dtype) for dtype in dtypes]
    if not names:
        raise ValueError("dtypes is empty")
    device = torch.device(device)
    report = KernelReport(getattr(kernel, "__name__", repr(kernel)), str(device))
    for case in resolve(cases):
        for name in names:
            if progress is not None:
                progress(f"{report.kernel} {case.name} {name}")
            report.rows.extend(_check_case(kernel, case, name, device, seed))
    return report


class _Reference(NamedTuple):
    inputs: tuple  # q, k, v, attn_mask, dout as torch tensors in the kernel's dtype
    golden: tuple[np.ndarray, ...] | None  # out, dq, dk, dv; None for dropout cases
    baseline: tuple[np.ndarray, ...] | None


@functools.lru_cache(maxsize=64)
def _reference(case: Case, dtype: str, device: torch.device, seed: int) -> _Reference:
    """The cast inputs, golden and baseline of a case: shared by every kernel checked."""
    inputs = tuple(
        None if a is None else _cast(a, DTYPES[dtype], device) for a in make_inputs(case, seed)
    )
    if case.dropout_p:
        return _Reference(inputs, None, None)
    return _Reference(inputs, *_expected(case, inputs, seed, None))


def _expected(case: Case, inputs: tuple, seed: int, keep: torch.Tensor | None) -> tuple:
    """Golden (NumPy float64 on the cast inputs) and baseline (``plain_attention``) results."""
    q, k, v, attn_mask, dout = (None if t is None else _to64(t) for t in inputs)
    out, _, ctx = attention_forward(
        q,
        k,
        v,
        causal=case.causal,
        attn_mask=attn_mask,
        scale=case.scale,
        dropout_p=case.dropout_p,
        dropout_mask=None if keep is None else _to64(keep),
    )
    golden = (out, *attention_backward(dout, ctx)[:3])
    baseline = _run(plain_attention, case, inputs, seed, keep=keep)
    return golden, tuple(_to64(t) for t in baseline)


def _check_case(
    kernel: Kernel, case: Case, dtype: str, device: torch.device, seed: int
) -> list[KernelRow]:
    reference = _reference(case, dtype, device, seed)
    rows = []
    try:
        golden, baseline = reference.golden, reference.baseline
        if case.dropout_p:
            keep = _read_keep_mask(kernel, case, DTYPES[dtype], device, seed)
            rows.append(_judge_keep(case, dtype, keep))
            golden, baseline = _expected(case, reference.inputs, seed, keep)
        results = _run(kernel, case, reference.inputs, seed)
    except Exception as exc:  # any failure of a user's kernel is a verdict, not a crash
        verdict = "skip" if isinstance(exc, KernelUnsupported) else "error"
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return rows + [
            KernelRow(
                case.name, dtype, "-", math.nan, math.nan, math.nan, math.nan, verdict, message
            )
        ]
    for tensor, result, gold, base in zip(TENSORS, results, golden, baseline, strict=True):
        rows.append(_judge(case.name, dtype, tensor, _to64(result), gold, base))
    return rows


def _run(
    kernel: Kernel, case: Case, inputs: tuple, seed: int, keep=None
) -> tuple[torch.Tensor, ...]:
    """Forward and backward of ``kernel`` on fresh leaves; returns (out, dq, dk, dv)."""
    q, k, v, attn_mask, dout = inputs
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    kwargs = {
        "attn_mask": None if attn_mask is None else attn_mask.clone(),
        "dropout_p": case.dropout_p,
        "is_causal": case.causal,
        "scale": case.scale,
    }
    if keep is not None:
        kwargs["keep"] = keep
    with torch.random.fork_rng(devices=_rng_devices(q.device)):
        torch.manual_seed(seed)
        out = kernel(*leaves, **kwargs)
    if not isinstance(out, torch.Tensor) or out.shape != dout.shape:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"kernel returned {shape}, expected a tensor of shape {tuple(dout.shape)}")
    grads = torch.autograd.grad(out, leaves, dout.clone(), allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads, strict=True)]
    return (out.detach(), *grads)


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
    return weights.detach() != 0


def _judge_keep(case: Case, dtype: str, keep: torch.Tensor) -> KernelRow:
    """The kept fraction against 1 - p, within DROPOUT_SIGMAS binomial standard deviations."""
    p, count = case.dropout_p, keep.numel()
    error = abs(keep.double().mean().item() - (1.0 - p))
    bound = DROPOUT_SIGMAS * math.sqrt(p * (1.0 - p) / count)
    return KernelRow(
        case.name,
        dtype,
        "keep",
        error,
        math.nan,
        1.0 - p,
        bound,
        "pass" if error <= bound else "fail",
        f"kept fraction should be {1 - p:g}",
    )


def _judge(case: str, dtype: str, tensor: str, result, gold, base) -> KernelRow:
    """Error and bound over the entries where the golden is finite (all of them, unless an input
    overflowed in its cast). A baseline that is itself NaN or inf there (plain half-precision
    math overflows on extreme logits) leaves the floor alone as the bound."""
    finite = np.isfinite(gold)
    factor = OUTPUT_FACTOR if tensor == "out" else GRAD_FACTOR
    golden_max = float(np.max(np.abs(gold[finite]), initial=0.0))
    floor = FLOOR[dtype] * golden_max
    detail = ""
    if np.all(np.isfinite(base[finite])):
        baseline = float(np.max(np.abs(base[finite] - gold[finite]), initial=0.0))
        bound = factor * baseline + floor
    else:
        baseline, bound, detail = math.nan, floor, "floor-only bound: baseline NaN/inf"
    if not np.all(np.isfinite(result[finite])):
        return KernelRow(
            case,
            dtype,
            tensor,
            math.inf,
            baseline,
            golden_max,
            bound,
            "nonfinite",
            "NaN or inf where the golden is finite",
        )
    error = float(np.max(np.abs(result[finite] - gold[finite]), initial=0.0))
    verdict = "pass" if error <= bound else "fail"
    return KernelRow(case, dtype, tensor, error, baseline, golden_max, bound, verdict, detail)


def attention_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """S = Q K^T * scale, plus a float mask, -inf where a bool mask or the causal mask forbids.

    Args:
        query: (B, H, N, D); key: (B, H, M, D); attn_mask: bool (True = may attend) or float,
            broadcasting to (B, H, N, M).

    Returns:
        scores (B, H, N, M) in the inputs' dtype.
    """
    n, m, d = query.shape[-2], key.shape[-2], query.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (query @ key.transpose(-2, -1)) * scale  # (B, H, N, D) @ (B, H, D, M) -> (B, H, N, M)
    if is_causal:
        causal = torch.ones(n, m, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~causal, -math.inf)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, -math.inf)
    elif attn_mask is not None:
        scores = scores + attn_mask
    return scores


def masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the keys (last axis); a fully masked row (all -inf) gets weights 0, not NaN."""
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True).detach()
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


def plain_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """The baseline Bl: textbook attention in the inputs' dtype, no upcasting, autograd backward.

    S = Q K^T * scale (+ float mask, -inf where masked); P = softmax(S), 0 on fully masked rows;
    P' = P * keep / (1 - p); O = P' V. Without an explicit bool ``keep`` (B, H, N, M), dropout
    draws it from torch's generator.

    Args:
        query: (B, H, N, D); key: (B, H, M, D); value: (B, H, M, Dv).

    Returns:
        (B, H, N, Dv).
    """
    probs = masked_softmax(attention_scores(query, key, attn_mask, is_causal, scale))
    if dropout_p:
        if keep is None:
            keep = torch.rand(probs.shape, device=probs.device) >= dropout_p
        probs = probs * keep.to(probs.dtype) * (1.0 / (1.0 - dropout_p))
    return probs @ value  # (B, H, N, M) @ (B, H, M, Dv) -> (B, H, N, Dv)


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
