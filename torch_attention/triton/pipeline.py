"""The score pipeline of ``numpy_attention/scores.py`` as Triton device functions, written once
and called by the forward kernel and both backward kernels (STYLE.md 12c: one option, one place).

- ``program_tile``: which (batch element and head, block) a program of the 1-D grid computes, the
  blocks with the most work first.
- ``head_start`` / ``tile_offsets``: every address the kernels read or write, in 64 bits.
- ``sequence``: where batch element (or packed sequence) b starts, its lengths, and p_i - i.
- ``base2_scales`` / ``scores_tile``: steps 1-5 of the pipeline on one (BLOCK_M, BLOCK_N) tile:
  S1 = Q K^T * scale; softcap; ALiBi; visibility (causal/window band, and the tile's parts past
  the sequence's ends) replacing hidden scores by -inf. The kernels exponentiate with exp2, so
  the tile comes out in base 2, S * log2(e), with the constants folded into the scale.
- ``visible_cols`` / ``visible_rows``: ``scores.visible_cols`` / ``visible_rows``, the keys a
  query block may see and the queries that see a key block, so that the kernels skip the tiles
  nobody sees; ``block_range`` is ``tiled._block_range``; ``interior_cols`` /
  ``interior_rows``: the part of that walk whose tiles every row sees whole, which skips the
  visibility mask (FlashAttention-2's split of the key loop).
- ``dropout_keep``: step 7's keep-mask, ``U >= p`` with U uniform from Philox keyed by the call's
  seed at the entry's flat index ((b * H + h) * rows + i) * keys + j: the forward and both
  backward passes draw the same mask without storing it.

Each takes its tile's indices as blocks of offsets (``rows`` (BLOCK_M,), ``cols`` (BLOCK_N,)),
as Triton kernels build masks from offsets (the Triton tutorial's fused attention).

Shape legend: B batch (or S sequences), H query heads, N query length, M key length.

Derivation: docs/derivations/attention.md (the pipeline), softcap.md, alibi.md, windows.md;
docs/triton-kernel.md ("Ready for a GPU": the grid, the interior tiles, base 2).
Tests: tests/torch_attention/triton/test_pipeline.py; test_launch.py (through the launcher).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): ln(x) = log2(x) * LN2


@triton.jit
def program_tile(blocks, REVERSE: tl.constexpr):
    """(which, block) of this program on the 1-D grid of ``blocks`` * (B * H) programs: ``which``
    the (batch element, head) index b * H + h, ``block`` its block of rows (or keys).

    One axis, so that no count meets CUDA's 65,535 limit of grid axes 1 and 2. The blocks of one
    head are neighbours (they read the same keys and values while those are in cache); with
    REVERSE the last block runs first: under causal the last query blocks see the most keys, and
    started first they do not leave a long tail at the end of the launch."""
    pid = tl.program_id(0)
    which = pid // blocks
    block = pid % blocks
    if REVERSE:
        block = blocks - 1 - block
    return which, block


@triton.jit
def head_start(b, h, start, stride_b, stride_h, stride_n):
    """The offset of row ``start`` of head h of batch element b, in 64 bits: b * stride_b alone
    passes 2^31 elements on a tensor of more than 2^31 elements."""
    return b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + start.to(tl.int64) * stride_n


@triton.jit
def tile_offsets(index, width, stride_index, stride_width):
    """The offsets of a tile's elements, (len(index), len(width)): index_i * stride_index +
    width_w * stride_width in 64 bits. In 32 bits a width index times a large stride (a layout
    whose last axis is not the innermost) wraps past 2^31 and reads another element."""
    return index.to(tl.int64)[:, None] * stride_index + width.to(tl.int64)[None, :] * stride_width


@triton.jit
def sequence(
    b,
    cu_seqlens_q,
    cu_seqlens_k,
    seqlen_q,
    seqlen_k,
    offset,
    VARLEN: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
):
    """(q_start, seqlen_q, k_start, seqlen_k, offset) of batch element b: with VARLEN, packed
    sequence b's rows of the token axis (``cu_seqlens``) and, aligned bottom-right, p_i = i +
    seqlen_k - seqlen_q per sequence; else the whole axes and the offset given."""
    q_start = b * 0
    k_start = b * 0
    if VARLEN:
        q_start = tl.load(cu_seqlens_q + b)
        seqlen_q = tl.load(cu_seqlens_q + b + 1) - q_start
        k_start = tl.load(cu_seqlens_k + b)
        seqlen_k = tl.load(cu_seqlens_k + b + 1) - k_start
        if BOTTOM_RIGHT:
            offset = seqlen_k - seqlen_q
    return q_start, seqlen_q, k_start, seqlen_k, offset


@triton.jit
def tanh(x):
    """tanh(x) from exp(-2|x|) <= 1, which never overflows (Triton's interpreter has no
    libdevice tanh, and the kernels must run there)."""
    e = tl.exp2(tl.abs(x) * (-2.0 * LOG2E))  # the tensor first: the interpreter's constexpr
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def base2_scales(scale, softcap, SOFTCAP: tl.constexpr):
    """(qk_scale, cap_scale): the multipliers of ``scores_tile``, folded once per program.

    Without softcap S = (Q K^T) * scale, and S * log2(e) = (Q K^T) * (scale * log2(e)): one
    multiply. With softcap S = softcap * tanh(S1 / softcap), whose tanh needs S1 / softcap =
    (Q K^T) * (scale / softcap) unscaled by log2(e), and S * log2(e) = (softcap * log2(e)) *
    tanh(...)."""
    if SOFTCAP:
        qk_scale = scale / softcap
        cap_scale = softcap * LOG2E
    else:
        qk_scale = scale * LOG2E
        cap_scale = 1.0  # unused: no softcap
    return qk_scale, cap_scale


@triton.jit
def scores_tile(
    q_tile,
    k_tile,
    rows,
    cols,
    seqlen_q,
    seqlen_k,
    offset,
    qk_scale,
    cap_scale,
    slope,
    left,
    right,
    MASKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Steps 1-5 of ``scores.py`` on one tile, in base 2: S * log2(e) (BLOCK_M, BLOCK_N),
    float32, -inf where hidden, and ``capped`` = tanh(S1 / softcap) for the softcap's backward
    (unused without softcap). ``qk_scale``, ``cap_scale`` from ``base2_scales``; ``slope`` the
    ALiBi slope times log2(e).

    q_tile (BLOCK_M, BLOCK_D), k_tile (BLOCK_N, BLOCK_D) in the inputs' dtype (zero past D);
    rows, cols the tile's query and key indices within the sequence. MASKED False: a tile that
    ``interior_cols`` / ``interior_rows`` proved visible whole, step 5 skipped.
    """
    scores = tl.dot(q_tile, tl.trans(k_tile), input_precision=DOT_PRECISION) * qk_scale  # 1: S1
    capped = scores
    if SOFTCAP:  # 2: S = softcap * tanh(S1 / softcap)
        capped = tanh(scores)
        scores = cap_scale * capped
    positions = rows[:, None] + offset  # p_i, (BLOCK_M, 1)
    if ALIBI:  # 3: S -= slope_h * |p_i - j|
        scores -= slope * tl.abs(positions - cols[None, :]).to(tl.float32)
    if MASKED:
        # 5: visibility replaces hidden scores by -inf (never adds to them). The tile's rows
        # and columns past the sequence's ends are hidden too: they hold no query or key.
        visible = (rows[:, None] < seqlen_q) & (cols[None, :] < seqlen_k)
        if HAS_RIGHT:  # causal (right = 0) and a window's right side: j <= p_i + right
            visible = visible & (cols[None, :] <= positions + right)
        if HAS_LEFT:  # a window's left side: j >= p_i - left
            visible = visible & (cols[None, :] >= positions - left)
        scores = tl.where(visible, scores, float("-inf"))
    return scores, capped


@triton.jit
def visible_cols(
    row_start,
    row_stop,
    offset,
    left,
    right,
    seqlen_k,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
):
    """``scores.visible_cols``: the keys [lo, hi) that some query of rows [row_start, row_stop)
    may see under causal, the window and the alignment."""
    lo = row_start * 0
    hi = seqlen_k + row_start * 0
    if HAS_LEFT:
        lo = tl.maximum(lo, row_start + offset - left)
    if HAS_RIGHT:
        hi = tl.minimum(hi, row_stop + offset + right)
    return lo, tl.maximum(lo, hi)


@triton.jit
def visible_rows(
    col_start,
    col_stop,
    offset,
    left,
    right,
    seqlen_q,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
):
    """``scores.visible_rows``: the queries [lo, hi) that see some key of cols
    [col_start, col_stop)."""
    lo = col_start * 0
    hi = seqlen_q + col_start * 0
    if HAS_RIGHT:
        lo = tl.maximum(lo, col_start - offset - right)
    if HAS_LEFT:
        hi = tl.minimum(hi, col_stop - offset + left)
    return lo, tl.maximum(lo, hi)


@triton.jit
def block_range(lo, hi, BLOCK: tl.constexpr):
    """``tiled._block_range``: (first, stop) of the blocks of BLOCK that hold some index of
    [lo, hi), for ``range(first, stop, BLOCK)``; empty when [lo, hi) is."""
    first = lo // BLOCK * BLOCK
    return first, tl.where(hi > lo, hi, first)


@triton.jit
def interior_cols(
    row_start,
    row_stop,
    first,
    stop,
    offset,
    left,
    right,
    seqlen_k,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """(mid_first, mid_stop), first <= mid_first <= mid_stop: the key blocks of
    ``range(first, stop, BLOCK_N)`` that start in [mid_first, mid_stop) lie inside the keys and
    inside the band of every query row of [row_start, row_stop); the blocks before cross a
    window's left edge, the blocks from mid_stop on the causal diagonal, a window's right edge
    or the keys' end, and need the mask. Rows past row_stop (past the queries' end) are never
    stored, nor do they enter another row's sums, so they set no edge.

    A block starting at c needs: c + BLOCK_N <= seqlen_k; j >= p_i - left for its first key
    and the last row; j <= p_i + right for its last key and the first row."""
    lo = first
    hi = seqlen_k - BLOCK_N + 1  # blocks start below hi
    if HAS_LEFT:
        lo = tl.maximum(lo, row_stop - 1 + offset - left)
    if HAS_RIGHT:
        hi = tl.minimum(hi, row_start + offset + right - BLOCK_N + 2)
    mid_first = tl.minimum(tl.cdiv(lo, BLOCK_N) * BLOCK_N, stop)  # lo >= first >= 0
    hi = tl.maximum(mid_first, tl.minimum(hi, stop))
    return mid_first, mid_first + tl.cdiv(hi - mid_first, BLOCK_N) * BLOCK_N


@triton.jit
def interior_rows(
    col_start,
    col_stop,
    first,
    stop,
    offset,
    left,
    right,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """(mid_first, mid_stop) as ``interior_cols``, for the dK/dV pass: the query blocks of
    ``range(first, stop, BLOCK_M)`` starting in [mid_first, mid_stop) see every key of
    [col_start, col_stop) whole; the blocks before cross the causal diagonal or a window's right
    edge, the blocks from mid_stop on a window's left edge. The ends set no edge there: a row
    past the queries' end has P = 0 (its lse is read as +inf, its dO as 0), and a key past the
    keys' end only adds into its own rows of dK and dV, which are never stored.

    A block starting at r needs: j <= p_i + right for the last key and row r; j >= p_i - left
    for the first key and row r + BLOCK_M - 1."""
    lo = first
    hi = stop
    if HAS_RIGHT:
        lo = tl.maximum(lo, col_stop - 1 - offset - right)
    if HAS_LEFT:
        hi = tl.minimum(hi, col_start - offset + left - BLOCK_M + 2)
    mid_first = tl.minimum(tl.cdiv(lo, BLOCK_M) * BLOCK_M, stop)  # lo >= first >= 0
    hi = tl.maximum(mid_first, tl.minimum(hi, stop))
    return mid_first, mid_first + tl.cdiv(hi - mid_first, BLOCK_M) * BLOCK_M


@triton.jit
def dropout_keep(seed, dropout_p, row_ids, cols, keys_per_row):
    """The keep-mask of a tile, (BLOCK_M, BLOCK_N): ``U >= p`` with U uniform in [0, 1) from
    Philox(seed) at each entry's flat index row_id * keys_per_row + j (row_id (BLOCK_M,) the
    row's index among all rows of all heads, int64)."""
    index = row_ids[:, None] * keys_per_row + cols[None, :]
    return tl.rand(seed, index) >= dropout_p


@triton.jit
def dropout_mask_kernel(keep, seed, dropout_p, keys_per_row, BLOCK_N: tl.constexpr):
    """The whole keep-mask the kernels draw, for reading it back: row ``program_id(0)`` of all
    rows of all heads, keys ``program_id(1) * BLOCK_N ...``, into ``keep`` (rows, M), contiguous
    bool stored as int8; ``seed`` points to the Philox key (int64), as in the kernels."""
    row_ids = tl.full([1], tl.program_id(0), tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    kept = dropout_keep(tl.load(seed), dropout_p, row_ids, cols, keys_per_row)  # (1, BLOCK_N)
    tl.store(
        keep + row_ids[:, None] * keys_per_row + cols[None, :],
        kept.to(tl.int8),
        mask=cols[None, :] < keys_per_row,
    )
