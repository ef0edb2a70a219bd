"""The "flashinfer_merge" spec: FlashInfer's cascade merge, one kernel for its two entry points:
``kernel(v_a, s_a, v_b, s_b) -> (v, s)`` as ``merge_state`` and, for the feature ``"states"``,
``kernel(v, s) -> (v, s)`` as ``merge_states`` (a user's adapter dispatches on the count of
arguments: docs/kernel-verification.md): v (T, H, D) or (T, S, H, D) in the kernel's dtype, s
(T, H) or (T, S, H) float32 log-sum-exps in base 2 (FlashInfer's lse), -inf for a state that saw
nothing. The merged v is the states' v weighted by 2^(s - s_max), the merged s their base-2
log-sum-exp; a token whose every state is -inf has v 0 and s -inf.

Its factors: the form (two states through ``merge_state``, or three through ``merge_states``),
the s pattern (close, 2^200 apart, -inf states, all -inf) and 1, 8 or 32 heads. Its feature:
``states`` (a kernel that claims none is judged on the pairwise merge).

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..battery.serving import MERGE_PATTERNS, MergeCase
from ..running.calls import BadResult
from ._serving import ServingSpec

TOKENS = 37


class FlashInferMergeSpec(ServingSpec):
    name = "flashinfer_merge"
    signature = "merge_state(v_a, s_a, v_b, s_b) -> (v, s); merge_states(v, s) -> (v, s)"
    features = frozenset({"states"})
    judged_everywhere = frozenset()
    factors = {"op": ("pair", "states"), "pattern": MERGE_PATTERNS, "heads": ("8", "1", "32")}
    feature_factors = {"states": "op"}

    def values_of(self, case: Any) -> dict[str, str]:
        return {"op": "pair" if case.states == 2 else "states", "pattern": case.pattern,
                "heads": str(case.heads)}  # fmt: skip

    def case_of(self, row: Mapping[str, str], d: int) -> MergeCase:
        states = 2 if row["op"] == "pair" else 3
        name = f"merge-{row['op']}-{row['pattern']}-h{row['heads']}-d{d}"
        return MergeCase(name, self.name, TOKENS, int(row["heads"]), d, states, row["pattern"])

    def call(self, kernel: Callable[..., Any], case: MergeCase, given: dict[str, torch.Tensor],
             want_lse: bool, options: Mapping[str, Any]) -> Any:  # fmt: skip
        v, s = given["v"], given["s"]
        if case.states == 2:
            return kernel(*(t[:, i].contiguous() for i in (0, 1) for t in (v, s)))
        return kernel(v, s)

    def results(self, case: MergeCase, result: Any, given: dict[str, torch.Tensor],
                want_lse: bool) -> dict:  # fmt: skip
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise BadResult(f"the kernel returned {type(result).__name__}, the flashinfer_merge "
                            "spec expects (v, s)")  # fmt: skip
        rows = (case.tokens, case.heads)
        return {"v": (result[0], (*rows, case.d)), "s": (result[1], rows)}

    def targets(self, device: Any, dtypes: tuple[str, ...]) -> list[Any]:
        from ..targets.builtin import Target
        from ..targets.serving import merge, plain_merge

        return [Target("merge_state+merge_states", merge, dtypes, self.name),
                Target("plain_merge", plain_merge, dtypes, self.name)]


SPEC = FlashInferMergeSpec()
