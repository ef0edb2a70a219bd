"""The verdict on one attention call (``running.calls.run_case``'s ``Outcome``): each of out,
dq, dk, dv (and lse, where the kernel claims it) judged by the policy (``judge.policy``) against
the golden and the baseline of the case (``golden.attention``), the kept fraction of dropout's
keep-mask read back through SDPA's signature, the draws through flash-attn's, a row for each
input changed in place, a "nondeterministic" row for each result a second call on identical
inputs did not repeat bit for bit, and a row for a call, a backward or a second call that
raised.

Tests: tests/checker/running/test_calls.py
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..golden.attention import case_inputs, dropout_spread, reference
from ..report.rows import KernelError, KernelRow
from ..running import dropout
from ..running.calls import TENSORS, Outcome, Request, failed_row, repeat_rows
from .policy import dtype_checked, judge_draws, judge_keep, judge_lse, judge_tensor

if TYPE_CHECKING:
    from ..spec import Spec


def judge_outcome(
    spec: Spec, request: Request, outcome: Outcome, errors: list[KernelError]
) -> list[KernelRow]:
    """The rows of one case and dtype from what the kernel gave: the forward's results judged
    even when the backward failed, and one row more for that failure."""
    case, dtype = request.case, request.dtype
    rows: list[KernelRow] = []
    keep = None
    if outcome.keep is not None:
        inputs = case_inputs(case, dtype, request.device, request.seed)
        seen = dropout.visible(case, inputs)
        rows.append(judge_keep(case.name, dtype, case.dropout_p, outcome.keep[seen]))
        keep = torch.from_numpy(outcome.keep).to(request.device)
    rows += outcome.changed
    if outcome.kind != "ok":
        return rows + [failed_row(case.name, dtype, outcome.kind, outcome.message,
                                  outcome.error, errors)]  # fmt: skip
    judged = spec.judged_case(case)
    golden, baseline = reference(judged, dtype, request.device, request.seed, keep)
    if outcome.draws is not None:
        spread = dropout_spread(case, dtype, request.device, request.seed)
        rows.append(judge_draws(case.name, dtype, case.dropout_p, outcome.draws,
                                outcome.arrays["out"], spread))  # fmt: skip
    names = ("out",) if request.forward_only or outcome.backward else TENSORS
    for tensor in names:
        row = judge_tensor(
            case.name, dtype, tensor, outcome.arrays[tensor], golden[tensor], baseline[tensor],
            golden.get(f"{tensor}_read_back"),
        )  # fmt: skip
        rows.append(dtype_checked(row, outcome.dtypes[tensor], dtype))
    if request.want_lse:
        row = judge_lse(
            case.name,
            dtype,
            outcome.arrays["lse"],
            golden["lse"],
            baseline["lse"],
            golden.get("lse_shifted"),
        )
        expected = "float32" if dtype in ("float16", "bfloat16") else dtype
        rows.append(dtype_checked(row, outcome.dtypes["lse"], expected))
    rows += repeat_rows(case.name, dtype, outcome, errors)
    if outcome.backward is not None:
        kind, message, error = outcome.backward
        rows.append(failed_row(case.name, dtype, kind, f"the backward: {message}", error, errors))
    return rows
