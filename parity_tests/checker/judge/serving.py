"""The verdict on one serving call (``running.serving.run_serving``'s ``Outcome``) by the policy
of every spec (``judge.policy``) against the golden and baseline of ``golden.serving``: out (a
merge's v) by the max and RMS bounds; lse where the kernel claims it, FlashInfer's base-2 lse
(float32), -inf or +inf accepted for a query with nothing to see; a merge's s, whose -inf
entries (no state saw anything) must be the golden's exactly; vLLM's cache after the call: the
slots of ``slot_mapping`` within the bound of the golden's (the new tokens, in the cache's
dtype), every other slot exactly as before, however small the change. A failing row names where
its worst error is: the sequence (its queries and keys), the query and the head; the page, slot
and head of a cache. A second call must give every result bit for bit.

Shape legend: T query tokens, H query heads, P page size.

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..golden.serving import serving_expected, serving_inputs
from ..report.rows import KernelError, KernelRow
from ..running.calls import Outcome, Request, failed_row, repeat_rows
from .policy import dtype_checked, judge_lse, judge_tensor
from .sparse import judge_exact_nonfinite

if TYPE_CHECKING:
    from ..spec import Spec

_LOCATED = ("fail", "bias", "nonfinite")


def judge_serving(
    spec: Spec, request: Request, outcome: Outcome, errors: list[KernelError]
) -> list[KernelRow]:
    """The rows of one case and dtype from what the kernel gave."""
    case, dtype = request.case, request.dtype
    rows = list(outcome.changed)
    if outcome.kind != "ok":
        return rows + [failed_row(case.name, dtype, outcome.kind, outcome.message,
                                  outcome.error, errors)]  # fmt: skip
    golden, baseline = serving_expected(case, dtype, request.device, request.seed)
    arrays, dtypes = outcome.arrays, outcome.dtypes
    half = "float32" if dtype in ("float16", "bfloat16") else dtype
    for tensor in ("out", "v"):
        if tensor in arrays:
            row = judge_tensor(case.name, dtype, tensor, arrays[tensor], golden[tensor],
                               baseline[tensor])  # fmt: skip
            row = _located(row, request, tensor, arrays[tensor], golden[tensor])
            rows.append(dtype_checked(row, dtypes[tensor], dtype))
    if "lse" in arrays:
        row = judge_lse(case.name, dtype, arrays["lse"], golden["lse"], baseline["lse"])
        row = _located(row, request, "lse", arrays["lse"], golden["lse"])
        rows.append(dtype_checked(row, dtypes["lse"], "float32" if half == "float32" else
                                  dtype))  # fmt: skip
    if "s" in arrays:
        row = judge_exact_nonfinite(case.name, dtype, "s", arrays["s"], golden["s"],
                                    baseline["s"])  # fmt: skip
        if row.verdict == "fail" and "FlashMLA" in row.detail:
            row = dataclasses.replace(row, detail="s is finite where every state saw nothing "
                                      "(-inf by FlashInfer's convention), or the reverse")
        rows.append(dtype_checked(_located(row, request, "s", arrays["s"], golden["s"]),
                                  dtypes["s"], "float32"))  # fmt: skip
    if "kv_cache" in arrays:
        rows.append(_judge_cache(request, arrays["kv_cache"], golden["kv_cache"],
                                 baseline["kv_cache"]))  # fmt: skip
    return rows + repeat_rows(case.name, dtype, outcome, errors)


def _judge_cache(request: Request, after: np.ndarray, gold: np.ndarray, base: np.ndarray):
    """vLLM's (2, pages, P, H_kv, D) cache after the call: the new tokens' slots within the
    bound, every other slot as before."""
    case, dtype = request.case, request.dtype
    inputs = serving_inputs(case, dtype, request.device, request.seed)
    slots = inputs["slot_mapping"].cpu().numpy()
    size = case.page_size
    written = np.zeros(after.shape[1:3], dtype=bool)  # (pages, P)
    written[slots // size, slots % size] = True
    before = np.stack([_np(inputs["k_pages"]), _np(inputs["v_pages"])])
    moved = (after != before) & ~written[None, :, :, None, None]
    if moved.any():
        change = np.abs(after - before)[moved]
        error = float(change.max()) if np.all(np.isfinite(change)) else math.inf
        which, page, slot, head = np.argwhere(moved)[0][:4]
        detail = (f"slots outside slot_mapping changed: {('k', 'v')[which]} page {page}, "
                  f"slot {slot}, kv head {head}")  # fmt: skip
        nan = math.nan
        return KernelRow(case.name, dtype, "kv_cache", error, nan, nan, 0.0, "fail", detail)
    pick = (slice(None), written)  # (2, new tokens, H_kv, D)
    row = judge_tensor(case.name, dtype, "kv_cache", after[pick], gold[pick], base[pick])
    if row.verdict in _LOCATED:
        error = np.nan_to_num(np.abs(after[pick] - gold[pick]), nan=np.inf)
        which, token = np.unravel_index(int(np.argmax(error)), error.shape)[:2]
        page, slot = np.argwhere(written)[token]
        detail = f"worst at {('k', 'v')[which]} page {page}, slot {slot}"
        row = dataclasses.replace(row, detail=f"{row.detail}; {detail}" if row.detail else detail)
    return row


def _np(tensor: Any) -> np.ndarray:
    return tensor.detach().cpu().double().numpy()


def _located(row: KernelRow, request: Request, tensor: str, result: np.ndarray,
             gold: np.ndarray) -> KernelRow:  # fmt: skip
    """``row``, its detail naming the token (its sequence, query and keys) and head of the
    worst error when its numbers are wrong."""
    if row.verdict not in _LOCATED:
        return row
    finite = np.isfinite(gold)
    error = np.nan_to_num(np.abs(result - np.where(finite, gold, 0.0)), nan=np.inf)
    score = np.where(finite, error, np.where(result == gold, 0.0, np.inf))
    if tensor == "lse":
        score = np.where(np.isneginf(gold) & np.isinf(result), 0.0, score)
    index = np.unravel_index(int(np.argmax(score)), score.shape)
    token, head = int(index[0]), int(index[-1] if tensor == "s" else index[1])
    case = request.case
    if hasattr(case, "q_lens"):
        ends = np.cumsum(case.q_lens)
        b = int(np.searchsorted(ends, token, side="right"))
        query = token - (int(ends[b - 1]) if b else 0)
        where = (f"worst at sequence {b} ({case.q_lens[b]} queries, {case.kv_lens[b]} keys), "
                 f"query {query}, head {head}")  # fmt: skip
    else:
        where = f"worst at token {token}, head {head}"
    return dataclasses.replace(row, detail=f"{row.detail}; {where}" if row.detail else where)
