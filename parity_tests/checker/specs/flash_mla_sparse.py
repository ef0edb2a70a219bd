"""The "flash_mla_sparse" spec: FlashMLA's ``flash_mla_sparse_fwd(q, kv, indices, sm_scale,
d_v=512, attn_sink=None, topk_length=None) -> (out, max_logits, lse)``, DeepSeek-V3.2's sparse
prefill: q (S_q, H, 576), one latent head kv (S_kv, 1, 576) whose first ``d_v`` = 512 numbers
are V, indices (S_q, 1, topk) int32 (-1 or >= S_kv invalid), the layer's scale
(128 + 64)^-0.5; forward only. Its conventions, from FlashMLA's tests/ref.py: ``attn_sink``
(H,) float32 scales the output by exp(lse) / (exp(lse) + exp(sink)) and is no part of lse or
max_logits; a query with no valid entry has out 0, lse +inf and max_logits -inf; lse and
max_logits float32.

Its factors: 16, 64 or 128 query heads (DeepSeek's shards: S_q * H past a 64-row tile),
``sinks``, ``topk_length`` and the lists' pattern (``battery.sparse.PATTERNS``). Its features:
``sinks``, ``topk_length`` and ``lse`` (lse and max_logits are always returned and always
judged).

Tests: tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..battery.decode.case import MLA_D, MLA_DV, MLA_SCALE
from ..battery.sparse import TOPK, Requirement, SparseCase
from ..running.calls import BadResult
from ._sparse import SparseSpec, on

S_Q = 8
ROWS = 64  # FlashMLA's tile of query rows


class FlashMlaSparseSpec(SparseSpec):
    name = "flash_mla_sparse"
    signature = ("flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, "
                 "topk_length=None)")  # fmt: skip
    features = frozenset({"sinks", "topk_length", "lse"})
    backward = False
    widths = (MLA_D,)
    factors = {
        "heads": ("16", "64", "128"),
        "sinks": ("off", "on"),
        "topk_length": ("off", "on"),
        "pattern": ("overlap", "duplicates", "sentinels", "dead"),
    }
    feature_factors = {"sinks": "sinks", "topk_length": "topk_length"}

    def values_of(self, case: Any) -> dict[str, str]:
        return {"heads": str(case.heads), "sinks": "on" if case.sinks else "off",
                "topk_length": "on" if case.topk_length else "off",
                "pattern": case.pattern}  # fmt: skip

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Requirement, ...]:
        """D = 576, and a call of more query rows than one 64-row tile."""
        rows = Requirement(f"S_q * H > {ROWS} (a second tile of query rows)", "rows", ROWS)
        return (*super().requirements(claimed), rows)

    def row_for(self, requirement: Requirement, claimed: frozenset[str] | None) -> dict:
        row = super().row_for(requirement, claimed)
        row["heads"] = self.factors["heads"][-1]
        return row

    def case_of(self, row: Mapping[str, str], d: int) -> SparseCase:
        heads = int(row["heads"])
        flags = [row["pattern"], f"h{heads}"]
        flags += [name for name in ("sinks", "topk_length") if on(row[name])]
        return SparseCase(
            "mla_sparse-" + "-".join(flags), self.name, S_Q, S_Q + TOPK + 37, heads, 1, MLA_D,
            MLA_DV, latent=True, pattern=row["pattern"], sinks=on(row["sinks"]),
            topk_length=on(row["topk_length"]), scale=MLA_SCALE,
        )  # fmt: skip

    def exercised(self, case: Any, claimed: frozenset[str]) -> frozenset[str]:
        return frozenset(case.needs) | (claimed & {"lse"})

    def call(self, kernel: Callable[..., Any], case: SparseCase, given: dict[str, torch.Tensor],
             want_lse: bool) -> Any:  # fmt: skip
        options: dict[str, Any] = {"d_v": case.dv}
        if case.sinks:
            options["attn_sink"] = given["sinks"]
        if case.topk_length:
            options["topk_length"] = given["topk_length"]
        return kernel(given["q"], given["k"], given["indices"], case.scale, **options)

    def results(self, case: SparseCase, result: Any, want_lse: bool) -> dict:
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            raise BadResult(f"the kernel returned {type(result).__name__}, the flash_mla_sparse "
                            "spec expects (out, max_logits, lse)")  # fmt: skip
        out, logits, lse = result
        rows = (case.s_q, case.heads)
        found = {"out": (out, (*rows, case.dv)), "max_logits": (logits, rows)}
        if want_lse:
            found["lse_mla"] = (lse, rows)
        return found

    def targets(self, device: Any, dtypes: tuple[str, ...]) -> list[Any]:
        from ..targets.builtin import Target
        from ..targets.sparse import flash_mla_sparse_fwd, plain_flash_mla_sparse_fwd

        return [
            Target("flash_mla_sparse_fwd", flash_mla_sparse_fwd, dtypes, self.name),
            Target("plain_flash_mla_sparse_fwd", plain_flash_mla_sparse_fwd, dtypes, self.name),
        ]


SPEC = FlashMlaSparseSpec()
