"""The rules of a call (numpy_attention.rules): every option checked once by ``prepare`` and
kept in the form the score pipeline's tiles read (causal and windows as one band, per-head
ALiBi slopes and sinks flattened over q's leading axes, the alignment's offset). Their errors:
tests/numpy_attention/test_functional_options.py and test_functional.py, through
attention_forward."""

from __future__ import annotations

import numpy as np

from numpy_attention.rules import prepare


def rules_for(n, m, **options):
    q, k = np.zeros((2, 3, n, 4)), np.zeros((2, 3, m, 4))
    return prepare(q, k, k, **options).rules


def test_options_are_kept_in_the_form_the_tiles_read():
    rules = rules_for(
        5, 7, causal=True, window=(2, 3), alibi_slopes=np.ones((2, 3)), sinks=np.arange(3.0)
    )

    assert (rules.left, rules.right, rules.offset) == (2, 0, 0)  # causal caps the right side
    assert rules.slopes.shape == (6,) and rules.sinks.tolist() == [0, 1, 2, 0, 1, 2]
    assert rules_for(5, 7, align="bottom-right").offset == 2
