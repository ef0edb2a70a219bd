"""Broken kernels with flash-attn's signature whose result changes from call to call on identical
inputs: a race that only some launches lose, the kind that vanishes when launches are serialized
(xformers #1392). Every result is within the bound of the golden, so only the checker's second
call on the same inputs (``running.calls.repeated``) flags it.

Each is ``pitfalls.flash._flash`` (correct flash-attn math) with its race made reproducible:
the launches are counted (a counter of this module's, not torch's seeded generator, which the
checker resets before each call), so the second call of a case always loses where the first won.

Shape legend: B batch, N query length, H heads, Dv value width.

Tests: tests/checker/pitfalls/test_init.py
"""

from __future__ import annotations

import itertools

import torch

from ..battery.attention.quick import pick
from ..specs.flash import SPEC
from . import Pitfall
from .flash import _flash

_LAUNCHES = itertools.count()  # the state a race keeps: how many launches came before


def order_of_atomic_adds(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                         window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                         deterministic=False, return_attn_probs=False):  # fmt: skip
    """The key blocks' partial outputs added into out with atomics, in the order the blocks
    finish: on every other launch they finish in the other order, and out's largest entry
    rounds one ulp higher. Right to within rounding every time; never the same bits twice in a
    row."""
    result = _flash(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    return_attn_probs, dropout_p=dropout_p)  # fmt: skip
    if not return_attn_probs:
        return one_ulp_every_other_launch(result)
    return (one_ulp_every_other_launch(result[0]), *result[1:])


def one_ulp_every_other_launch(t: torch.Tensor) -> torch.Tensor:
    """``t``, or on every other launch (those that lose the race) ``t`` with its largest entry
    one ulp higher: a constant shift, so that gradients through it stay right."""
    if next(_LAUNCHES) % 2 == 0:
        return t
    entries = t.detach().flatten()
    largest = entries.abs().argmax()
    higher = torch.nextafter(entries[largest], torch.full_like(entries[largest], torch.inf))
    shift = torch.zeros_like(entries)
    shift[largest] = higher - entries[largest]  # one ulp
    return t + shift.view(t.shape)


PITFALLS: dict[str, Pitfall] = {
    "order_of_atomic_adds": Pitfall(order_of_atomic_adds, pick(SPEC, "any"), "out", "flash"),
}
