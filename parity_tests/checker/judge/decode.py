"""The verdict on one decode call (``running.decode.run_decode``'s ``Outcome``), by the policy
of every spec (``judge.policy``) against the golden and baseline of ``golden.decode``: "out";
"lse" where the kernel claims the feature (float32 for half inputs; under causal ALiBi
flash-attn's convention, which drops the per-row constant, is accepted as for the "flash" spec);
with new tokens, "k_cache" and "v_cache": the slots they go to judged against the golden's
(rotated keys) by the same bound, and any other slot that changed fails the row, however
little; every other argument (and the caches without new tokens) must be left as it was
("inplace" rows, made by the call).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/running/test_decode.py
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..golden.decode import CACHES, decode_expected
from ..report.rows import KernelError, KernelRow
from ..running.calls import Outcome, Request, failed_row
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
    rows.append(dtype_checked(row, outcome.dtypes["out"], dtype))
    if request.want_lse:
        row = judge_lse(case.name, dtype, arrays["lse"], golden["lse"], baseline["lse"],
                        golden.get("lse_shifted"))  # fmt: skip
        row = _either(row, golden, "lse", lambda gold: judge_lse(
            case.name, dtype, arrays["lse"], gold, baseline["lse"]))  # fmt: skip
        expected = "float32" if dtype in ("float16", "bfloat16") else dtype
        rows.append(dtype_checked(row, outcome.dtypes["lse"], expected))
    if slots is not None:
        for name in CACHES:
            rows.append(_judge_cache(case.name, dtype, name, arrays, golden, baseline, slots))
    return rows


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


def _judge_cache(case, dtype, name, arrays, golden, baseline, slots) -> KernelRow:
    """A cache after the call: every slot but the new tokens' exactly as before (else "fail",
    however small the change), the new ones within the bound of the golden's."""
    after, before = arrays[name], arrays[f"{name}_before"]
    changed = after != before  # (pool pages, P, H_kv, W); the inputs hold no NaN
    changed[slots] = False
    if changed.any():
        change = np.abs(after[changed] - before[changed])
        error = float(np.max(change)) if np.all(np.isfinite(change)) else math.inf
        nan = math.nan
        detail = "slots outside the new tokens' [cache_seqlens, cache_seqlens + s_new) changed"
        return KernelRow(case, dtype, name, error, nan, nan, 0.0, "fail", detail)
    return judge_tensor(case, dtype, name, after[slots], golden[name][slots], baseline[name][slots])
