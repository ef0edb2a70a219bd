"""Broken kernels with the "flashinfer_merge" spec's signature (``merge_state`` with four
arguments, ``merge_states`` with two), one mistake each, over the plain merge of
``golden.serving_baseline.plain_merge``.

Shape legend: T tokens, S states, H heads, D head width.

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_serving.py
"""

from __future__ import annotations

import torch

from ..golden.serving_baseline import plain_merge
from . import Pitfall

SPEC = "flashinfer_merge"


def _merge(args: tuple[torch.Tensor, ...], *mistakes: str) -> tuple[torch.Tensor, torch.Tensor]:
    if len(args) == 4:  # merge_state: two states
        v = torch.stack([args[0], args[2]], dim=1)
        s = torch.stack([args[1], args[3]], dim=1)
    else:
        v, s = args
    return plain_merge(v, s, frozenset(mistakes))


def merge_natural_base(*args):
    """s read as natural logs: FlashInfer's are base 2."""
    return _merge(args, "natural")


def merge_no_max(*args):
    """2^s summed without the largest s subtracted first: overflows past 2^128 in float32."""
    return _merge(args, "no_max")


def merge_dead_nan(*args):
    """A token whose every state saw nothing (s -inf) comes out NaN."""
    return _merge(args, "dead_nan")


def merge_dead_lse_zero(*args):
    """A token whose every state saw nothing gets s 0 (2^0 = one unit of weight in the next
    merge) where -inf is due."""
    return _merge(args, "dead_zero")


def merge_states_first_two(*args):
    """merge_states merges only the first two of its states."""
    return _merge(args, "first_two")


PITFALLS = {
    "merge_natural_base": Pitfall(merge_natural_base, "merge-pair-close-h1-d128", "v", SPEC),
    "merge_no_max": Pitfall(merge_no_max, "merge-pair-far-h32-d32", "v", SPEC),
    "merge_dead_nan": Pitfall(merge_dead_nan, "merge-pair-dead-h8-d256", "v", SPEC),
    "merge_dead_lse_zero": Pitfall(merge_dead_lse_zero, "merge-pair-dead-h8-d256", "s", SPEC),
    "merge_states_first_two": Pitfall(merge_states_first_two, "merge-states-close-h8-d64", "v",
                                      SPEC),
}
