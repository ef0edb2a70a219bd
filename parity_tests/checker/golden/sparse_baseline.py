"""The sparse specs' plain kernels: attention by indices computed plainly in torch (gather each
key head's rows once for its group of query heads, one softmax with the sink as one more logit,
one product; float32 for half inputs, float64 for float64), differentiable by autograd, with the
switches the sparse pitfalls (``checker.pitfalls.sparse``, ``checker.pitfalls.flash_mla_sparse``)
turn to make one mistake each, all off by default; and FlashMLA's conventions over it
(``plain_flash_mla_sparse``: lse without the sink, a lonely query's lse +inf, max_logits).
Independent of the torch twin (``torch_attention.sparse``, the baseline the bounds scale), so
that a built-in correct target of each sparse spec is not the baseline itself and the
calibration measures a real kernel's rounding against it.

Shape legend: S_q query tokens, S_kv key tokens, H query heads, H_kv key heads, D head width,
Dv value width, topk entries per list.

Tests: tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

import math
from typing import Any

import torch


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


def plain_flash_mla_sparse(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, *,
                           v_from_end=False, lse_with_sink=False, lonely_minus_inf=False,
                           lengths_ignored=False, past_end_clamped=False) -> Any:  # fmt: skip
    """FlashMLA's ``flash_mla_sparse_fwd`` over ``plain_sparse``: (out, max_logits, lse), lse
    and max_logits float32 (float64 for float64 inputs), the sink scaling the output and no part
    of lse, a lonely query's lse +inf and max_logits -inf. The pitfalls' switches: V the last d_v
    numbers of kv; lse with the sink; a lonely query's lse -inf; topk_length ignored; an entry at
    or past S_kv read as the last row (only negative entries invalid)."""
    stats = torch.float64 if q.dtype == torch.float64 else torch.float32
    s_kv = kv.shape[0]
    if past_end_clamped:
        indices = torch.where(indices >= s_kv, s_kv - 1, indices)
    lengths = None if lengths_ignored else topk_length
    qc, kc = q.to(stats), kv.to(stats)
    vc = kc[..., kc.shape[-1] - d_v :] if v_from_end else None
    d = None if v_from_end else d_v
    sinks = None if attn_sink is None else attn_sink.to(stats)
    out, with_sink = plain_sparse(qc, kc, vc, indices, softmax_scale=sm_scale, sinks=sinks,
                                  topk_length=lengths, d_v=d, return_lse=True)  # fmt: skip
    _, lse = plain_sparse(qc, kc, vc, indices, softmax_scale=sm_scale, topk_length=lengths,
                          d_v=d, return_lse=True)  # fmt: skip
    if lse_with_sink:
        lse = with_sink
    if not lonely_minus_inf:
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    return out.to(q.dtype), max_logits(q, kv, indices, sm_scale, lengths).to(stats), lse.to(stats)


def max_logits(q, kv, indices, scale, topk_length):
    """(S_q, H) the largest scaled score over each query's valid entries, -inf where none (one
    key head: FlashMLA's)."""
    s_kv, topk = kv.shape[0], indices.shape[-1]
    valid = (indices[:, 0] >= 0) & (indices[:, 0] < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk, device=q.device) < topk_length[:, None]
    rows = torch.where(valid, indices[:, 0], 0).long()
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = (q.to(compute) @ kv[rows, 0].to(compute).transpose(1, 2)) * scale  # (S_q, H, topk)
    scores = scores.masked_fill(~valid[:, None, :], -math.inf)
    return scores.amax(dim=-1)
