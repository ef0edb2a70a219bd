"""The tolerance policy applied to one tensor: a kernel's result against the float64 golden G and
the plain same-dtype baseline Bl,

    max|K - G| <= c * max|Bl - G| + FLOOR[dtype] * max|G|

with c = OUTPUT_FACTOR for the output and GRAD_FACTOR for gradients (``parity_tests.tolerances``,
measured in docs/kernel-verification.md), and the kept fraction of dropout against 1 - p. Pure
NumPy on float64 arrays: running the kernel is ``checker.kernels``' job.

Tests: tests/checker/test_judge.py
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..tolerances import DROPOUT_SIGMAS, FLOOR, GRAD_FACTOR, OUTPUT_FACTOR
from .report import KernelRow


def judge_tensor(
    case: str, dtype: str, tensor: str, result: np.ndarray, gold: np.ndarray, base: np.ndarray
) -> KernelRow:
    """One tensor's row: error and bound over the entries where the golden is finite (all of
    them, unless an input overflowed in its cast).

    A NaN or inf in ``result`` there is "nonfinite" at once. A baseline that is itself NaN or inf
    there (plain half-precision math overflows on extreme logits) leaves the floor alone as the
    bound, and the row says so.
    """
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
        detail = "NaN or inf where the golden is finite"
        return KernelRow(
            case, dtype, tensor, math.inf, baseline, golden_max, bound, "nonfinite", detail
        )
    error = float(np.max(np.abs(result[finite] - gold[finite]), initial=0.0))
    verdict = "pass" if error <= bound else "fail"
    return KernelRow(case, dtype, tensor, error, baseline, golden_max, bound, verdict, detail)


def judge_keep(case: str, dtype: str, dropout_p: float, keep: np.ndarray) -> KernelRow:
    """The kept fraction of the bool keep-mask ``keep`` against 1 - p, within DROPOUT_SIGMAS
    binomial standard deviations (row "keep"; ``golden_max`` holds 1 - p)."""
    p = dropout_p
    error = abs(float(np.mean(keep)) - (1.0 - p))
    bound = DROPOUT_SIGMAS * math.sqrt(p * (1.0 - p) / keep.size)
    verdict = "pass" if error <= bound else "fail"
    detail = f"kept fraction should be {1 - p:g}"
    return KernelRow(case, dtype, "keep", error, math.nan, 1.0 - p, bound, verdict, detail)


def wrong_dtype(row: KernelRow, got: str) -> KernelRow:
    """``row`` with the verdict "dtype": the kernel returned ``got`` for inputs of ``row.dtype``.
    Its error and bound stay, for information; no bound makes a wrong dtype right."""
    detail = f"{row.tensor} is {got}, the inputs are {row.dtype}"
    return dataclasses.replace(row, verdict="dtype", detail=detail)


def unmeasured(case: str, dtype: str, verdict: str, detail: str, exception: int = 0) -> KernelRow:
    """The one row of a case that produced nothing to measure ("error" or "skip")."""
    nan = math.nan
    return KernelRow(case, dtype, "-", nan, nan, nan, nan, verdict, detail, exception)
