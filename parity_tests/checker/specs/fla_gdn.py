"""The "fla_gdn" spec: flash-linear-attention's ``chunk_gated_delta_rule(q, k, v, g, beta,
scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
use_qk_l2norm_in_kernel=False) -> (o, final_state)``, Qwen3-Next's gated DeltaNet:
``S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T``, ``o_t = scale S_t^T q_t``,
``a_t = exp(g_t)``; q, k (B, T, H, K), v (B, T, H, V), g and beta (B, T, H), initial_state
(N, H, K, V), ``cu_seqlens`` (N + 1,) int64 with B = 1.

The checker always passes ``output_final_state=True`` and judges o, the final state (on every
case: it is a result of every call, not a feature) and every gradient (dq, dk, dv, dg, dbeta,
and dinitial_state when an initial state is given), the backward through (o, final_state) with
random upstream gradients for both. Only the options a case holds are passed: no
``initial_state=`` without one, no ``cu_seqlens=`` without varlen, ``scale=`` only for a case
that sets one; q and k come L2-normalized, as the layers make them (``use_qk_l2norm_in_kernel``
is never passed).

Its factors: the length of the case's own sequence across the 64-token chunks (1, 63, 64, 65,
129), ``varlen`` (three packed sequences, one of them a single token), ``initial_state``, the
gate (typical, near 0: a -> 1, strongly negative: -20), beta (typical, or exactly 0 and 1), K
equal to V or not, the default scale or another; key widths 16 and 32. Its features:
``varlen`` and ``initial_state``.

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..battery.linear import BETAS, GATES, LENGTHS, LinearCase, seqlens_of
from ..running.calls import BadResult
from ._linear import LinearSpec, on

HEADS = 2
SCALE = 0.7  # the "custom" scale: not K^-0.5 at any battery width


class FlaGdnSpec(LinearSpec):
    name = "fla_gdn"
    case_prefix = "gdn"  # each case's name starts with it
    signature = (
        "chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, "
        "output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False)"
    )
    features = frozenset({"varlen", "initial_state"})
    widths = (16, 32)
    factors = {
        "length": tuple(str(n) for n in LENGTHS),
        "varlen": ("off", "on"),
        "initial_state": ("off", "on"),
        "gate": GATES,
        "beta": BETAS,
        "kv": ("equal", "unequal"),
        "scale": ("default", "custom"),
    }
    feature_factors = {"varlen": "varlen", "initial_state": "initial_state"}

    def values_of(self, case: Any) -> dict[str, str]:
        return {
            "length": str(case.seqlens[-1]),
            "varlen": "on" if case.varlen else "off",
            "initial_state": "on" if case.initial_state else "off",
            "gate": case.gate,
            "beta": case.beta,
            "kv": "equal" if case.k == case.v else "unequal",
            "scale": "default" if case.scale is None else "custom",
        }

    def case_of(self, row: Mapping[str, str], k: int) -> LinearCase:
        length, varlen = int(row["length"]), on(row["varlen"])
        v = k if row["kv"] == "equal" else k // 2
        flags = [f"t{length}", f"gate_{row['gate']}", f"beta_{row['beta']}", f"k{k}-v{v}"]
        flags += [name for name in ("varlen", "initial_state") if on(row[name])]
        flags += ["scale"] if row["scale"] == "custom" else []
        name = f"{self.case_prefix}-" + "-".join(flags)
        return LinearCase(
            name, self.name, seqlens_of(length, varlen), varlen, HEADS, k, v,
            gate=row["gate"], beta=row["beta"], initial_state=on(row["initial_state"]),
            scale=SCALE if row["scale"] == "custom" else None,
        )  # fmt: skip

    def call(
        self, kernel: Callable[..., Any], case: LinearCase, given: dict[str, torch.Tensor]
    ) -> Any:
        options: dict[str, Any] = {"output_final_state": True}
        if case.scale is not None:
            options["scale"] = case.scale
        if case.initial_state:
            options["initial_state"] = given["initial_state"]
        if case.varlen:
            options["cu_seqlens"] = given["cu_seqlens"]
        return kernel(given["q"], given["k"], given["v"], given["g"], given["beta"], **options)

    def results(self, case: LinearCase, result: Any) -> dict:
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise BadResult(f"the kernel returned {type(result).__name__}, the {self.name} spec "
                            "expects (o, final_state) with output_final_state=True")  # fmt: skip
        out, final = result
        states = (len(case.seqlens), case.heads, case.k, case.v)
        return {"out": (out, (case.batch, case.tokens, case.heads, case.v)),
                "final_state": (final, states)}  # fmt: skip

    def targets(self, device: Any, dtypes: tuple[str, ...]) -> list[Any]:
        from ..targets.builtin import Target
        from ..targets.linear import twin_chunk_gated_delta_rule

        return [Target("torch_attention.linear_attention[chunk]", twin_chunk_gated_delta_rule,
                       dtypes, self.name)]  # fmt: skip


SPEC = FlaGdnSpec()
