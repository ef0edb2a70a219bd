"""Native sparse attention (NSA; flash-linear-attention's ``naive_nsa``) as a composition of the
sparse core: three branches, each one ``sparse_attention_forward`` call over index lists, mixed by
per-head gates; forward and hand-derived backward.

    out = g_cmp * O_cmp + g_slc * O_slc + g_swa * O_swa

- **compressed** (cmp): attention over the blocks' mean keys and values; query t sees block c
  once the whole block is in its past, (c + 1) * block_size - 1 <= t;
- **selected** (slc): attention over the tokens of the top ``block_counts`` blocks, ranked by the
  compressed branch's probabilities summed over the GQA group, block 0 and the query's current
  and previous blocks always in; causal within them (t sees rows <= t);
- **sliding window** (swa): the last ``window_size`` tokens, itself included.

Token-major, as the core (a batch is offsets ``cu_seqlens`` into the token axis, as fla's
varlen path): q (S, H, D), k (S, H_kv, D), v (S, H_kv, Dv), gates (S, H). The block choice is
piecewise constant in q and k: it carries no gradient (as DSA's indexer's choice).

Shape legend: S tokens, H query heads, H_kv key/value heads, g = H / H_kv, D key width, Dv value
width, S_c blocks of all sequences, n selected blocks per token.

Derivation: docs/derivations/nsa.md. Tests: tests/numpy_attention/test_nsa.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation
from .indexer import topk_indices
from .sparse import SparseCtx, check_shapes, sparse_attention_backward, sparse_attention_forward
from .varlen import _offsets


class Layout(NamedTuple):
    """Where each token sits: its sequence, its position there, its block among all blocks."""

    pos: np.ndarray  # (S,) position within its sequence
    bos: np.ndarray  # (S,) the token index of its sequence's first token
    first_block: np.ndarray  # (S,) the row of its sequence's block 0 among all blocks
    block: np.ndarray  # (S,) the row of its own block
    counts: np.ndarray  # (S_c,) tokens per block (a sequence's last block may be short)
    blocks_max: int  # the most blocks of one sequence


class NSACtx(NamedTuple):
    """What ``nsa_backward`` needs: each branch's core ctx, the pooling's layout, the gates and
    the branches' outputs (compute dtype)."""

    cmp: SparseCtx
    slc: SparseCtx
    swa: SparseCtx | None
    layout: Layout
    gates: tuple[np.ndarray, np.ndarray, np.ndarray | None]  # (S, H) each
    dtype: np.dtype


class NSAOutput(NamedTuple):
    out: np.ndarray  # (S, H, Dv)
    block_indices: np.ndarray  # (S, H_kv, n) the selected blocks (within each sequence), -1 pads
    ctx: NSACtx | None


class NSAGrads(NamedTuple):
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dg_cmp: np.ndarray
    dg_slc: np.ndarray
    dg_swa: np.ndarray | None


def nsa_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g_cmp: np.ndarray,
    g_slc: np.ndarray,
    g_swa: np.ndarray | None = None,
    *,
    block_size: int,
    block_counts: int | np.ndarray = 16,
    window_size: int = 0,
    softmax_scale: float | None = None,
    block_indices: np.ndarray | None = None,
    cu_seqlens: np.ndarray | None = None,
) -> NSAOutput:
    """Native sparse attention, causal, over one or several packed sequences.

    Args:
        q: (S, H, D) queries. k: (S, H_kv, D) keys. v: (S, H_kv, Dv) values.
        g_cmp, g_slc: (S, H) the compressed and selected branches' gates (used as given: a
            model's sigmoid is applied before).
        g_swa: (S, H) the sliding window's gate; given exactly when ``window_size > 0``.
        block_size: tokens per block, for the pooling and the selection alike.
        block_counts: blocks selected per token: an int, or (S, H_kv) integers.
        window_size: the sliding window's length (itself included); 0 leaves the branch out.
        softmax_scale: the score scale of every branch; None is 1/sqrt(D).
        block_indices: (S, H_kv, n) blocks to attend (within each sequence, -1 for none), in
            place of the selection by the compressed scores.
        cu_seqlens: (N + 1,) offsets of the packed sequences; None is one sequence.

    Returns:
        ``NSAOutput(out, block_indices, ctx)``: out (S, H, Dv) in the inputs' dtype, the blocks
        attended (S, H_kv, n), ctx None under ``no_grad()``.
    """
    gates = _check(q, k, v, g_cmp, g_slc, g_swa, block_size, window_size, block_indices)
    layout = block_layout(cu_seqlens, q.shape[0], block_size)
    kv_heads = k.shape[1]
    k_cmp, v_cmp = mean_pool_forward(k, layout), mean_pool_forward(v, layout)  # (S_c, H_kv, *)
    cmp_rows = compressed_rows(layout, block_size)  # (S, W)
    cmp = sparse_attention_forward(
        q, k_cmp, v_cmp, _per_head(cmp_rows, kv_heads), softmax_scale=softmax_scale,
        return_lse=True,
    )  # fmt: skip
    assert cmp.lse is not None
    if block_indices is None:
        counts = check_block_counts(block_counts, (q.shape[0], kv_heads))
        block_indices = select_blocks(
            q, k_cmp, cmp_rows, cmp.lse, layout, block_size, counts, softmax_scale
        )
    slc_rows = selected_rows(np.asarray(block_indices), layout, block_size)  # (S, H_kv, n * bs)
    slc = sparse_attention_forward(q, k, v, slc_rows, softmax_scale=softmax_scale)
    out = gates[0][..., None] * cmp.out + gates[1][..., None] * slc.out
    swa = None
    if gates[2] is not None:  # window_size > 0
        swa_rows = _per_head(window_rows(layout, window_size), kv_heads)  # (S, H_kv, w)
        swa = sparse_attention_forward(q, k, v, swa_rows, softmax_scale=softmax_scale)
        out = out + gates[2][..., None] * swa.out
    ctx = None
    if cmp.ctx is not None and slc.ctx is not None:
        ctx = NSACtx(cmp.ctx, slc.ctx, None if swa is None else swa.ctx, layout, gates, q.dtype)
    return NSAOutput(out.astype(q.dtype, copy=False), np.asarray(block_indices), ctx)


def nsa_backward(dout: np.ndarray, ctx: NSACtx) -> NSAGrads:
    """The gradients of ``nsa_forward``, by the chain rule through the core's backward.

    out = sum_b g_b O_b over the branches b: dg_b = rowsum(dO * O_b); dO_b = g_b dO; each
    branch's core backward gives (dq, dk, dv) of its inputs; the compressed branch's keys and
    values are block means, so their gradients go back to every token of the block divided by
    its count (the pooling's adjoint); dq, dk and dv are the sums over the branches. The block
    choice carries no gradient. Derivation: docs/derivations/nsa.md.

    Args:
        dout: (S, H, Dv) gradient of the output.
        ctx: from ``nsa_forward``.

    Returns:
        ``NSAGrads(dq, dk, dv, dg_cmp, dg_slc, dg_swa)`` in the inputs' dtype (dg_swa None
        without the window).
    """
    if not isinstance(ctx, NSACtx):
        raise TypeError(
            f"nsa_backward needs the ctx of a forward run outside no_grad(), "
            f"got {type(ctx).__name__}"
        )
    compute = ctx.slc.q.dtype
    dout = validation.grad_output(dout, ctx.slc.out.shape).astype(compute, copy=False)
    branches = [("cmp", ctx.cmp), ("slc", ctx.slc), ("swa", ctx.swa)]
    dq = np.zeros_like(ctx.slc.q)
    dk = np.zeros_like(ctx.slc.k)
    dv = np.zeros_like(ctx.slc.v)
    dgates: list[np.ndarray | None] = []
    for (name, branch), gate in zip(branches, ctx.gates, strict=True):
        if branch is None or gate is None:
            dgates.append(None)
            continue
        dgates.append(np.einsum("thd,thd->th", dout, branch.out))  # forward: out += g_b * O_b
        grads = sparse_attention_backward(gate[..., None] * dout, branch)
        dq += grads.dq
        if name == "cmp":  # forward: k_cmp, v_cmp = mean_pool(k), mean_pool(v)
            dk += mean_pool_backward(grads.dk, ctx.layout)
            dv += mean_pool_backward(_given(grads.dv), ctx.layout)
        else:
            dk += grads.dk
            dv += _given(grads.dv)
    dtype = ctx.dtype
    dg_cmp, dg_slc, dg_swa = (None if g is None else g.astype(dtype) for g in dgates)
    assert dg_cmp is not None and dg_slc is not None
    return NSAGrads(dq.astype(dtype), dk.astype(dtype), dv.astype(dtype), dg_cmp, dg_slc, dg_swa)


def block_layout(cu_seqlens: Any, total: int, block_size: int) -> Layout:
    """Blocks of ``block_size`` tokens per packed sequence (a sequence's last block may be
    short; a block never crosses a sequence's end), numbered in token order."""
    offsets = (
        np.array([0, total]) if cu_seqlens is None else _offsets("cu_seqlens", cu_seqlens, total)
    )
    lengths = np.diff(offsets)
    n_blocks = -(-lengths // block_size)  # ceil: the short last block counts
    block_offsets = np.concatenate([[0], np.cumsum(n_blocks)])
    seq = np.repeat(np.arange(len(lengths)), lengths)  # (S,)
    bos = offsets[:-1][seq]
    pos = np.arange(total) - bos
    first_block = block_offsets[:-1][seq]
    block = first_block + pos // block_size
    counts = np.bincount(block, minlength=int(block_offsets[-1]))
    blocks_max = int(n_blocks.max(initial=0))
    return Layout(pos, bos, first_block, block, counts, blocks_max)


def mean_pool_forward(x: np.ndarray, layout: Layout) -> np.ndarray:
    """(S, H_kv, W) -> (S_c, H_kv, W): each block's mean over its tokens."""
    pooled = np.zeros((len(layout.counts),) + x.shape[1:], x.dtype)
    np.add.at(pooled, layout.block, x)  # pooled[block[t]] += x[t]
    return pooled / layout.counts[:, None, None].astype(x.dtype)


def mean_pool_backward(dpooled: np.ndarray, layout: Layout) -> np.ndarray:
    """The pooling's adjoint: every token of block c gets dpooled[c] / count[c]."""
    return dpooled[layout.block] / layout.counts[layout.block][:, None, None].astype(dpooled.dtype)


def compressed_rows(layout: Layout, block_size: int) -> np.ndarray:
    """(S, W) rows of the pooled keys token t sees: its sequence's blocks c with
    (c + 1) * block_size - 1 <= pos, i.e. c < (pos + 1) // block_size; -1 pads."""
    visible = (layout.pos + 1) // block_size
    width = max(1, int(visible.max(initial=0)))
    c = np.arange(width)
    return np.where(c < visible[:, None], layout.first_block[:, None] + c, -1)


def selected_rows(block_indices: np.ndarray, layout: Layout, block_size: int) -> np.ndarray:
    """(S, H_kv, n) blocks -> (S, H_kv, n * block_size) key rows, each block's tokens in order,
    -1 for a token after t (causal) and for every token of a block < 0."""
    s, kv_heads, n = block_indices.shape
    local = block_indices[..., None] * block_size + np.arange(block_size)  # (S, H_kv, n, bs)
    pos = layout.pos[:, None, None, None]
    valid = (block_indices[..., None] >= 0) & (local <= pos)
    rows = np.where(valid, layout.bos[:, None, None, None] + local, -1)
    return rows.reshape(s, kv_heads, n * block_size)


def window_rows(layout: Layout, window_size: int) -> np.ndarray:
    """(S, window_size) rows of the sliding window: positions pos - w + 1 .. pos, -1 before 0."""
    local = layout.pos[:, None] - window_size + 1 + np.arange(window_size)
    return np.where(local >= 0, layout.bos[:, None] + local, -1)


def select_blocks(
    q: np.ndarray,
    k_cmp: np.ndarray,
    cmp_rows: np.ndarray,
    lse: np.ndarray,
    layout: Layout,
    block_size: int,
    block_counts: int | np.ndarray,
    softmax_scale: float | None,
) -> np.ndarray:
    """(S, H_kv, n) the top blocks per token and kv head: importance = the compressed branch's
    probabilities summed over the group's heads; block 0, the current block and the previous one
    forced in with importance g (one per head); ties to the lower block; -1 past the blocks
    allowed (visible or forced) and past ``block_counts``."""
    s, heads, width = q.shape
    kv_heads = k_cmp.shape[1]
    group = heads // kv_heads
    scale = 1.0 / np.sqrt(width) if softmax_scale is None else softmax_scale
    k_sel = k_cmp[np.maximum(cmp_rows, 0)]  # (S, W, H_kv, D)
    q_g = q.reshape(s, kv_heads, group, width).astype(lse.dtype)
    scores = scale * np.einsum("tcgd,twcd->tcgw", q_g, k_sel)
    finite = np.isfinite(lse).reshape(s, kv_heads, group, 1)
    lse_g = np.where(finite, lse.reshape(s, kv_heads, group, 1), 0.0)
    probs = np.where(finite & (cmp_rows[:, None, None, :] >= 0), np.exp(scores - lse_g), 0.0)
    importance = np.zeros((s, kv_heads, layout.blocks_max))
    importance[..., : cmp_rows.shape[1]] = probs.sum(axis=2)[..., : layout.blocks_max]
    c = np.arange(layout.blocks_max)
    current = (layout.pos // block_size)[:, None]
    visible = c < ((layout.pos + 1) // block_size)[:, None]  # (S, blocks_max)
    forced = (c == 0) | (c == current) | (c == current - 1)
    importance = np.where(forced[:, None], float(group), importance)
    scores_c = np.where((visible | forced)[:, None], importance, -np.inf)
    n = int(np.max(block_counts, initial=0))
    chosen = topk_indices(scores_c.reshape(s * kv_heads, -1), max(1, n)).reshape(s, kv_heads, -1)
    quota = np.arange(chosen.shape[-1]) < np.asarray(block_counts)[..., None]
    return np.where(quota, chosen, -1)


def check_block_counts(block_counts: Any, shape: tuple[int, int]) -> int | np.ndarray:
    """An int >= 1, or (S, H_kv) integers >= 0."""
    if isinstance(block_counts, (int, np.integer)) and not isinstance(block_counts, bool):
        return validation.positive_int("block_counts", block_counts)
    counts = np.asarray(block_counts)
    if counts.dtype == np.bool_ or not np.issubdtype(counts.dtype, np.integer):
        raise TypeError(
            f"block_counts must be an int or an integer array, got dtype {counts.dtype}"
        )
    check_block_counts_shape(counts.shape, shape, int(counts.min(initial=0)))
    return counts


def check_block_counts_shape(counts: tuple[int, ...], shape: tuple[int, int], lo: int) -> None:
    if tuple(counts) != shape:
        raise ValueError(f"block_counts must be an int or (S, H_kv) = {shape}, got {tuple(counts)}")
    if lo < 0:
        raise ValueError(f"block_counts must be >= 0, got {lo}")


def check_options(
    q: tuple[int, ...],
    k: tuple[int, ...],
    v: tuple[int, ...],
    g_cmp: tuple[int, ...],
    g_slc: tuple[int, ...],
    g_swa: tuple[int, ...] | None,
    block_size: Any,
    window_size: Any,
    block_indices: tuple[int, ...] | None,
) -> None:
    """The shapes and options of one call (pure Python: the torch twin runs the same rules)."""
    check_shapes(q, k, v, tuple(q[:1]) + tuple(k[1:2]) + (0,), None)
    if q[0] != k[0]:
        raise ValueError(f"NSA is self-attention: q and k must have one token axis, got {q}, {k}")
    validation.positive_int("block_size", block_size)
    window = validation.non_negative_int("window_size", window_size)
    if (g_swa is None) != (window == 0):
        raise ValueError("g_swa must be given exactly when window_size > 0")
    for name, shape in (("g_cmp", g_cmp), ("g_slc", g_slc), ("g_swa", g_swa)):
        if shape is not None and tuple(shape) != q[:2]:
            raise ValueError(f"{name} must be (S, H) = {q[:2]}, got {tuple(shape)}")
    if block_indices is not None and (len(block_indices) != 3 or block_indices[:2] != (q[0], k[1])):
        raise ValueError(
            f"block_indices must be (S, H_kv, n) = ({q[0]}, {k[1]}, n), got {block_indices}"
        )


def _check(
    q: Any, k: Any, v: Any, g_cmp: Any, g_slc: Any, g_swa: Any, block_size: Any,
    window_size: Any, block_indices: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:  # fmt: skip
    """Every argument checked before any work; the gates returned in the inputs' dtype."""
    arrays = {"q": q, "k": k, "v": v, "g_cmp": g_cmp, "g_slc": g_slc}
    if g_swa is not None:
        arrays["g_swa"] = g_swa
    arrays = {name: validation.float_array(name, a) for name, a in arrays.items()}
    validation.same_dtype(**arrays)
    if block_indices is not None:
        block_indices = np.asarray(block_indices)
        if block_indices.dtype == np.bool_ or not np.issubdtype(block_indices.dtype, np.integer):
            raise TypeError(
                f"block_indices must be an integer array, got dtype {block_indices.dtype}"
            )
    check_options(
        arrays["q"].shape, arrays["k"].shape, arrays["v"].shape,
        arrays["g_cmp"].shape, arrays["g_slc"].shape,
        arrays["g_swa"].shape if "g_swa" in arrays else None,
        block_size, window_size, None if block_indices is None else block_indices.shape,
    )  # fmt: skip
    return arrays["g_cmp"], arrays["g_slc"], arrays.get("g_swa")


def _given(dv: np.ndarray | None) -> np.ndarray:
    """The core's dv, always present here: NSA gives v (never MLA's shared latent)."""
    assert dv is not None
    return dv


def _per_head(rows: np.ndarray, kv_heads: int) -> np.ndarray:
    """(S, W) -> (S, H_kv, W): the same list for every kv head."""
    return np.broadcast_to(rows[:, None, :], (rows.shape[0], kv_heads, rows.shape[1]))
