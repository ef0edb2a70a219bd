"""Tiled, memory-bounded attention (FlashAttention-2 style): the same math as the dense path,
computed in blocks of queries and keys so that no (N, M) array is ever held.

The forward walks the key blocks a query block can see with an online softmax (a running row max and
row sum rescale the partial output; where a bound on every score known in advance is tight enough,
``scores.fixed_shift``, it is the shift instead and nothing is rescaled) and keeps only the output
and the log-sum-exp ``lse`` of each query row. The backward recomputes each tile of probabilities
from ``lse`` and uses ``delta = rowsum(dO * O)`` in place of ``rowsum(dP * P)``. Every option runs
inside the tiles, through the one score pipeline of ``scores.py``: causal masks, windows and
alignment skip the tiles nobody sees (so a window's cost grows linearly in N), mask only the
tiles they cut and take exp only over the parts of a cut tile that some query may see; softcap,
ALiBi and masks apply per tile; a sink starts each row's online softmax as a state with no value
(row max = the sink logit, row sum = 1). GQA: the query heads of one kv head share each
key/value block through broadcasting, so K and V are never repeated. Memory is O(N * block) per
head.

Work is cut into independent tiles (a run of kv heads with their query heads at one index of
the other leading axes, times one block) that ``threads.run`` spreads over the cores. Results do
not depend on thread timing: every output row and every dk/dv block is written by one tile, and
the tiles that add into the same rows of dq add in the order of their key blocks (float
addition is not associative: any other order changes the last bits from run to run).

Shape legend: B batch, H query heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value head width; O the product of q's leading axes but the heads axis, G = O * H
the flattened leading indices; g, gk a tile's share of query heads and kv heads.

Derivation: docs/derivations/tiled.md (the online softmax and the recomputing backward),
windows.md (the tiles skipped), lse.md and sinks.md (delta - dlse, the sink as a starting state).
Tests: tests/numpy_attention/test_tiled.py, and the random combinations of
tests/numpy_attention/test_functional_properties.py.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, NamedTuple

import numpy as np

from . import scores, threads, validation
from .grad_mode import is_grad_enabled
from .rules import ScoreRules, prepare
from .scores import AttentionGrads, AttentionOutput, Tile

# Default block sizes and the number of score entries one tile aims at (several heads share a
# tile when blocks are small). Chosen by measurement on a 2-core AVX-512 machine
# (docs/benchmarks.md): a (4, 256, 256) float32 tile is 1 MiB, which stays in cache across the
# elementwise passes while the products run near NumPy's matmul peak.
BLOCK_Q = 256
BLOCK_K = 256
TILE_ENTRIES = 4 * 256 * 256
# Keys per piece of a tile that a causal/window band cuts (``_pieces``): the forward takes no exp
# where no query of the tile sees a piece's keys. 64 measured fastest on a diagonal tile of 256
# (32 and 128 cost more in small strided passes or in the exp they leave).
PIECE_KEYS = 64


class Blocks(NamedTuple):
    """How a call is cut into tiles."""

    block_q: int  # query rows per tile
    block_k: int  # key rows per tile
    kv_chunk: int  # kv heads per tile (each with its ``group`` query heads)


class TiledAttentionCtx(NamedTuple):
    """q, k, v and out grouped by kv head: (O, H_kv, group, L, W), kv tensors with group 1."""

    q_scaled: np.ndarray  # (O, H_kv, group, N, D), Q * query_scale in the compute dtype
    k: np.ndarray  # (O, H_kv, 1, M, D)
    v: np.ndarray  # (O, H_kv, 1, M, Dv)
    out: np.ndarray  # (O, H_kv, group, N, Dv), compute dtype, before the cast
    lse: np.ndarray  # (G, 1, N): like a row of S^T; -inf for a dead row (the sink with sinks)
    rules: ScoreRules
    blocks: Blocks
    shapes: tuple[tuple[int, ...], ...]  # the shapes of q, k and v as given
    dtype: np.dtype  # the inputs' dtype, which the gradients are returned in


def tiled_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
    **options: Any,
) -> AttentionOutput:
    """Attention in (block_q, block_k) tiles with an online softmax.

    Same options, results and dtypes as ``functional.attention_forward`` (every keyword of it
    but ``impl``), computed without any (N, M) array.

    Args:
        q: (..., H, N, D) queries.
        k: (..., H_kv, M, D) keys.
        v: (..., H_kv, M, Dv) values.
        block_q: query rows per tile.
        block_k: key rows per tile.
        return_lse: also return the log-sum-exp of each row of scores.
        **options: causal, window, align, key_padding_mask, attn_mask, scale, softcap,
            alibi_slopes, sinks, enable_gqa, dropout_p, dropout_mask, rng, chunk_size,
            chunk_start.

    Returns:
        ``AttentionOutput(out, lse, ctx)`` as ``functional.attention_forward`` returns it.
    """
    blocks_asked = (
        validation.positive_int("block_q", block_q),
        validation.positive_int("block_k", block_k),
    )
    return_lse = validation.flag("return_lse", return_lse)
    q, k, v, dtype, rules = prepare(q, k, v, **options)
    shapes = (q.shape, k.shape, v.shape)
    blocks = _blocks(rules, *blocks_asked)
    # Tiles read q, k and v in place, strided or not (BLAS needs a unit stride on one axis only):
    # copying the heads out of a fused projection first cost a quarter of the attention time.
    q = _grouped(q, rules, rules.group)  # (O, H_kv, group, N, D)
    k, v = _grouped(k, rules, 1), _grouped(v, rules, 1)  # (O, H_kv, 1, M, W)
    # The backward reads Q * query_scale whole; a forward alone scales each tile's rows of q as
    # it reads them, and makes no copy of q.
    keep_ctx = is_grad_enabled()
    q_scaled = q * rules.query_scale if keep_ctx else None  # (O, H_kv, group, N, D)
    out = np.empty(q.shape[:-1] + v.shape[-1:], rules.compute)  # (O, H_kv, group, N, Dv)
    lse = np.empty((_num_groups(rules), 1, rules.n), rules.compute)  # (G, 1, N)
    tasks = [
        (part, bi)
        for bi in reversed(range(_num_blocks(rules.n, blocks.block_q)))  # long rows first
        for part in _parts(rules, blocks)
    ]

    def work(task: tuple[_Part, int]) -> None:
        _forward_tile(rules, blocks, q, q_scaled, k, v, out, lse, *task)

    threads.run(tasks, work)
    ctx = (
        TiledAttentionCtx(q_scaled, k, v, out, lse, rules, blocks, shapes, dtype)
        if q_scaled is not None
        else None
    )
    # The ctx keeps O for the backward's delta: hand out a copy, so that in-place work on the
    # result cannot change it.
    result = out.reshape(rules.lead + out.shape[-2:]).astype(dtype, copy=keep_ctx)  # (..., N, Dv)
    lse_out = lse.reshape(rules.lead + (rules.n,)).copy() if return_lse else None  # (..., N)
    return AttentionOutput(result, lse_out, ctx)


def _forward_tile(
    rules: ScoreRules,
    blocks: Blocks,
    q: np.ndarray,
    q_scaled: np.ndarray | None,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    part: _Part,
    bi: int,
) -> None:
    """Rows ``bi`` of ``out`` and ``lse`` for the heads of ``part``: an online softmax over the
    key blocks these rows see. ``q_scaled`` is Q * query_scale, or None: scale these rows of q.

    Tiles hold S^T (keys x queries), so the softmax reduces over axis -2: NumPy reduces across
    rows with vectorized elementwise max/add, 2-3x faster than along the contiguous last axis.
    The two products of each key block write into buffers made once per call, which the key
    blocks reuse, rather than into a fresh tile-sized array per block.
    """
    rows = _span(bi, blocks.block_q, rules.n)
    if q_scaled is None:
        q_block = q[part.at][:, :, rows] * rules.query_scale  # (gk, group, bq, D)
    else:
        q_block = q_scaled[part.at][:, :, rows]  # (gk, group, bq, D), a view
    q_t = q_block.swapaxes(-1, -2)  # (gk, group, D, bq), a view: BLAS reads it transposed
    k, v = k[part.at], v[part.at]  # (gk, 1, M, W), views
    gk, group, bq = q_block.shape[:3]
    compute = rules.compute.type
    sinks = scores.sink_logits(rules, part.flat)  # (g, 1, 1) or None
    stat_shape = (gk * group, 1, bq)
    # The state of each row: the shift (its running max, or a bound known in advance), the sum
    # of exp(scores - shift), and the unnormalized output. A sink is a state with no value: max
    # = its logit, sum = exp(0) = 1 (exp(sink - shift) under a fixed shift), output 0.
    fixed = scores.fixed_shift(rules)
    if fixed is not None:
        row_max = np.full(stat_shape, fixed, compute)
        row_sum = np.zeros(stat_shape, compute) if sinks is None else np.exp(sinks - row_max)
    elif sinks is None:
        row_max, row_sum = np.full(stat_shape, -np.inf, compute), np.zeros(stat_shape, compute)
    else:
        row_max, row_sum = sinks + np.zeros(stat_shape, compute), np.ones(stat_shape, compute)
    acc = np.zeros((gk, group, bq, v.shape[-1]), compute)  # (gk, group, bq, Dv)
    scores_buffer = np.empty(gk * group * blocks.block_k * bq, compute)
    partial = np.empty_like(acc)  # one key block's P V
    for cols, pieces in _key_tiles(rules, blocks, rows):
        bk = cols.stop - cols.start
        tile = Tile(part.flat, rows, cols, transposed=True)
        scores_t = scores_buffer[: gk * group * bk * bq].reshape(gk * group, bk, bq)  # S1^T
        # (gk, 1, bk, D) @ (gk, group, D, bq) -> (gk, group, bk, bq), a view of scores_t
        np.matmul(k[:, :, cols], q_t, out=scores_t.reshape(gk, group, bk, bq))
        scores.apply(rules, scores_t, tile, shift=fixed)  # S, or S - fixed
        if fixed is not None:  # each row's largest weight in [exp(floor), 1]: nothing to rescale
            scores.flush_underflow(scores_t, scores.exp_floor(rules, tile))  # ALiBi's far keys
            probs_t = _exp_visible(scores_t, pieces, scores_t)  # (g, bk, bq), unnormalized
            row_sum += _ones(bk, rules.compute) @ probs_t  # (1, bk) @ (g, bk, bq)
        else:
            probs_t, correction = _online_step(rules, tile, scores_t, row_max, pieces)
            row_sum *= correction
            row_sum += _ones(bk, rules.compute) @ probs_t
            acc *= correction.reshape(gk, group, bq, 1)
        keep_t = scores.keep_tile(rules, tile)
        weights_t = probs_t if keep_t is None else probs_t * keep_t * rules.rescale
        weights = weights_t.reshape(gk, group, bk, bq).swapaxes(-1, -2)  # (gk, group, bq, bk)
        # (gk, group, bq, bk) @ (gk, 1, bk, Dv) -> (gk, group, bq, Dv)
        acc += np.matmul(weights, v[:, :, cols], out=partial)
    # A dead row has row_sum 0 and acc 0: output 0 and lse = -inf + log(0) = -inf.
    total = np.where(row_sum == 0, compute(1), row_sum)  # (g, 1, bq)
    np.divide(acc, total.reshape(gk, group, bq, 1), out=out[part.at][:, :, rows])
    with np.errstate(divide="ignore"):
        row_lse = row_max + np.log(row_sum)
    if fixed is not None:  # a visible +inf score: row_sum inf; NaN, as the running max gives it
        row_lse[np.isposinf(row_sum)] = np.nan
    lse[part.flat, :, rows] = row_lse


class _Piece(NamedTuple):
    """A run of a cut tile's keys, ``keys`` on the tile's key axis, and the stretch of its
    queries that may see one of them, ``queries`` on the tile's query axis: every score of
    these keys outside that stretch is hidden."""

    keys: slice
    queries: slice


def _key_tiles(
    rules: ScoreRules, blocks: Blocks, rows: slice
) -> list[tuple[slice, tuple[_Piece, ...] | None]]:
    """The key blocks that query block ``rows`` sees, each with its pieces (``_pieces``)."""
    key_blocks = _block_range(*scores.visible_cols(rules, rows), blocks.block_k)
    spans = [_span(bj, blocks.block_k, rules.m) for bj in key_blocks]
    return [(cols, _pieces(rules, rows, cols)) for cols in spans]


def _pieces(rules: ScoreRules, rows: slice, cols: slice) -> tuple[_Piece, ...] | None:
    """A tile that a causal/window band or chunks cut, as runs of PIECE_KEYS keys, each with the
    queries of ``rows`` that may see one of its keys (``scores.visible_rows``); None when every
    run may be seen by every query.

    The pipeline has made every score outside the pieces -inf, so its weight is an exact 0:
    ``_exp_visible`` takes exp over the pieces alone and writes those zeros (on a causal
    diagonal tile, 5/8 of it is worked on), the same bits as exp over the whole tile.
    """
    if rules.left is None and rules.right is None and rules.chunk is None:
        return None
    pieces = []
    for start in range(cols.start, cols.stop, PIECE_KEYS):
        run = slice(start, min(start + PIECE_KEYS, cols.stop))
        lo, hi = scores.visible_rows(rules, run)
        lo, hi = max(lo, rows.start), min(hi, rows.stop)
        hi = max(lo, hi)  # empty: no query of the tile sees these keys
        keys = slice(run.start - cols.start, run.stop - cols.start)
        pieces.append(_Piece(keys, slice(lo - rows.start, hi - rows.start)))
    bq = rows.stop - rows.start
    if all(piece.queries == slice(0, bq) for piece in pieces):
        return None
    return tuple(pieces)


def _exp_visible(
    shifted_t: np.ndarray, pieces: tuple[_Piece, ...] | None, out: np.ndarray
) -> np.ndarray:
    """exp of a tile's shifted scores ``shifted_t`` (g, bk, bq) into ``out`` (the same array,
    in the forward): over the whole tile, or over its ``pieces`` with exp(-inf) = 0 written
    elsewhere."""
    if pieces is None:
        return np.exp(shifted_t, out=out)
    for piece in pieces:
        run = out[:, piece.keys]  # (g, run, bq)
        run[:, :, : piece.queries.start] = 0
        run[:, :, piece.queries.stop :] = 0
        seen = (slice(None), piece.keys, piece.queries)  # (g, run, queries)
        np.exp(shifted_t[seen], out=out[seen])
    return out


def _online_step(
    rules: ScoreRules,
    tile: Tile,
    scores_t: np.ndarray,
    row_max: np.ndarray,
    pieces: tuple[_Piece, ...] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One tile of the online softmax: the running max ``row_max`` (g, 1, bq) raised to this
    tile's in place; the tile's weights exp(S - max), in place of ``scores_t`` (exp over its
    ``pieces`` alone when it is cut), and the factor exp(old max - new max) that rescales what
    earlier blocks accumulated."""
    new_max = np.maximum(row_max, scores_t.max(axis=-2, keepdims=True))
    # A row with nothing visible yet has max -inf: shift by 0 so that exp(-inf) stays 0.
    shift = np.where(np.isneginf(new_max), rules.compute.type(0), new_max)
    scores_t -= shift
    scores.flush_underflow(scores_t, scores.exp_floor(rules, tile))  # no denormal weights
    probs_t = _exp_visible(scores_t, pieces, scores_t)  # (g, bk, bq), unnormalized
    correction = np.exp(row_max - shift)
    row_max[...] = new_max
    return probs_t, correction


def tiled_attention_backward(
    dout: np.ndarray, ctx: TiledAttentionCtx, dlse: np.ndarray | None = None
) -> AttentionGrads:
    """Gradients of q, k, v (and of the sinks), tile by tile, recomputing P from ``lse``.

    delta = rowsum(dO * O) - dlse, once; then for each tile of query block i and key block j:
    S = the pipeline on (Q_i * scale) K_j^T;  P = exp(S - lse_i);  P' = P * keep / (1 - p);
    dV_j += P'^T dO_i;  dP = (dO_i V_j^T) * keep / (1 - p);  dS = P * (dP - delta_i);
    dS1 = dS * (1 - tanh^2) (softcap);  dQ_i += dS1 K_j * scale;  dK_j += dS1^T (Q_i * scale);
    dK, dV summed over each kv head's query heads; dsink_h = -sum over rows of
    exp(sink_h - lse) * delta. A dead row has lse = -inf and P = 0 in every tile: zero gradient.
    Derivation: docs/derivations/tiled.md, lse.md, sinks.md.

    Args:
        dout: (..., H, N, Dv) gradient of the output.
        ctx: from ``tiled_attention_forward``.
        dlse: (..., H, N) gradient of lse, or None.

    Returns:
        ``AttentionGrads(dq, dk, dv, dsinks)`` in the inputs' dtype.
    """
    if not isinstance(ctx, TiledAttentionCtx):
        raise TypeError(
            "attention_backward needs the ctx of a forward run outside no_grad(), "
            f"got {type(ctx).__name__}"
        )
    q_scaled, k, v, out, lse, rules, blocks, shapes, dtype = ctx
    compute = rules.compute
    dout = validation.grad_output(dout, rules.lead + out.shape[-2:], compute)
    dout = dout.reshape(out.shape)  # (O, H_kv, group, N, Dv)
    delta = (dout * out).sum(axis=-1).reshape(lse.shape)  # rowsum(dO * O), (G, 1, N)
    if dlse is not None:
        dlse = validation.grad_output(dlse, rules.lead + (rules.n,), compute, name="dlse")
        delta = delta - dlse.reshape(lse.shape)  # dS = P * (dP - delta + dlse)
    dsinks = None
    if rules.sinks is not None:
        sink_probs = np.exp(rules.sinks[:, None, None] - lse)  # (G, 1, N)
        per_group = -(sink_probs * delta).sum(axis=(-2, -1))  # (G,)
        heads = per_group.reshape(rules.lead).sum(axis=tuple(range(len(rules.lead) - 1)))
        dsinks = heads.astype(dtype, copy=False)  # (H,)
    # exp(S - inf) = 0: a dead row (lse = -inf) gets P = 0 in every tile.
    lse = np.where(np.isneginf(lse), compute.type(np.inf), lse)
    dq = np.zeros_like(q_scaled)
    dk, dv = np.empty_like(k), np.empty_like(v)
    order = _InOrder()
    tasks = [
        (part, bj)
        for bj in range(_num_blocks(rules.m, blocks.block_k))
        for part in _parts(rules, blocks)
    ]

    def work(task: tuple[_Part, int]) -> None:
        try:
            _backward_tile(
                rules, blocks, q_scaled, k, v, dout, lse, delta, dq, dk, dv, order, *task
            )
        except BaseException:
            order.fail()  # release the tiles waiting for this one's turn
            raise

    threads.run(tasks, work)
    dq *= rules.scale  # forward: S1 = (Q * scale) K^T
    if rules.softcap:
        dk *= rules.compute.type(scores.key_grad_scale(rules))  # Q was scaled by scale / softcap
    return AttentionGrads(
        dq.reshape(shapes[0]).astype(dtype, copy=False),
        dk.reshape(shapes[1]).astype(dtype, copy=False),
        dv.reshape(shapes[2]).astype(dtype, copy=False),
        dsinks,
    )


def _backward_tile(
    rules: ScoreRules,
    blocks: Blocks,
    q_scaled: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    dout: np.ndarray,
    lse: np.ndarray,
    delta: np.ndarray,
    dq: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
    order: _InOrder,
    part: _Part,
    bj: int,
) -> None:
    """dk, dv of key block ``bj`` and its share of dq, for the heads of ``part``.

    Tiles hold S^T (keys x queries), as in the forward; every product then reads its operands
    in place (BLAS takes the transposes as flags).
    """
    cols = _span(bj, blocks.block_k, rules.m)
    q_scaled, dout, dq = q_scaled[part.at], dout[part.at], dq[part.at]  # views
    k_block = k[part.at][:, :, cols]  # (gk, 1, bk, D)
    v_block = v[part.at][:, :, cols]  # (gk, 1, bk, Dv)
    lse, delta = lse[part.flat], delta[part.flat]  # (g, 1, N)
    dk_block = np.zeros_like(k_block)
    dv_block = np.zeros_like(v_block)
    for bi in _block_range(*scores.visible_rows(rules, cols), blocks.block_q):
        rows = _span(bi, blocks.block_q, rules.n)
        tile = Tile(part.flat, rows, cols, transposed=True)
        q_block, dout_block = q_scaled[:, :, rows], dout[:, :, rows]  # (gk, group, bq, W)
        gk, group, bq = q_block.shape[:3]
        scores_t = k_block @ q_block.swapaxes(-1, -2)  # (gk, 1, bk, D) @ (gk, group, D, bq)
        scores_t = scores_t.reshape(gk * group, -1, bq)  # (g, bk, bq): S1^T
        capped = scores.apply(rules, scores_t, tile, keep_capped=True, shift=lse[:, :, rows])
        scores.flush_underflow(scores_t, scores.exp_floor(rules, tile))  # as in the forward
        probs_t = np.exp(scores_t, out=scores_t)  # P^T = exp(S^T - lse), (g, bk, bq)
        keep_t = scores.keep_tile(rules, tile)
        weights_t = probs_t if keep_t is None else probs_t * keep_t * rules.rescale
        weights_t = weights_t.reshape(gk, group, -1, bq)  # (gk, group, bk, bq)
        dv_block += _group_sum(weights_t @ dout_block)  # dV_j += P'^T dO_i: -> (gk, 1, bk, Dv)
        dprobs_t = v_block @ dout_block.swapaxes(
            -1, -2
        )  # dP^T: (gk, 1, bk, Dv) @ (gk, group, Dv, bq)
        dprobs_t = dprobs_t.reshape(gk * group, -1, bq)  # (g, bk, bq)
        if keep_t is not None:
            dprobs_t *= keep_t
            dprobs_t *= rules.rescale
        dprobs_t -= delta[:, :, rows]
        dscores_t = np.multiply(dprobs_t, probs_t, out=dprobs_t)  # dS^T = P^T * (dP^T - delta)
        dscores_t = scores.backward(rules, dscores_t, capped)  # dS1^T
        dscores_t = dscores_t.reshape(gk, group, -1, bq)  # (gk, group, bk, bq)
        dk_block += _group_sum(dscores_t @ q_block)  # dK_j += dS1^T (Q_i * scale)
        dq_part = (
            dscores_t.swapaxes(-1, -2) @ k_block
        )  # dS1 K_j: (gk, group, bq, bk) @ (gk, 1, bk, D)
        first = scores.visible_cols(rules, rows)[0] // blocks.block_k
        order.add((part.flat.start, bi), bj - first, dq[:, :, rows], dq_part)
    dk[part.at][:, :, cols] = dk_block
    dv[part.at][:, :, cols] = dv_block


def _group_sum(grads: np.ndarray) -> np.ndarray:
    """(gk, group, L, W) -> (gk, 1, L, W): the kv heads' gradients sum over their query heads."""
    return grads if grads.shape[1] == 1 else grads.sum(axis=1, keepdims=True)


class _InOrder:
    """Adds the dq contributions of one query block in the order of their key blocks.

    Tasks are handed out in order of key block, so the one a task waits for was handed out
    before it and never waits for a later one: no deadlock. If a task fails, the waiting ones
    stop too (``fail``), so that ``threads.run`` can report the first error.
    """

    def __init__(self) -> None:
        self._turn: dict[tuple[int, int], int] = {}
        self._failed = False
        self._done = threading.Condition()

    def add(
        self, key: tuple[int, int], position: int, target: np.ndarray, value: np.ndarray
    ) -> None:
        with self._done:
            self._done.wait_for(lambda: self._failed or self._turn.get(key, 0) == position)
            if self._failed:
                raise RuntimeError("a tile of the same backward failed")
            target += value
            self._turn[key] = position + 1
            self._done.notify_all()

    def fail(self) -> None:
        with self._done:
            self._failed = True
            self._done.notify_all()


# -- how a call is cut into tiles ----------------------------------------------------------------


def _blocks(rules: ScoreRules, block_q: int, block_k: int) -> Blocks:
    # Blocks never exceed the lengths (nor drop below 1 row for an empty sequence).
    block_q, block_k = max(1, min(block_q, rules.n)), max(1, min(block_k, rules.m))
    kv_chunk = max(1, TILE_ENTRIES // (block_q * block_k * rules.group))
    return Blocks(block_q, block_k, kv_chunk)


def _grouped(t: np.ndarray, rules: ScoreRules, group: int) -> np.ndarray:
    """(..., H_kv * group, L, W) -> (O, H_kv, group, L, W); an unbatched (L, W) gets O = H = 1."""
    heads = rules.lead[-1] if rules.lead else 1
    outer = _num_groups(rules) // heads
    return t.reshape(outer, heads // rules.group, group, *t.shape[-2:])


def _num_groups(rules: ScoreRules) -> int:
    return int(np.prod(rules.lead, dtype=np.int64))


class _Part(NamedTuple):
    """One tile's heads: a run of kv heads (with all their query heads) at one outer index.

    ``at`` selects them from any (O, H_kv, group, L, W) array as a view; ``flat`` is the
    same query heads in the flattened numbering of q's leading axes (masks, slopes, sinks,
    lse and the dropout streams use it).
    """

    at: tuple[int, slice]
    flat: slice


def _parts(rules: ScoreRules, blocks: Blocks) -> list[_Part]:
    heads = rules.lead[-1] if rules.lead else 1
    kv_heads = heads // rules.group
    parts = []
    for outer in range(_num_groups(rules) // heads):
        for start in range(0, kv_heads, blocks.kv_chunk):
            stop = min(start + blocks.kv_chunk, kv_heads)
            flat = slice(outer * heads + start * rules.group, outer * heads + stop * rules.group)
            parts.append(_Part((outer, slice(start, stop)), flat))
    return parts


def _span(index: int, size: int, length: int) -> slice:
    return slice(index * size, min((index + 1) * size, length))


def _num_blocks(length: int, size: int) -> int:
    return -(-length // size)


def _block_range(lo: int, hi: int, size: int) -> range:
    """The blocks of ``size`` that hold some index of [lo, hi); none when it is empty."""
    return range(lo // size, _num_blocks(hi, size)) if hi > lo else range(0)


@functools.lru_cache(maxsize=8)
def _ones(length: int, dtype: np.dtype) -> np.ndarray:
    """A (1, length) row of ones: a product with it sums over keys through BLAS, faster than
    ``add.reduce``. Read-only."""
    ones = np.ones((1, length), dtype=dtype)
    ones.flags.writeable = False
    return ones
