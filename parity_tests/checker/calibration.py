"""The measurement behind the kernel tolerance policy: ``python -m parity_tests --calibrate 60``.

Over many seeds of the default battery it runs the correct kernels (every built-in target) and
every pitfall, and prints, as Markdown tables for
docs/kernel-verification.md:

- per dtype and tensor, the correct kernels' worst ratio ``max|K - G| / max|Bl - G|`` and the
  smallest floor that c = OUTPUT_FACTOR / GRAD_FACTOR would need, ``(error - c * baseline) /
  max|G|``, to pass every row: FLOOR must sit above it;
- per pitfall and dtype, over seeds, the weakest flag: the smallest (over seeds) largest (over
  rows) ``error / bound``. Above 1 on every seed means the pitfall is always caught.

Rows of known failures (``targets.EXPECTED_FAILURES``) and skipped cases are left out.

Tests: tests/checker/test_calibration.py
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..tolerances import FLOOR, GRAD_FACTOR, OUTPUT_FACTOR
from .kernels import TENSORS, check_kernel
from .pitfalls import PITFALLS
from .targets import builtin_targets, expected_failure


@dataclass
class _Worst:
    """The largest value seen so far and where it was seen."""

    value: float = -math.inf
    where: str = ""

    def see(self, value: float, where: str) -> None:
        if value > self.value:
            self.value, self.where = value, where


def calibrate(
    seeds: int,
    device: str,
    dtypes: tuple[str, ...],
    battery: str,
    progress: Any,
    emit: Callable[[str], None],
) -> int:
    """Run the measurement on ``battery`` over ``range(seeds)`` and emit the tables.

    Returns 0 when the constants hold (no correct kernel fails a row, every pitfall is flagged
    on every seed and dtype), else 1. ``progress`` is the CLI's progress display.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    correct = builtin_targets(device, dtypes)
    ratio = {(d, t): _Worst() for d in dtypes for t in TENSORS}
    floor = {(d, t): _Worst() for d in dtypes for t in TENSORS}
    failed: list[str] = []
    weakest = {(name, d): _Worst() for name in PITFALLS for d in dtypes}
    for seed in range(seeds):
        progress.start(f"calibration seed {seed + 1}/{seeds}")
        for target in correct:
            report = check_kernel(
                target.kernel, device=device, dtypes=target.dtypes, cases=battery, seed=seed
            )
            for row in report.rows:
                if row.verdict == "skip" or expected_failure(
                    target.name, row.case, row.dtype, device
                ):
                    continue
                where = f"{target.name} {row.case} seed {seed}"
                if row.failed:
                    failed.append(f"{where} {row.dtype} {row.tensor}: {row.verdict} {row.detail}")
                if row.tensor in TENSORS:
                    factor = OUTPUT_FACTOR if row.tensor == "out" else GRAD_FACTOR
                    key = (row.dtype, row.tensor)
                    ratio[key].see(row.error / max(row.baseline, 1e-300), where)
                    floor[key].see(
                        (row.error - factor * row.baseline) / max(row.golden_max, 1e-300), where
                    )
        for name, pitfall in PITFALLS.items():
            report = check_kernel(
                pitfall.kernel, device=device, dtypes=dtypes, cases=battery, seed=seed
            )
            for dtype in dtypes:
                strongest = max(_flag(row) for row in report.rows if row.dtype == dtype)
                # _Worst keeps the largest; the weakest flag is the smallest, so negate.
                weakest[name, dtype].see(-strongest, f"seed {seed}")
    progress.done()
    _emit_tables(emit, seeds, device, battery, dtypes, ratio, floor, weakest)
    missed = [f"{name} {d}" for (name, d), w in weakest.items() if not -w.value > 1.0]
    for line in failed + [f"pitfall not flagged on every seed: {m}" for m in missed]:
        emit(f"- {line}")
    return 0 if not failed and not missed else 1


def _flag(row) -> float:
    """How clearly a row flags a broken kernel: error / bound; infinite for a verdict that is no
    matter of degree (NaN or inf, a wrong dtype, an input changed in place, a raise)."""
    if row.verdict in ("nonfinite", "dtype", "inplace", "error"):
        return math.inf
    return 0.0 if row.verdict == "skip" else row.ratio


def _emit_tables(emit, seeds, device, battery, dtypes, ratio, floor, weakest) -> None:
    emit(
        f"Correct kernels, {battery} battery, {seeds} seeds on {device}: worst error / baseline "
        f"ratio, and the floor (x max|G|) that c = {OUTPUT_FACTOR:g} (out) / {GRAD_FACTOR:g} "
        f"(grads) would need (negative: c alone suffices).\n"
    )
    emit("| dtype | tensor | worst ratio | where | floor needed | where | FLOOR |")
    emit("|---|---|---|---|---|---|---|")
    for (dtype, tensor), worst in ratio.items():
        need = floor[dtype, tensor]
        emit(
            f"| {dtype} | {tensor} | {worst.value:.2f} | {worst.where} | "
            f"{need.value:.1e} | {need.where} | {FLOOR[dtype]:.0e} |"
        )
    emit(
        f"\nPitfalls: the weakest flag over {seeds} seeds (min over seeds of max over rows of "
        "error / bound; inf = NaN, a wrong dtype, an input changed in place or a raise).\n"
    )
    emit("| pitfall | " + " | ".join(dtypes) + " |")
    emit("|---|" + "---|" * len(dtypes))
    for name in PITFALLS:
        cells = [f"{-weakest[name, d].value:.3g}" for d in dtypes]
        emit(f"| {name} | " + " | ".join(cells) + " |")
