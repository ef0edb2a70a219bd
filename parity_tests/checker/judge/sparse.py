"""The verdict on one sparse call (``running.sparse.run_sparse``'s ``Outcome``) by the policy of
every spec (``judge.policy``) against the golden and baseline of ``golden.sparse``: out and, for
a spec with a backward, dq, dk, dv and dsinks by the max and RMS bounds; lse where the kernel
claims it (the core's: -inf or +inf accepted for a row with nothing to see); FlashMLA's lse and
max_logits, always returned, whose non-finite entries must be the golden's exactly (a lonely
query's lse +inf, its max_logits -inf: the convention the callers merge by); float32 for half
inputs. A failing row names the query token and head of its worst error (and, for a key
gradient, the key row). A second call must give every result bit for bit.

Tests: tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from ..golden.sparse import sparse_expected
from ..report.rows import KernelError, KernelRow
from ..running.calls import Outcome, Request, failed_row, repeat_rows
from .policy import dtype_checked, judge_lse, judge_tensor

if TYPE_CHECKING:
    from ..spec import Spec

GRADIENT_ROWS = ("dq", "dk", "dv", "dsinks")
EXACT_NONFINITE = ("lse_mla", "max_logits")
_LOCATED = ("fail", "bias", "nonfinite")
_KEY_ROWS = ("dk", "dv")


def judge_sparse(
    spec: Spec, request: Request, outcome: Outcome, errors: list[KernelError]
) -> list[KernelRow]:
    """The rows of one case and dtype from what the kernel gave."""
    case, dtype = request.case, request.dtype
    rows = list(outcome.changed)
    if outcome.kind != "ok":
        return rows + [failed_row(case.name, dtype, outcome.kind, outcome.message,
                                  outcome.error, errors)]  # fmt: skip
    golden, baseline = sparse_expected(case, dtype, request.device, request.seed)
    arrays = outcome.arrays
    half = "float32" if dtype in ("float16", "bfloat16") else dtype
    names = ["out"]
    if not request.forward_only and outcome.backward is None:
        names += [name for name in GRADIENT_ROWS if name in golden]
    for tensor in names:
        row = judge_tensor(case.name, dtype, tensor, arrays[tensor], golden[tensor],
                           baseline[tensor])  # fmt: skip
        row = _located(row, tensor, arrays[tensor], golden[tensor])
        rows.append(dtype_checked(row, outcome.dtypes[tensor], dtype))
    if request.want_lse and "lse" in arrays:
        row = judge_lse(case.name, dtype, arrays["lse"], golden["lse"], baseline["lse"])
        row = _located(row, "lse", arrays["lse"], golden["lse"])
        rows.append(dtype_checked(row, outcome.dtypes["lse"], half))
    for tensor in EXACT_NONFINITE:
        if tensor in arrays:
            row = judge_exact_nonfinite(case.name, dtype, tensor, arrays[tensor],
                                        golden[tensor], baseline[tensor])  # fmt: skip
            row = _located(row, tensor, arrays[tensor], golden[tensor])
            rows.append(dtype_checked(row, outcome.dtypes[tensor], half))
    rows += repeat_rows(case.name, dtype, outcome, errors)
    if outcome.backward is not None:
        kind, message, error = outcome.backward
        rows.append(failed_row(case.name, dtype, kind, f"the backward: {message}", error, errors))
    return rows


def judge_exact_nonfinite(
    case: str, dtype: str, tensor: str, result: np.ndarray, gold: np.ndarray, base: np.ndarray
) -> KernelRow:
    """``tensor``'s row where the golden's non-finite entries (+inf or -inf by convention) must
    be the kernel's exactly, and the finite ones are within the max bound (no RMS bound: these
    are per-row statistics, not a field of numbers)."""
    odd = ~np.isfinite(gold)
    row = judge_tensor(case, dtype, tensor, result, gold, np.where(odd, gold, base))
    row = dataclasses.replace(row, rms_error=math.nan, rms_bound=math.nan, rms_baseline=math.nan)
    if np.any(result[odd] != gold[odd]):  # the bound stays: error / bound is inf, a clear flag
        where = np.argwhere(odd & (result != gold))[0]
        got, want = result[tuple(where)], gold[tuple(where)]
        detail = (f"{tensor} is {got} where a query with no valid entry has {want} by "
                  "FlashMLA's convention")  # fmt: skip
        return dataclasses.replace(row, error=math.inf, verdict="fail", detail=detail)
    return dataclasses.replace(row, verdict="pass", detail="") if row.verdict == "bias" else row


def _located(row: KernelRow, tensor: str, result: np.ndarray, gold: np.ndarray) -> KernelRow:
    """``row``, its detail naming where the worst error is when its numbers are wrong: the query
    token and head (out, lse, dq), the key row and key head (dk, dv), the head (dsinks)."""
    if row.verdict not in _LOCATED:
        return row
    finite = np.isfinite(gold)
    error = np.nan_to_num(np.abs(result - np.where(finite, gold, 0.0)), nan=np.inf)
    score = np.where(finite, error, np.where(result == gold, 0.0, np.inf))
    index = np.unravel_index(int(np.argmax(score)), score.shape)
    if tensor == "dsinks":
        where = f"worst at head {index[0]}"
    elif tensor in _KEY_ROWS:
        where = f"worst at key row {index[0]}, kv head {index[1]}"
    else:
        where = f"worst at query token {index[0]}, head {index[1]}"
    detail = f"{row.detail}; {where}" if row.detail else where
    return dataclasses.replace(row, detail=detail)
