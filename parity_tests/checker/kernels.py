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

The checker also refuses what no correct kernel does, as failing verdicts rather than exceptions
(``checker.calls`` makes each call and judges what it gave, the keep-mask of dropout included):
NaN or inf where the golden is finite, a result of another dtype than the inputs (lse: float32
for half-precision inputs), a result of another shape or layout, inputs changed in place (the
kernel gets copies; the golden is computed from the originals), an exception (``SystemExit``
included; ``KeyboardInterrupt`` is left to propagate, so that Ctrl-C still stops a run). With
``isolate=True`` every call runs in a child process (``checker.isolation``): a crash or a hang is
an "error" verdict naming the signal or the time limit. ``forward_only=True`` judges out (and
lse) with no backward, on inputs that do not require grad.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T_q, T_k packed token counts.

Tests: tests/checker/test_kernels.py (one call, made and judged: tests/checker/test_calls.py)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from ..tolerances import ISOLATE_TIME_LIMIT_S
from . import specs
from .battery import Case, default_battery, quick_battery, resolve
from .calls import Kernel, Request, judge_outcome, run_case
from .decode import check_decode
from .expected import DTYPES
from .isolation import IsolatedKernel
from .judge import unmeasured
from .report import KernelReport
from .ring import check_ring

DEFAULT_DTYPES = ("float32", "float16", "bfloat16")
# What torch.manual_seed and NumPy's SeedSequence both accept.
SEED_LIMIT = 2**64


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
    mla_metadata: Callable[..., Any] | None = None,
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
        spec: "sdpa", "flash", "flash_varlen", "flex", "ring", or a decode spec,
            "flash_kvcache" or "flash_mla" (``checker.decode``: their own battery, forward
            only by nature; ``cases`` None, "default" or "quick" runs it).
        features: the options the kernel claims (``specs.FEATURES``); None is the spec's
            default set. A case needing an undeclared feature is "not run"; "lse" asks the
            kernel for lse and judges it.
        device: where the inputs live.
        dtypes: torch dtypes or their names ("float64", "float32", "float16", "bfloat16").
        cases: None (the spec's default battery), "quick", "stress", "ring", or a sequence of
            cases or names (``checker.battery``). The default and quick batteries are built for
            the spec and the features claimed (every pair of the claimed features' values meets
            in a case), and list the spec's cases that need other features as not run; the
            stress battery keeps the cases the spec can express; a case named explicitly that
            the spec cannot express is a ValueError.
        forward_only: judge out (and lse) only, with inputs that do not require grad.
        isolate: run every kernel call in a child process; True uses ISOLATE_TIME_LIMIT_S per
            call, a number is the limit in seconds. The kernel must pickle (a module-level
            function, or "module:function").
        seed: an integer in [0, 2**64): draws the inputs and seeds torch around each kernel
            call; the same seed gives the same verdict.
        progress: called with a short message before each case.
        world_size: ranks of the "ring" spec (default 2); only for that spec.
        mla_metadata: for "flash_mla", FlashMLA's ``get_mla_metadata`` (or a stand-in):
            called as ``(cache_seqlens, s_q * H // H_kv, H_kv)``, it gives the kernel's
            ``tile_scheduler_metadata`` and ``num_splits``; None passes None for both.

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
    if spec in specs.DECODE_SPECS:
        if isolate is not False or world_size is not None:
            raise ValueError(f"the {spec} spec runs in this process, without ranks")
        return check_decode(
            kernel, spec, claimed, torch.device(device), names, cases, seed, progress,
            mla_metadata,
        )  # fmt: skip
    battery = battery_for(spec, cases, claimed)
    device = torch.device(device)
    if mla_metadata is not None:
        raise ValueError(f"mla_metadata is for the flash_mla spec only, not {spec!r}")
    if spec == "ring":
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


def battery_for(
    spec: str,
    cases: str | Sequence[Case | str] | None,
    features: Iterable[str] | None = None,
) -> tuple[Case, ...]:
    """The cases ``spec`` runs for a kernel claiming ``features`` (None: all the spec's): the
    default or quick battery built for them, then the spec's own cases that need features not
    claimed (to be listed as not run); the stress battery's cases the spec can express; the
    ring battery for the ring spec. Explicitly named cases (looked up in the spec's batteries
    first) must all be expressible."""
    claimed = None if features is None else frozenset(features)
    if claimed is not None and claimed >= specs.SPEC_FEATURES[spec] - {"lse"}:
        claimed = None
    if cases is None or isinstance(cases, str):
        if spec == "ring" and cases in (None, "default", "quick"):
            cases = "ring"
        if spec == "ring" and cases == "stress":
            raise ValueError(
                "the ring spec has no stress battery (its cases must split over the ranks): "
                "run its own battery, 'ring', or name cases"
            )
        if cases in (None, "default", "quick") and claimed is not None:
            build = quick_battery if cases == "quick" else default_battery
            unclaimed = tuple(c for c in build(spec) if c.needs - claimed)
            named = _unique_names(build(spec, claimed) + unclaimed)
        else:
            named = resolve(cases, spec)
        kept = tuple(c for c in named if specs.cannot_express(spec, c) is None)
        if not kept:
            raise ValueError(f"the {cases or 'default'} battery has no case the {spec} spec runs")
        return kept
    battery = resolve(cases, spec, claimed)
    for case in battery:
        reason = specs.cannot_express(spec, case)
        if reason is not None:
            raise ValueError(f"the {spec} spec cannot run case {case.name!r}: {reason}")
    return battery


def _unique_names(cases: tuple[Case, ...]) -> tuple[Case, ...]:
    return tuple({case.name: case for case in cases}.values())


def check_seed(seed: object) -> int:
    """``seed`` if it is an integer in [0, 2**64), the range both torch and NumPy accept."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return int(seed)


def _isolated_runner(kernel: Kernel, isolate: bool | float) -> IsolatedKernel:
    if isolate is True:
        limit = ISOLATE_TIME_LIMIT_S
    elif isinstance(isolate, (int, float)) and not isinstance(isolate, bool) and isolate > 0:
        limit = float(isolate)
    else:
        raise ValueError(f"isolate must be a bool or a time limit in seconds > 0, got {isolate!r}")
    return IsolatedKernel(kernel, limit)


def _dtype_name(dtype: torch.dtype | str) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return name
