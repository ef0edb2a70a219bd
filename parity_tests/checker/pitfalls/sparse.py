"""Broken kernels with the "sparse" spec's signature (the torch twin's ``sparse_attention``), one
mistake each, the mistakes of 2025-2026's sparse kernels: ``plain_sparse`` is the attention by
indices computed plainly (gather, softmax with the sink, product; float32 for half inputs),
differentiable by autograd, correct but for the mistake it is given.

A backward-only mistake keeps the correct forward: the kernel returns
``correct.detach() + (wrong - wrong.detach())``, whose value is the correct output exactly and
whose gradient is the wrong computation's.

Shape legend: S_q query tokens, S_kv key tokens, H query heads, H_kv key heads, D head width,
Dv value width, topk entries per list.

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..specs.sparse import SPEC
from . import Pitfall


class _OverwritingGather(torch.autograd.Function):
    """``source[rows, heads]`` whose backward writes each entry's gradient to its row instead
    of adding it: a row named by several entries keeps one of them (cudnn-frontend #385)."""

    @staticmethod
    def forward(ctx: Any, source: torch.Tensor, rows: torch.Tensor, heads: torch.Tensor):
        ctx.save_for_backward(rows, heads)
        ctx.shape = source.shape
        return source[rows, heads]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        rows, heads = ctx.saved_tensors
        found = grad.new_zeros(ctx.shape)
        rows, heads = torch.broadcast_tensors(rows, heads)
        found.index_put_((rows, heads), grad, accumulate=False)
        return found, None, None


def plain_sparse(q, k, v, indices, *, softmax_scale=None, sinks=None, topk_length=None,
                 d_v=None, return_lse=False, overwrite=False, wrap_minus_one=False,
                 head_map="group"):  # fmt: skip
    """Attention by indices, plainly: ``overwrite`` scatters the key gradients by writing (the
    gather's backward, ``_OverwritingGather``); ``wrap_minus_one`` reads a -1 entry as row -1,
    the last key row (Python's and a pointer's wrap), as valid; ``head_map`` "modulo" gives
    query head h the list of key head h % H_kv instead of h // (H / H_kv)."""
    dtype = q.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    s_q, heads, width = q.shape
    s_kv, kv_heads = k.shape[:2]
    topk = indices.shape[-1]
    group = heads // kv_heads
    indices = indices.long()
    if wrap_minus_one:
        indices = torch.where(indices == -1, s_kv - 1, indices)
    valid = (indices >= 0) & (indices < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk, device=q.device) < topk_length.long()[:, None, None]
    rows = torch.where(valid, indices, 0)
    if head_map == "group":  # the lists of key head h serve its group: X = H_kv, G = H / H_kv
        lanes, width_q = kv_heads, group
        key_head = torch.arange(kv_heads, device=q.device)[None, :, None]
    else:  # query head h (X = H, G = 1) reads key head h // G's keys by list h % H_kv
        per_head = torch.arange(heads, device=q.device)
        rows, valid = rows[:, per_head % kv_heads], valid[:, per_head % kv_heads]
        lanes, width_q = heads, 1
        key_head = (per_head // group)[None, :, None]
    gather = _OverwritingGather.apply if overwrite else (lambda t, r, h: t[r, h])
    kc = k.to(compute)
    k_sel = gather(kc, rows, key_head)  # (S_q, X, topk, D)
    values = kc[..., :d_v] if v is None else v.to(compute)
    v_sel = gather(values, rows, key_head)
    scale = 1.0 / math.sqrt(width) if softmax_scale is None else softmax_scale
    q_lanes = q.to(compute).reshape(s_q, lanes, width_q, width)
    scores = (q_lanes @ k_sel.transpose(-1, -2)) * scale  # (S_q, X, G, topk)
    scores = scores.masked_fill(~valid[:, :, None, :], -math.inf)
    if sinks is not None:
        sink = sinks.to(compute).reshape(1, lanes, width_q, 1).expand(s_q, -1, -1, 1)
        scores = torch.cat([scores, sink], -1)
    top = scores.detach().amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(scores - top)
    total = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    out = (p[..., :topk] @ v_sel).reshape(s_q, heads, -1).to(dtype)
    lse = (top + torch.log(total)).reshape(s_q, heads)
    return (out, lse) if return_lse else out


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
