"""The verdict on one linear-attention call (``running.linear.run_linear``'s ``Outcome``) by the
policy of every spec (``judge.policy``) against the golden and baseline of ``golden.linear``: o
and the final state always (the final state is a result of every call, not a feature), and, for
a call with its backward, dq, dk, dv, dg, dbeta and dinitial_state (when an initial state was
given), each by the max and RMS bounds in the kernel's dtype. o and the gradients of q, k, v, g
and beta must come in the inputs' dtype, the final state and dinitial_state in the state's
(float32 for half inputs). dg's floor is on the scale of dq and dk: dg_t = <dP_t, P_t> (P_t =
a_t S_{t-1}; for KDA one such sum over V per key channel) is 0 where the state before a token
is 0 (a first token without an initial state) and tiny where g = -20 wiped it, while a chunked
kernel reaches it through a reverse cumulative sum of terms of the size of q . dq and k . dk
(|q| = |k| = 1) that cancel: its rounding is on their scale, as the suite's structural floors
are (docs/parity.md).

A chunked kernel may have one more error, the chunk allowance: it forms each decay
exp(G_t - G_s) from cumulative log-gates G (sums of g over the chunk so far) held in float32
(fla's kernels cast g to float32 for the cumulative sum; float64 ones in float64), and a
difference of two such sums carries up to |G| eps of absolute error, so each decay factor a
relative error of |G| eps. Where gates are strongly negative (g = -20 every 5th token) |G|
reaches about 260 within a 64-token chunk, and |G| eps32 = 3e-5 is above FLOOR: a correct
chunked kernel lands there (the chunked twin measured up to a third of it), while the recurrent
baseline, multiplying one gate at a time, does not. Every row's bounds get
``CHUNK_ALLOWANCE`` x eps x Gmax x the row's scale (dg: the scale of its floor), Gmax the largest
|sum of g| over 64 consecutive tokens of one sequence, head (and key channel) of the case, eps
float32's (float64's for float64 kernels); ``CHUNK_ALLOWANCE`` = 2 covers the rounding of both
cumulative sums, three times what the twin needs. With typical gates (Gmax ~ 25) it is a
fraction of FLOOR. docs/kernel-verification.md, "Linear-attention kernels", says why this
allowance and not a looser factor. A failing row names where
its worst error is: the sequence, the token within it and the head (the state's rows: the
sequence and head). A second call must give every result bit for bit.

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from ...tolerances import BIAS_FLOOR, FLOOR
from ..battery.linear import CHUNK, make_linear_inputs
from ..golden.linear import linear_expected, state_dtype
from ..report.rows import KernelError, KernelRow
from ..running.calls import Outcome, Request, failed_row, repeat_rows
from .policy import dtype_checked, judge_tensor

if TYPE_CHECKING:
    from ..battery.linear import LinearCase
    from ..spec import Spec

GRADIENT_ROWS = ("dq", "dk", "dv", "dg", "dbeta", "dinitial_state")
STATE_ROWS = ("final_state", "dinitial_state")  # (N, H, K, V), in the state's dtype
_LOCATED = ("fail", "bias", "nonfinite")
CHUNK_ALLOWANCE = 2.0  # x eps x Gmax x scale: both cumulative log-gates' rounding (docstring)


def judge_linear(
    spec: Spec, request: Request, outcome: Outcome, errors: list[KernelError]
) -> list[KernelRow]:
    """The rows of one case and dtype from what the kernel gave."""
    case, dtype = request.case, request.dtype
    rows = list(outcome.changed)
    if outcome.kind != "ok":
        return rows + [failed_row(case.name, dtype, outcome.kind, outcome.message,
                                  outcome.error, errors)]  # fmt: skip
    golden, baseline = linear_expected(case, dtype, request.device, request.seed)
    arrays = outcome.arrays
    names = ["out", "final_state"]
    if not request.forward_only and outcome.backward is None:
        names += [name for name in GRADIENT_ROWS if name in golden]
    relative = chunk_allowance(case, dtype, request.seed)
    for tensor in names:
        row = judge_tensor(case.name, dtype, tensor, arrays[tensor], golden[tensor],
                           baseline[tensor])  # fmt: skip
        scale = row.golden_max
        if tensor == "dg":
            scale = max(_largest(golden["dq"]), _largest(golden["dk"]), scale)
            row = with_floor(row, scale)
        row = with_allowance(row, relative * scale)
        row = located(row, case, arrays[tensor], golden[tensor])
        expected = state_dtype(dtype) if tensor in STATE_ROWS else dtype
        rows.append(dtype_checked(row, outcome.dtypes[tensor], expected))
    rows += repeat_rows(case.name, dtype, outcome, errors)
    if outcome.backward is not None:
        kind, message, error = outcome.backward
        rows.append(failed_row(case.name, dtype, kind, f"the backward: {message}", error, errors))
    return rows


def with_floor(row: KernelRow, scale: float) -> KernelRow:
    """``row`` judged with its floors on ``scale`` where that is larger than its own (a
    "nonfinite" row stays)."""
    if row.verdict == "nonfinite" or scale <= row.golden_max:
        return row
    bound = row.bound + FLOOR[row.dtype] * (scale - row.golden_max)
    rms_bound = row.rms_bound + BIAS_FLOOR[row.dtype] * (scale - row.golden_max)
    verdict = "fail" if row.error > bound else "bias" if row.rms_error > rms_bound else "pass"
    detail = row.detail if verdict == row.verdict else ""
    return dataclasses.replace(row, bound=bound, rms_bound=rms_bound, verdict=verdict,
                               detail=detail)  # fmt: skip


def chunk_allowance(case: LinearCase, dtype: str, seed: int) -> float:
    """CHUNK_ALLOWANCE x eps x Gmax for the case's gates as the kernel gets them (cast to
    ``dtype``): Gmax the largest |sum of g| over CHUNK consecutive tokens of one sequence."""
    g = make_linear_inputs(case, seed).g
    g = np.asarray(g.astype(dtype if dtype != "bfloat16" else "float32"), dtype=np.float64)
    if dtype == "bfloat16":  # NumPy has no bfloat16: round to its 8 bits of mantissa
        g = _round_bfloat16(g)
    if case.cu_seqlens is None:
        spans = [(row, 0, g.shape[1]) for row in range(g.shape[0])]
    else:
        bounds = list(case.cu_seqlens)
        spans = [(0, start, stop) for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]
    largest = 0.0
    for row, start, stop in spans:
        # cumulative sums with a leading 0 along T: a window's sum is a difference of two
        sums = np.cumsum(np.concatenate([np.zeros_like(g[row, :1]), g[row, start:stop]]), axis=0)
        width = min(CHUNK, stop - start)
        if width:
            largest = max(largest, float(np.max(np.abs(sums[width:] - sums[:-width]))))
    eps = float(np.finfo(np.float64 if dtype == "float64" else np.float32).eps)
    return CHUNK_ALLOWANCE * eps * largest


def _round_bfloat16(x: np.ndarray) -> np.ndarray:
    """float64 values rounded to bfloat16 (through float32, nearest even)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def with_allowance(row: KernelRow, allowance: float) -> KernelRow:
    """``row`` with ``allowance`` added to both its bounds (a "nonfinite" row stays)."""
    if row.verdict == "nonfinite" or allowance <= 0:
        return row
    bound, rms_bound = row.bound + allowance, row.rms_bound + allowance
    verdict = "fail" if row.error > bound else "bias" if row.rms_error > rms_bound else "pass"
    detail = row.detail if verdict == row.verdict else ""
    return dataclasses.replace(row, bound=bound, rms_bound=rms_bound, verdict=verdict,
                               detail=detail)  # fmt: skip


def _largest(values: np.ndarray) -> float:
    return float(np.max(np.abs(values), initial=0.0))


def located(row: KernelRow, case: LinearCase, result: np.ndarray, gold: np.ndarray) -> KernelRow:
    """``row``, its detail naming where the worst error is when its numbers are wrong: the
    sequence, its token and the head (o and the token gradients, (B, T, H, ...)), or the
    sequence and head (the state's rows, (N, H, K, V))."""
    if row.verdict not in _LOCATED:
        return row
    finite = np.isfinite(gold)
    error = np.nan_to_num(np.abs(result - np.where(finite, gold, 0.0)), nan=np.inf)
    score = np.where(finite, error, np.where(result == gold, 0.0, np.inf))
    index = np.unravel_index(int(np.argmax(score)), score.shape)
    if row.tensor in STATE_ROWS:
        where = f"worst at sequence {index[0]}, head {index[1]}"
    else:
        sequence, token = int(index[0]), int(index[1])
        if case.cu_seqlens is not None:  # B = 1: the sequence is the one holding the token
            starts = np.asarray(case.cu_seqlens[:-1])
            sequence = int(np.searchsorted(starts, token, side="right") - 1)
            token -= int(starts[sequence])
        where = f"worst at sequence {sequence}, token {token}, head {index[2]}"
    detail = f"{row.detail}; {where}" if row.detail else where
    return dataclasses.replace(row, detail=detail)
