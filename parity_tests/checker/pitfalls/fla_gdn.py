"""Broken kernels with the "fla_gdn" spec's signature (flash-linear-attention's
``chunk_gated_delta_rule``), one mistake each, the mistakes of gated-DeltaNet kernels: each is
``golden.linear_baseline.plain_gated_delta_rule`` (the recurrence computed plainly,
differentiable by autograd) correct but for the mistake it is given. The six are the state
mistakes ``pitfalls._linear`` declares for both linear specs, with a scalar gate a per head.

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_linear.py
"""

from __future__ import annotations

from typing import Any

from ..golden.linear_baseline import plain_gated_delta_rule
from ..specs.fla_gdn import SPEC
from . import Pitfall
from ._linear import state_pitfalls


def _broken(name: str, doc: str, **switch: Any) -> Any:
    """``plain_gated_delta_rule`` with ``switch`` turned, as a kernel of fla's signature."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
               cu_seqlens=None, use_qk_l2norm_in_kernel=False):  # fmt: skip
        return plain_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
                                      output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
                                      **switch)  # fmt: skip

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc
    return kernel


PITFALLS: dict[str, Pitfall] = state_pitfalls(
    "gdn",
    _broken,
    SPEC,
    gate_read_as_a="g read as the gate a itself instead of its log (a = g).",
    forget_after_error="The gate applied after the delta update: S = a (S + beta k (v - S^T k)^T).",
)
