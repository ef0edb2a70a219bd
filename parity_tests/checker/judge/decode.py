"""The verdict on one decode call (``running.decode.run_decode``'s ``Outcome``), by the policy
of every spec (``judge.policy``) against the golden and baseline of ``golden.decode``: "out";
"lse" where the kernel claims the feature (float32 for half inputs; under causal ALiBi
flash-attn's convention, which drops the per-row constant, is accepted as for the "flash" spec);
with new tokens, "k_cache" and "v_cache": the slots they go to judged against the golden's
(rotated keys) by the same bound, and any other slot that changed fails the row, however
little; every other argument (and the caches without new tokens) must be left as it was
("inplace" rows, made by the call). A failing row of out, lse or a cache names where its worst
error is: the sequence, its cache length and the query and head (out, lse) or the slot and
key/value head (the caches), "worst at sequence 2 (cache_seqlens 17), query 0, head 1". A second
call must give out, lse and the caches bit for bit ("nondeterministic" rows,
``running.calls.repeat_rows``).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/running/test_decode.py (where a failing row's worst error is:
tests/checker/judge/test_decode.py)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..golden.decode import CACHES, decode_expected, decode_inputs
from ..report.rows import KernelError, KernelRow
from ..running.calls import Outcome, Request, failed_row, repeat_rows
from .policy import dtype_checked, judge_lse, judge_tensor

if TYPE_CHECKING:
    from ..spec import Spec


def judge_decode(
    spec: Spec, request: Request, outcome: Outcome, errors: list[KernelError]
) -> list[KernelRow]:
    """The rows of one case and dtype from what the kernel gave."""
    case, dtype = request.case, request.dtype
    rows = list(outcome.changed)
    if outcome.kind != "ok":  # "skip", "refused" or "error"
        return rows + [failed_row(case.name, dtype, outcome.kind, outcome.message,
                                  outcome.error, errors)]  # fmt: skip
    golden, baseline, slots = decode_expected(spec, case, dtype, request.device, request.seed)
    arrays = outcome.arrays
    row = judge_tensor(case.name, dtype, "out", arrays["out"], golden["out"], baseline["out"])
    row = _either(row, golden, "out", lambda gold: judge_tensor(
        case.name, dtype, "out", arrays["out"], gold, baseline["out"]))  # fmt: skip
    row = _located(row, case, "out", arrays["out"], golden["out"])
    rows.append(dtype_checked(row, outcome.dtypes["out"], dtype))
    if request.want_lse:
        row = judge_lse(case.name, dtype, arrays["lse"], golden["lse"], baseline["lse"],
                        golden.get("lse_shifted"))  # fmt: skip
        row = _either(row, golden, "lse", lambda gold: judge_lse(
            case.name, dtype, arrays["lse"], gold, baseline["lse"]))  # fmt: skip
        expected = "float32" if dtype in ("float16", "bfloat16") else dtype
        row = _located(row, case, "lse", arrays["lse"], golden["lse"])
        rows.append(dtype_checked(row, outcome.dtypes["lse"], expected))
    if slots is not None:
        inputs = decode_inputs(case, dtype, request.device, request.seed)
        for name in CACHES:
            rows.append(_judge_cache(case, dtype, name, arrays, golden, baseline, slots, inputs))
    return rows + repeat_rows(case.name, dtype, outcome, errors)


def _either(row: KernelRow, golden: dict, tensor: str, judge: Callable) -> KernelRow:
    """``row``, or where it fails and the golden has the other rotary convention (the rotated
    query kept unrounded: ``<tensor>_exact_q``), that convention's row when it passes, saying
    so."""
    other = golden.get(f"{tensor}_exact_q")
    if not row.failed or other is None:
        return row
    alternative = judge(other)
    if alternative.failed:
        return row
    return dataclasses.replace(alternative, detail="the rotated query kept unrounded")


def _judge_cache(case, dtype, name, arrays, golden, baseline, slots, inputs) -> KernelRow:
    """A cache after the call: every slot but the new tokens' exactly as before (else "fail",
    however small the change), the new ones within the bound of the golden's; a failing row
    names the slot of the largest change, or of the worst error."""
    after, before = arrays[name], arrays[f"{name}_before"]
    changed = after != before  # (pool pages, P, H_kv, W); the inputs hold no NaN
    changed[slots] = False
    if changed.any():
        change = np.abs(after[changed] - before[changed])
        error = float(np.max(change)) if np.all(np.isfinite(change)) else math.inf
        nan = math.nan
        detail = "slots outside the new tokens' [cache_seqlens, cache_seqlens + s_new) changed"
        row = KernelRow(case.name, dtype, name, error, nan, nan, 0.0, "fail", detail)
        moved = np.where(changed, np.nan_to_num(np.abs(after - before), nan=np.inf), -1.0)
        page, slot, head = np.unravel_index(np.argmax(moved), moved.shape)[:3]
        return _with_detail(row, _cache_slot(case, inputs, int(page), int(slot), int(head)))
    row = judge_tensor(case.name, dtype, name, after[slots], golden[name][slots],
                       baseline[name][slots])  # fmt: skip
    if row.verdict not in _LOCATED:
        return row
    token, head = _worst(after[slots], golden[name][slots], name)[:2]
    page, slot = (int(i) for i in np.argwhere(slots)[token])
    return _with_detail(row, _cache_slot(case, inputs, page, slot, head))


# The verdicts of a row whose numbers are wrong somewhere (not a dtype, not an exception).
_LOCATED = ("fail", "bias", "nonfinite")
# The axes of out (B, s_q, H, Dv) and lse (B, H, s_q) that hold the sequence, query and head.
_AXES = {"out": (0, 1, 2), "lse": (0, 2, 1)}


def _located(row: KernelRow, case, tensor: str, result: np.ndarray, gold: np.ndarray) -> KernelRow:
    """``row``, its detail naming the sequence, query and head of the worst error when its
    numbers are wrong."""
    if row.verdict not in _LOCATED:
        return row
    index = _worst(result, gold, tensor)
    b, query, head = (index[axis] for axis in _AXES[tensor])
    return _with_detail(row, f"{_sequence(case, b)}, query {query}, head {head}")


def _worst(result: np.ndarray, gold: np.ndarray, tensor: str) -> tuple[int, ...]:
    """The index of the entry that is most wrong: the largest |K - G| where G is finite (a NaN
    or inf there first); where G is not finite, for lse's rows with nothing to see (G -inf),
    anything but +-inf."""
    finite = np.isfinite(gold)
    error = np.nan_to_num(np.abs(result - np.where(finite, gold, 0.0)), nan=np.inf)
    score = np.where(finite, error, 0.0)
    if tensor == "lse":
        score = np.where(np.isneginf(gold) & ~np.isinf(result), np.inf, score)
    return tuple(int(i) for i in np.unravel_index(np.argmax(score), score.shape))


def _cache_slot(case, inputs: dict, page: int, slot: int, head: int) -> str:
    """Where slot ``slot`` of pool page (or cache row) ``page`` is: the sequence that owns it
    and the position in it, or no sequence's."""
    size = case.page_size or case.capacity
    for b in range(case.batch):
        if "block_table" in inputs:
            pages = inputs["block_table"][b].tolist()
        else:
            pages = [int(inputs["cache_batch_idx"][b]) if "cache_batch_idx" in inputs else b]
        if page in pages:
            position = pages.index(page) * size + slot
            return f"{_sequence(case, b)}, slot {position}, kv head {head}"
    return f"worst at page {page}, slot {slot} (no sequence's), kv head {head}"


def _sequence(case, b: int) -> str:
    return f"worst at sequence {b} (cache_seqlens {case.seqlens[b]})"


def _with_detail(row: KernelRow, where: str) -> KernelRow:
    return dataclasses.replace(row, detail=f"{row.detail}; {where}" if row.detail else where)
