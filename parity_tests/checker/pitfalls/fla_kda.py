"""Broken kernels with the "fla_kda" spec's signature (flash-linear-attention's ``chunk_kda``),
one mistake each: gated DeltaNet's six (``pitfalls.fla_gdn``) made with KDA's per-channel gate,
and one of KDA's own, the first key channel's gate applied to every channel (a kernel that reads
g with the stride of a per-head gate, or a scalar-gate kernel handed KDA's gate). Each is
``golden.linear_baseline.plain_gated_delta_rule`` (the recurrence computed plainly,
differentiable by autograd; g (B, T, H, K) read per key channel) correct but for the mistake it
is given.

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import functools
from typing import Any

from ..battery.linear import CHUNK
from ..golden.linear_baseline import plain_gated_delta_rule
from ..specs.fla_kda import SPEC
from . import Pitfall


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


kda_state_in_half = _broken(
    "kda_state_in_half",
    "The state kept in the inputs' half dtype, rounded after every token (ollama #15865).",
    half_state=True,
)
kda_gate_read_as_a = _broken(
    "kda_gate_read_as_a",
    "g read as the gate itself instead of its log (D = diag(g)).",
    gate_is_log=False,
)
kda_forget_after_error = _broken(
    "kda_forget_after_error",
    "The gate applied after the delta update: S = D (S + beta k (v - S^T k)^T).",
    forget_after=True,
)
kda_state_leaks_across_sequences = _broken(
    "kda_state_leaks_across_sequences",
    "The state carried across a cu_seqlens boundary: sequence n + 1 starts from n's last.",
    reset_at_starts=False,
)
kda_initial_state_ignored = _broken(
    "kda_initial_state_ignored",
    "initial_state ignored: every sequence starts from 0.",
    ignore_initial_state=True,
)
kda_final_state_of_wrong_sequence = _broken(
    "kda_final_state_of_wrong_sequence",
    "Each sequence's final state returned as the next one's (rolled by one).",
    roll_final_state=True,
)
kda_one_channel_gate = _broken(
    "kda_one_channel_gate",
    "The first key channel's gate applied to every channel: D = exp(g[0]) I.",
    one_channel_gate=True,
)


@functools.cache
def _first(what: str) -> str:
    predicates = {
        # the gate -> 1: nothing forgets the rounding the half state takes at every token
        "near_one": lambda c: c.gate == "near_zero" and c.initial_state and c.tokens > CHUNK,
        "typical": lambda c: c.gate == "typical" and c.tokens > 1,
        "varlen": lambda c: c.varlen and c.initial_state,
        "initial_state": lambda c: c.initial_state and c.tokens > 1,
        "states": lambda c: len(c.seqlens) > 1,
        # channels that forget nothing beside channels wiped every 8th token
        "channels": lambda c: c.gate == "channels" and c.tokens > 1,
    }  # fmt: skip
    return next(case.name for case in SPEC.default_battery() if predicates[what](case))


PITFALLS: dict[str, Pitfall] = {
    "kda_state_in_half": Pitfall(
        kda_state_in_half,
        _first("near_one"),
        "dinitial_state",
        SPEC.name,
        dtypes=("float16", "bfloat16"),
    ),  # fmt: skip
    "kda_gate_read_as_a": Pitfall(kda_gate_read_as_a, _first("typical"), "out", SPEC.name),
    "kda_forget_after_error": Pitfall(
        kda_forget_after_error, _first("typical"), "out", SPEC.name
    ),  # fmt: skip
    "kda_state_leaks_across_sequences": Pitfall(
        kda_state_leaks_across_sequences, _first("varlen"), "out", SPEC.name
    ),
    "kda_initial_state_ignored": Pitfall(
        kda_initial_state_ignored, _first("initial_state"), "final_state", SPEC.name
    ),  # fmt: skip
    "kda_final_state_of_wrong_sequence": Pitfall(
        kda_final_state_of_wrong_sequence, _first("states"), "final_state", SPEC.name
    ),
    "kda_one_channel_gate": Pitfall(kda_one_channel_gate, _first("channels"), "out", SPEC.name),
}
