"""The "fla_kda" spec: flash-linear-attention's ``chunk_kda(q, k, v, g, beta, scale=None,
initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False, ...,
cu_seqlens=None)`` (fla-core 0.6.0), Kimi Linear's Kimi Delta Attention: the gated delta rule
with one gate per key channel, ``S_t = D_t S_{t-1} + beta_t k_t (v_t - (D_t S_{t-1})^T k_t)^T``,
``o_t = scale S_t^T q_t``, ``D_t = diag(exp(g_t))``; q, k (B, T, H, K), v (B, T, H, V), g
(B, T, H, K) in log space, beta (B, T, H), initial_state (N, H, K, V), ``cu_seqlens`` (N + 1,)
int64 with B = 1.

The plain form is the one checked: g is the per-token log-gate itself, neither cumulated nor
raw (``use_gate_in_kernel=False``, fla's default: no ``A_log``/``dt_bias``, no
``-exp(A_log) softplus(g + dt_bias)`` inside the kernel), beta already in (0, 1)
(``use_beta_sigmoid_in_kernel=False``), no ``safe_gate``/``lower_bound`` (they bound the gates
the layer makes; a plain gate is not bounded), the state (K, V) (``state_v_first=False``), and
as many value heads as key heads (fla's grouped value heads, HV > H, are not drawn). Those
options are Kimi Linear's layer around the core (its gate and beta projections), not the
recurrence; a kernel that has them adapts to this signature by leaving them off.

What the checker passes and judges is "fla_gdn"'s (``specs.fla_gdn``, whose call this spec
inherits): ``output_final_state=True`` always; o, the final state and every gradient (dq, dk,
dv, dg (B, T, H, K), dbeta, and dinitial_state with an initial state), the backward through
(o, final_state); only the options a case holds; q and k L2-normalized, as Kimi Linear's layer
makes them. Its factors are "fla_gdn"'s, with one gate more, "channels": a gate that differs
across the key channels, a third near 0 (nothing forgotten), a third typical and a third wiped
(-20) every 8th token at the channel's own offset (``battery.linear``). Its features:
``varlen`` and ``initial_state``.

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

from typing import Any

from ..battery.linear import BETAS, KDA_GATES, LENGTHS
from .fla_gdn import FlaGdnSpec


class FlaKdaSpec(FlaGdnSpec):
    """``chunk_kda``: ``chunk_gated_delta_rule``'s call and results with a per-channel gate."""

    name = "fla_kda"
    case_prefix = "kda"
    signature = (
        "chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, "
        "use_qk_l2norm_in_kernel=False, cu_seqlens=None)"
    )
    factors = {
        "length": tuple(str(n) for n in LENGTHS),
        "varlen": ("off", "on"),
        "initial_state": ("off", "on"),
        "gate": KDA_GATES,
        "beta": BETAS,
        "kv": ("equal", "unequal"),
        "scale": ("default", "custom"),
    }

    def targets(self, device: Any, dtypes: tuple[str, ...]) -> list[Any]:
        from ..targets.builtin import Target
        from ..targets.linear import twin_chunk_kda

        return [Target("torch_attention.linear_attention.kda[chunk]", twin_chunk_kda, dtypes,
                       self.name)]  # fmt: skip


SPEC = FlaKdaSpec()
