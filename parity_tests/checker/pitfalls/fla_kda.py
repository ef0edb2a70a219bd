"""Broken kernels with the "fla_kda" spec's signature (flash-linear-attention's ``chunk_kda``),
one mistake each: gated DeltaNet's six state mistakes (``pitfalls._linear``, shared with
``pitfalls.fla_gdn``) made with KDA's per-channel gate, and one of KDA's own, the first key
channel's gate applied to every channel (a kernel that reads g with the stride of a per-head
gate, or a scalar-gate kernel handed KDA's gate). Each is
``golden.linear_baseline.plain_gated_delta_rule`` (the recurrence computed plainly,
differentiable by autograd; g (B, T, H, K) read per key channel) correct but for the mistake it
is given.

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_linear.py
"""

from __future__ import annotations

from typing import Any

from ..golden.linear_baseline import plain_gated_delta_rule
from ..specs.fla_kda import SPEC
from . import Pitfall
from ._linear import first_case, state_pitfalls


def _broken(name: str, doc: str, **switch: Any) -> Any:
    """``plain_gated_delta_rule`` with ``switch`` turned, as a kernel of ``chunk_kda``'s
    signature."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, cu_seqlens=None):  # fmt: skip
        return plain_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
                                      output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
                                      **switch)  # fmt: skip

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc
    return kernel


kda_one_channel_gate = _broken(
    "kda_one_channel_gate",
    "The first key channel's gate applied to every channel: D = exp(g[0]) I.",
    one_channel_gate=True,
)

# channels that forget nothing beside channels wiped every 8th token
_CHANNELS = first_case(SPEC, lambda c: c.gate == "channels" and c.tokens > 1)

PITFALLS: dict[str, Pitfall] = state_pitfalls(
    "kda",
    _broken,
    SPEC,
    gate_read_as_a="g read as the gate itself instead of its log (D = diag(g)).",
    forget_after_error="The gate applied after the delta update: S = D (S + beta k (v - S^T k)^T).",
) | {"kda_one_channel_gate": Pitfall(kda_one_channel_gate, _CHANNELS, "out", SPEC.name)}
