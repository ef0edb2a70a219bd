"""The state mistakes that the linear-attention pitfalls share (``pitfalls.fla_gdn``,
``pitfalls.fla_kda``): six ways a gated-delta-rule kernel gets its state wrong, each a switch of
``golden.linear_baseline.plain_gated_delta_rule``, with the case of the spec's default battery
that flags it. Each spec's module makes them with its own kernel signature and gate (a scalar a
per head, or KDA's per-channel D), and adds its own mistakes.

Not a spec's module (its name starts with ``_``: ``all_pitfalls`` passes it by).

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_linear.py
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..battery.linear import CHUNK, LinearCase
from ..specs._linear import LinearSpec
from . import ALL_DTYPES, Kernel, Pitfall

# the case each mistake needs, by the name a table gives it
CASES: dict[str, Callable[[LinearCase], bool]] = {
    # the gate -> 1: nothing forgets the rounding the half state takes at every token
    "near_one": lambda c: c.gate == "near_zero" and c.initial_state and c.tokens > CHUNK,
    "typical": lambda c: c.gate == "typical" and c.tokens > 1,
    "varlen": lambda c: c.varlen and c.initial_state,
    "initial_state": lambda c: c.initial_state and c.tokens > 1,
    "states": lambda c: len(c.seqlens) > 1,
}  # fmt: skip


def first_case(spec: LinearSpec, predicate: Callable[[LinearCase], bool]) -> str:
    """The name of the first case of ``spec``'s default battery that ``predicate`` holds for."""
    return next(case.name for case in spec.default_battery() if predicate(case))


def state_pitfalls(
    prefix: str,
    broken: Callable[..., Kernel],
    spec: LinearSpec,
    *,
    gate_read_as_a: str,
    forget_after_error: str,
) -> dict[str, Pitfall]:
    """The six state mistakes as ``spec``'s pitfalls, named ``{prefix}_{mistake}``.

    Args:
        prefix: the spec's short name ("gdn", "kda").
        broken: ``broken(name, doc, **switch)``, ``plain_gated_delta_rule`` with ``switch``
            turned, as a kernel of the spec's signature.
        spec: the spec whose default battery holds the cases.
        gate_read_as_a: the doc of g read as the gate instead of its log (it names the gate).
        forget_after_error: the doc of the gate applied after the delta update (likewise).
    """
    # mistake -> (doc, the case it needs, the tensor that flags it, dtypes, the switch)
    mistakes: dict[str, tuple[str, str, str, tuple[str, ...], dict[str, Any]]] = {
        "state_in_half": (
            "The state kept in the inputs' half dtype, rounded after every token (ollama #15865).",
            "near_one", "dinitial_state", ("float16", "bfloat16"), {"half_state": True},
        ),
        "gate_read_as_a": (gate_read_as_a, "typical", "out", ALL_DTYPES, {"gate_is_log": False}),
        "forget_after_error": (
            forget_after_error, "typical", "out", ALL_DTYPES, {"forget_after": True},
        ),
        "state_leaks_across_sequences": (
            "The state carried across a cu_seqlens boundary: sequence n + 1 starts from n's last.",
            "varlen", "out", ALL_DTYPES, {"reset_at_starts": False},
        ),
        "initial_state_ignored": (
            "initial_state ignored: every sequence starts from 0.",
            "initial_state", "final_state", ALL_DTYPES, {"ignore_initial_state": True},
        ),
        "final_state_of_wrong_sequence": (
            "Each sequence's final state returned as the next one's (rolled by one).",
            "states", "final_state", ALL_DTYPES, {"roll_final_state": True},
        ),
    }  # fmt: skip
    return {
        f"{prefix}_{mistake}": Pitfall(
            broken(f"{prefix}_{mistake}", doc, **switch),
            first_case(spec, CASES[case]),
            tensor,
            spec.name,
            dtypes=dtypes,
        )
        for mistake, (doc, case, tensor, dtypes, switch) in mistakes.items()
    }
