"""Broken kernels with the "fla_gdn" spec's signature (flash-linear-attention's
``chunk_gated_delta_rule``), one mistake each, the mistakes of gated-DeltaNet kernels: each is
``golden.linear_baseline.plain_gated_delta_rule`` (the recurrence computed plainly,
differentiable by autograd) correct but for the mistake it is given.

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import functools
from typing import Any

from ..battery.linear import CHUNK
from ..golden.linear_baseline import plain_gated_delta_rule
from ..specs.fla_gdn import SPEC
from . import Pitfall


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


gdn_state_in_half = _broken(
    "gdn_state_in_half",
    "The state kept in the inputs' half dtype, rounded after every token (ollama #15865).",
    half_state=True,
)
gdn_gate_read_as_a = _broken(
    "gdn_gate_read_as_a",
    "g read as the gate a itself instead of its log (a = g).",
    gate_is_log=False,
)
gdn_forget_after_error = _broken(
    "gdn_forget_after_error",
    "The gate applied after the delta update: S = a (S + beta k (v - S^T k)^T).",
    forget_after=True,
)
gdn_state_leaks_across_sequences = _broken(
    "gdn_state_leaks_across_sequences",
    "The state carried across a cu_seqlens boundary: sequence n + 1 starts from n's last.",
    reset_at_starts=False,
)
gdn_initial_state_ignored = _broken(
    "gdn_initial_state_ignored",
    "initial_state ignored: every sequence starts from 0.",
    ignore_initial_state=True,
)
gdn_final_state_of_wrong_sequence = _broken(
    "gdn_final_state_of_wrong_sequence",
    "Each sequence's final state returned as the next one's (rolled by one).",
    roll_final_state=True,
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
    }  # fmt: skip
    return next(case.name for case in SPEC.default_battery() if predicates[what](case))


PITFALLS: dict[str, Pitfall] = {
    "gdn_state_in_half": Pitfall(
        gdn_state_in_half,
        _first("near_one"),
        "dinitial_state",
        SPEC.name,
        dtypes=("float16", "bfloat16"),
    ),  # fmt: skip
    "gdn_gate_read_as_a": Pitfall(gdn_gate_read_as_a, _first("typical"), "out", SPEC.name),
    "gdn_forget_after_error": Pitfall(
        gdn_forget_after_error, _first("typical"), "out", SPEC.name
    ),  # fmt: skip
    "gdn_state_leaks_across_sequences": Pitfall(
        gdn_state_leaks_across_sequences, _first("varlen"), "out", SPEC.name
    ),
    "gdn_initial_state_ignored": Pitfall(
        gdn_initial_state_ignored, _first("initial_state"), "final_state", SPEC.name
    ),  # fmt: skip
    "gdn_final_state_of_wrong_sequence": Pitfall(
        gdn_final_state_of_wrong_sequence, _first("states"), "final_state", SPEC.name
    ),
}
