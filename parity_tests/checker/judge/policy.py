"""The tolerance policy applied to one tensor: a kernel's result against the float64 golden G and
the plain same-dtype baseline Bl,

    max|K - G| <= c * max|Bl - G| + FLOOR[dtype] * max|G|

with c = OUTPUT_FACTOR for the output and GRAD_FACTOR for gradients (``parity_tests.tolerances``,
measured in docs/kernel-verification.md); beside it the bias statistic, which a small error made
everywhere cannot slip under,

    rms(K - G) <= BIAS_FACTOR * max(rms(Bl - G), rms(R - G), rms(rd(G) - G))
                  + BIAS_FLOOR[dtype] * rms(G)

(for dq, dk and dv, R is the exact answer of a kernel that reads back its stored output and
lse, and max|Bl - G| in the max bound is max|R - G| where that is larger; ``judge_tensor``)

(the rounding of a correct kernel is about as spread as the baseline's, while a systematic error
adds to every entry; rd(G) is the golden stored in the kernel's dtype, the rounding no kernel
avoids, which stands in for the baseline's where that overflowed); lse as the libraries return it (a
row with nothing to see may carry -inf or +inf; under causal ALiBi flash-attn's convention, shifted
by slope_h * p_i, is recognised exactly, docs/derivations/alibi.md); the kept fraction of dropout
against 1 - p; and, where the signature returns no keep-mask (flash-attn's), the outputs of many
draws at p against what dropout does to the output at p = 0 (``judge_draws``); and a second call on
identical inputs against the first, bit for bit (``difference``, ``judge_repeat``). Pure NumPy on
float64 arrays: running the kernel is ``checker.running.calls``' job.

Tests: tests/checker/judge/test_policy.py
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...tolerances import (
    BIAS_FACTOR,
    BIAS_FLOOR,
    DROPOUT_SIGMAS,
    FLOOR,
    GRAD_FACTOR,
    OUTPUT_FACTOR,
)
from ..report.rows import KernelRow


def judge_tensor(
    case: str,
    dtype: str,
    tensor: str,
    result: np.ndarray,
    gold: np.ndarray,
    base: np.ndarray,
    read_back: np.ndarray | None = None,
) -> KernelRow:
    """One tensor's row: error and bound over the entries where the golden is finite (all of
    them, unless an input overflowed in its cast), and the bias statistic over the same entries.

    The reference error the bounds scale is the plain baseline's, or, where larger, that of
    ``read_back``: the exact answer of a kernel that reads its own output back as stored in the
    dtype and recomputes its weights from lse as stored (dq, dk and dv of FlashAttention's
    backward, ``golden.attention._read_back``), a choice a correct kernel may make. The row's
    ``baseline`` and ``rms_baseline`` are that larger error. A NaN or inf in ``result`` there is
    "nonfinite" at once. A baseline that is itself NaN or inf there
    (plain half-precision math overflows on extreme logits) leaves the floors (and
    ``read_back``'s error) alone as the bounds, and the row says so. The verdict is "fail" above
    the max bound, else "bias" above the RMS bound, else "pass".
    """
    finite = np.isfinite(gold)
    factor = OUTPUT_FACTOR if tensor == "out" else GRAD_FACTOR
    golden = gold[finite]
    golden_max = float(np.max(np.abs(golden), initial=0.0))
    floor = FLOOR[dtype] * golden_max
    rms_floor = BIAS_FLOOR[dtype] * _rms(golden)
    rms_storage = _rms(stored(golden, dtype) - golden)
    other, rms_other = 0.0, 0.0
    if read_back is not None:
        other = float(np.max(np.abs(read_back[finite] - golden), initial=0.0))
        rms_other = _rms(read_back[finite] - golden)
    detail = ""
    if np.all(np.isfinite(base[finite])):
        baseline = max(float(np.max(np.abs(base[finite] - golden), initial=0.0)), other)
        bound = factor * baseline + floor
        rms_baseline = max(_rms(base[finite] - golden), rms_other)
        rms_bound = BIAS_FACTOR * max(rms_baseline, rms_storage) + rms_floor
    else:
        baseline, rms_baseline, detail = math.nan, math.nan, "floor-only bound: baseline NaN/inf"
        bound = factor * other + floor
        rms_bound = BIAS_FACTOR * max(rms_other, rms_storage) + rms_floor
    if not np.all(np.isfinite(result[finite])):
        detail = "NaN or inf where the golden is finite"
        return KernelRow(
            case, dtype, tensor, math.inf, baseline, golden_max, bound, "nonfinite", detail
        )
    error = float(np.max(np.abs(result[finite] - golden), initial=0.0))
    rms_error = _rms(result[finite] - golden)
    verdict = "pass"
    if error > bound:
        verdict = "fail"
    elif rms_error > rms_bound:
        verdict, detail = "bias", "rms error above its bound: a systematic error everywhere"
    return KernelRow(
        case, dtype, tensor, error, baseline, golden_max, bound, verdict, detail, 0, rms_error,
        rms_bound, rms_baseline,
    )  # fmt: skip


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values)))) if values.size else 0.0


_LARGEST = {"float16": float(np.finfo(np.float16).max), "bfloat16": 3.3895313892515355e38}


def stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """Float64 ``values`` rounded to ``dtype`` (round to nearest, ties to even) and back: what a
    kernel that computed them exactly would return. Beyond the dtype's largest finite value they
    are clipped to it (a kernel's inf there is judged "nonfinite" anyway). bfloat16, which NumPy
    lacks, keeps the top 16 bits of the float32 value."""
    if dtype == "float64":
        return np.asarray(values, dtype=np.float64)
    if dtype == "float32":
        return np.asarray(values).astype(np.float32).astype(np.float64)
    clipped = np.clip(values, -_LARGEST[dtype], _LARGEST[dtype])
    if dtype == "float16":
        return clipped.astype(np.float16).astype(np.float64)
    bits = clipped.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round half to even on bit 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def judge_lse(
    case: str,
    dtype: str,
    result: np.ndarray,
    gold: np.ndarray,
    base: np.ndarray,
    shifted: np.ndarray | None = None,
) -> KernelRow:
    """The lse row. Where the golden is -inf (a row with nothing to see) the kernel may give
    -inf or +inf (flash-attn's CUDA kernels write +inf), nothing else; elsewhere the max bound.
    ``shifted`` is the other accepted convention (flash-attn's causal ALiBi lse): the row passes
    if it is within the bound of either, and says which it matched."""
    dead = np.isneginf(gold)
    if np.any(np.isfinite(result[dead])) or np.any(np.isnan(result[dead])):
        detail = "a row with nothing to attend to must have lse -inf (or +inf)"
        nan = math.nan
        return KernelRow(case, dtype, "lse", math.inf, nan, nan, nan, "fail", detail)
    row = judge_tensor(case, dtype, "lse", result, gold, base)
    row = dataclasses.replace(row, rms_error=math.nan, rms_bound=math.nan, rms_baseline=math.nan)
    if row.verdict == "bias":
        row = dataclasses.replace(row, verdict="pass", detail="")
    if row.verdict == "fail" and shifted is not None:
        finite = np.isfinite(gold)
        shift = np.zeros_like(gold)
        shift[finite] = shifted[finite] - gold[finite]  # the baseline shifted alike
        other = judge_tensor(case, dtype, "lse", result, shifted, base + shift)
        if other.error <= other.bound:
            detail = "lse in flash-attn's causal ALiBi convention (shifted by slope_h * p_i)"
            nan = math.nan
            return dataclasses.replace(
                other, verdict="pass", detail=detail, rms_error=nan, rms_bound=nan, rms_baseline=nan
            )
    return row


def judge_keep(case: str, dtype: str, dropout_p: float, keep: np.ndarray) -> KernelRow:
    """The kept fraction of the bool keep-mask ``keep`` against 1 - p, within DROPOUT_SIGMAS
    binomial standard deviations (row "keep"; ``golden_max`` holds 1 - p)."""
    p = dropout_p
    if keep.size == 0:
        nan = math.nan
        return KernelRow(case, dtype, "keep", 0.0, nan, 1.0 - p, 0.0, "pass", "nothing visible")
    error = abs(float(np.mean(keep)) - (1.0 - p))
    bound = DROPOUT_SIGMAS * math.sqrt(p * (1.0 - p) / keep.size)
    verdict = "pass" if error <= bound else "fail"
    detail = f"kept fraction should be {1 - p:g}"
    return KernelRow(case, dtype, "keep", error, math.nan, 1.0 - p, bound, verdict, detail)


def judge_draws(
    case: str,
    dtype: str,
    dropout_p: float,
    draws: np.ndarray,
    center: np.ndarray,
    spread: np.ndarray,
) -> KernelRow:
    """The "keep" row of dropout judged by draws: ``draws`` (K, ..., Dv) are outputs at p,
    ``center`` (..., Dv) the kernel's own output at p = 0 and ``spread`` (..., Dv) the variance
    sigma^2 that dropout gives each entry (``reference.dropout_variance``).

    Over the R rows (the entries of one query row share their draws of the keep-mask, the rows
    are independent), each normalised by its variance w_r = sum_c sigma^2:

        moved = mean over draws and rows of sum_c (draw - center)^2 / w_r       (expected 1)
        mean  = mean over rows of sum_c (mean of draws - center)^2 / (w_r / K)   (expected 1)

    ``moved`` near 0 is a kernel that ignores dropout_p (its draws equal its p = 0 output),
    far above 1 one that drops too much; ``mean`` above 1 one whose expectation is not the p = 0
    output (a missing 1 / (1 - p) rescale). Each is held within DROPOUT_SIGMAS of its standard
    deviation: at most sqrt(kappa / (K R)) for ``moved``, with kappa = max(2, p^2 / (1 - p) +
    (1 - p)^2 / p - 1) the relative variance of a squared dropout term, Gaussian or two-point,
    and sqrt((2 + max(0, kappa - 2) / K) / R) for ``mean``. The row's error and bound are
    those of the test further outside its bound.
    """
    nan = math.nan
    if not np.all(np.isfinite(draws)):
        detail = "NaN or inf in an output at dropout_p"
        return KernelRow(case, dtype, "keep", math.inf, nan, 1.0, nan, "nonfinite", detail)
    weights = spread.sum(axis=-1)  # w_r, (...)
    live = weights > 0  # rows with something to drop
    rows, draw_count = int(live.sum()), draws.shape[0]
    if rows == 0:
        return KernelRow(case, dtype, "keep", 0.0, nan, 1.0, 0.0, "pass", "no row to drop from")
    deviations = draws - center  # (K, ..., Dv)
    moved = float(np.mean(np.sum(deviations**2, axis=-1)[:, live] / weights[live]))
    mean = float(np.mean(np.sum(deviations.mean(axis=0) ** 2, axis=-1)[live]
                         / (weights[live] / draw_count)))  # fmt: skip
    p = dropout_p
    kappa = max(2.0, p * p / (1.0 - p) + (1.0 - p) ** 2 / p - 1.0)
    moved_bound = DROPOUT_SIGMAS * math.sqrt(kappa / (draw_count * rows))
    mean_bound = DROPOUT_SIGMAS * math.sqrt((2.0 + max(0.0, kappa - 2.0) / draw_count) / rows)
    tests = [
        (abs(moved - 1.0), moved_bound,
         f"draws at p = {p:g} move the output {moved:.3g} times as much as dropout does"),
        (max(0.0, mean - 1.0), mean_bound,
         f"the mean of {draw_count} draws is {mean:.3g} times as far from the p = 0 output as "
         "dropout's own spread allows"),
    ]  # fmt: skip
    error, bound, detail = max(tests, key=lambda test: test[0] / test[1])
    verdict = "pass" if error <= bound else "fail"
    return KernelRow(case, dtype, "keep", error, nan, 1.0, bound, verdict, detail)


def difference(first: np.ndarray, second: np.ndarray) -> float:
    """max|second - first| over the entries where two results differ: 0.0 when they are equal bit
    for bit (``torch.equal``'s sense, with NaN at the same positions equal), inf where one holds
    NaN and the other not, or infinities of opposite signs. The arrays are float64 copies of the
    kernel's tensors, exact for every dtype it returns, so they differ where the tensors do."""
    if first.shape != second.shape:
        return math.inf
    same = (first == second) | (np.isnan(first) & np.isnan(second))
    if np.all(same):
        return 0.0
    with np.errstate(invalid="ignore"):  # inf - inf
        gap = np.abs(second[~same] - first[~same])
    return float(np.max(np.where(np.isnan(gap), math.inf, gap)))


def judge_repeat(case: str, dtype: str, tensor: str, gap: float) -> KernelRow:
    """The "nondeterministic" row of ``tensor``, which a second call on identical inputs (fresh
    copies, the same torch seed) gave ``gap`` = max|second - first| away from the first: the
    bound is 0, bit for bit."""
    detail = f"{tensor} differs from call to call on identical inputs: max|difference| {gap:.3g}"
    nan = math.nan
    return KernelRow(case, dtype, tensor, gap, nan, nan, 0.0, "nondeterministic", detail)


def wrong_dtype(row: KernelRow, got: str) -> KernelRow:
    """``row`` with the verdict "dtype": the kernel returned ``got`` for inputs of ``row.dtype``.
    Its error and bound stay, for information; no bound makes a wrong dtype right."""
    detail = f"{row.tensor} is {got}, the inputs are {row.dtype}"
    return dataclasses.replace(row, verdict="dtype", detail=detail)


def unmeasured(case: str, dtype: str, verdict: str, detail: str, exception: int = 0) -> KernelRow:
    """The one row of a case that produced nothing to measure ("error" or "skip")."""
    nan = math.nan
    return KernelRow(case, dtype, "-", nan, nan, nan, nan, verdict, detail, exception)


def dtype_checked(row: KernelRow, got: str, expected: str) -> KernelRow:
    """``row``, or its "dtype" verdict when the result was ``got`` where ``expected`` was due
    (lse: float32 for half-precision inputs, as the libraries return it)."""
    if got == expected:
        return row
    return wrong_dtype(row, got) if row.tensor != "lse" else _wrong_lse_dtype(row, got, expected)


def _wrong_lse_dtype(row: KernelRow, got: str, expected: str) -> KernelRow:
    detail = f"lse is {got}, the libraries return {expected} for inputs of {row.dtype}"
    return dataclasses.replace(row, verdict="dtype", detail=detail)
