"""Broken kernels with FlashMLA's ``flash_mla_sparse_fwd`` signature, one mistake each:
each is ``golden.sparse_baseline.plain_flash_mla_sparse`` (FlashMLA's conventions: the sink scales
the output and is no part of lse, a lonely query's lse +inf and max_logits -inf) correct but for
the mistake.

Shape legend: S_q query tokens, S_kv key tokens, H query heads, topk entries per list.

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

from typing import Any

from ..golden.sparse_baseline import plain_flash_mla_sparse
from ..specs.flash_mla_sparse import SPEC
from . import Pitfall

_mla_sparse = plain_flash_mla_sparse


def mla_sparse_v_wrong_end(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    """V taken from the wrong end of kv: its last d_v numbers (the rope part and most of the
    latent) instead of the first."""
    return _mla_sparse(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, v_from_end=True)


def mla_sparse_lse_with_sink(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                             topk_length=None):  # fmt: skip
    """lse returned with the sink in it (the core's convention), where FlashMLA's lse is the
    scores' alone and the sink only scales the output."""
    return _mla_sparse(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, lse_with_sink=True)


def mla_sparse_lonely_lse_minus_inf(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                                    topk_length=None):  # fmt: skip
    """A query with no valid entry gets lse -inf, where FlashMLA's convention is +inf (its
    callers merge partial results by it)."""
    return _mla_sparse(q, kv, indices, sm_scale, d_v, attn_sink, topk_length,
                       lonely_minus_inf=True)  # fmt: skip


def mla_sparse_topk_length_ignored(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                                   topk_length=None):  # fmt: skip
    """``topk_length`` ignored: every entry of a list read."""
    return _mla_sparse(q, kv, indices, sm_scale, d_v, attn_sink, topk_length,
                       lengths_ignored=True)  # fmt: skip


def mla_sparse_past_end_clamped(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                                topk_length=None):  # fmt: skip
    """Only negative entries taken as invalid: one at or past S_kv (S_kv, 2^31 - 1) is clamped
    to the last key row and attended."""
    return _mla_sparse(q, kv, indices, sm_scale, d_v, attn_sink, topk_length,
                       past_end_clamped=True)  # fmt: skip


def _first(predicate: Any) -> str:
    return next(case.name for case in SPEC.default_battery() if predicate(case))


_PLAIN = _first(lambda c: not c.sinks and not c.topk_length and c.pattern == "overlap")
_SINKS = _first(lambda c: c.sinks and c.topk_length)  # short lists: the sink weighs
_DEAD = _first(lambda c: c.pattern == "dead")
_LENGTHS = _first(lambda c: c.topk_length)
_SENTINELS = _first(lambda c: c.pattern == "sentinels")

PITFALLS: dict[str, Pitfall] = {
    "mla_sparse_v_wrong_end": Pitfall(mla_sparse_v_wrong_end, _PLAIN, "out", SPEC.name),
    "mla_sparse_lse_with_sink": Pitfall(mla_sparse_lse_with_sink, _SINKS, "lse_mla", SPEC.name),
    "mla_sparse_lonely_lse_minus_inf": Pitfall(
        mla_sparse_lonely_lse_minus_inf, _DEAD, "lse_mla", SPEC.name
    ),
    "mla_sparse_topk_length_ignored": Pitfall(
        mla_sparse_topk_length_ignored, _LENGTHS, "out", SPEC.name
    ),
    "mla_sparse_past_end_clamped": Pitfall(
        mla_sparse_past_end_clamped, _SENTINELS, "out", SPEC.name
    ),
}
