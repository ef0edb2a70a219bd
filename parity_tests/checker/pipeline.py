"""The kernel checker: a kernel with a real library's signature (``checker.specs``), judged case by
case against the float64 NumPy golden.

For each case and dtype the kernel runs forward and backward (with a random upstream gradient)
and each of ``out, dq, dk, dv`` (and lse, where the kernel claims the feature) is judged by

    max|K - G| <= c * max|Bl - G| + floor(dtype) * max|G|

beside the bias statistic ``rms(K - G) <= BIAS_FACTOR * max(rms(Bl - G), rms(R - G), rms(rd(G) -
G)) + BIAS_FLOOR * rms(G)`` (rd: stored in the kernel's dtype; R, for dq and dk: the exact answer
of a kernel reading back its stored output, which also stands in for Bl in the max bound where
farther from G),
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
kernel gets copies; the golden is computed from the originals), an exception: a refusal
("refused": ``ValueError``, ``NotImplementedError``, ``AssertionError``, ``TypeError``) apart
from any other ("error", ``SystemExit`` included; ``KeyboardInterrupt`` is left to propagate, so
that Ctrl-C still stops a run), the forward judged when only the backward raised. With
``isolate=True`` every call runs in a child process (``checker.isolation``): a crash or a hang
past ``timeout`` is an "error" verdict naming the signal or the time limit.
``forward_only=True`` judges out (and lse) with no backward, on inputs that do not require
grad. ``limits=KernelLimits(...)`` (``checker.limits``) declares the head widths, lengths and
layouts a kernel takes: a case outside them is "not run", and its nearest case inside them is
judged instead.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T_q, T_k packed token counts.

Tests: tests/checker/test_pipeline.py (one call, made and judged: tests/checker/running/test_calls.py)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ..tolerances import ISOLATE_TIME_LIMIT_S
from . import specs
from .battery.catalog import Case, default_battery, quick_battery, resolve
from .battery.decode_case import resolve_decode
from .battery.limits import KernelLimits, not_run, outside
from .battery.limits import apply as apply_limits
from .battery.limits import check_spec as check_limits
from .golden.expected import DTYPES
from .judge.policy import unmeasured
from .report.rows import KernelReport
from .running.calls import Kernel, Request, judge_outcome, load_kernel, run_case
from .running.decode import check_decode
from .running.isolation import IsolatedKernel
from .running.ranks import check_ring

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
    limits: KernelLimits | None = None,
    forward_only: bool = False,
    isolate: bool | float = False,
    timeout: float | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    world_size: int | None = None,
    mla_metadata: Callable[..., Any] | None = None,
) -> KernelReport:
    """Run ``kernel`` on every case and dtype and judge it against the float64 golden.

    Args:
        kernel: a callable with the signature of ``spec`` (``checker.specs``), or the string
            "module:function" (the robust form for ``isolate`` and the ring spec, whose child
            processes import it by that name: a function that a module re-exports after
            patching something at import keeps its patches there). For "sdpa": ``kernel(query,
            key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False)`` with query (B, H, N, D), returning (B, H, N, Dv) in the inputs'
            dtype, differentiable by autograd (``enable_gqa`` is passed only to cases with
            fewer KV heads). Dropout must draw from torch's default generator (the checker reads
            the keep-mask back).
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
            the spec cannot express, or that lies outside ``limits``, is a ValueError.
        limits: the head widths, lengths and memory layouts the kernel takes
            (``KernelLimits``, ``checker.limits``; None: any). A case of a battery outside them
            is "not run", and the battery holds its nearest case inside them instead.
        forward_only: judge out (and lse) only, with inputs that do not require grad.
        isolate: run every kernel call in a child process, which imports a "module:function"
            kernel by that name and gets any other by pickle (a module-level function, or a
            ``functools.partial`` of one). A number is the older spelling of
            ``isolate=True, timeout=number``.
        timeout: the time limit of one isolated call in seconds (default
            ``ISOLATE_TIME_LIMIT_S``): a call past it is an "error" (a hang), its child ended.
        seed: an integer in [0, 2**64): draws the inputs and seeds torch around each kernel
            call; the same seed gives the same verdict.
        progress: called with a short message before each case.
        world_size: ranks of the "ring" spec (default 2); only for that spec.
        mla_metadata: for "flash_mla", FlashMLA's ``get_mla_metadata`` (or a stand-in):
            called as ``(cache_seqlens, s_q * H // H_kv, H_kv)``, it gives the kernel's
            ``tile_scheduler_metadata`` and ``num_splits``; None passes None for both.

    Returns:
        A ``KernelReport`` with one row per (case, dtype, tensor); a case where the kernel raised
        has one "refused", "error" or "skip" row (the exception, once per distinct one, in
        ``report.errors``), and when only its backward raised, that row after the forward's
        out (and lse), judged; a case not run one "not-run" row; a dropout case has one more
        row "keep" for the kept fraction; an input changed in place adds an "inplace" row
        naming it.

    Raises:
        TypeError: ``kernel`` is neither callable nor "module:function", ``seed`` is not an
            integer, ``limits`` is not a ``KernelLimits``, or an isolated kernel does not
            pickle.
        ValueError: an unknown spec, feature, dtype or case, a case the spec cannot express or
            named outside the limits, limits the spec's battery cannot honour, an empty list of
            dtypes or cases, ``seed`` out of range, a time limit that is not > 0 (given twice,
            or without isolation), isolation of the ring or decode specs, ``world_size``
            outside the ring spec.
    """
    given = kernel
    kernel = load_kernel(kernel)
    spec = specs.check_spec(spec)
    claimed = specs.resolve_features(spec, features)
    check_seed(seed)
    if not isinstance(forward_only, bool):
        raise TypeError(f"forward_only must be a bool, got {type(forward_only).__name__}")
    if limits is not None and not isinstance(limits, KernelLimits):
        raise TypeError(f"limits must be a KernelLimits, got {type(limits).__name__}")
    if limits is not None:
        check_limits(spec, limits)
    declared = {} if limits is None else limits.declared
    limit = time_limit(isolate, timeout)
    names = [_dtype_name(dtype) for dtype in dtypes]
    if not names:
        raise ValueError("dtypes is empty")
    if spec in specs.DECODE_SPECS:
        if limit is not None or world_size is not None:
            raise ValueError(f"the {spec} spec runs in this process, without ranks")
        report = check_decode(
            kernel, spec, claimed, torch.device(device), names, cases, seed, progress,
            mla_metadata,
        )  # fmt: skip
        report.limits = declared
        return report
    battery, excluded = within_limits(spec, cases, claimed, limits)
    device = torch.device(device)
    if mla_metadata is not None:
        raise ValueError(f"mla_metadata is for the flash_mla spec only, not {spec!r}")
    if spec == "ring":
        if limit is not None:
            raise ValueError("the ring spec runs in spawned ranks of its own: no isolate")
        world = 2 if world_size is None else world_size
        inside = tuple(case for case in battery if case.name not in excluded)
        report = check_ring(given, claimed, device, names, inside, forward_only, seed, world,
                            progress)  # fmt: skip
        return _with_excluded(report, battery, names, claimed, excluded, declared)
    if world_size is not None:
        raise ValueError(f"world_size is for the ring spec only, not {spec!r}")
    report = KernelReport(
        getattr(kernel, "__name__", repr(kernel)),
        str(device),
        cases={case.name: case for case in battery},
        limits=declared,
        excluded=excluded,
    )
    call = IsolatedKernel(given, limit) if limit is not None else None
    try:
        for case in battery:
            for name in names:
                if progress is not None:
                    progress(f"{report.kernel} {case.name} {name}")
                detail = not_run(case, claimed, excluded)
                if detail is not None:
                    report.rows.append(unmeasured(case.name, name, "not-run", detail))
                    continue
                request = Request(spec, case, name, device, seed, forward_only, "lse" in claimed)
                outcome = call(request) if call is not None else run_case(kernel, request)
                report.rows.extend(judge_outcome(request, outcome, report.errors))
    finally:
        if call is not None:
            call.close()
    return report


class Group(NamedTuple):
    """One (case, dtype) group of a battery as ``check_kernel`` would run it: ``runs`` False
    with ``detail`` saying why for a group that is "not run" (a feature not claimed, or outside
    the kernel's limits), and the features the case exercises (``needs``)."""

    case: str
    dtype: str
    runs: bool
    detail: str
    needs: frozenset[str]


def plan_groups(
    spec: str = "sdpa",
    *,
    features: Iterable[str] | None = None,
    dtypes: Sequence[torch.dtype | str] = DEFAULT_DTYPES,
    cases: str | Sequence[Case | str] | None = None,
    limits: KernelLimits | None = None,
) -> list[Group]:
    """The (case, dtype) groups ``check_kernel`` runs for these arguments, in its order, without
    running anything: each names a case that ``check_kernel(..., cases=[group.case],
    dtypes=[group.dtype])`` judges alone (the same verdict as inside the whole battery)."""
    spec = specs.check_spec(spec)
    claimed = specs.resolve_features(spec, features)
    if limits is not None and not isinstance(limits, KernelLimits):
        raise TypeError(f"limits must be a KernelLimits, got {type(limits).__name__}")
    if limits is not None:
        check_limits(spec, limits)
    names = [_dtype_name(dtype) for dtype in dtypes]
    if not names:
        raise ValueError("dtypes is empty")
    if spec in specs.DECODE_SPECS:
        battery: tuple[Any, ...] = resolve_decode(spec, cases)
        excluded: dict[str, tuple[str, str]] = {}
    else:
        battery, excluded = within_limits(spec, cases, claimed, limits)
    groups = []
    for case in battery:
        detail = not_run(case, claimed, excluded)
        for name in names:
            groups.append(Group(case.name, name, detail is None, detail or "", case.needs))
    return groups


def within_limits(
    spec: str,
    cases: str | Sequence[Case | str] | None,
    claimed: frozenset[str],
    limits: KernelLimits | None,
) -> tuple[tuple[Case, ...], dict[str, tuple[str, str]]]:
    """The cases ``spec`` runs (``battery_for``) for a kernel claiming ``claimed`` with
    ``limits``: a battery holds, after each case outside them, its nearest case inside them;
    and for each case outside them (why, the case judged instead). A case named explicitly
    outside them is a ValueError: the limits exclude what was asked for."""
    battery = battery_for(spec, cases, claimed)
    if limits is None:
        return battery, {}
    if cases is not None and not isinstance(cases, str):
        for case in battery:
            why = outside(limits, case) if case.needs <= claimed else None
            if why is not None:
                raise ValueError(f"case {case.name!r} is outside the kernel's limits: {why}")
        return battery, {}
    return apply_limits(limits, battery, claimed)


def _with_excluded(
    report: KernelReport,
    battery: tuple[Case, ...],
    dtypes: list[str],
    claimed: frozenset[str],
    excluded: dict[str, tuple[str, str]],
    declared: dict[str, Any],
) -> KernelReport:
    """``report`` of the cases inside the limits, with a "not-run" row per dtype of each case
    outside them, every row in the battery's order."""
    cases = {case.name: case for case in battery}
    rows = list(report.rows)
    for name in excluded:
        detail = not_run(cases[name], claimed, excluded) or ""
        rows += [unmeasured(name, dtype, "not-run", detail) for dtype in dtypes]
    order = {name: i for i, name in enumerate(cases)}
    report.rows = sorted(rows, key=lambda row: order[row.case])
    report.cases, report.limits, report.excluded = cases, declared, excluded
    return report


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


def time_limit(isolate: bool | float, timeout: float | None) -> float | None:
    """The time limit of an isolated call in seconds, None when the calls are not isolated:
    ``timeout``, or the older ``isolate=SECONDS``, else ``ISOLATE_TIME_LIMIT_S``."""
    for name, value in (("isolate", isolate), ("timeout", timeout)):
        if value is None or (value is True or value is False) and name == "isolate":
            continue
        if not _positive_seconds(value):
            kind = "a bool or a time limit" if name == "isolate" else "a time limit"
            raise ValueError(f"{name} must be {kind} in seconds > 0, got {value!r}")
    if isolate is False:
        if timeout is not None:
            raise ValueError("timeout limits an isolated call: it needs isolate=True")
        return None
    if isolate is not True:
        if timeout is not None:
            raise ValueError("give the time limit once: isolate=True, timeout=SECONDS")
        return float(isolate)
    return ISOLATE_TIME_LIMIT_S if timeout is None else float(timeout)


def _positive_seconds(value: object) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and 0 < value < math.inf  # type: ignore[operator]


def _dtype_name(dtype: torch.dtype | str) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return name
