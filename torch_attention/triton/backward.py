"""The backward kernels: ``numpy_attention/tiled.py::_backward_tile`` as two Triton passes,
FlashAttention-2's schedule with dQ in a pass of its own.

Both recompute each tile of probabilities from the forward's ``lse``, P = exp(S - lse), and use
``delta = rowsum(dO * O) - dlse`` (computed once before them, as ``tiled_attention_backward``
does) in place of rowsum(dP * P):

- ``attention_backward_dkdv_kernel``: one program per key block and query head. It walks the
  query blocks that see the key block (``visible_rows``), accumulating dV_j += P'^T dO_i and
  dK_j += dS1^T Q_i in registers, and writes them once, at its query head: under GQA into
  float32 buffers (B, H, M, W) that the launcher sums over each kv head's group in a fixed
  order (as flash-attn sums its expanded dK, dV), so that a kv head's group runs in parallel.
- ``attention_backward_dq_kernel``: one program per query block and query head, walking the key
  blocks its rows see (as the forward does) and accumulating dQ_i += dS1 K_j.

dQ is a separate pass rather than atomic adds from the dK/dV programs: every element of dq and
of the dK/dV buffers is then written by one program with its sum taken in a fixed order, so the
backward is deterministic (bit-identical run to run, as the NumPy tiled path is), at the price
of recomputing S and dP for dQ (docs/triton-kernel.md, "dQ: a pass of its own").

As the forward: one grid axis (``program_tile``), the walks split into edge tiles (masked) and
interior ones (``interior_rows``, ``interior_cols``), scores in base 2 (exp2 against lse *
log2(e)), 64-bit offsets, the dropout seed read from a tensor.

Strides as in ``forward.py``: every tensor read through the strides it has; lse and delta share
one layout (B, H, N); a packed call passes batch strides 0.

Shape legend: B batch (or S sequences), H query heads, H_kv key/value heads, N query length, M
key length, D head width, Dv value head width; BLOCK_D, BLOCK_DV the widths rounded up.

Derivation: docs/derivations/tiled.md (the recomputing backward), lse.md (delta - dlse),
softcap.md, docs/triton-kernel.md.
Tests: tests/torch_attention/triton/test_backward.py; test_launch.py (through the launcher).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .pipeline import (
    LOG2E,
    base2_scales,
    block_range,
    dropout_keep,
    head_start,
    interior_cols,
    interior_rows,
    program_tile,
    scores_tile,
    sequence,
    tile_offsets,
    visible_cols,
    visible_rows,
)


@triton.jit
def attention_backward_dkdv_kernel(
    q, k, v, dout, lse, delta, dk, dv, slopes, seed, cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_lb, stride_lh, stride_ln,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_slope_b, stride_slope_h,
    heads, group, seqlen_q, seqlen_k, offset, head_dim, value_dim,
    scale, softcap, left, right, dropout_p, rescale, lse_rows, keys_per_row, length_bucket,
    VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dK and dV of one key block from one query head h of one batch element (``program_tile``:
    the grid is cdiv(M, BLOCK_N) * B * H programs), written at query head h of ``dk``, ``dv``:
    (B, H, M, W) float32 buffers that the launcher sums over each kv head's group under GQA, dk
    and dv themselves without. dout's strides are ``stride_g*``."""
    # Under causal the first key blocks are seen by the most queries and run first as they
    # are; a window with only a left side turns it around.
    which, block_n = program_tile(tl.cdiv(seqlen_k, BLOCK_N), HAS_LEFT and not HAS_RIGHT)
    b = which // heads
    h = which % heads
    kv_h = h // group
    q_start, seqlen_q, k_start, seqlen_k, offset = sequence(
        b, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, offset, VARLEN, BOTTOM_RIGHT
    )
    col_start = block_n * BLOCK_N
    if col_start >= seqlen_k:  # a block past a short packed sequence's end
        return
    col_stop = tl.minimum(col_start + BLOCK_N, seqlen_k)
    cols = col_start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    # Every address in 64 bits (head_start, tile_offsets): large tensors pass 2^31 elements.
    k += head_start(b, kv_h, k_start, stride_kb, stride_kh, stride_kn)
    v += head_start(b, kv_h, k_start, stride_vb, stride_vh, stride_vn)
    dk += head_start(b, h, k_start, stride_dkb, stride_dkh, stride_dkn)
    dv += head_start(b, h, k_start, stride_dvb, stride_dvh, stride_dvn)
    k_block = tl.load(
        k + tile_offsets(cols, dims, stride_kn, stride_kd),
        mask=(cols[:, None] < seqlen_k) & (dims[None, :] < head_dim),
        other=0.0,
    )  # (BLOCK_N, BLOCK_D)
    v_block = tl.load(
        v + tile_offsets(cols, vdims, stride_vn, stride_vd),
        mask=(cols[:, None] < seqlen_k) & (vdims[None, :] < value_dim),
        other=0.0,
    )  # (BLOCK_N, BLOCK_DV)
    qk_scale, cap_scale = base2_scales(scale, softcap, SOFTCAP)
    slope = 0.0
    if ALIBI:
        slope = tl.load(slopes + b64 * stride_slope_b + h64 * stride_slope_h) * LOG2E
    key = 0
    if DROPOUT:
        key = tl.load(seed)
    row_base = (b64 * heads + h64) * lse_rows + q_start  # dropout's flat index of row 0
    q += head_start(b, h, q_start, stride_qb, stride_qh, stride_qn)
    dout += head_start(b, h, q_start, stride_gb, stride_gh, stride_gn)
    lse += head_start(b, h, q_start, stride_lb, stride_lh, stride_ln)
    delta += head_start(b, h, q_start, stride_lb, stride_lh, stride_ln)
    dk_block = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv_block = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)

    # for bi in _block_range(*visible_rows(rules, cols), block_q): the query blocks that see
    # this key block, in order: those before mid_first cross the diagonal or a window's right
    # edge, those from mid_stop on a window's left edge; the ones between see it whole.
    lo, hi = visible_rows(col_start, col_stop, offset, left, right, seqlen_q, HAS_LEFT, HAS_RIGHT)
    first, stop = block_range(lo, hi, BLOCK_M)
    mid_first, mid_stop = interior_rows(
        col_start, col_stop, first, stop, offset, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M
    )
    for row_start in range(first, mid_first, BLOCK_M):
        dk_block, dv_block = dkdv_step(
            q, dout, lse, delta, k_block, v_block, dk_block, dv_block, row_start, cols, dims,
            vdims, stride_qn, stride_qd, stride_gn, stride_gd, stride_ln, seqlen_q, seqlen_k,
            offset, head_dim, value_dim, qk_scale, cap_scale, slope, left, right, dropout_p,
            rescale, key, row_base, keys_per_row,
            True, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DROPOUT, DOT_PRECISION, BLOCK_M,
        )  # fmt: skip
    for row_start in range(mid_first, mid_stop, BLOCK_M):
        dk_block, dv_block = dkdv_step(
            q, dout, lse, delta, k_block, v_block, dk_block, dv_block, row_start, cols, dims,
            vdims, stride_qn, stride_qd, stride_gn, stride_gd, stride_ln, seqlen_q, seqlen_k,
            offset, head_dim, value_dim, qk_scale, cap_scale, slope, left, right, dropout_p,
            rescale, key, row_base, keys_per_row,
            False, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DROPOUT, DOT_PRECISION, BLOCK_M,
        )  # fmt: skip
    for row_start in range(mid_stop, stop, BLOCK_M):
        dk_block, dv_block = dkdv_step(
            q, dout, lse, delta, k_block, v_block, dk_block, dv_block, row_start, cols, dims,
            vdims, stride_qn, stride_qd, stride_gn, stride_gd, stride_ln, seqlen_q, seqlen_k,
            offset, head_dim, value_dim, qk_scale, cap_scale, slope, left, right, dropout_p,
            rescale, key, row_base, keys_per_row,
            True, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DROPOUT, DOT_PRECISION, BLOCK_M,
        )  # fmt: skip
    dk_block *= scale  # forward: S1 = (Q K^T) * scale
    tl.store(
        dk + tile_offsets(cols, dims, stride_dkn, stride_dkd),
        dk_block.to(dk.dtype.element_ty),
        mask=(cols[:, None] < seqlen_k) & (dims[None, :] < head_dim),
    )
    tl.store(
        dv + tile_offsets(cols, vdims, stride_dvn, stride_dvd),
        dv_block.to(dv.dtype.element_ty),
        mask=(cols[:, None] < seqlen_k) & (vdims[None, :] < value_dim),
    )


@triton.jit
def dkdv_step(
    q, dout, lse, delta, k_block, v_block, dk_block, dv_block, row_start, cols, dims,
    vdims, stride_qn, stride_qd, stride_gn, stride_gd, stride_ln, seqlen_q, seqlen_k,
    offset, head_dim, value_dim, qk_scale, cap_scale, slope, left, right, dropout_p,
    rescale, key, row_base, keys_per_row,
    MASKED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """One query block of the dK/dV walk, ``tiled._backward_tile``'s lines for dK and dV:
    (dk_block, dv_block) plus the rows row_start ... row_start + BLOCK_M - 1 (q, dout, lse,
    delta point to the sequence's first row of the head). MASKED False: a block that sees the
    key block whole (``interior_rows``); its loads keep their row mask (its last rows may lie
    past the queries' end)."""
    rows = row_start + tl.arange(0, BLOCK_M)
    q_rows = rows.to(tl.int64)
    in_rows = rows < seqlen_q
    q_tile = tl.load(
        q + tile_offsets(rows, dims, stride_qn, stride_qd),
        mask=in_rows[:, None] & (dims[None, :] < head_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_D)
    dout_tile = tl.load(
        dout + tile_offsets(rows, vdims, stride_gn, stride_gd),
        mask=in_rows[:, None] & (vdims[None, :] < value_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_DV)
    # exp2(S - inf) = 0: a dead row (lse = -inf) gets P = 0, as do rows past the end.
    row_lse = tl.load(lse + q_rows * stride_ln, mask=in_rows, other=float("inf"))
    row_lse = tl.where(row_lse == float("-inf"), float("inf"), row_lse) * LOG2E
    row_delta = tl.load(delta + q_rows * stride_ln, mask=in_rows, other=0.0)
    # S = the pipeline on Q_i K_j^T (base 2);  P = exp(S - lse_i);  P' = P * keep / (1 - p)
    scores, capped = scores_tile(
        q_tile, k_block, rows, cols, seqlen_q, seqlen_k, offset, qk_scale, cap_scale, slope,
        left, right, MASKED, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DOT_PRECISION,
    )  # fmt: skip
    probs = tl.exp2(scores - row_lse[:, None])  # (BLOCK_M, BLOCK_N)
    weights = probs
    if DROPOUT:
        keep = dropout_keep(key, dropout_p, row_base + q_rows, cols, keys_per_row)
        weights = tl.where(keep, probs * rescale, 0.0)
    # dV_j += P'^T dO_i
    dv_block += tl.dot(
        tl.trans(weights).to(dout_tile.dtype), dout_tile, input_precision=DOT_PRECISION
    )
    # dP = (dO_i V_j^T) * keep / (1 - p);  dS = P * (dP - delta_i)
    dprobs = tl.dot(dout_tile, tl.trans(v_block), input_precision=DOT_PRECISION)
    if DROPOUT:
        dprobs = tl.where(keep, dprobs * rescale, 0.0)
    dscores = probs * (dprobs - row_delta[:, None])
    if SOFTCAP:  # dS1 = dS * (1 - tanh^2(S1 / softcap))
        dscores = dscores * (1.0 - capped * capped)
    # dK_j += dS1^T Q_i (times scale, once, at the end)
    dk_block += tl.dot(tl.trans(dscores).to(q_tile.dtype), q_tile, input_precision=DOT_PRECISION)
    return dk_block, dv_block


@triton.jit
def attention_backward_dq_kernel(
    q, k, v, dout, lse, delta, dq, dslope_rows, slopes, seed, cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_lb, stride_lh, stride_ln,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    stride_slope_b, stride_slope_h,
    heads, group, seqlen_q, seqlen_k, offset, head_dim, value_dim,
    scale, softcap, left, right, dropout_p, rescale, lse_rows, keys_per_row, length_bucket,
    VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, SLOPE_GRAD: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dq of one query block of one head of one batch element (``program_tile``, as the
    forward: cdiv(N, BLOCK_M) * B * H programs, the heaviest causal blocks first), summed over
    the key blocks in order. With SLOPE_GRAD also each row's share of the ALiBi slope's
    gradient, -sum_j dS_ij |p_i - j|, into ``dslope_rows`` (lse's layout; summed per slope in
    torch)."""
    which, block_m = program_tile(tl.cdiv(seqlen_q, BLOCK_M), HAS_RIGHT)
    b = which // heads
    h = which % heads
    kv_h = h // group
    q_start, seqlen_q, k_start, seqlen_k, offset = sequence(
        b, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, offset, VARLEN, BOTTOM_RIGHT
    )
    row_start = block_m * BLOCK_M
    if row_start >= seqlen_q:
        return
    row_stop = tl.minimum(row_start + BLOCK_M, seqlen_q)
    rows = row_start + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    q_rows = rows.to(tl.int64)
    in_rows = rows < seqlen_q
    # Every address in 64 bits (head_start, tile_offsets): large tensors pass 2^31 elements.
    q += head_start(b, h, q_start, stride_qb, stride_qh, stride_qn)
    dout += head_start(b, h, q_start, stride_gb, stride_gh, stride_gn)
    dq += head_start(b, h, q_start, stride_dqb, stride_dqh, stride_dqn)
    lse += head_start(b, h, q_start, stride_lb, stride_lh, stride_ln)
    delta += head_start(b, h, q_start, stride_lb, stride_lh, stride_ln)
    q_tile = tl.load(
        q + tile_offsets(rows, dims, stride_qn, stride_qd),
        mask=in_rows[:, None] & (dims[None, :] < head_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_D)
    dout_tile = tl.load(
        dout + tile_offsets(rows, vdims, stride_gn, stride_gd),
        mask=in_rows[:, None] & (vdims[None, :] < value_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_DV)
    row_lse = tl.load(lse + q_rows * stride_ln, mask=in_rows, other=float("inf"))
    row_lse = tl.where(row_lse == float("-inf"), float("inf"), row_lse)  # a dead row: P = 0
    row_lse = row_lse * LOG2E  # base 2, as the scores
    row_delta = tl.load(delta + q_rows * stride_ln, mask=in_rows, other=0.0)
    qk_scale, cap_scale = base2_scales(scale, softcap, SOFTCAP)
    slope = 0.0
    if ALIBI:
        slope = tl.load(slopes + b64 * stride_slope_b + h64 * stride_slope_h) * LOG2E
    key = 0
    if DROPOUT:
        key = tl.load(seed)
    row_ids = (b64 * heads + h64) * lse_rows + q_start + q_rows  # dropout's flat row index
    k += head_start(b, kv_h, k_start, stride_kb, stride_kh, stride_kn)
    v += head_start(b, kv_h, k_start, stride_vb, stride_vh, stride_vn)
    dq_block = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dslope = tl.zeros([BLOCK_M], tl.float32)

    # The key blocks these rows see, in order (the forward's walk, split as the forward's).
    lo, hi = visible_cols(row_start, row_stop, offset, left, right, seqlen_k, HAS_LEFT, HAS_RIGHT)
    first, stop = block_range(lo, hi, BLOCK_N)
    mid_first, mid_stop = interior_cols(
        row_start, row_stop, first, stop, offset, left, right, seqlen_k, HAS_LEFT, HAS_RIGHT,
        BLOCK_N,
    )  # fmt: skip
    for col_start in range(first, mid_first, BLOCK_N):
        dq_block, dslope = dq_step(
            q_tile, dout_tile, row_lse, row_delta, k, v, dq_block, dslope, rows, col_start,
            dims, vdims, stride_kn, stride_kd, stride_vn, stride_vd, seqlen_q, seqlen_k,
            offset, head_dim, value_dim, qk_scale, cap_scale, slope, left, right, dropout_p,
            rescale, key, row_ids, keys_per_row,
            True, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DROPOUT, DOT_PRECISION, SLOPE_GRAD,
            BLOCK_N,
        )  # fmt: skip
    for col_start in range(mid_first, mid_stop, BLOCK_N):
        dq_block, dslope = dq_step(
            q_tile, dout_tile, row_lse, row_delta, k, v, dq_block, dslope, rows, col_start,
            dims, vdims, stride_kn, stride_kd, stride_vn, stride_vd, seqlen_q, seqlen_k,
            offset, head_dim, value_dim, qk_scale, cap_scale, slope, left, right, dropout_p,
            rescale, key, row_ids, keys_per_row,
            False, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DROPOUT, DOT_PRECISION, SLOPE_GRAD,
            BLOCK_N,
        )  # fmt: skip
    for col_start in range(mid_stop, stop, BLOCK_N):
        dq_block, dslope = dq_step(
            q_tile, dout_tile, row_lse, row_delta, k, v, dq_block, dslope, rows, col_start,
            dims, vdims, stride_kn, stride_kd, stride_vn, stride_vd, seqlen_q, seqlen_k,
            offset, head_dim, value_dim, qk_scale, cap_scale, slope, left, right, dropout_p,
            rescale, key, row_ids, keys_per_row,
            True, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DROPOUT, DOT_PRECISION, SLOPE_GRAD,
            BLOCK_N,
        )  # fmt: skip
    dq_block *= scale  # forward: S1 = (Q K^T) * scale
    tl.store(
        dq + tile_offsets(rows, dims, stride_dqn, stride_dqd),
        dq_block.to(dq.dtype.element_ty),
        mask=in_rows[:, None] & (dims[None, :] < head_dim),
    )
    if SLOPE_GRAD:
        dslope_rows += head_start(b, h, q_start, stride_lb, stride_lh, stride_ln)
        tl.store(dslope_rows + q_rows * stride_ln, dslope, mask=in_rows)


@triton.jit
def dq_step(
    q_tile, dout_tile, row_lse, row_delta, k, v, dq_block, dslope, rows, col_start,
    dims, vdims, stride_kn, stride_kd, stride_vn, stride_vd, seqlen_q, seqlen_k,
    offset, head_dim, value_dim, qk_scale, cap_scale, slope, left, right, dropout_p,
    rescale, key, row_ids, keys_per_row,
    MASKED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SLOPE_GRAD: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One key block of the dQ walk: (dq_block, dslope) plus keys col_start ... col_start +
    BLOCK_N - 1 (``k``, ``v`` point to the sequence's first key of the kv head; row_lse in
    base 2). MASKED False: a block inside the keys and every row's band (``interior_cols``)."""
    cols = col_start + tl.arange(0, BLOCK_N)
    k_mask = dims[None, :] < head_dim  # an interior block lies before the keys' end
    v_mask = vdims[None, :] < value_dim
    if MASKED:
        k_mask = k_mask & (cols[:, None] < seqlen_k)
        v_mask = v_mask & (cols[:, None] < seqlen_k)
    k_tile = tl.load(
        k + tile_offsets(cols, dims, stride_kn, stride_kd), mask=k_mask, other=0.0
    )  # (BLOCK_N, BLOCK_D)
    v_tile = tl.load(
        v + tile_offsets(cols, vdims, stride_vn, stride_vd), mask=v_mask, other=0.0
    )  # (BLOCK_N, BLOCK_DV)
    # S = the pipeline on Q_i K_j^T (base 2);  P = exp(S - lse_i)
    scores, capped = scores_tile(
        q_tile, k_tile, rows, cols, seqlen_q, seqlen_k, offset, qk_scale, cap_scale, slope,
        left, right, MASKED, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DOT_PRECISION,
    )  # fmt: skip
    probs = tl.exp2(scores - row_lse[:, None])
    # dP = (dO_i V_j^T) * keep / (1 - p);  dS = P * (dP - delta_i)
    dprobs = tl.dot(dout_tile, tl.trans(v_tile), input_precision=DOT_PRECISION)
    if DROPOUT:
        keep = dropout_keep(key, dropout_p, row_ids, cols, keys_per_row)
        dprobs = tl.where(keep, dprobs * rescale, 0.0)
    dscores = probs * (dprobs - row_delta[:, None])
    if SLOPE_GRAD:  # forward: S -= slope * |p_i - j|
        distance = tl.abs(rows[:, None] + offset - cols[None, :]).to(tl.float32)
        dslope -= tl.sum(dscores * distance, 1)
    if SOFTCAP:  # dS1 = dS * (1 - tanh^2(S1 / softcap))
        dscores = dscores * (1.0 - capped * capped)
    # dQ_i += dS1 K_j (times scale, once, at the end)
    dq_block += tl.dot(dscores.to(k_tile.dtype), k_tile, input_precision=DOT_PRECISION)
    return dq_block, dslope
