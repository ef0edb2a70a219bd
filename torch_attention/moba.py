"""Mixture of block attention (MoBA; flash-linear-attention's ``parallel_moba``) in torch, the twin
of ``numpy_attention.moba``, differentiable by autograd through the torch sparse core:

    gate[t, h, c] = q[t, h] . mean(k[chunk c, h // g])        over the complete past chunks c
    rows(t, h)    = the tokens of the top (topk - 1) chunks by gate  +  its own chunk up to t

``topk`` counts the own chunk; ``topk = 1`` is full causal attention; ties to the lower chunk.
Token-major with ``cu_seqlens``, as the NumPy twin, whose pure rules (shapes, the integer layout
of chunks) it runs. The choice runs under ``torch.no_grad()``: it carries no gradient.

Derivation: docs/derivations/moba.md. Tests: tests/torch_attention/test_moba.py.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# The shapes and the integer layout are pure NumPy on shapes: the NumPy twin's rules.
from numpy_attention.moba import causal_rows, check_options, own_chunk_rows
from numpy_attention.nsa import Layout, block_layout, selected_rows

from . import validation
from .indexer import topk_indices
from .sparse import sparse_attention
from .varlen import _offsets

__all__ = ["moba"]


def moba(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    chunk_size: int,
    topk: int,
    softmax_scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoBA, causal, over one or several packed sequences.

    Args:
        q, k, v, chunk_size, topk, softmax_scale, cu_seqlens: as
            ``numpy_attention.moba.moba_forward``.

    Returns:
        out (S, H, Dv) in the inputs' dtype.
    """
    q, k, v = (validation.float_tensor(n, t) for n, t in (("q", q), ("k", k), ("v", v)))
    validation.same_dtype(q=q, k=k, v=v)
    check_options(tuple(q.shape), tuple(k.shape), tuple(v.shape), chunk_size, topk)
    s, heads = q.shape[:2]
    offsets = None if cu_seqlens is None else np.array(_offsets("cu_seqlens", cu_seqlens, s))
    layout = block_layout(offsets, s, chunk_size)
    group = heads // k.shape[1]
    if topk == 1:
        causal = causal_rows(layout)  # (S, L)
        rows = np.broadcast_to(causal[:, None], (s, heads, causal.shape[1]))
    else:
        with torch.no_grad():
            chosen = _choose_chunks(q, k, layout, chunk_size, topk)
        own = own_chunk_rows(layout, chunk_size)[:, None]  # (S, 1, chunk)
        past = selected_rows(chosen.cpu().numpy(), layout, chunk_size)
        rows = np.concatenate([past, np.broadcast_to(own, (s, heads, own.shape[2]))], -1)
    index = torch.from_numpy(np.ascontiguousarray(rows)).to(q.device)
    k_rep, v_rep = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = sparse_attention(q, k_rep, v_rep, index, softmax_scale=softmax_scale)
    assert isinstance(out, torch.Tensor)
    return out


def _choose_chunks(
    q: torch.Tensor, k: torch.Tensor, layout: Layout, chunk_size: int, topk: int
) -> torch.Tensor:
    """(S, H, topk - 1): ``numpy_attention.moba.choose_chunks`` in torch."""
    s, heads, width = q.shape
    kv_heads = k.shape[1]
    block = torch.from_numpy(layout.block).to(q.device)
    counts = torch.from_numpy(layout.counts).to(q.device)
    k_mean = k.new_zeros((counts.shape[0], kv_heads, width)).index_add(0, block, k)
    k_mean = k_mean / counts[:, None, None].to(k.dtype)
    c = np.arange(max(1, layout.blocks_max))
    candidate_np = c < (layout.pos // chunk_size)[:, None]
    rows = torch.from_numpy(np.where(candidate_np, layout.first_block[:, None] + c, 0))
    k_c = k_mean[rows.to(q.device)]  # (S, chunks, H_kv, D)
    q_g = q.reshape(s, kv_heads, heads // kv_heads, width)
    gate = torch.einsum("tcgd,twcd->tcgw", q_g, k_c).reshape(s, heads, -1)
    candidate = torch.from_numpy(candidate_np).to(q.device)[:, None]
    gate = torch.where(candidate, gate, torch.full_like(gate, -math.inf))
    return topk_indices(gate.reshape(s * heads, -1), topk - 1).reshape(s, heads, topk - 1)
