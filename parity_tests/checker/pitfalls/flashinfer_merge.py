"""Broken kernels with the "flashinfer_merge" spec's signature (``merge_state`` with four
arguments, ``merge_states`` with two), one mistake each, over the plain merge of
``golden.serving_baseline.plain_merge``.

Shape legend: T tokens, S states, H heads, D head width.

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_serving.py
"""

from __future__ import annotations

from ..golden.serving_baseline import plain_merge_call
from . import Pitfall

SPEC = "flashinfer_merge"


def merge_natural_base(*args):
    """s read as natural logs: FlashInfer's are base 2."""
    return plain_merge_call(args, "natural")


def merge_no_max(*args):
    """2^s summed without the largest s subtracted first: overflows past 2^128 in float32."""
    return plain_merge_call(args, "no_max")


def merge_dead_nan(*args):
    """A token whose every state saw nothing (s -inf) comes out NaN."""
    return plain_merge_call(args, "dead_nan")


def merge_dead_lse_zero(*args):
    """A token whose every state saw nothing gets s 0 (2^0 = one unit of weight in the next
    merge) where -inf is due."""
    return plain_merge_call(args, "dead_zero")


def merge_states_first_two(*args):
    """merge_states merges only the first two of its states."""
    return plain_merge_call(args, "first_two")


PITFALLS = {
    "merge_natural_base": Pitfall(merge_natural_base, "merge-pair-close-h1-d128", "v", SPEC),
    "merge_no_max": Pitfall(merge_no_max, "merge-pair-far-h32-d32", "v", SPEC),
    "merge_dead_nan": Pitfall(merge_dead_nan, "merge-pair-dead-h8-d256", "v", SPEC),
    "merge_dead_lse_zero": Pitfall(merge_dead_lse_zero, "merge-pair-dead-h8-d256", "s", SPEC),
    "merge_states_first_two": Pitfall(merge_states_first_two, "merge-states-close-h8-d64", "v",
                                      SPEC),
}
