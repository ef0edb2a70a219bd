"""The forward kernel: ``numpy_attention/tiled.py::_forward_tile`` as one Triton program per
query block and query head, FlashAttention-2's schedule.

Each program holds one block of BLOCK_M query rows of one head h of one batch element (or packed
sequence) b, walks the key blocks those rows may see (``visible_cols``: causal and windows skip
the rest) with the online softmax of ``tiled._online_step``, and writes its rows of ``out`` and
``lse``. The running state of each row is tiled.py's: ``row_max``, ``row_sum`` and ``acc``
(the unnormalized output); a sink starts it as a state with no value. GQA: head h reads kv head
h // group in place (K and V are never repeated).

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

from .pipeline import block_range, dropout_keep, scores_tile, sequence, visible_cols


@triton.jit
def attention_forward_kernel(
    q, k, v, out, lse, sinks, slopes, cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_lb, stride_lh, stride_ln,
    stride_slope_b, stride_slope_h,
    heads, group, seqlen_q, seqlen_k, offset, head_dim, value_dim,
    scale, softcap, left, right, dropout_p, rescale, seed, lse_rows, keys_per_row, length_bucket,
    VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, SINKS: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out and lse of query block ``program_id(0)`` of head ``program_id(1) % heads`` of batch
    element ``program_id(1) // heads``. ``length_bucket`` only keys the autotuner."""
    # Which tile: query block, head, batch element; GQA's kv head (step 1).
    block_m = tl.program_id(0)
    b = tl.program_id(1) // heads
    h = tl.program_id(1) % heads
    kv_h = h // group
    q_start, seqlen_q, k_start, seqlen_k, offset = sequence(
        b, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, offset, VARLEN, BOTTOM_RIGHT
    )
    row_start = block_m * BLOCK_M
    if row_start >= seqlen_q:  # a block past a short packed sequence's end
        return
    rows = row_start + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    b64, h64, kv64 = b.to(tl.int64), h.to(tl.int64), kv_h.to(tl.int64)
    q += b64 * stride_qb + h64 * stride_qh + q_start.to(tl.int64) * stride_qn
    k += b64 * stride_kb + kv64 * stride_kh + k_start.to(tl.int64) * stride_kn
    v += b64 * stride_vb + kv64 * stride_vh + k_start.to(tl.int64) * stride_vn
    q_tile = tl.load(
        q + rows[:, None].to(tl.int64) * stride_qn + dims[None, :] * stride_qd,
        mask=(rows[:, None] < seqlen_q) & (dims[None, :] < head_dim),
        other=0.0,
    )  # (BLOCK_M, BLOCK_D)
    slope = 0.0
    if ALIBI:
        slope = tl.load(slopes + b * stride_slope_b + h * stride_slope_h)
    row_ids = (b64 * heads + h64) * lse_rows + q_start + rows  # dropout's flat row index

    # tiled._forward_tile: the state of each row. A sink is a state with no value: row_max = its
    # logit, row_sum = exp(0) = 1, acc = 0.
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    if SINKS:
        row_max = tl.zeros([BLOCK_M], tl.float32) + tl.load(sinks + h)
        row_sum = row_sum + 1.0
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    # for bj in _block_range(*visible_cols(rules, rows), block_k): the key blocks rows see.
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
        # scores.apply: steps 1-5 of the pipeline on this tile.
        scores, _ = scores_tile(
            q_tile, k_tile, rows, cols, seqlen_q, seqlen_k, offset, scale, softcap, slope,
            left, right, SOFTCAP, ALIBI, HAS_LEFT, HAS_RIGHT, DOT_PRECISION,
        )  # fmt: skip
        # tiled._online_step: raise the running max; a row with nothing visible yet (max
        # -inf) shifts by 0, so that exp(-inf) stays 0 instead of exp(-inf + inf) = NaN.
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.exp(scores - shift[:, None])  # (BLOCK_M, BLOCK_N), unnormalized
        correction = tl.exp(row_max - shift)  # rescales what earlier blocks accumulated
        row_max = new_max
        row_sum = row_sum * correction + tl.sum(probs, 1)
        acc = acc * correction[:, None]
        # Step 7, dropout: only the weights added into acc, never row_sum (the softmax
        # normalizes over every key before dropout drops weights).
        weights = probs
        if DROPOUT:
            keep = dropout_keep(seed, dropout_p, row_ids, cols, keys_per_row)
            weights = tl.where(keep, probs * rescale, 0.0)
        acc += tl.dot(weights.to(v_tile.dtype), v_tile, input_precision=DOT_PRECISION)

    # A dead row has row_sum 0 and acc 0: output 0 and lse = -inf (with a sink: row_max = the
    # sink, row_sum = 1, lse = the sink logit).
    total = tl.where(row_sum == 0.0, 1.0, row_sum)
    out_tile = acc / total[:, None]
    row_lse = tl.where(row_sum == 0.0, float("-inf"), row_max + tl.log(total))
    out += b64 * stride_ob + h64 * stride_oh + q_start.to(tl.int64) * stride_on
    tl.store(
        out + rows[:, None].to(tl.int64) * stride_on + vdims[None, :] * stride_od,
        out_tile.to(out.dtype.element_ty),
        mask=(rows[:, None] < seqlen_q) & (vdims[None, :] < value_dim),
    )
    lse += b64 * stride_lb + h64 * stride_lh + q_start.to(tl.int64) * stride_ln
    tl.store(lse + rows.to(tl.int64) * stride_ln, row_lse, mask=rows < seqlen_q)
