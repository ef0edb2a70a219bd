"""The backward kernels: ``numpy_attention/tiled.py::_backward_tile`` as two Triton passes,
FlashAttention-2's schedule with dQ in a pass of its own.

Both recompute each tile of probabilities from the forward's ``lse``, P = exp(S - lse), and use
``delta = rowsum(dO * O) - dlse`` (computed once before them, as ``tiled_attention_backward``
does) in place of rowsum(dP * P):

- ``attention_backward_dkdv_kernel``: one program per key block and kv head. It walks the query
  heads of its group (GQA: dK and dV sum over them) and the query blocks that see the key block
  (``visible_rows``), accumulating dV_j += P'^T dO_i and dK_j += dS1^T Q_i in registers; each
  dK/dV block is written once, by one program.
- ``attention_backward_dq_kernel``: one program per query block and query head, walking the key
  blocks its rows see (as the forward does) and accumulating dQ_i += dS1 K_j.

dQ is a separate pass rather than atomic adds from the dK/dV programs: every element of dq, dk
and dv is then written by one program with its sum taken in a fixed order, so the backward is
deterministic (bit-identical run to run, as the NumPy tiled path is), at the price of
recomputing S and dP for dQ (docs/triton-kernel.md, "dQ: a pass of its own").

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
    block_range,
    dropout_keep,
    scores_tile,
    sequence,
    visible_cols,
    visible_rows,
)


@triton.jit
def attention_backward_dkdv_kernel(
    q, k, v, dout, lse, delta, dk, dv, slopes, cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_lb, stride_lh, stride_ln,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_slope_b, stride_slope_h,
    heads, group, seqlen_q, seqlen_k, offset, head_dim, value_dim,
    scale, softcap, left, right, dropout_p, rescale, seed, lse_rows, keys_per_row, length_bucket,
    VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dk and dv of key block ``program_id(0)`` of kv head ``program_id(1) % (heads // group)``
    of batch element ``program_id(1) // (heads // group)``; dout's strides are ``stride_g*``."""
    block_n = tl.program_id(0)
    kv_heads = heads // group
    b = tl.program_id(1) // kv_heads
    kv_h = tl.program_id(1) % kv_heads
    q_start, seqlen_q, k_start, seqlen_k, offset = sequence(
        b, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, offset, VARLEN, BOTTOM_RIGHT
    )
    col_start = block_n * BLOCK_N
    if col_start >= seqlen_k:  # a block past a short packed sequence's end
        return
    cols = col_start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    b64, kv64 = b.to(tl.int64), kv_h.to(tl.int64)
    k_rows = (k_start + cols)[:, None].to(tl.int64)
    k += b64 * stride_kb + kv64 * stride_kh
    v += b64 * stride_vb + kv64 * stride_vh
    dk += b64 * stride_dkb + kv64 * stride_dkh
    dv += b64 * stride_dvb + kv64 * stride_dvh
    k_block = tl.load(
        k + k_rows * stride_kn + dims[None, :] * stride_kd,
        mask=(cols[:, None] < seqlen_k) & (dims[None, :] < head_dim),
        other=0.0,
    )  # (BLOCK_N, BLOCK_D)
    v_block = tl.load(
        v + k_rows * stride_vn + vdims[None, :] * stride_vd,
        mask=(cols[:, None] < seqlen_k) & (vdims[None, :] < value_dim),
        other=0.0,
    )  # (BLOCK_N, BLOCK_DV)
    dk_block = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv_block = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)

    # for bi in _block_range(*visible_rows(rules, cols), block_q): the query blocks that see
    # this key block, for every query head of the kv head's group.
    lo, hi = visible_rows(
        col_start, tl.minimum(col_start + BLOCK_N, seqlen_k), offset, left, right, seqlen_q,
        HAS_LEFT, HAS_RIGHT,
    )  # fmt: skip
    first, stop = block_range(lo, hi, BLOCK_M)
    for g in range(0, group):
        h = kv_h * group + g
        h64 = h.to(tl.int64)
        slope = 0.0
        if ALIBI:
            slope = tl.load(slopes + b * stride_slope_b + h * stride_slope_h)
        q_head = q + b64 * stride_qb + h64 * stride_qh
        dout_head = dout + b64 * stride_gb + h64 * stride_gh
        lse_head = lse + b64 * stride_lb + h64 * stride_lh
        delta_head = delta + b64 * stride_lb + h64 * stride_lh
        for row_start in range(first, stop, BLOCK_M):
            rows = row_start + tl.arange(0, BLOCK_M)
            q_rows = (q_start + rows).to(tl.int64)
            in_rows = rows < seqlen_q
            q_tile = tl.load(
                q_head + q_rows[:, None] * stride_qn + dims[None, :] * stride_qd,
                mask=in_rows[:, None] & (dims[None, :] < head_dim),
                other=0.0,
            )  # (BLOCK_M, BLOCK_D)
            dout_tile = tl.load(
                dout_head + q_rows[:, None] * stride_gn + vdims[None, :] * stride_gd,
                mask=in_rows[:, None] & (vdims[None, :] < value_dim),
                other=0.0,
            )  # (BLOCK_M, BLOCK_DV)
            # exp(S - inf) = 0: a dead row (lse = -inf) gets P = 0, as do rows past the end.
            row_lse = tl.load(lse_head + q_rows * stride_ln, mask=in_rows, other=float("inf"))
            row_lse = tl.where(row_lse == float("-inf"), float("inf"), row_lse)
            row_delta = tl.load(delta_head + q_rows * stride_ln, mask=in_rows, other=0.0)
            # S = the pipeline on Q_i K_j^T;  P = exp(S - lse_i);  P' = P * keep / (1 - p)
            scores, capped = scores_tile(
                q_tile, k_block, rows, cols, seqlen_q, seqlen_k, offset, scale, softcap, slope,
                left, right, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DOT_PRECISION,
            )  # fmt: skip
            probs = tl.exp(scores - row_lse[:, None])  # (BLOCK_M, BLOCK_N)
            weights = probs
            if DROPOUT:
                row_ids = (b64 * heads + h64) * lse_rows + q_rows
                keep = dropout_keep(seed, dropout_p, row_ids, cols, keys_per_row)
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
            # dK_j += dS1^T Q_i (times scale, once, below)
            dk_block += tl.dot(
                tl.trans(dscores).to(q_tile.dtype), q_tile, input_precision=DOT_PRECISION
            )
    dk_block *= scale  # forward: S1 = (Q K^T) * scale
    tl.store(
        dk + k_rows * stride_dkn + dims[None, :] * stride_dkd,
        dk_block.to(dk.dtype.element_ty),
        mask=(cols[:, None] < seqlen_k) & (dims[None, :] < head_dim),
    )
    tl.store(
        dv + k_rows * stride_dvn + vdims[None, :] * stride_dvd,
        dv_block.to(dv.dtype.element_ty),
        mask=(cols[:, None] < seqlen_k) & (vdims[None, :] < value_dim),
    )


@triton.jit
def attention_backward_dq_kernel(
    q, k, v, dout, lse, delta, dq, dslope_rows, slopes, cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_lb, stride_lh, stride_ln,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    stride_slope_b, stride_slope_h,
    heads, group, seqlen_q, seqlen_k, offset, head_dim, value_dim,
    scale, softcap, left, right, dropout_p, rescale, seed, lse_rows, keys_per_row, length_bucket,
    VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, SLOPE_GRAD: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dq of query block ``program_id(0)`` of head ``program_id(1) % heads`` of batch element
    ``program_id(1) // heads``, summed over the key blocks in order. With SLOPE_GRAD also each
    row's share of the ALiBi slope's gradient, -sum_j dS_ij |p_i - j|, into ``dslope_rows``
    (lse's layout; summed per slope in torch)."""
    block_m = tl.program_id(0)
    b = tl.program_id(1) // heads
    h = tl.program_id(1) % heads
    kv_h = h // group
    q_start, seqlen_q, k_start, seqlen_k, offset = sequence(
        b, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, offset, VARLEN, BOTTOM_RIGHT
    )
    row_start = block_m * BLOCK_M
    if row_start >= seqlen_q:
        return
    rows = row_start + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    b64, h64, kv64 = b.to(tl.int64), h.to(tl.int64), kv_h.to(tl.int64)
    q_rows = (q_start + rows).to(tl.int64)
    in_rows = rows < seqlen_q
    q += b64 * stride_qb + h64 * stride_qh
    dout += b64 * stride_gb + h64 * stride_gh
    dq += b64 * stride_dqb + h64 * stride_dqh
    q_tile = tl.load(
        q + q_rows[:, None] * stride_qn + dims[None, :] * stride_qd,
        mask=in_rows[:, None] & (dims[None, :] < head_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_D)
    dout_tile = tl.load(
        dout + q_rows[:, None] * stride_gn + vdims[None, :] * stride_gd,
        mask=in_rows[:, None] & (vdims[None, :] < value_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_DV)
    lse_head = lse + b64 * stride_lb + h64 * stride_lh
    row_lse = tl.load(lse_head + q_rows * stride_ln, mask=in_rows, other=float("inf"))
    row_lse = tl.where(row_lse == float("-inf"), float("inf"), row_lse)  # a dead row: P = 0
    delta_head = delta + b64 * stride_lb + h64 * stride_lh
    row_delta = tl.load(delta_head + q_rows * stride_ln, mask=in_rows, other=0.0)
    slope = 0.0
    if ALIBI:
        slope = tl.load(slopes + b * stride_slope_b + h * stride_slope_h)
    row_ids = (b64 * heads + h64) * lse_rows + q_rows  # dropout's flat row index
    k += b64 * stride_kb + kv64 * stride_kh + k_start.to(tl.int64) * stride_kn
    v += b64 * stride_vb + kv64 * stride_vh + k_start.to(tl.int64) * stride_vn
    dq_block = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dslope = tl.zeros([BLOCK_M], tl.float32)

    # The key blocks these rows see, in order (the forward's walk).
    lo, hi = visible_cols(
        row_start, tl.minimum(row_start + BLOCK_M, seqlen_q), offset, left, right, seqlen_k,
        HAS_LEFT, HAS_RIGHT,
    )  # fmt: skip
    first, stop = block_range(lo, hi, BLOCK_N)
    for col_start in range(first, stop, BLOCK_N):
        cols = col_start + tl.arange(0, BLOCK_N)
        k_tile = tl.load(
            k + cols[:, None].to(tl.int64) * stride_kn + dims[None, :] * stride_kd,
            mask=(cols[:, None] < seqlen_k) & (dims[None, :] < head_dim),
            other=0.0,
        )  # (BLOCK_N, BLOCK_D)
        v_tile = tl.load(
            v + cols[:, None].to(tl.int64) * stride_vn + vdims[None, :] * stride_vd,
            mask=(cols[:, None] < seqlen_k) & (vdims[None, :] < value_dim),
            other=0.0,
        )  # (BLOCK_N, BLOCK_DV)
        # S = the pipeline on Q_i K_j^T;  P = exp(S - lse_i)
        scores, capped = scores_tile(
            q_tile, k_tile, rows, cols, seqlen_q, seqlen_k, offset, scale, softcap, slope,
            left, right, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DOT_PRECISION,
        )  # fmt: skip
        probs = tl.exp(scores - row_lse[:, None])
        # dP = (dO_i V_j^T) * keep / (1 - p);  dS = P * (dP - delta_i)
        dprobs = tl.dot(dout_tile, tl.trans(v_tile), input_precision=DOT_PRECISION)
        if DROPOUT:
            keep = dropout_keep(seed, dropout_p, row_ids, cols, keys_per_row)
            dprobs = tl.where(keep, dprobs * rescale, 0.0)
        dscores = probs * (dprobs - row_delta[:, None])
        if SLOPE_GRAD:  # forward: S -= slope * |p_i - j|
            distance = tl.abs(rows[:, None] + offset - cols[None, :]).to(tl.float32)
            dslope -= tl.sum(dscores * distance, 1)
        if SOFTCAP:  # dS1 = dS * (1 - tanh^2(S1 / softcap))
            dscores = dscores * (1.0 - capped * capped)
        # dQ_i += dS1 K_j (times scale, once, below)
        dq_block += tl.dot(dscores.to(k_tile.dtype), k_tile, input_precision=DOT_PRECISION)
    dq_block *= scale  # forward: S1 = (Q K^T) * scale
    tl.store(
        dq + q_rows[:, None] * stride_dqn + dims[None, :] * stride_dqd,
        dq_block.to(dq.dtype.element_ty),
        mask=in_rows[:, None] & (dims[None, :] < head_dim),
    )
    if SLOPE_GRAD:
        dslope_head = dslope_rows + b64 * stride_lb + h64 * stride_lh
        tl.store(dslope_head + q_rows * stride_ln, dslope, mask=in_rows)
