"""Mixture of block attention (MoBA; flash-linear-attention's ``parallel_moba``) as a composition of
the sparse core: each query head's gate picks past chunks by q . mean(k of the chunk), and the
query attends their tokens together with its own chunk's tokens up to itself; forward and
hand-derived backward.

    gate[t, h, c] = q[t, h] . mean(k[chunk c, h // g])        over the complete past chunks c
    rows(t, h)    = the tokens of the top (topk - 1) chunks by gate  +  its own chunk up to t
    out[t, h]     = softmax(scale q[t, h] . k[rows]) v[rows]        (one softmax over all rows)

Token-major, as the core (a batch is offsets ``cu_seqlens`` into the token axis, as fla's
varlen path): q (S, H, D), k (S, H_kv, D), v (S, H_kv, Dv). The chunk choice is piecewise
constant in q and k: it carries no gradient. fla's conventions (``fla/ops/moba/parallel.py``):
``topk`` counts the query's own chunk; a sequence's last chunk is never a gate's candidate (only
complete chunks strictly before the query's own are); ``topk = 1`` is plain causal attention over
the whole sequence (fla's documented fallback); ties go to the lower chunk here (fla's
``torch.topk`` leaves them unspecified).

Shape legend: S tokens, H query heads, H_kv key/value heads, g = H / H_kv, D key width, Dv value
width.

Derivation: docs/derivations/moba.md. Tests: tests/numpy_attention/test_moba.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation
from .indexer import topk_indices
from .nsa import Layout, block_layout, mean_pool_forward, selected_rows
from .sparse import SparseCtx, check_shapes, sparse_attention_backward, sparse_attention_forward


class MoBACtx(NamedTuple):
    """The core's ctx over k and v repeated to the query heads, and the group to sum back."""

    core: SparseCtx
    group: int


class MoBAOutput(NamedTuple):
    out: np.ndarray  # (S, H, Dv)
    chunk_indices: np.ndarray  # (S, H, topk - 1) past chunks chosen (within each sequence), -1
    ctx: MoBACtx | None


class MoBAGrads(NamedTuple):
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray


def moba_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    chunk_size: int,
    topk: int,
    softmax_scale: float | None = None,
    cu_seqlens: np.ndarray | None = None,
) -> MoBAOutput:
    """MoBA, causal, over one or several packed sequences.

    Args:
        q: (S, H, D) queries. k: (S, H_kv, D) keys. v: (S, H_kv, Dv) values.
        chunk_size: tokens per chunk (a sequence's last chunk may be short).
        topk: chunks per query, its own included; 1 is full causal attention.
        softmax_scale: the score scale; None is 1/sqrt(D). The gate is unscaled (as fla's).
        cu_seqlens: (N + 1,) offsets of the packed sequences; None is one sequence.

    Returns:
        ``MoBAOutput(out, chunk_indices, ctx)``: out (S, H, Dv) in the inputs' dtype; the past
        chunks each query head chose, (S, H, topk - 1); ctx None under ``no_grad()``.
    """
    q, k, v = (validation.float_array(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    validation.same_dtype(q=q, k=k, v=v)
    check_options(q.shape, k.shape, v.shape, chunk_size, topk)
    layout = block_layout(cu_seqlens, q.shape[0], chunk_size)
    group = q.shape[1] // k.shape[1]
    if topk == 1:
        chosen = np.full(q.shape[:2] + (0,), -1)
        causal = causal_rows(layout)  # (S, L)
        rows = np.broadcast_to(causal[:, None], q.shape[:2] + causal.shape[1:])
    else:
        chosen = choose_chunks(q, mean_pool_forward(k, layout), layout, chunk_size, topk)
        own = own_chunk_rows(layout, chunk_size)[:, None]  # (S, 1, chunk)
        past = selected_rows(chosen, layout, chunk_size)  # (S, H, (topk - 1) * chunk)
        rows = np.concatenate([past, np.broadcast_to(own, q.shape[:2] + own.shape[2:])], -1)
    k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # (S, H, *)
    res = sparse_attention_forward(q, k_rep, v_rep, rows, softmax_scale=softmax_scale)
    ctx = None if res.ctx is None else MoBACtx(res.ctx, group)
    return MoBAOutput(res.out, chosen, ctx)


def moba_backward(dout: np.ndarray, ctx: MoBACtx) -> MoBAGrads:
    """The gradients of ``moba_forward``: the core's backward over the repeated keys and values,
    then the repeat's adjoint, dk[s, c] = sum over the group's heads h of dk_rep[s, h] (and so for
    dv). The chunk choice carries no gradient. Derivation: docs/derivations/moba.md.

    Args:
        dout: (S, H, Dv) gradient of the output.
        ctx: from ``moba_forward``.

    Returns:
        ``MoBAGrads(dq, dk, dv)`` in the inputs' dtype.
    """
    if not isinstance(ctx, MoBACtx):
        raise TypeError(
            f"moba_backward needs the ctx of a forward run outside no_grad(), "
            f"got {type(ctx).__name__}"
        )
    grads = sparse_attention_backward(dout, ctx.core)
    assert grads.dv is not None
    s, heads = grads.dk.shape[:2]
    shape = (s, heads // ctx.group, ctx.group)
    dk = grads.dk.reshape(shape + (-1,)).sum(axis=2)  # forward: k_rep = repeat(k, g, axis=1)
    dv = grads.dv.reshape(shape + (-1,)).sum(axis=2)
    return MoBAGrads(grads.dq, dk, dv)


def choose_chunks(
    q: np.ndarray, k_mean: np.ndarray, layout: Layout, chunk_size: int, topk: int
) -> np.ndarray:
    """(S, H, topk - 1): per query head, the complete chunks before its own with the largest
    gate q . mean(k), ties to the lower chunk, -1 past the candidates."""
    s, heads, width = q.shape
    kv_heads = k_mean.shape[1]
    c = np.arange(max(1, layout.blocks_max))
    candidate = c < (layout.pos // chunk_size)[:, None]  # (S, chunks): strictly before its own
    rows = np.where(candidate, layout.first_block[:, None] + c, 0)
    k_c = k_mean[rows]  # (S, chunks, H_kv, D)
    q_g = q.reshape(s, kv_heads, heads // kv_heads, width)
    gate = np.einsum("tcgd,twcd->tcgw", q_g, k_c).reshape(s, heads, -1)
    gate = np.where(candidate[:, None], gate, -np.inf)
    return topk_indices(gate.reshape(s * heads, -1), topk - 1).reshape(s, heads, topk - 1)


def own_chunk_rows(layout: Layout, chunk_size: int) -> np.ndarray:
    """(S, chunk_size) rows of the query's own chunk up to itself, -1 after it."""
    start = layout.pos - layout.pos % chunk_size
    local = start[:, None] + np.arange(chunk_size)
    return np.where(local <= layout.pos[:, None], layout.bos[:, None] + local, -1)


def causal_rows(layout: Layout) -> np.ndarray:
    """(S, L) rows of plain causal attention within each sequence (L its longest), -1 pads."""
    local = np.arange(max(1, int(layout.pos.max(initial=0)) + 1))
    return np.where(local <= layout.pos[:, None], layout.bos[:, None] + local, -1)


def check_options(
    q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], chunk_size: Any, topk: Any
) -> None:
    """The shapes and options of one call (pure Python: the torch twin runs the same rules)."""
    check_shapes(q, k, v, tuple(q[:1]) + tuple(k[1:2]) + (0,), None)
    if q[0] != k[0]:
        raise ValueError(f"MoBA is self-attention: q and k must have one token axis, got {q}, {k}")
    validation.positive_int("chunk_size", chunk_size)
    validation.positive_int("topk", topk)
