"""Plain same-dtype computations of the serving specs' calls, one sequence at a time, written
as a reader of the APIs would write them, with named mistakes that the pitfalls turn on
(``pitfalls.flashinfer_paged``, ``pitfalls.vllm_paged``, ``pitfalls.flashinfer_merge``):
correct with none.

``plain_paged``: each sequence's keys gathered from its pages, scores in the compute dtype
(float32 for half inputs), the masks of its queries' positions p_i = L_b - n_b + i
(bottom-right), sinks in the denominator, lse natural. ``plain_merge``: FlashInfer's merge of S
base-2 states by their largest s.

``PlainWrapper``, ``plain_vllm`` and ``plain_merge_call`` put them behind the specs'
signatures (the pitfalls turn their mistakes on; ``targets.serving`` has them without any).

Mistakes of ``plain_paged``: "ids16" (page ids truncated to 16 bits), "page128" (slots past 128
of a page read from slot % 128: FlashInfer #4347), "top_left" (causal and windows aligned
top-left in every sequence: query i at key i), "window_plus" (one key more left of the window),
"far_masked" (finite scores below -3000 read as masked: FlashInfer #4450), "no_sink" (the sinks
left out), "scale64" (at D = 64 the scale of D = 128: one width untested, FlashInfer #4748),
"prefix_top_left" (a shared prefix of ``prefix`` keys seen by query i only up to key i).

Shape legend: T query tokens, H query heads, H_kv key/value heads, D head width, P page size,
L_b keys and n_b queries of sequence b, S states.

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def plain_paged(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    qo_indptr: Sequence[int],
    pages_of: Sequence[Sequence[int]],
    kv_lens: Sequence[int],
    *,
    causal: bool = False,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    scale: float | None = None,
    prefix: int = 0,
    mistakes: frozenset[str] = frozenset(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (T, H, D) in q's dtype, lse (T, H) natural, compute dtype) of the paged call; the
    pools NHD (pages, P, H_kv, D)."""
    compute = compute_dtype(q.dtype)
    tokens, heads, d = q.shape
    size, heads_kv = k_pages.shape[1], k_pages.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if "scale64" in mistakes and d == 64:
        scale = 1.0 / math.sqrt(128)
    out = torch.zeros(tokens, heads, v_pages.shape[-1], dtype=compute, device=q.device)
    lse = torch.full((tokens, heads), -math.inf, dtype=compute, device=q.device)
    for b, length in enumerate(kv_lens):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        n = hi - lo
        if n == 0:
            continue
        positions = torch.arange(length, device=q.device)
        ids = torch.tensor([int(p) for p in pages_of[b]], device=q.device)
        if "ids16" in mistakes:
            ids = ids & 0xFFFF
        slots = positions % size
        if "page128" in mistakes:
            slots = slots % 128
        page = ids[positions // size]
        keys = k_pages[page, slots].to(compute)  # (L, H_kv, D)
        values = v_pages[page, slots].to(compute)
        group = heads // heads_kv
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (H, L, D)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q[lo:hi].to(compute).transpose(0, 1) @ keys.transpose(1, 2) * scale  # (H,n,L)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        row = torch.arange(n, device=q.device)[:, None]
        at = row if "top_left" in mistakes else row + (length - n)  # p_i
        col = positions[None, :]
        hidden = torch.zeros(n, length, dtype=torch.bool, device=q.device)
        if causal:
            hidden |= col > at
        if window_left >= 0:
            hidden |= col < at - window_left - (1 if "window_plus" in mistakes else 0)
        if "prefix_top_left" in mistakes and prefix:
            hidden |= (col < prefix) & (col > row)
        if "far_masked" in mistakes:
            hidden = hidden | (scores < -3000.0)
        scores = scores.masked_fill(hidden, -math.inf)
        total = torch.logsumexp(scores, dim=-1)  # (H, n)
        if sinks is not None and "no_sink" not in mistakes:
            total = torch.logaddexp(total, sinks.to(compute)[:, None].expand_as(total))
        weights = torch.exp(scores - total[..., None]).nan_to_num(0.0)
        out[lo:hi] = (weights @ values).transpose(0, 1)
        lse[lo:hi] = torch.where(torch.isneginf(scores).all(-1), -math.inf, total).transpose(0, 1)
    return out.to(q.dtype), lse


def plain_merge(
    v: torch.Tensor, s: torch.Tensor, mistakes: frozenset[str] = frozenset()
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's merge of S states, v (T, S, H, D), s (T, S, H) base 2 -> (v (T, H, D) in
    v's dtype, s (T, H) float32). Mistakes: "natural" (s read as natural logs), "no_max" (2^s
    without the largest subtracted), "dead_nan" (a token whose every state is -inf gets NaN),
    "dead_zero" (... gets s 0), "first_two" (only the first two states merged)."""
    compute = compute_dtype(v.dtype)
    if "first_two" in mistakes:
        v, s = v[:, :2], s[:, :2]
    s32 = s.to(torch.float32 if compute != torch.float64 else torch.float64)
    base = math.e if "natural" in mistakes else 2.0
    top = s32.max(dim=1, keepdim=True).values
    if "no_max" in mistakes:
        top = torch.zeros_like(top)
    elif "dead_nan" not in mistakes:
        top = torch.where(torch.isneginf(top), 0.0, top)
    weights = torch.pow(base, s32 - top)  # (T, S, H)
    total = weights.sum(dim=1)  # (T, H)
    merged = (weights[..., None] * v.to(compute)).sum(dim=1) / total[..., None]
    lse = torch.log(total) / math.log(base) + top[:, 0]
    dead = torch.isneginf(s32).all(dim=1)
    if "dead_nan" not in mistakes:
        merged = torch.where(dead[..., None], 0.0, merged)
        lse = torch.where(dead, 0.0 if "dead_zero" in mistakes else -math.inf, lse)
    return merged.to(v.dtype), lse.to(torch.float32)  # FlashInfer's s: float32


class PlainWrapper:
    """FlashInfer's ``plan``/``run`` over ``plain_paged``, with ``mistakes`` (``plain_paged``'s,
    and "lse_natural":
    lse in natural log; "last_page_full": every last page read as full; "hnd_as_nhd": an HND
    cache read as NHD)."""

    def __init__(self, kv_layout: str, mistakes: frozenset[str] = frozenset()) -> None:
        self.layout, self.mistakes = kv_layout, mistakes

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, causal=False, sm_scale=None,
             window_left=-1, logits_soft_cap=None, **_: Any) -> None:  # fmt: skip
        indptr, indices = paged_kv_indptr.tolist(), paged_kv_indices.tolist()
        last = paged_kv_last_page_len.tolist()
        self.pages = [indices[indptr[b] : indptr[b + 1]] for b in range(len(indptr) - 1)]
        full = "last_page_full" in self.mistakes
        self.kv_lens = [0 if not pages else (len(pages) - 1) * page_size +
                        (page_size if full else last[b]) for b, pages in enumerate(self.pages)]
        self.qo_indptr = qo_indptr.tolist()
        self.options = {"causal": causal, "window_left": window_left, "scale": sm_scale,
                        "softcap": logits_soft_cap or 0.0}  # fmt: skip

    def run(self, q, paged_kv_cache, *, return_lse=False, sinks=None):
        if isinstance(paged_kv_cache, torch.Tensor):
            k, v = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
        else:
            k, v = paged_kv_cache
        if self.layout == "HND":
            if "hnd_as_nhd" in self.mistakes:  # the same memory read with NHD's strides
                k, v = (t.reshape(t.shape[0], t.shape[2], t.shape[1], t.shape[3]) for t in (k, v))
            else:
                k, v = k.transpose(1, 2), v.transpose(1, 2)
        out, lse = plain_paged(q, k, v, self.qo_indptr, self.pages, self.kv_lens, sinks=sinks,
                               mistakes=self.mistakes, **self.options)  # fmt: skip
        if not return_lse:
            return out
        base = 1.0 if "lse_natural" in self.mistakes else math.log(2.0)
        return out, lse / base  # the compute dtype: float32 for half inputs


def plain_vllm(query, key, value, kv_cache, attn_metadata, sliding_window, logits_soft_cap, sinks,
               *mistakes: str) -> torch.Tensor:  # fmt: skip
    """vLLM's call with ``mistakes`` (``plain_paged``'s, and "no_write": the new tokens never
    written; "write_after": written after attending; "table_stride": row b of the block table
    read at b * (the most pages a sequence needs), not at the table's width)."""
    m, found = attn_metadata, frozenset(mistakes)
    size = kv_cache.shape[2]

    def write() -> None:
        for pool, tokens in zip(kv_cache, (key, value), strict=True):
            pool.view(-1, *pool.shape[2:])[m.slot_mapping] = tokens

    if not found & {"no_write", "write_after"}:
        write()
    lengths = m.seq_lens.tolist()
    needed = [-(-n // size) for n in lengths]
    if "table_stride" in found:
        flat, stride = m.block_table.flatten().tolist(), max(needed)
        rows: Any = [flat[b * stride : b * stride + n] for b, n in enumerate(needed)]
    else:
        rows = [m.block_table[b, :n].tolist() for b, n in enumerate(needed)]
    out, _ = plain_paged(
        query, kv_cache[0], kv_cache[1], m.query_start_loc.tolist(), rows, lengths,
        causal=m.causal, window_left=-1 if sliding_window is None else sliding_window - 1,
        softcap=logits_soft_cap or 0.0, sinks=sinks, scale=m.scale,
        prefix=m.common_prefix_len if m.use_cascade else 0, mistakes=found,
    )  # fmt: skip
    if "write_after" in found:
        write()
    return out


def plain_merge_call(args: tuple[torch.Tensor, ...], *mistakes: str
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``merge_state`` (four arguments) or ``merge_states`` (two) over ``plain_merge``."""
    if len(args) == 4:  # merge_state: two states
        v = torch.stack([args[0], args[2]], dim=1)
        s = torch.stack([args[1], args[3]], dim=1)
    else:
        v, s = args
    return plain_merge(v, s, frozenset(mistakes))
