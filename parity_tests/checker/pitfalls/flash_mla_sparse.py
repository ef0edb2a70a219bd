"""Broken kernels with FlashMLA's ``flash_mla_sparse_fwd`` signature, one mistake each:
``_mla_sparse`` is FlashMLA's conventions (``targets.sparse``: the sink scales the output and is
no part of lse, a lonely query's lse +inf and max_logits -inf) over ``pitfalls.sparse``'s plain
attention by indices, correct but for the mistake.

Shape legend: S_q query tokens, S_kv key tokens, H query heads, topk entries per list.

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..specs.flash_mla_sparse import SPEC
from ..targets.sparse import _max_logits
from . import Pitfall
from .sparse import plain_sparse


def _mla_sparse(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, *, v_from_end=False,
                lse_with_sink=False, lonely_minus_inf=False, lengths_ignored=False,
                past_end_clamped=False) -> Any:  # fmt: skip
    """FlashMLA's sparse prefill, correct but for one mistake: V the last d_v numbers of kv;
    lse including the sink; a lonely query's lse -inf; ``topk_length`` ignored; an entry at or
    past S_kv read as the last row (only negative entries taken as invalid)."""
    stats = torch.float64 if q.dtype == torch.float64 else torch.float32
    compute = stats
    s_kv = kv.shape[0]
    if past_end_clamped:
        indices = torch.where(indices >= s_kv, s_kv - 1, indices)
    lengths = None if lengths_ignored else topk_length
    values = kv[..., kv.shape[-1] - d_v :] if v_from_end else None
    sinks = None if attn_sink is None else attn_sink.to(compute)
    qc, kc = q.to(compute), kv.to(compute)
    vc = None if values is None else values.to(compute)
    d = None if values is not None else d_v
    out, with_sink = plain_sparse(qc, kc, vc, indices, softmax_scale=sm_scale, sinks=sinks,
                                  topk_length=lengths, d_v=d, return_lse=True)  # fmt: skip
    _, lse = plain_sparse(qc, kc, vc, indices, softmax_scale=sm_scale, topk_length=lengths,
                          d_v=d, return_lse=True)  # fmt: skip
    if lse_with_sink:
        lse = with_sink
    lse = lse.to(stats)
    if not lonely_minus_inf:
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    logits = _max_logits(q, kv, indices, sm_scale, lengths).to(stats)
    return out.to(q.dtype), logits, lse


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
