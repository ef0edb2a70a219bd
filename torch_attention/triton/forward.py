"""The forward kernel: ``numpy_attention/tiled.py::_forward_tile`` as one Triton program per
query block and query head, FlashAttention-2's schedule.

Each program holds one block of BLOCK_M query rows of one head h of one batch element (or packed
sequence) b, walks the key blocks those rows may see (``visible_cols``: causal and windows skip
the rest) with the online softmax of ``tiled._online_step``, and writes its rows of ``out`` and
``lse``. The running state of each row is tiled.py's: ``row_max``, ``row_sum`` and ``acc``
(the unnormalized output); a sink starts it as a state with no value. GQA: head h reads kv head
h // group in place (K and V are never repeated).

For a GPU (docs/triton-kernel.md, "Ready for a GPU"): the programs are numbered on one grid axis
(``program_tile``; under causal the heaviest query blocks first); the walk is split in three, the
tiles that cross an edge masked and the interior ones not (``interior_cols``, ``forward_step``'s
MASKED); scores and the running max are in base 2 (exp2, with scale * log2(e) folded into one
multiply), lse converted back to the natural log on its way out; every offset is 64-bit; the dropout
seed is read from a tensor (a CUDA graph replays the kernel with a fresh seed drawn on the device).

Every tensor is read through the strides it has (a pointer's strides come from the tensor, never
assumed): q (B, H, N, D), k (B, H_kv, M, D), v (B, H_kv, M, Dv), out (B, H, N, Dv), lse (B, H, N)
as strided views; a packed (varlen) call passes batch strides 0 and finds each sequence's rows
through ``cu_seqlens``.

Shape legend: B batch (or S sequences), H query heads, H_kv key/value heads, N query length, M
key length, D head width, Dv value head width; BLOCK_D, BLOCK_DV the widths rounded up to a power
of two (>= 16, what ``tl.dot`` takes).

Derivation: docs/derivations/tiled.md (the online softmax), sinks.md (the sink as a starting
state), docs/triton-kernel.md (the schedule).
Tests: tests/torch_attention/triton/test_forward.py; test_launch.py (through the launcher).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .pipeline import (
    LN2,
    LOG2E,
    base2_scales,
    block_range,
    dropout_keep,
    head_start,
    interior_cols,
    program_tile,
    scores_tile,
    sequence,
    tile_offsets,
    visible_cols,
)


@triton.jit
def attention_forward_kernel(
    q, k, v, out, lse, sinks, slopes, seed, cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_lb, stride_lh, stride_ln,
    stride_slope_b, stride_slope_h,
    heads, group, seqlen_q, seqlen_k, offset, head_dim, value_dim,
    scale, softcap, left, right, dropout_p, rescale, lse_rows, keys_per_row, length_bucket,
    VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, SINKS: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out and lse of one query block of one head of one batch element (``program_tile``: the
    grid is cdiv(N, BLOCK_M) * B * H programs on axis 0). ``seed`` points to dropout's Philox
    key (int64); ``length_bucket`` only keys the autotuner."""
    # Which tile: query block, head, batch element; GQA's kv head (step 1). Under causal the
    # last query blocks see the most keys: they run first.
    which, block_m = program_tile(tl.cdiv(seqlen_q, BLOCK_M), HAS_RIGHT)
    b = which // heads
    h = which % heads
    kv_h = h // group
    q_start, seqlen_q, k_start, seqlen_k, offset = sequence(
        b, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, offset, VARLEN, BOTTOM_RIGHT
    )
    row_start = block_m * BLOCK_M
    if row_start >= seqlen_q:  # a block past a short packed sequence's end
        return
    row_stop = tl.minimum(row_start + BLOCK_M, seqlen_q)
    rows = row_start + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    # Every address in 64 bits (head_start, tile_offsets): large tensors pass 2^31 elements.
    q += head_start(b, h, q_start, stride_qb, stride_qh, stride_qn)
    k += head_start(b, kv_h, k_start, stride_kb, stride_kh, stride_kn)
    v += head_start(b, kv_h, k_start, stride_vb, stride_vh, stride_vn)
    q_tile = tl.load(
        q + tile_offsets(rows, dims, stride_qn, stride_qd),
        mask=(rows[:, None] < seqlen_q) & (dims[None, :] < head_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_D)
    # Base 2: S * log2(e) from one multiply of Q K^T; the slope times log2(e) too.
    qk_scale, cap_scale = base2_scales(scale, softcap, SOFTCAP)
    slope = 0.0
    if ALIBI:
        slope = tl.load(slopes + b64 * stride_slope_b + h64 * stride_slope_h) * LOG2E
    key = 0
    row_ids = rows.to(tl.int64)
    if DROPOUT:
        key = tl.load(seed)
        row_ids = (b64 * heads + h64) * lse_rows + q_start + rows  # dropout's flat row index

    # tiled._forward_tile: the state of each row, in base 2. A sink is a state with no value:
    # row_max = its logit, row_sum = exp(0) = 1, acc = 0.
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    if SINKS:
        row_max = tl.zeros([BLOCK_M], tl.float32) + tl.load(sinks + h) * LOG2E
        row_sum = row_sum + 1.0
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    # for bj in _block_range(*visible_cols(rules, rows), block_k): the key blocks rows see, in
    # order: those before mid_first cross a window's left edge, those from mid_stop on the
    # diagonal, a window's right edge or the keys' end; the ones between are visible whole.
    lo, hi = visible_cols(row_start, row_stop, offset, left, right, seqlen_k, HAS_LEFT, HAS_RIGHT)
    first, stop = block_range(lo, hi, BLOCK_N)
    mid_first, mid_stop = interior_cols(
        row_start, row_stop, first, stop, offset, left, right, seqlen_k, HAS_LEFT, HAS_RIGHT,
        BLOCK_N,
    )  # fmt: skip
    for col_start in range(first, mid_first, BLOCK_N):
        row_max, row_sum, acc = forward_step(
            q_tile, k, v, row_max, row_sum, acc, rows, col_start, dims, vdims,
            stride_kn, stride_kd, stride_vn, stride_vd, seqlen_q, seqlen_k, offset,
            head_dim, value_dim, qk_scale, cap_scale, slope, left, right,
            dropout_p, rescale, key, row_ids, keys_per_row,
            True, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DROPOUT, DOT_PRECISION, BLOCK_N,
        )  # fmt: skip
    for col_start in range(mid_first, mid_stop, BLOCK_N):
        row_max, row_sum, acc = forward_step(
            q_tile, k, v, row_max, row_sum, acc, rows, col_start, dims, vdims,
            stride_kn, stride_kd, stride_vn, stride_vd, seqlen_q, seqlen_k, offset,
            head_dim, value_dim, qk_scale, cap_scale, slope, left, right,
            dropout_p, rescale, key, row_ids, keys_per_row,
            False, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DROPOUT, DOT_PRECISION, BLOCK_N,
        )  # fmt: skip
    for col_start in range(mid_stop, stop, BLOCK_N):
        row_max, row_sum, acc = forward_step(
            q_tile, k, v, row_max, row_sum, acc, rows, col_start, dims, vdims,
            stride_kn, stride_kd, stride_vn, stride_vd, seqlen_q, seqlen_k, offset,
            head_dim, value_dim, qk_scale, cap_scale, slope, left, right,
            dropout_p, rescale, key, row_ids, keys_per_row,
            True, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DROPOUT, DOT_PRECISION, BLOCK_N,
        )  # fmt: skip

    # A dead row has row_sum 0 and acc 0: output 0 and lse = -inf (with a sink: row_max = the
    # sink, row_sum = 1, lse = the sink logit). lse leaves in the natural log.
    total = tl.where(row_sum == 0.0, 1.0, row_sum)
    out_tile = acc / total[:, None]
    row_lse = tl.where(row_sum == 0.0, float("-inf"), (row_max + tl.log2(total)) * LN2)
    out += head_start(b, h, q_start, stride_ob, stride_oh, stride_on)
    tl.store(
        out + tile_offsets(rows, vdims, stride_on, stride_od),
        out_tile.to(out.dtype.element_ty),
        mask=(rows[:, None] < seqlen_q) & (vdims[None, :] < value_dim),
    )
    lse += head_start(b, h, q_start, stride_lb, stride_lh, stride_ln)
    tl.store(lse + rows.to(tl.int64) * stride_ln, row_lse, mask=rows < seqlen_q)


@triton.jit
def forward_step(
    q_tile, k, v, row_max, row_sum, acc, rows, col_start, dims, vdims,
    stride_kn, stride_kd, stride_vn, stride_vd, seqlen_q, seqlen_k, offset,
    head_dim, value_dim, qk_scale, cap_scale, slope, left, right,
    dropout_p, rescale, key, row_ids, keys_per_row,
    MASKED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One key block of the walk, ``tiled._online_step`` and the lines after it: the state
    (row_max, row_sum, acc) after the keys col_start ... col_start + BLOCK_N - 1. ``k``, ``v``
    point to the sequence's first key of the kv head. MASKED False: a block inside the keys
    and every row's band (``interior_cols``), loaded and scored without the key mask."""
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
    # scores.apply: steps 1-5 of the pipeline on this tile, in base 2.
    scores, _ = scores_tile(
        q_tile, k_tile, rows, cols, seqlen_q, seqlen_k, offset, qk_scale, cap_scale, slope,
        left, right, MASKED, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DOT_PRECISION,
    )  # fmt: skip
    # tiled._online_step: raise the running max; a row with nothing visible yet (max -inf)
    # shifts by 0, so that exp(-inf) stays 0 instead of exp(-inf + inf) = NaN.
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    probs = tl.exp2(scores - shift[:, None])  # (BLOCK_M, BLOCK_N), unnormalized
    correction = tl.exp2(row_max - shift)  # rescales what earlier blocks accumulated
    row_sum = row_sum * correction + tl.sum(probs, 1)
    acc = acc * correction[:, None]
    # Step 7, dropout: only the weights added into acc, never row_sum (the softmax normalizes
    # over every key before dropout drops weights).
    weights = probs
    if DROPOUT:
        keep = dropout_keep(key, dropout_p, row_ids, cols, keys_per_row)
        weights = tl.where(keep, probs * rescale, 0.0)
    acc += tl.dot(weights.to(v_tile.dtype), v_tile, input_precision=DOT_PRECISION)
    return new_max, row_sum, acc
