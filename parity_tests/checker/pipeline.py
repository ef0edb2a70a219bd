"""The kernel checker: a kernel with a real library's signature (``checker.specs``), judged case by
case against the float64 NumPy golden.

For each case and dtype the kernel runs forward and backward (with a random upstream gradient)
and each of ``out, dq, dk, dv`` (and lse, where the kernel claims the feature) is judged by

    max|K - G| <= c * max|Bl - G| + floor(dtype) * max|G|

beside the bias statistic ``rms(K - G) <= BIAS_FACTOR * max(rms(Bl - G), rms(R - G), rms(rd(G) - G))
+ BIAS_FLOOR * rms(G)`` (rd: stored in the kernel's dtype; R, for dq and dk: the exact answer of a
kernel reading back its stored output, which also stands in for Bl in the max bound where farther
from G), where G is the float64 golden (``numpy_attention``'s core, or its varlen form, with the
case's options) computed on the inputs *after* their cast to the kernel's dtype (input rounding is
not charged to the kernel), Bl is plain torch math in the kernel's dtype without upcasting
(``checker.golden.attention_baseline``), and K the kernel (``checker.judge`` applies the
inequalities). The constants live in ``parity_tests.tolerances`` and were set by measurement:
``python -m parity_tests --calibrate 60``, docs/kernel-verification.md.

The checker also refuses what no correct kernel does, as failing verdicts rather than exceptions
(``checker.running.calls`` makes each call and judges what it gave, the keep-mask of dropout
included): NaN or inf where the golden is finite, a result of another dtype than the inputs (lse:
float32 for half-precision inputs), a result of another shape or layout, inputs changed in place
(the kernel gets copies; the golden is computed from the originals), an exception: a refusal
("refused": ``ValueError``, ``NotImplementedError``, ``AssertionError``, ``TypeError``) apart from
any other ("error", ``SystemExit`` included; ``KeyboardInterrupt`` is left to propagate, so that
Ctrl-C still stops a run), the forward judged when only the backward raised. With ``isolate=True``
every call runs in a child process (``checker.running.isolation``): a crash or a hang past
``timeout`` is an "error" verdict naming the signal or the time limit. ``forward_only=True`` judges
out (and lse) with no backward, on inputs that do not require grad. ``limits=KernelLimits(...)``
(``checker.battery.limits``) declares the head widths, lengths and layouts a kernel takes: a case
outside them is "not run", and its nearest case inside them is judged instead. Every call is
made a second time on identical inputs, and its results must be the first's bit for bit
(``running.calls.repeated``; the backward's too where the kernel claims "deterministic"): a
difference is "nondeterministic", unless ``KernelLimits(nondeterministic=True)`` declares it.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T_q, T_k packed token counts.

Tests: tests/checker/test_pipeline.py (one call, made and judged:
tests/checker/running/test_calls.py)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ..tolerances import ISOLATE_TIME_LIMIT_S
from . import specs
from .battery.catalog import select
from .battery.limits import KernelLimits, check_claims, not_run
from .battery.limits import apply as apply_limits
from .golden import DTYPES
from .judge.policy import unmeasured
from .report.diagnosis import factor_values
from .report.rows import KernelReport
from .running.calls import Kernel, Outcome, Request, load_kernel
from .running.interpreter import InterpreterWarning, interpreter_skips, skip_warning
from .running.isolation import IsolatedKernel

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
    cases: str | Sequence[Any] | None = None,
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
        spec: a spec's name (``checker.specs.SPECS``): "sdpa", "flash", "flash_varlen", "flex",
            "ring", a decode spec, "flash_kvcache" or "flash_mla" (forward only by nature), or
            a sparse spec, "sparse" (the torch twin's ``sparse_attention``, gradients judged)
            or "flash_mla_sparse" (FlashMLA's ``flash_mla_sparse_fwd``, forward only), or a
            linear-attention spec, "fla_gdn" or "fla_kda" (flash-linear-attention's
            ``chunk_gated_delta_rule`` or ``chunk_kda``: o, the final state and every gradient
            judged).
        features: the options the kernel claims (``specs.FEATURES``); None is the spec's
            default set. A case needing an undeclared feature is "not run"; "lse" asks the
            kernel for lse and judges it; "deterministic" (an attention spec's, never claimed
            by default) compares a second backward with the first, bit for bit. A claimed
            feature that no judged case of a battery exercised is "not covered", and fails the
            verdict (``KernelReport.not_covered``).
        device: where the inputs live.
        dtypes: torch dtypes or their names ("float64", "float32", "float16", "bfloat16").
            A Triton kernel under Triton's interpreter (``TRITON_INTERPRET=1``) skips
            bfloat16, which the interpreter mishandles: an ``InterpreterWarning``, and its
            groups "skip" (``running.interpreter``).
        cases: None (the spec's default battery), a battery's name ("quick"; "stress" for the
            attention specs, "ring" for the ring spec), or a sequence of cases or names. A
            battery is built for the spec and the features claimed (every pair of the claimed
            features' values meets in a case), and lists the spec's cases that need other
            features as not run; a case named explicitly that the spec cannot express, or that
            lies outside ``limits``, is a ValueError.
        limits: the head widths, lengths, page sizes and memory layouts the kernel takes
            (``KernelLimits``, ``battery.limits``; None: any). A case of a battery outside them
            is "not run", and the battery holds its nearest case inside them instead.
            ``nondeterministic=True``: each case is called once, its results not compared with
            a second call's.
        forward_only: judge out (and lse) only, with inputs that do not require grad.
        isolate: run every kernel call in a child process, which imports a "module:function"
            kernel by that name and gets any other by pickle (a module-level function, or a
            ``functools.partial`` of one). A number is the older spelling of
            ``isolate=True, timeout=number``.
        timeout: the time limit of one isolated call in seconds (default
            ``ISOLATE_TIME_LIMIT_S``): a call past it is an "error" (a hang), its child ended.
        seed: an integer in [0, 2**64): draws the inputs and seeds torch around each kernel
            call; the same seed gives the same verdict.
        progress: called with a short message before each case and dtype run, "kernel case
            dtype (i of n)". Where it also has a method ``group_done(report, done, total)``
            (the CLI's display has), that is called after each (case, dtype) group judged,
            with the report so far: the CLI counts the time left from it, and writes the
            groups finished to its JSON report as it goes.
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
        naming it, a result the second call did not repeat bit for bit a "nondeterministic"
        row.

    Raises:
        TypeError: ``kernel`` is neither callable nor "module:function", ``seed`` is not an
            integer, ``limits`` is not a ``KernelLimits``, or an isolated kernel does not
            pickle.
        ValueError: an unknown spec, feature, dtype or case, a case the spec cannot express or
            named outside the limits, limits the spec's battery cannot honour (or that
            contradict the claim: nondeterministic with "deterministic"), an empty list of
            dtypes or cases, ``seed`` out of range, a time limit that is not > 0 (given twice,
            or without isolation), an option of another spec (``world_size``,
            ``mla_metadata``), isolation of a spec that runs on ranks of its own.
    """
    given = kernel
    kernel = load_kernel(kernel)
    plan = _plan(spec, features, dtypes, cases, limits)
    check_seed(seed)
    if not isinstance(forward_only, bool):
        raise TypeError(f"forward_only must be a bool, got {type(forward_only).__name__}")
    limit = time_limit(isolate, timeout)
    asked = {"world_size": world_size, "mla_metadata": mla_metadata}
    options = plan.spec.options({name: value for name, value in asked.items() if value is not None})
    plan.spec.check_options(plan.battery, options)
    skipped = interpreter_skips(kernel, plan.dtypes)  # bfloat16 under Triton's interpreter
    if skipped:
        warnings.warn(skip_warning(skipped), InterpreterWarning, stacklevel=2)
        plan = plan._replace(dtypes=tuple(d for d in plan.dtypes if d not in skipped))
    device = torch.device(device)
    report = KernelReport(
        getattr(kernel, "__name__", repr(kernel)),
        str(device),
        cases={case.name: case for case in plan.battery},
        limits={} if limits is None else limits.declared,
        excluded=plan.excluded,
        claimed=plan.claimed,
        exercised={case.name: plan.spec.exercised(case, plan.claimed) for case in plan.battery},
        named=not (cases is None or isinstance(cases, str)),
        factors={case.name: factor_values(plan.spec, case) for case in plan.battery},
    )
    requests = []
    for case in plan.battery:
        for dtype in plan.dtypes:
            if not_run(case, plan.claimed, plan.excluded) is None:
                requests.append(
                    Request(
                        plan.spec.name,
                        case,
                        dtype,
                        device,
                        seed,
                        forward_only or not plan.spec.backward,
                        "lse" in plan.claimed,
                        options,
                        "deterministic" in plan.claimed,
                        limits is not None and limits.nondeterministic,
                    )  # fmt: skip
                )
    if limit is not None and not plan.spec.isolatable:
        raise ValueError(f"the {plan.spec.name} spec runs in spawned ranks of its own: no isolate")
    outcomes = plan.spec.run_all(given, requests, options, progress) if requests else {}
    call = IsolatedKernel(given, limit) if limit is not None and outcomes is None else None
    pending = iter(requests)
    group_done, done = getattr(progress, "group_done", None), 0
    try:
        for case in plan.battery:
            for dtype in plan.dtypes:
                detail = not_run(case, plan.claimed, plan.excluded)
                if detail is not None:
                    report.rows.append(unmeasured(case.name, dtype, "not-run", detail))
                    continue
                request = next(pending)
                if outcomes is not None:
                    outcome: Outcome = outcomes[case.name, dtype]
                else:
                    if progress is not None:
                        count = f"({done + 1} of {len(requests)})"
                        progress(f"{report.kernel} {case.name} {dtype} {count}")
                    outcome = call(request) if call is not None else plan.spec.run(kernel, request)
                report.rows.extend(plan.spec.judge(request, outcome, report.errors))
                done += 1
                if group_done is not None:
                    group_done(report, done, len(requests))
    finally:
        if call is not None:
            call.close()
    for case in plan.battery:  # the dtypes skipped, each group "skip" where it would run
        for dtype, why in skipped.items():
            detail = not_run(case, plan.claimed, plan.excluded)
            verdict = "skip" if detail is None else "not-run"
            report.rows.append(unmeasured(case.name, dtype, verdict, detail or why))
    return report


class Plan(NamedTuple):
    """What a check runs: the spec, the features claimed, the cases (each outside the
    kernel's limits followed by its nearest case inside them), those excluded by the limits
    (why, the case judged instead) and the dtypes' names."""

    spec: Any
    claimed: frozenset[str]
    battery: tuple[Any, ...]
    excluded: dict[str, tuple[str, str]]
    dtypes: tuple[str, ...]


def _plan(
    spec: Any,
    features: Iterable[str] | None,
    dtypes: Sequence[torch.dtype | str],
    cases: str | Sequence[Any] | None,
    limits: KernelLimits | None,
) -> Plan:
    """Everything a check decides before it runs anything, each bad argument a ValueError or
    TypeError."""
    found = specs.get(spec)
    claimed = specs.resolve_features(found, features)
    if limits is not None and not isinstance(limits, KernelLimits):
        raise TypeError(f"limits must be a KernelLimits, got {type(limits).__name__}")
    if limits is not None:
        found.check_limits(limits)
    names = tuple(_dtype_name(dtype) for dtype in dtypes)
    if not names:
        raise ValueError("dtypes is empty")
    battery, excluded = within_limits(found, cases, claimed, limits)
    return Plan(found, claimed, battery, excluded, names)


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
    cases: str | Sequence[Any] | None = None,
    limits: KernelLimits | None = None,
) -> list[Group]:
    """The (case, dtype) groups ``check_kernel`` runs for these arguments, in its order, without
    running anything: each names a case that ``check_kernel(..., cases=[group.case],
    dtypes=[group.dtype])`` judges alone (the same verdict as inside the whole battery)."""
    plan = _plan(spec, features, dtypes, cases, limits)
    groups = []
    for case in plan.battery:
        detail = not_run(case, plan.claimed, plan.excluded)
        exercised = plan.spec.exercised(case, plan.claimed)
        for name in plan.dtypes:
            groups.append(Group(case.name, name, detail is None, detail or "", exercised))
    return groups


def within_limits(
    spec: Any,
    cases: str | Sequence[Any] | None,
    claimed: frozenset[str],
    limits: KernelLimits | None,
) -> tuple[tuple[Any, ...], dict[str, tuple[str, str]]]:
    """The cases ``spec`` runs (``battery.catalog.select``) for a kernel claiming ``claimed``
    with ``limits``: a battery holds, after each case outside them, its nearest case inside
    them; and for each case outside them (why, the case judged instead). A case named
    explicitly is looked up among the spec's cases and those the limits add to its batteries
    (so that each group ``plan_groups`` lists runs alone); one outside the limits is a
    ValueError: the limits exclude what was asked for, as are limits the claim contradicts."""
    spec = specs.get(spec)
    check_claims(claimed, limits)
    if limits is None:
        return select(spec, cases, claimed), {}
    if cases is None or isinstance(cases, str):
        battery = select(spec, cases, claimed)
        kept, excluded = apply_limits(spec, limits, battery, claimed)
        _check_emptied(spec, claimed, limits, battery, [c for c in kept if c.name not in excluded])
        return kept, excluded
    battery = select(spec, cases, claimed, added_by(spec, claimed, limits))
    for case in battery:
        why = spec.outside(limits, case) if case.needs <= claimed else None
        if why is not None:
            raise ValueError(f"case {case.name!r} is outside the kernel's limits: {why}")
    return battery, {}


def _check_emptied(
    spec: Any, claimed: frozenset[str], limits: KernelLimits, battery: Any, inside: list[Any]
) -> None:
    """A ValueError naming the claimed features that cases of ``battery`` exercise and none of
    the cases ``inside`` the limits does: the limits removed a claim's only cases."""

    def exercised(cases: Any) -> set[str]:
        found: set[str] = set()
        for case in cases:
            if case.needs <= claimed:
                found |= spec.exercised(case, claimed)
        return found

    removed = sorted(exercised(battery) - exercised(inside))
    if removed:
        raise ValueError(
            f"the kernel's limits {limits.declared} leave no case of the claimed feature(s) "
            f"{', '.join(removed)}: drop the claim or widen the limits"
        )


def added_by(spec: Any, claimed: frozenset[str], limits: KernelLimits) -> tuple[Any, ...]:
    """The cases ``limits`` add to ``spec``'s batteries (each the nearest case inside them of
    one outside)."""
    added: dict[str, Any] = {}
    for name in spec.batteries:
        try:
            battery = select(spec, name, claimed)
        except ValueError:  # a battery this spec cannot run (the ring's stress)
            continue
        names = {case.name for case in battery}
        kept, _ = apply_limits(spec, limits, battery, claimed)
        added.update((case.name, case) for case in kept if case.name not in names)
    return tuple(added.values())


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
