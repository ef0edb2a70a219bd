"""Tiled, memory-bounded attention (FlashAttention-2 style): the same math as the dense core,
computed in blocks of queries and keys so that no (N, M) array is ever held.

The forward walks key blocks with an online softmax (a running row max and row sum rescale the
partial output) and keeps only the output and the log-sum-exp ``lse`` of each query row. The
backward recomputes each block of probabilities from ``lse`` and uses
``delta = rowsum(dO * O)`` in place of ``rowsum(dP * P)``. Blocks that the causal mask hides
entirely are skipped; partially hidden blocks are masked. Memory is O(N * block) per head, not
O(N * M). Derivation: docs/derivations/tiled.md.

Work is split into independent tiles (a run of the last leading axis, e.g. a few heads, times
one block) that a thread pool runs concurrently: NumPy releases the GIL in matmul and ufuncs.
OpenBLAS threads would oversubscribe the cores, so each pool thread limits its own BLAS to one
thread (``openblas_set_num_threads_local``); where NumPy's BLAS offers no such control, tiles run
in the calling thread and BLAS parallelizes each product itself.

Shape legend: B batch, H heads, N query length, M key/value length, D head width (queries and
keys), Dv value head width; "..." the leading axes, g the leading indices of one tile.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, NamedTuple

import numpy as np

from . import functional, masks, threads, validation
from .grad_mode import is_grad_enabled
from .scores import AttentionGrads, AttentionOutput

# Default block sizes and the number of score entries one tile aims at (several indices of the
# last leading axis, e.g. heads, share a tile when blocks are small). Chosen by measurement on a
# 2-core AVX-512 machine (docs/benchmarks.md): a (4, 256, 256) float32 tile is 1 MiB, which
# stays in cache across the elementwise passes while the products run near NumPy's matmul peak.
BLOCK_Q = 256
BLOCK_K = 256
TILE_ENTRIES = 4 * 256 * 256


class TilePlan(NamedTuple):
    """How a problem is cut into tiles, and the masks and dropout each tile applies."""

    lead: tuple[int, ...]  # the leading axes "..." of q
    n: int
    m: int
    block_q: int
    block_k: int
    group_chunk: int  # how many indices of the last leading axis one tile covers
    causal: bool
    hidden: np.ndarray | None  # bool attn_mask negated, True = never attended
    biases: tuple[np.ndarray, ...]  # added to the scores: a float attn_mask, key padding as -inf
    keep: np.ndarray | None  # explicit bool keep-mask broadcasting to (..., N, M)
    seed: int | None  # regenerates the keep-mask block by block when no explicit one is given
    dropout_p: float
    rescale: Any  # 1 / (1 - dropout_p), in the compute dtype
    scale: Any  # the scores' scale, in the compute dtype


class TiledAttentionCtx(NamedTuple):
    """Shapes carry at least one leading axis: an unbatched q (N, D) is kept as (1, N, D)."""

    q: np.ndarray  # (..., N, D), compute dtype
    k: np.ndarray  # (..., M, D)
    v: np.ndarray  # (..., M, Dv)
    out: np.ndarray  # (..., N, Dv), compute dtype, before the cast to the inputs' dtype
    lse: np.ndarray  # (..., 1, N), log-sum-exp of each row of scores; -inf for a fully masked row
    plan: TilePlan
    dtype: np.dtype  # the inputs' dtype, which the gradients are returned in


def tiled_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    key_padding_mask: np.ndarray | None = None,
    attn_mask: np.ndarray | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    dropout_mask: np.ndarray | None = None,
    rng: np.random.Generator | int | None = None,
    return_lse: bool = False,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> AttentionOutput:
    """``softmax(q k^T * scale + masks) v`` in (block_q, block_k) tiles with an online softmax.

    Same arguments, masks, dtypes and results as ``functional.attention_forward``, except for
    dropout without an explicit ``dropout_mask``: the keep-mask is not drawn whole but
    regenerated tile by tile from ``seed = default_rng(rng).integers(2**63)`` (one draw per call,
    kept in ``ctx.plan.seed``), so the backward sees the same mask without storing it.
    ``tiled_dropout_mask`` materializes that mask.

    Args:
        q: (..., N, D) queries.
        k: (..., M, D) keys.
        v: (..., M, Dv) values.
        causal: top-left aligned, query i sees keys j <= i; fully hidden tiles are skipped.
        key_padding_mask: bool (B, M), True = padding.
        attn_mask: bool (True = may attend) or float (added), broadcasting to (..., N, M).
        scale: multiplies q k^T; defaults to 1 / sqrt(D).
        dropout_p: inverted dropout on the attention weights, in [0, 1).
        dropout_mask: bool keep-mask broadcasting to (..., N, M), sliced per tile.
        rng: a generator or seed; only its seed draw is used, see above.
        return_lse: also return the log-sum-exp of each row of (masked) scores.
        block_q: query rows per tile.
        block_k: key rows per tile.

    Returns:
        ``(out, ctx)``, or ``(out, lse, ctx)`` with ``return_lse``: out (..., N, Dv) in the
        inputs' dtype, lse (..., N) in the compute dtype (float32 for float16 inputs), -inf for a
        query row with nothing to attend to (its output is 0). ``ctx`` is None under
        ``no_grad()``: nothing is kept for a backward.
    """
    q, k, v, dtype = functional._check_qkv(q, k, v)
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    plan = _make_plan(
        q.shape,
        k.shape[-2],
        compute,
        causal=causal,
        key_padding_mask=key_padding_mask,
        attn_mask=attn_mask,
        scale=scale,
        dropout_p=dropout_p,
        dropout_mask=dropout_mask,
        rng=rng,
        block_q=block_q,
        block_k=block_k,
    )
    # Tiles read q, k and v in place, strided or not (BLAS needs a unit stride on one axis
    # only): copying the heads out of a fused projection first cost a quarter of the attention
    # time at GPT-2 size.
    q, k, v = (_with_lead(t.astype(compute, copy=False)) for t in (q, k, v))  # (..., L, W)
    out = np.empty(q.shape[:-1] + v.shape[-1:], compute)  # (..., N, Dv)
    lse = np.empty(q.shape[:-2] + (1, plan.n), compute)  # (..., 1, N): like a row of S^T
    tasks = [(part, bi) for bi in _blocks_by_work(plan.n, plan.block_q) for part in _parts(plan)]
    threads.run(tasks, lambda task: _forward_tile(plan, q, k, v, out, lse, *task))

    keep_ctx = is_grad_enabled()
    ctx = TiledAttentionCtx(q, k, v, out, lse, plan, dtype) if keep_ctx else None
    # The ctx keeps O for the backward's delta: hand out a copy, so that in-place work on the
    # result cannot change it.
    result = out.reshape(plan.lead + out.shape[-2:]).astype(dtype, copy=keep_ctx)  # (..., N, Dv)
    lse_out = lse.reshape(plan.lead + (plan.n,)) if return_lse else None  # (..., 1, N) -> (..., N)
    return AttentionOutput(result, lse_out, ctx)


def _forward_tile(
    plan: TilePlan,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    part: _Part,
    bi: int,
) -> None:
    """Rows ``bi`` of ``out`` and ``lse`` for the leading indices of ``part``: online softmax.

    Tiles hold S^T (keys x queries), so the softmax reduces over axis -2: NumPy reduces across
    rows with vectorized elementwise max/add, 2-3x faster than along the contiguous last axis.
    """
    q, k, v, out, lse = (t[part.index] for t in (q, k, v, out, lse))  # views, (g, L, W)
    groups, rows = part.flat, _span(bi, plan.block_q, plan.n)
    compute = q.dtype.type
    q_scaled = q[:, rows] * plan.scale  # (g, bq, D)
    stat_shape = (q_scaled.shape[0], 1, q_scaled.shape[1])
    row_max = np.full(stat_shape, -np.inf, dtype=compute)  # (g, 1, bq) running max of scores
    row_sum = np.zeros(stat_shape, dtype=compute)  # running sum of exp(scores - row_max)
    acc = np.zeros(q_scaled.shape[:-1] + v.shape[-1:], dtype=compute)  # (g, bq, Dv) unnormalized
    for bj in range(_visible_key_blocks(plan, rows)):
        cols = _span(bj, plan.block_k, plan.m)
        scores_t = k[:, cols] @ q_scaled.swapaxes(-1, -2)  # (g, bk, D) @ (g, D, bq)
        _mask_scores_t(plan, scores_t, groups, rows, cols)
        new_max = np.maximum(row_max, scores_t.max(axis=-2, keepdims=True))
        # A row with nothing visible yet has max -inf: shift by 0 so that exp(-inf) stays 0.
        shift = np.where(np.isneginf(new_max), compute(0), new_max)
        scores_t -= shift
        probs_t = np.exp(scores_t, out=scores_t)  # (g, bk, bq), unnormalized
        correction = np.exp(row_max - shift)  # rescales what earlier blocks accumulated
        row_sum *= correction
        row_sum += _ones(probs_t.shape[-2], compute) @ probs_t  # (1, bk) @ (g, bk, bq): key sums
        acc *= correction.swapaxes(-1, -2)  # (g, bq, 1)
        keep_t = _tile_keep_t(plan, groups, bi, bj, rows, cols)
        weights_t = probs_t if keep_t is None else probs_t * keep_t * plan.rescale
        acc += weights_t.swapaxes(-1, -2) @ v[:, cols]  # (g, bq, bk) @ (g, bk, Dv)
        row_max = new_max
    # A fully masked row has row_sum 0 and acc 0: output 0 and lse = -inf + log(0) = -inf.
    out[:, rows] = acc / np.where(row_sum == 0, compute(1), row_sum).swapaxes(-1, -2)
    with np.errstate(divide="ignore"):
        lse[..., rows] = row_max + np.log(row_sum)


def tiled_attention_backward(dout: np.ndarray, ctx: TiledAttentionCtx) -> AttentionGrads:
    """Gradients of q, k and v, tile by tile, recomputing the probabilities from ``lse``.

    delta = rowsum(dO * O), once; then for each tile of query block i and key block j:
    S = Q_i K_j^T * scale (masked);  P = exp(S - lse_i);  P' = P * keep / (1 - p);
    dV_j += P'^T dO_i;  dP = (dO_i V_j^T) * keep / (1 - p);  dS = P * (dP - delta_i);
    dQ_i += dS K_j * scale;  dK_j += dS^T Q_i * scale.
    A fully masked row has lse = -inf and P = 0 in every tile, so it gets zero gradient.
    Derivation: docs/derivations/tiled.md.

    Args:
        dout: (..., N, Dv) gradient of the output.
        ctx: from ``tiled_attention_forward``.

    Returns:
        dq (..., N, D), dk (..., M, D), dv (..., M, Dv), in the inputs' dtype.
    """
    if not isinstance(ctx, TiledAttentionCtx):
        raise TypeError(
            "attention_backward needs the ctx of a forward run outside no_grad(), "
            f"got {type(ctx).__name__}"
        )
    q, k, v, out, lse, plan, dtype = ctx
    dout = validation.float_array("dout", dout)
    expected = plan.lead + out.shape[-2:]
    if dout.shape != expected:
        raise ValueError(f"dout must have the output's shape {expected}, got {dout.shape}")
    dout = _with_lead(dout.astype(q.dtype, copy=False))  # (..., N, Dv)

    delta = (dout * out).sum(axis=-1)[..., None, :]  # rowsum(dO * O), (..., N) -> (..., 1, N)
    # exp(S - inf) = 0: a fully masked row (lse = -inf) gets P = 0 in every tile.
    lse = np.where(np.isneginf(lse), q.dtype.type(np.inf), lse)
    q_scaled = q * plan.scale  # (..., N, D)
    dq = np.zeros_like(q)
    dk, dv = np.empty_like(k), np.empty_like(v)
    lock = threading.Lock()
    tasks = [(part, bj) for bj in range(_num_blocks(plan.m, plan.block_k)) for part in _parts(plan)]
    threads.run(
        tasks,
        lambda task: _backward_tile(
            plan, q_scaled, k, v, dout, lse, delta, dq, dk, dv, lock, *task
        ),
    )
    dq *= plan.scale
    dq, dk, dv = (
        grad.reshape(plan.lead + grad.shape[-2:]).astype(dtype, copy=False) for grad in (dq, dk, dv)
    )
    return AttentionGrads(dq, dk, dv, None)


def _backward_tile(
    plan: TilePlan,
    q_scaled: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    dout: np.ndarray,
    lse: np.ndarray,
    delta: np.ndarray,
    dq: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
    lock: threading.Lock,
    part: _Part,
    bj: int,
) -> None:
    """dk, dv of key block ``bj`` and its share of dq, for the leading indices of ``part``.

    Tiles hold S^T (keys x queries), as in the forward; every product then reads its operands
    in place (BLAS takes the transposes as flags).
    """
    q_scaled, k, v, dout, lse, delta, dq, dk, dv = (
        t[part.index] for t in (q_scaled, k, v, dout, lse, delta, dq, dk, dv)
    )  # views, (g, L, W)
    groups, cols = part.flat, _span(bj, plan.block_k, plan.m)
    k_block, v_block = k[:, cols], v[:, cols]  # (g, bk, D), (g, bk, Dv)
    dk_block = np.zeros_like(k_block)
    dv_block = np.zeros_like(v_block)
    for bi in _query_blocks_seeing(plan, cols):
        rows = _span(bi, plan.block_q, plan.n)
        q_block, dout_block = q_scaled[:, rows], dout[:, rows]  # (g, bq, D), (g, bq, Dv)
        scores_t = k_block @ q_block.swapaxes(-1, -2)  # (g, bk, D) @ (g, D, bq) -> (g, bk, bq)
        _mask_scores_t(plan, scores_t, groups, rows, cols)
        scores_t -= lse[..., rows]
        probs_t = np.exp(scores_t, out=scores_t)  # P^T = exp(S^T - lse), (g, bk, bq)
        keep_t = _tile_keep_t(plan, groups, bi, bj, rows, cols)
        weights_t = probs_t if keep_t is None else probs_t * keep_t * plan.rescale
        dv_block += weights_t @ dout_block  # dV_j += P'^T dO_i: (g, bk, bq) @ (g, bq, Dv)
        dprobs_t = v_block @ dout_block.swapaxes(-1, -2)  # dP^T: (g, bk, Dv) @ (g, Dv, bq)
        if keep_t is not None:
            dprobs_t *= keep_t
            dprobs_t *= plan.rescale
        dprobs_t -= delta[..., rows]
        dscores_t = np.multiply(dprobs_t, probs_t, out=dprobs_t)  # dS^T = P^T * (dP^T - delta)
        dk_block += dscores_t @ q_block  # dK_j += dS^T Q_i: (g, bk, bq) @ (g, bq, D)
        dq_part = dscores_t.swapaxes(-1, -2) @ k_block  # dS K_j: (g, bq, bk) @ (g, bk, D)
        with lock:  # tiles of other key blocks add into the same rows of dq
            dq[:, rows] += dq_part
    dk[:, cols] = dk_block
    dv[:, cols] = dv_block


# -- dropout regenerated from a seed -----------------------------------------------------------


def tiled_dropout_mask(
    seed: int,
    shape: tuple[int, ...],
    dropout_p: float,
    *,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> np.ndarray:
    """The whole keep-mask that the tiled path regenerates tile by tile, for testing it densely.

    Entry (g, i, j), g the flattened leading index, lies in query block bi = i // block_q and key
    block bj = j // block_k; that block is drawn as ``U >= dropout_p`` with U float32 uniform from
    a Philox generator keyed by ``seed`` with counter ``(g << 192) | (bi << 128) | (bj << 64)``,
    so every block has its own stream, independent of threads and of the tiles' grouping.

    Args:
        seed: ``ctx.plan.seed`` of a tiled forward.
        shape: (..., N, M), the scores' shape.
        dropout_p: the dropout probability.
        block_q: the forward's query block size (``ctx.plan.block_q``).
        block_k: the forward's key block size (``ctx.plan.block_k``).

    Returns:
        bool (..., N, M), True = kept.
    """
    *lead, n, m = shape
    keep = np.empty((math.prod(lead), n, m), dtype=bool)  # (G, N, M)
    for bi in range(_num_blocks(n, block_q)):
        for bj in range(_num_blocks(m, block_k)):
            rows, cols = _span(bi, block_q, n), _span(bj, block_k, m)
            keep[:, rows, cols] = _block_keep(
                seed, slice(0, len(keep)), bi, bj, rows, cols, dropout_p
            )
    return keep.reshape(shape)  # (G, N, M) -> (..., N, M)


def _block_keep(
    seed: int, groups: slice, bi: int, bj: int, rows: slice, cols: slice, dropout_p: float
) -> np.ndarray:
    """The regenerated keep-mask of block (bi, bj) for the leading indices ``groups``."""
    shape = (rows.stop - rows.start, cols.stop - cols.start)
    return np.stack(
        [
            np.random.Generator(
                np.random.Philox(key=seed, counter=(g << 192) | (bi << 128) | (bj << 64))
            ).random(shape, dtype=np.float32)
            >= dropout_p
            for g in range(groups.start, groups.stop)
        ]
    )  # (g, bq, bk)


def _tile_keep_t(
    plan: TilePlan, groups: slice, bi: int, bj: int, rows: slice, cols: slice
) -> np.ndarray | None:
    """The tile's keep-mask, transposed to (g, bk, bq): sliced from the explicit mask or
    regenerated; None without dropout."""
    if plan.keep is not None:
        return _tile(plan.keep, plan.lead, groups, rows, cols).swapaxes(-1, -2)
    if plan.seed is not None:
        return _block_keep(plan.seed, groups, bi, bj, rows, cols, plan.dropout_p).swapaxes(-1, -2)
    return None


# -- plan, masks and tiles ---------------------------------------------------------------------


def _make_plan(
    q_shape: tuple[int, ...],
    m: int,
    compute: np.dtype,
    *,
    causal: bool,
    key_padding_mask: Any,
    attn_mask: Any,
    scale: Any,
    dropout_p: Any,
    dropout_mask: Any,
    rng: Any,
    block_q: Any,
    block_k: Any,
) -> TilePlan:
    """Check every option (before any work) and put each mask into a tile-sliceable form."""
    lead, n, d = q_shape[:-2], q_shape[-2], q_shape[-1]
    score_shape = lead + (n, m)
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"{name} must be a positive integer, got {size!r}")
    hidden, biases = None, []
    if attn_mask is not None:
        allowed, bias = masks.split_attn_mask(attn_mask, score_shape, compute)
        hidden = None if allowed is None else ~allowed
        if bias is not None:
            biases.append(bias)
    if key_padding_mask is not None:
        # Adding -inf is a third of the cost of np.copyto(..., where=mask) per tile, and the
        # (B, M) padding is small enough to hold as floats.
        allowed = masks.key_padding_allowed(key_padding_mask, q_shape, m)
        biases.append(np.where(allowed, compute.type(0), compute.type(-np.inf)))
    p = validation.dropout_p(dropout_p)
    keep, seed = None, None
    if dropout_mask is not None:
        keep = validation.bool_array("dropout_mask", dropout_mask)
        if p == 0.0:
            raise ValueError("dropout_mask was given with dropout_p == 0; set dropout_p > 0")
        validation.broadcasts_to("dropout_mask", keep, score_shape)
    elif p > 0.0:
        seed = int(np.random.default_rng(rng).integers(2**63))
    rank = len(score_shape)
    # Blocks never exceed the lengths (nor drop below 1 row for an empty sequence).
    block_q, block_k = max(1, min(int(block_q), n)), max(1, min(int(block_k), m))
    return TilePlan(
        lead=lead,
        n=n,
        m=m,
        block_q=block_q,
        block_k=block_k,
        group_chunk=max(1, TILE_ENTRIES // (block_q * block_k)),
        causal=bool(causal),
        hidden=None if hidden is None else _full_rank(hidden, rank),
        biases=tuple(_full_rank(bias, rank) for bias in biases),
        keep=None if keep is None else _full_rank(keep, rank),
        seed=seed,
        dropout_p=p,
        rescale=compute.type(1.0 / (1.0 - p)),
        scale=compute.type(1.0 / math.sqrt(d) if scale is None else functional._check_scale(scale)),
    )


def _full_rank(mask: np.ndarray, rank: int) -> np.ndarray:
    """Prepend unit axes so that ``mask`` has one axis per axis of the scores (..., N, M)."""
    return mask.reshape((1,) * (rank - mask.ndim) + mask.shape)


def _tile(
    mask: np.ndarray, lead: tuple[int, ...], groups: slice, rows: slice, cols: slice
) -> np.ndarray:
    """One tile of a full-rank ``mask`` that broadcasts to (..., N, M), as an array that
    broadcasts to (g, bq, bk): unit axes of the mask stay unit axes."""
    rows = rows if mask.shape[-2] > 1 else slice(None)
    cols = cols if mask.shape[-1] > 1 else slice(None)
    block = mask[..., rows, cols]
    if all(size == 1 for size in mask.shape[:-2]):
        return block.reshape((1,) + block.shape[-2:])  # (1, ..., 1, bq, bk) -> (1, bq, bk)
    index = np.unravel_index(np.arange(groups.start, groups.stop), lead)
    index = tuple(i if size > 1 else 0 for i, size in zip(index, mask.shape[:-2], strict=True))
    return block[index]  # (g, bq, bk)


def _mask_scores_t(
    plan: TilePlan, scores_t: np.ndarray, groups: slice, rows: slice, cols: slice
) -> None:
    """Add the float masks and set hidden entries to -inf, in place, on one (g, bk, bq) tile."""
    for bias in plan.biases:
        scores_t += _tile(bias, plan.lead, groups, rows, cols).swapaxes(-1, -2)
    if plan.causal and cols.stop - 1 > rows.start:  # the tile reaches above the diagonal
        scores_t += _causal_bias_t(rows.start - cols.start, *scores_t.shape[1:], scores_t.dtype)
    if plan.hidden is not None:
        hidden_t = _tile(plan.hidden, plan.lead, groups, rows, cols).swapaxes(-1, -2)
        np.copyto(scores_t, scores_t.dtype.type(-np.inf), where=hidden_t)


@functools.lru_cache(maxsize=64)
def _causal_bias_t(offset: int, keys: int, queries: int, dtype: np.dtype) -> np.ndarray:
    """(keys, queries): -inf where key j > query i, else 0, for a tile whose first query row is
    ``offset`` positions after its first key. Built once per (offset, shape), read-only; adding
    it costs a third of ``np.copyto(..., where=mask)``."""
    hidden_t = np.arange(keys)[:, None] - np.arange(queries)[None, :] > offset  # (bk, bq)
    bias_t = np.where(hidden_t, dtype.type(-np.inf), dtype.type(0))
    bias_t.flags.writeable = False
    return bias_t


@functools.lru_cache(maxsize=8)
def _ones(length: int, dtype: type) -> np.ndarray:
    """A (1, length) row of ones: a product with it sums over keys through BLAS, faster than
    ``add.reduce``. Read-only."""
    ones = np.ones((1, length), dtype=dtype)
    ones.flags.writeable = False
    return ones


def _span(index: int, size: int, length: int) -> slice:
    return slice(index * size, min((index + 1) * size, length))


def _num_blocks(length: int, size: int) -> int:
    return -(-length // size)


def _visible_key_blocks(plan: TilePlan, rows: slice) -> int:
    """How many key blocks query rows ``rows`` see; causal skips those entirely to the right."""
    total = _num_blocks(plan.m, plan.block_k)
    return min(total, _num_blocks(rows.stop, plan.block_k)) if plan.causal else total


def _query_blocks_seeing(plan: TilePlan, cols: slice) -> range:
    """The query blocks that see some key of ``cols``; causal skips those entirely above it."""
    first = cols.start // plan.block_q if plan.causal else 0
    return range(first, _num_blocks(plan.n, plan.block_q))


def _blocks_by_work(length: int, size: int) -> list[int]:
    """Query blocks, last first: under a causal mask the last ones see the most keys, and
    starting the longest tiles first balances the pool."""
    return list(range(_num_blocks(length, size)))[::-1]


class _Part(NamedTuple):
    """One tile's leading indices: a run of the last leading axis at one index of the others.

    ``index`` selects them as a view of any (..., L, W) array (basic indexing only, so strided
    inputs stay uncopied); ``flat`` is the same run in the flattened numbering of the leading
    axes, which masks and the dropout streams use.
    """

    index: tuple[int | slice, ...]
    flat: slice


def _parts(plan: TilePlan) -> list[_Part]:
    *outer, last = plan.lead or (1,)
    parts = []
    for flat_outer, outer_index in enumerate(np.ndindex(*outer)):
        for start in range(0, last, plan.group_chunk):
            stop = min(start + plan.group_chunk, last)
            flat = slice(flat_outer * last + start, flat_outer * last + stop)
            parts.append(_Part((*outer_index, slice(start, stop)), flat))
    return parts


def _with_lead(array: np.ndarray) -> np.ndarray:
    """(..., L, W) with at least one leading axis: an unbatched (L, W) becomes a (1, L, W) view."""
    return array if array.ndim > 2 else array[None]
