"""The score pipeline of attention, shared by the dense and tiled paths, and its result types.

Derivation: docs/derivations/attention.md. Tests: tests/numpy_attention/test_scores.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class AttentionOutput(NamedTuple):
    """What ``attention_forward`` returns, whatever the options: the same three fields.

    out: (..., N, Dv) in the inputs' dtype. lse: (..., N), the natural-log log-sum-exp of each
    row of scores, in the compute dtype, when ``return_lse=True``; else None. ctx: what
    ``attention_backward`` needs; None under ``no_grad()``.
    """

    out: np.ndarray
    lse: np.ndarray | None
    ctx: Any


class AttentionGrads(NamedTuple):
    """What ``attention_backward`` returns: dq, dk, dv, and dsinks (None without sinks)."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dsinks: np.ndarray | None
