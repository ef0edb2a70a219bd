"""Broken kernels with the "sparse" spec's signature (the torch twin's ``sparse_attention``), one
mistake each, the mistakes of 2025-2026's sparse kernels: each is
``golden.sparse_baseline.plain_sparse`` (the attention by indices computed plainly,
differentiable by autograd) correct but for the mistake it is given.

A backward-only mistake keeps the correct forward: the kernel returns
``correct.detach() + (wrong - wrong.detach())``, whose value is the correct output exactly and
whose gradient is the wrong computation's.

Shape legend: S_q query tokens, S_kv key tokens, H query heads, H_kv key heads, D head width,
Dv value width, topk entries per list.

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

from typing import Any

import torch

from ..golden.sparse_baseline import plain_sparse
from ..specs.sparse import SPEC
from . import Pitfall


def _backward_of(correct: Any, wrong: Any) -> Any:
    """The correct forward with the wrong computation's gradient."""
    if isinstance(correct, tuple):
        return (_backward_of(correct[0], wrong[0]), correct[1])
    return correct.detach() + (wrong - wrong.detach())


def sparse_overwrite_scatter(q, k, v, indices, *, softmax_scale=None, sinks=None,
                             topk_length=None, d_v=None, return_lse=False):  # fmt: skip
    """dk and dv scattered by writing instead of adding: a key row named by several queries (the
    normal case: neighbouring queries share most keys) keeps one query's gradient."""
    return plain_sparse(q, k, v, indices, softmax_scale=softmax_scale, sinks=sinks,
                        topk_length=topk_length, d_v=d_v, return_lse=return_lse,
                        overwrite=True)  # fmt: skip


def sparse_sink_forgotten_in_backward(q, k, v, indices, *, softmax_scale=None, sinks=None,
                                      topk_length=None, d_v=None, return_lse=False):  # fmt: skip
    """The forward right; the backward's weights normalized without the sink and d_sink 0
    (cudnn-frontend PR #421), worst where a list is short."""
    arguments = {"softmax_scale": softmax_scale, "topk_length": topk_length, "d_v": d_v,
                 "return_lse": return_lse}  # fmt: skip
    correct = plain_sparse(q, k, v, indices, sinks=sinks, **arguments)
    wrong = plain_sparse(q, k, v, indices, sinks=None, **arguments)
    found = _backward_of(correct, wrong)
    if sinks is None:
        return found
    if isinstance(found, tuple):
        return (found[0] + 0 * sinks.sum(), found[1])  # d_sink 0
    return found + 0 * sinks.sum()


def sparse_sentinel_to_last_row(q, k, v, indices, *, softmax_scale=None, sinks=None,
                                topk_length=None, d_v=None, return_lse=False):  # fmt: skip
    """The forward right; the backward reads a -1 entry as row -1, the last key row, and writes
    its gradient there (flash-attention's sparse MLA backward)."""
    arguments = {"softmax_scale": softmax_scale, "sinks": sinks, "topk_length": topk_length,
                 "d_v": d_v, "return_lse": return_lse}  # fmt: skip
    correct = plain_sparse(q, k, v, indices, **arguments)
    wrong = plain_sparse(q, k, v, indices, wrap_minus_one=True, **arguments)
    return _backward_of(correct, wrong)


def sparse_topk_length_ignored(q, k, v, indices, *, softmax_scale=None, sinks=None,
                               topk_length=None, d_v=None, return_lse=False):  # fmt: skip
    """``topk_length`` ignored: every entry of a list read."""
    return plain_sparse(q, k, v, indices, softmax_scale=softmax_scale, sinks=sinks, d_v=d_v,
                        return_lse=return_lse)  # fmt: skip


def sparse_as_dense_mask(q, k, v, indices, *, softmax_scale=None, sinks=None, topk_length=None,
                         d_v=None, return_lse=False):  # fmt: skip
    """The lists turned into a dense mask over the keys, then dense attention: a key named twice
    in a list counts once (the meaning of a mask, not of a gather)."""
    s_kv, topk = k.shape[0], indices.shape[-1]
    valid = (indices >= 0) & (indices < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk, device=q.device) < topk_length[:, None, None]
    mask = torch.zeros((*indices.shape[:2], s_kv + 1), dtype=torch.bool, device=q.device)
    mask.scatter_(2, torch.where(valid, indices.long(), s_kv), True)
    every = torch.arange(s_kv, device=q.device).expand(*indices.shape[:2], s_kv)
    lists = torch.where(mask[..., :s_kv], every, -1)
    return plain_sparse(q, k, v, lists, softmax_scale=softmax_scale, sinks=sinks, d_v=d_v,
                        return_lse=return_lse)  # fmt: skip


def sparse_gqa_modulo_heads(q, k, v, indices, *, softmax_scale=None, sinks=None,
                            topk_length=None, d_v=None, return_lse=False):  # fmt: skip
    """Query head h reads the list of key head h % H_kv instead of h // (H / H_kv)."""
    return plain_sparse(q, k, v, indices, softmax_scale=softmax_scale, sinks=sinks,
                        topk_length=topk_length, d_v=d_v, return_lse=return_lse,
                        head_map="modulo")  # fmt: skip


def _first(predicate: Any) -> str:
    return next(case.name for case in SPEC.default_battery() if predicate(case))


_SHARED = _first(lambda c: c.pattern == "overlap" and not c.topk_length)
_SINK_SHORT = _first(lambda c: c.sinks and c.topk_length)
_SENTINELS = _first(lambda c: c.pattern == "sentinels")
_LENGTHS = _first(lambda c: c.topk_length)
_DUPLICATES = _first(lambda c: c.pattern == "duplicates")
_GQA = _first(lambda c: c.heads_kv != c.heads)

PITFALLS: dict[str, Pitfall] = {
    "sparse_overwrite_scatter": Pitfall(sparse_overwrite_scatter, _SHARED, "dk", SPEC.name),
    "sparse_sink_forgotten_in_backward": Pitfall(
        sparse_sink_forgotten_in_backward, _SINK_SHORT, "dsinks", SPEC.name
    ),
    "sparse_sentinel_to_last_row": Pitfall(
        sparse_sentinel_to_last_row, _SENTINELS, "dk", SPEC.name
    ),
    "sparse_topk_length_ignored": Pitfall(sparse_topk_length_ignored, _LENGTHS, "out", SPEC.name),
    "sparse_as_dense_mask": Pitfall(sparse_as_dense_mask, _DUPLICATES, "out", SPEC.name),
    "sparse_gqa_modulo_heads": Pitfall(sparse_gqa_modulo_heads, _GQA, "out", SPEC.name),
}
