"""The score pipeline of ``numpy_attention/scores.py`` as Triton device functions, written once
and called by the forward kernel and both backward kernels (STYLE.md 12c: one option, one place).

- ``sequence``: where batch element (or packed sequence) b starts, its lengths, and p_i - i.
- ``scores_tile``: steps 1-5 of the pipeline on one (BLOCK_M, BLOCK_N) tile: S1 = Q K^T * scale;
  softcap; ALiBi; visibility (causal/window band, and the tile's parts past the sequence's ends)
  replacing hidden scores by -inf.
- ``visible_cols`` / ``visible_rows``: ``scores.visible_cols`` / ``visible_rows``, the keys a
  query block may see and the queries that see a key block, so that the kernels skip the tiles
  nobody sees; ``block_range`` is ``tiled._block_range``.
- ``dropout_keep``: step 7's keep-mask, ``U >= p`` with U uniform from Philox keyed by the call's
  seed at the entry's flat index ((b * H + h) * rows + i) * keys + j: the forward and both
  backward passes draw the same mask without storing it.

Each takes its tile's indices as blocks of offsets (``rows`` (BLOCK_M,), ``cols`` (BLOCK_N,)),
as Triton kernels build masks from offsets (the Triton tutorial's fused attention).

Shape legend: B batch (or S sequences), H query heads, N query length, M key length.

Derivation: docs/derivations/attention.md (the pipeline), softcap.md, alibi.md, windows.md.
Tests: tests/torch_attention/triton/test_pipeline.py; test_launch.py (through the launcher).
"""

from __future__ import annotations

import triton
import triton.language as tl


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
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def scores_tile(
    q_tile,
    k_tile,
    rows,
    cols,
    seqlen_q,
    seqlen_k,
    offset,
    scale,
    softcap,
    slope,
    left,
    right,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Steps 1-5 of ``scores.py`` on one tile: S (BLOCK_M, BLOCK_N), float32, -inf where
    hidden, and ``capped`` = tanh(S1 / softcap) for the softcap's backward (S1 without softcap).

    q_tile (BLOCK_M, BLOCK_D), k_tile (BLOCK_N, BLOCK_D) in the inputs' dtype (zero past D);
    rows, cols the tile's query and key indices within the sequence.
    """
    scores = tl.dot(q_tile, tl.trans(k_tile), input_precision=DOT_PRECISION) * scale  # 1: S1
    capped = scores
    if SOFTCAP:  # 2: S = softcap * tanh(S1 / softcap)
        capped = tanh(scores / softcap)
        scores = softcap * capped
    positions = rows[:, None] + offset  # p_i, (BLOCK_M, 1)
    if ALIBI:  # 3: S -= slope_h * |p_i - j|
        scores -= slope * tl.abs(positions - cols[None, :]).to(tl.float32)
    # 5: visibility replaces hidden scores by -inf (never adds to them). The tile's rows and
    # columns past the sequence's ends are hidden too: they hold no query or key.
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
    bool stored as int8."""
    row_ids = tl.full([1], tl.program_id(0), tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    kept = dropout_keep(seed, dropout_p, row_ids, cols, keys_per_row)  # (1, BLOCK_N)
    tl.store(
        keep + row_ids[:, None] * keys_per_row + cols[None, :],
        kept.to(tl.int8),
        mask=cols[None, :] < keys_per_row,
    )
