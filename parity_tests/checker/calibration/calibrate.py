"""The measurement behind the kernel tolerance policy: ``python -m parity_tests --calibrate 60``.

Over many seeds of the default battery it runs the correct kernels (every built-in target but the
isolated, compiled ones, which would compile again for every seed) and every pitfall (each with
its spec), and prints, as Markdown tables for docs/kernel-verification.md:

- per dtype and tensor, the correct kernels' worst ratio ``max|K - G| / max|Bl - G|`` and the
  smallest floor that c = OUTPUT_FACTOR / GRAD_FACTOR would need, ``(error - c * baseline) /
  max|G|``, to pass every row: FLOOR must sit above it;
- the same for the bias statistic: the worst ``rms(K - G) / rms(Bl - G)``, and the largest
  ``rms_error / rms_bound`` (below 1: no correct kernel is flagged);
- per pitfall and dtype, over seeds, the weakest flag: the smallest (over seeds) largest (over
  rows) ``error / bound`` or ``rms_error / rms_bound``. Above 1 on every seed means the pitfall is
  always caught.

The tables cover out, dq, dk, dv, the decode specs' lse and caches, the sparse specs' dsinks,
lse_mla and max_logits, and the linear specs' final_state, dg, dbeta and dinitial_state
(``TRACKED``). Rows of known failures
(``targets.expected.EXPECTED_FAILURES``), skipped and not-run cases are left out.

Tests: tests/checker/calibration/test_calibrate.py
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...tolerances import BIAS_FACTOR, FLOOR, GRAD_FACTOR, OUTPUT_FACTOR
from ..golden import forget
from ..golden.decode import CACHES
from ..pipeline import check_kernel
from ..pitfalls import all_pitfalls
from ..running.calls import TENSORS
from ..targets.builtin import builtin_targets
from ..targets.expected import expected_failure

# The tensors whose ratios the tables show: the attention specs', the decode specs' and the
# sparse specs' (the sinks' gradient, FlashMLA's lse and max_logits) and the linear specs' (the
# final state, the gates', betas' and initial state's gradients) and the serving specs' (vLLM's
# cache after the call, a merge's v and s).
LINEAR = ("final_state", "dg", "dbeta", "dinitial_state")
SERVING = ("kv_cache", "v", "s")
TRACKED = TENSORS + ("lse", *CACHES, "dsinks", "lse_mla", "max_logits", *LINEAR, *SERVING)


@dataclass
class _Worst:
    """The largest value seen so far and where it was seen."""

    value: float = -math.inf
    where: str = ""
    seen: bool = False  # whether anything was seen (a value of -inf too)

    def see(self, value: float, where: str) -> None:
        self.seen = True
        if value > self.value:
            self.value, self.where = value, where


def calibrate(
    seeds: int,
    device: str,
    dtypes: tuple[str, ...],
    battery: str | list[str],
    progress: Any,
    emit: Callable[[str], None],
    specs: tuple[str, ...] | None = None,
    first_seed: int = 0,
) -> int:
    """Run the measurement on ``battery`` (a battery's name, or case names) over ``seeds``
    seeds from ``first_seed`` on and emit the tables (runs over disjoint ranges of seeds, in
    parallel or on other machines, combine: the worst of each table's rows, the weakest flag).

    Returns 0 when the constants hold (no correct kernel fails a row, every pitfall is flagged
    on every seed and dtype), else 1. ``progress`` is the CLI's progress display
    (``parity_tests.progress``): the checks done of all, with the time left. ``specs``
    keeps the targets and pitfalls of those specs only (None: all; the decode specs' own
    command, ``python -m parity_tests.checker.calibration.decode``, keeps theirs).
    """
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    correct = [
        target
        for target in builtin_targets(device, dtypes)
        if not target.isolate and (specs is None or target.spec in specs)
    ]
    pitfalls = {
        name: pitfall
        for name, pitfall in all_pitfalls().items()
        if specs is None or pitfall.spec in specs
    }
    ratio = {(d, t): _Worst() for d in dtypes for t in TENSORS}
    floor = {(d, t): _Worst() for d in dtypes for t in TENSORS}
    bias = {(d, t): _Worst() for d in dtypes for t in TENSORS}
    bias_bound = {(d, t): _Worst() for d in dtypes for t in TENSORS}
    failed: list[str] = []
    weakest = {
        (name, d): _Worst() for name, pitfall in pitfalls.items() for d in dtypes
        if d in pitfall.dtypes
    }  # fmt: skip
    progress.start(f"calibration, seeds {first_seed}..{first_seed + seeds - 1}")
    total, done, seed = seeds * (len(correct) + len(pitfalls)), 0, first_seed
    try:
        for seed in range(first_seed, first_seed + seeds):
            for target in correct:
                progress.update(f"seed {seed}: {target.name}")
                report = target.check(device, battery, seed)
                done += 1
                progress.advance(done, total, "checks")
                for row in report.rows if report is not None else []:
                    if row.verdict in ("skip", "not-run") or expected_failure(
                        target.name, row.case, row.dtype, device
                    ):
                        continue
                    where = f"{target.name} {row.case} seed {seed}"
                    if row.failed:
                        line = f"{where} {row.dtype} {row.tensor}: {row.verdict} {row.detail}"
                        failed.append(line)
                    if row.tensor in TRACKED:
                        factor = OUTPUT_FACTOR if row.tensor == "out" else GRAD_FACTOR
                        key = (row.dtype, row.tensor)
                        ratio.setdefault(key, _Worst()).see(
                            row.error / max(row.baseline, 1e-300), where
                        )
                        floor.setdefault(key, _Worst()).see(
                            (row.error - factor * row.baseline) / max(row.golden_max, 1e-300), where
                        )
                        if not math.isnan(row.rms_error):  # lse has no bias statistic
                            bias.setdefault(key, _Worst()).see(
                                row.rms_error / max(row.rms_baseline, 1e-300), where
                            )
                            bias_bound.setdefault(key, _Worst()).see(row.bias_ratio, where)
            for name, pitfall in pitfalls.items():
                progress.update(f"seed {seed}: pitfall {name}")
                report = check_kernel(
                    pitfall.kernel, spec=pitfall.spec, device=device, dtypes=dtypes, cases=battery,
                    seed=seed,
                )  # fmt: skip
                done += 1
                progress.advance(done, total, "checks")
                for dtype in (d for d in dtypes if d in pitfall.dtypes):
                    strongest = max(_flag(row) for row in report.rows if row.dtype == dtype)
                    # _Worst keeps the largest; the weakest flag is the smallest, so negate.
                    weakest[name, dtype].see(-strongest, f"seed {seed}")
            forget()  # this seed's cases are not asked for again: free their goldens
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli.Terminated): keep what was measured
        progress.done()
        whole = f"seeds {first_seed}..{seed - 1} whole and " if seed > first_seed else ""
        emit(
            f"Stopped during seed {seed}, after {done} of {total} checks: the tables hold "
            f"{whole}seed {seed}'s checks until then.\n"
        )
        span = f"seeds {first_seed}..{seed}, stopped,"
        _emit_tables(emit, span, device, battery, dtypes, ratio, floor, weakest)
        _emit_bias(emit, bias, bias_bound)
        # a stopped run still names every row a correct kernel failed until then ("none" too)
        emit(f"\nRows a correct kernel failed until then: {len(failed) or 'none'}.")
        for line in failed:
            emit(f"- {line}")
        raise
    progress.done()
    span = f"{seeds} seeds ({first_seed}..{first_seed + seeds - 1})"
    _emit_tables(emit, span, device, battery, dtypes, ratio, floor, weakest)
    _emit_bias(emit, bias, bias_bound)
    missed = [f"{name} {d}" for (name, d), w in weakest.items() if not -w.value > 1.0]
    for line in failed + [f"pitfall not flagged on every seed: {m}" for m in missed]:
        emit(f"- {line}")
    return 0 if not failed and not missed else 1


def _flag(row) -> float:
    """How clearly a row flags a broken kernel: error / bound, or rms error / rms bound where
    that is larger; infinite for a verdict that is no matter of degree (NaN or inf, a wrong
    dtype, an input changed in place, a raise)."""
    if row.verdict in ("nonfinite", "dtype", "inplace", "error"):
        return math.inf
    if row.verdict in ("skip", "not-run"):
        return 0.0
    bias = row.bias_ratio
    return row.ratio if math.isnan(bias) else max(row.ratio, bias)


def _weakest_cell(worst: _Worst | None) -> str:
    """A pitfall's weakest flag in one dtype: "-" where it is no mistake, "not run" where a
    stopped calibration did not reach it."""
    if worst is None:
        return "-"
    return f"{-worst.value:.3g}" if worst.seen else "not run"


def _emit_bias(emit, bias, bias_bound) -> None:
    emit(
        f"\nThe bias statistic of the correct kernels: worst rms(K - G) / rms(Bl - G) (BIAS_FACTOR "
        f"= {BIAS_FACTOR:g}), and worst rms error / rms bound (below 1: none flagged).\n"
    )
    emit("| dtype | tensor | worst rms ratio | where | worst rms error / bound | where |")
    emit("|---|---|---|---|---|---|")
    for (dtype, tensor), worst in bias.items():
        if worst.value == -math.inf:
            continue
        bound = bias_bound[dtype, tensor]
        emit(
            f"| {dtype} | {tensor} | {worst.value:.2f} | {worst.where} | {bound.value:.2f} | "
            f"{bound.where} |"
        )


def _emit_tables(emit, seeds, device, battery, dtypes, ratio, floor, weakest) -> None:
    emit(
        f"Correct kernels, {battery} battery, {seeds} on {device}: worst error / baseline "
        f"ratio, and the floor (x max|G|) that c = {OUTPUT_FACTOR:g} (out) / {GRAD_FACTOR:g} "
        f"(grads) would need (negative: c alone suffices).\n"
    )
    emit("| dtype | tensor | worst ratio | where | floor needed | where | FLOOR |")
    emit("|---|---|---|---|---|---|---|")
    for (dtype, tensor), worst in ratio.items():
        if worst.value == -math.inf:  # not measured (a tensor of specs not calibrated)
            continue
        need = floor[dtype, tensor]
        emit(
            f"| {dtype} | {tensor} | {worst.value:.3g} | {worst.where} | "
            f"{need.value:.1e} | {need.where} | {FLOOR[dtype]:.0e} |"
        )
    emit(
        f"\nPitfalls: the weakest flag over {seeds} (min over seeds of max over rows of "
        "error / bound; inf = NaN, a wrong dtype, an input changed in place or a raise).\n"
    )
    emit("| pitfall | " + " | ".join(dtypes) + " |")
    emit("|---|" + "---|" * len(dtypes))
    for name in dict.fromkeys(name for name, _ in weakest):
        cells = [_weakest_cell(weakest.get((name, d))) for d in dtypes]
        emit(f"| {name} | " + " | ".join(cells) + " |")
