"""Sparse attention by indices (DeepSeek-V3.2's DSA, FlashMLA's sparse kernels): each query token
attends only to the key rows its index list names, forward and hand-derived backward.

Token-major, as FlashMLA's sparse kernels (a batch is offsets into the token axis):

    q        (S_q, H, D)            k (S_kv, H_kv, D)        v (S_kv, H_kv, Dv), or None with d_v:
    indices  (S_q, H_kv, topk) int  V = k[..., :d_v], the shared latent of MLA
    topk_length (S_q,) int, or None

Query token t, head h attends the key rows ``indices[t, h // (H / H_kv), :topk_length[t]]`` of
its kv head. An entry < 0 or >= S_kv is invalid (-1 is the usual sentinel; S_kv, 2^31 - 1 and
any other value outside [0, S_kv) mean the same): it contributes nothing, reads nothing and
writes nothing. An entry past ``topk_length[t]`` is not read at all. A row index repeated
within one list counts once per entry (a gather's meaning: the key gets twice the weight); a
key named by several queries gets every query's gradient added. Scale, sinks, lse and dead rows
follow the core's rules (``functional.attention_forward``): a row with no valid entry gives out 0
and lse -inf, or lse = the sink logit with sinks.

The work runs in blocks of query tokens, so that the gathered keys of a block stay small; its
cost is proportional to S_q * topk, not S_q * S_kv.

Shape legend: S_q query tokens, S_kv key tokens, H query heads, H_kv key/value heads, g = H / H_kv
the group, D key width, Dv value width, topk entries per query and kv head.

Derivation: docs/derivations/sparse.md. Tests: tests/numpy_attention/test_sparse.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import validation
from .grad_mode import is_grad_enabled
from .scores import AttentionOutput

# A block of query tokens holds at most this many gathered key entries (block * H_kv * topk * D),
# ~64 MiB of float64: the gather of a whole S_q x topk x D problem would not fit in memory.
_BLOCK_ENTRIES = 1 << 23
# The backward's scatter-add works in chunks of query tokens: _SCATTER_TOKENS of them, their
# rows grouped by which tokens name them (at most 2^3 - 1 products a chunk), unless a token's
# entries are under about _SCATTER_WORK / _SCATTER_TOKENS multiply-adds; then a chunk holds
# tokens enough for _SCATTER_WORK, in one product. Both chosen by measurement
# (docs/benchmarks.md, sparse attention).
_SCATTER_TOKENS = 3
_SCATTER_WORK = 1 << 20


class SparseCtx(NamedTuple):
    """What ``sparse_attention_backward`` needs: the inputs in the compute dtype, the rules."""

    q: np.ndarray  # (S_q, H, D), compute dtype
    k: np.ndarray  # (S_kv, H_kv, D)
    v: np.ndarray | None  # (S_kv, H_kv, Dv), or None: V = k[..., :d_v]
    d_v: int
    rows: np.ndarray  # (S_q, H_kv, topk) int64: the key row of each entry, 0 where invalid
    valid: np.ndarray  # (S_q, H_kv, topk) bool: the entry is read
    scale: Any  # compute-dtype scalar
    sinks: np.ndarray | None  # (H,), compute dtype
    out: np.ndarray  # (S_q, H, Dv), compute dtype
    lse: np.ndarray  # (S_q, H), compute dtype
    dtype: np.dtype  # the inputs' dtype (the gradients')


class SparseGrads(NamedTuple):
    """What ``sparse_attention_backward`` returns: the fields of the core's ``AttentionGrads``, in
    its order, with dv None when V is k's shared latent (its gradient is then in dk)."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray | None
    dsinks: np.ndarray | None


class Sparse(NamedTuple):
    """The inputs checked and cast to the compute dtype."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray | None
    d_v: int
    rows: np.ndarray
    valid: np.ndarray
    scale: Any
    sinks: np.ndarray | None
    dtype: np.dtype


def sparse_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray | None,
    indices: np.ndarray,
    *,
    softmax_scale: float | None = None,
    sinks: np.ndarray | None = None,
    topk_length: np.ndarray | None = None,
    d_v: int | None = None,
    return_lse: bool = False,
) -> AttentionOutput:
    """Attention of each query token over the key rows its indices name.

    Args:
        q: (S_q, H, D) queries.
        k: (S_kv, H_kv, D) keys; H_kv must divide H.
        v: (S_kv, H_kv, Dv) values, or None with ``d_v``: the values are ``k[..., :d_v]`` (MLA's
            latent, which is key and value at once; ``dk`` then carries both gradients).
        indices: (S_q, H_kv, topk) integer key rows; entries outside [0, S_kv) are invalid.
        softmax_scale: the score scale; None is 1/sqrt(D).
        sinks: (H,) one sink logit per query head, or None.
        topk_length: (S_q,) integers in [0, topk]: token t reads only its first
            ``topk_length[t]`` entries; None reads all.
        d_v: the value width when ``v`` is None (1 <= d_v <= D); must be None when v is given.
        return_lse: also return lse.

    Returns:
        ``AttentionOutput(out, lse, ctx)``: out (S_q, H, Dv) in the inputs' dtype; lse (S_q, H)
        (q's shape without its width, as the core's), the natural log of each row's
        denominator, sink included, in the compute dtype, or None; ctx None under ``no_grad()``.
    """
    s = _prepare(q, k, v, indices, softmax_scale, sinks, topk_length, d_v)
    s_q, heads, _ = s.q.shape
    out = np.zeros((s_q, heads, s.d_v), s.q.dtype)
    lse = np.empty((s_q, heads), s.q.dtype)
    for t in _blocks(s):
        k_sel = _gather_k(s, t)  # (n, H_kv, topk, D)
        p, block_lse = _probabilities(s, t, k_sel)
        out[t] = _group_matmul(p, _gather_v(s, t, k_sel))
        lse[t] = block_lse
    ctx = None
    if is_grad_enabled():
        ctx = SparseCtx(s.q, s.k, s.v, s.d_v, s.rows, s.valid, s.scale, s.sinks, out, lse, s.dtype)
    return AttentionOutput(out.astype(s.dtype, copy=False), lse if return_lse else None, ctx)


def sparse_attention_backward(
    dout: np.ndarray, ctx: SparseCtx, dlse: np.ndarray | None = None
) -> SparseGrads:
    """The gradients of ``sparse_attention_forward``, derived by hand.

    Per query token t and head h, with P its weights over its entries (sink in the denominator),
    O its output and delta = dO . O: dP_j = dO . V_j, dS_j = P_j (dP_j - delta + dlse),
    dq = scale sum_j dS_j K_j; every entry j then adds scale dS_j q to the key row it names and
    P_j dO to that row's value, summed over the group's heads and over every query naming the
    row (a scatter-add: repeated rows accumulate, invalid entries write nothing); dsink_h =
    sum_t P_sink (dlse - delta). Derivation: docs/derivations/sparse.md.

    Args:
        dout: (S_q, H, Dv) gradient of the output.
        ctx: from ``sparse_attention_forward``.
        dlse: (S_q, H) gradient of lse, or None.

    Returns:
        ``SparseGrads(dq, dk, dv, dsinks)`` (``AttentionGrads``' fields): (S_q, H, D),
        (S_kv, H_kv, D), (S_kv, H_kv, Dv) or None when V is k's latent (its gradient is in
        dk's first d_v columns), and (H,) with sinks, else None; in the inputs' dtype.
    """
    if not isinstance(ctx, SparseCtx):
        raise TypeError(
            "sparse_attention_backward needs the ctx of a forward run outside no_grad(), "
            f"got {type(ctx).__name__}"
        )
    s_q, heads, _ = ctx.q.shape
    compute = ctx.q.dtype
    dout = validation.grad_output(dout, (s_q, heads, ctx.d_v)).astype(compute, copy=False)
    if dlse is not None:
        dlse = validation.grad_output(dlse, (s_q, heads), name="dlse").astype(compute, copy=False)
    s = Sparse(ctx.q, ctx.k, ctx.v, ctx.d_v, ctx.rows, ctx.valid, ctx.scale, ctx.sinks, ctx.dtype)
    kv_heads = ctx.k.shape[1]
    group = heads // kv_heads
    dq = np.zeros_like(ctx.q)
    dk = np.zeros_like(ctx.k)
    dv = None if ctx.v is None else np.zeros_like(ctx.v)
    # delta_t,h = dO . O: the rowsum of dP * P without building dP over the whole row
    delta = np.einsum("thd,thd->th", dout, ctx.out)
    shift = delta if dlse is None else delta - dlse  # dS = P (dP - shift)
    for t in _blocks(s):
        n = t.stop - t.start
        k_sel = _gather_k(s, t)  # (n, H_kv, topk, D)
        v_sel = _gather_v(s, t, k_sel)  # (n, H_kv, topk, Dv)
        p = _weights(s, t, k_sel, ctx.lse[t])  # (n, H_kv, g, topk)
        do = dout[t].reshape(n, kv_heads, group, ctx.d_v)
        dp = do @ v_sel.swapaxes(-1, -2)  # (n, H_kv, g, topk)
        ds = p * (dp - shift[t].reshape(n, kv_heads, group, 1))
        dq[t] = (ctx.scale * (ds @ k_sel)).reshape(n, heads, -1)
        q_t = ctx.q[t].reshape(n, kv_heads, group, -1)
        rows, valid = ctx.rows[t], ctx.valid[t]
        if dv is None:
            # MLA: V is k's latent, so an entry's key and value gradients go to the same row of
            # dk: one scatter of both, weights [scale dS; P] over vectors [q; dO | 0]
            weights = np.concatenate([ctx.scale * ds, p], axis=2)  # (n, H_kv, 2g, topk)
            vectors = np.zeros((n, kv_heads, 2 * group, ctx.q.shape[2]), compute)
            vectors[:, :, :group] = q_t
            vectors[:, :, group:, : ctx.d_v] = do
        for h in range(kv_heads):  # each key row gets the sum over every entry naming it
            entries = rows[:, h], valid[:, h]
            if dv is None:
                _scatter_products(dk[:, h], *entries, weights[:, h], vectors[:, h], 1.0)
            else:
                _scatter_products(dk[:, h], *entries, ds[:, h], q_t[:, h], ctx.scale)
                _scatter_products(dv[:, h], *entries, p[:, h], do[:, h], 1.0)
    dsinks = None
    if ctx.sinks is not None:
        # P_sink = exp(s_h - lse); a row with neither keys nor sink has lse = -inf and P_sink 0
        p_sink = np.exp(ctx.sinks[None, :] - ctx.lse)
        dsinks = -np.sum(p_sink * shift, axis=0).astype(ctx.dtype, copy=False)
    return SparseGrads(
        dq.astype(ctx.dtype, copy=False),
        dk.astype(ctx.dtype, copy=False),
        None if dv is None else dv.astype(ctx.dtype, copy=False),
        dsinks,
    )


def valid_entries(
    indices: np.ndarray, s_kv: int, topk_length: np.ndarray | None = None
) -> np.ndarray:
    """(S_q, H_kv, topk) bool: the entries that are read, in [0, S_kv) and before topk_length."""
    valid = (indices >= 0) & (indices < s_kv)
    if topk_length is not None:
        valid &= np.arange(indices.shape[-1]) < np.asarray(topk_length)[:, None, None]
    return valid


def _prepare(
    q: Any,
    k: Any,
    v: Any,
    indices: Any,
    softmax_scale: Any,
    sinks: Any,
    topk_length: Any,
    d_v: Any,
) -> Sparse:
    """Every argument checked once, before any work; q, k, v (and sinks) cast to the compute
    dtype (float32 for float16 inputs, as the core)."""
    q = validation.float_array("q", q)
    k = validation.float_array("k", k)
    arrays = {"q": q, "k": k}
    if v is not None:
        v = validation.float_array("v", v)
        arrays["v"] = v
    dtype = validation.same_dtype(**arrays)
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    indices = np.asarray(indices)
    if indices.dtype == np.bool_ or not np.issubdtype(indices.dtype, np.integer):
        raise TypeError(f"indices must be an integer array, got dtype {indices.dtype}")
    d_v = check_shapes(q.shape, k.shape, None if v is None else v.shape, indices.shape, d_v)
    (s_q, heads, width), s_kv = q.shape, k.shape[0]
    if topk_length is not None:
        topk_length = np.asarray(topk_length)
        if topk_length.dtype == np.bool_ or not np.issubdtype(topk_length.dtype, np.integer):
            raise TypeError(f"topk_length must be an integer array, got dtype {topk_length.dtype}")
        lo, hi = (int(topk_length.min()), int(topk_length.max())) if topk_length.size else (0, 0)
        check_topk_length(topk_length.shape, s_q, indices.shape[2], lo, hi)
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(width) if width else 1.0
    else:
        scale = validation.finite_real("softmax_scale", softmax_scale)
    if sinks is not None:
        sinks = validation.float_array("sinks", sinks)
        if sinks.shape != (heads,):
            raise ValueError(
                f"sinks must be (H,) = ({heads},), one per query head, got {sinks.shape}"
            )
        if sinks.dtype != dtype:
            raise TypeError(f"sinks must have the dtype of q, k and v ({dtype}), got {sinks.dtype}")
        if not np.all(np.isfinite(sinks)):
            raise ValueError("sinks must be finite")
        sinks = sinks.astype(compute)
    valid = valid_entries(indices, s_kv, topk_length)
    rows = np.where(valid, indices, 0).astype(np.int64)  # an invalid entry reads row 0, masked
    return Sparse(
        q.astype(compute, copy=False),
        k.astype(compute, copy=False),
        None if v is None else v.astype(compute, copy=False),
        d_v,
        rows,
        valid,
        compute.type(scale),
        sinks,
        dtype,
    )


def check_shapes(
    q: tuple[int, ...],
    k: tuple[int, ...],
    v: tuple[int, ...] | None,
    indices: tuple[int, ...],
    d_v: Any,
) -> int:
    """The shapes of one call checked (pure Python: the torch twin runs the same rules); the
    value width returned: v's, or ``d_v`` when v is None (MLA's latent)."""
    for name, shape in (("q", q), ("k", k), ("v", v)):
        if shape is not None and len(shape) != 3:
            raise ValueError(
                f"{name} must be token-major (tokens, heads, width), got shape {shape}"
            )
    s_q, heads, width = q
    s_kv, kv_heads, _ = k
    if k[2] != width:
        raise ValueError(f"q and k must share the head width D, got q {q} and k {k}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {q}, k {k})"
        )
    if v is None:
        if d_v is None:
            raise ValueError("v is None: give d_v, the width of the values k[..., :d_v] (MLA)")
        d_v = validation.positive_int("d_v", d_v)
        if d_v > width:
            raise ValueError(f"d_v must be at most the key width D = {width}, got {d_v}")
    else:
        if d_v is not None:
            raise ValueError("d_v is the width of k[..., :d_v] when v is None; v was given")
        if v[:2] != (s_kv, kv_heads):
            raise ValueError(f"k and v must share the key tokens and kv heads, got k {k} and v {v}")
        d_v = v[2]
    if len(indices) != 3 or tuple(indices[:2]) != (s_q, kv_heads):
        raise ValueError(
            f"indices must be (S_q, H_kv, topk) = ({s_q}, {kv_heads}, topk), got shape "
            f"{tuple(indices)}"
        )
    return int(d_v)


def check_topk_length(shape: tuple[int, ...], s_q: int, topk: int, lo: int, hi: int) -> None:
    """topk_length's shape (S_q,) and its values' range [lo, hi] within [0, topk]."""
    if tuple(shape) != (s_q,):
        raise ValueError(f"topk_length must be (S_q,) = ({s_q},), got {tuple(shape)}")
    if lo < 0 or hi > topk:
        raise ValueError(
            f"topk_length must lie in [0, topk = {topk}], got values from {lo} to {hi}"
        )


def _blocks(s: Sparse) -> list[slice]:
    """Blocks of query tokens whose gathered keys hold at most ``_BLOCK_ENTRIES`` numbers."""
    s_q = s.q.shape[0]
    per_token = max(1, s.rows.shape[1] * s.rows.shape[2] * (s.k.shape[2] + s.d_v))
    size = max(1, _BLOCK_ENTRIES // per_token)
    return [slice(start, min(start + size, s_q)) for start in range(0, s_q, size)]


def _gather_k(s: Sparse, t: slice) -> np.ndarray:
    """(n, H_kv, topk, D): each entry's key row (row 0 where invalid; masked by the caller)."""
    return s.k[s.rows[t], np.arange(s.k.shape[1])[None, :, None]]


def _gather_v(s: Sparse, t: slice, k_sel: np.ndarray) -> np.ndarray:
    """(n, H_kv, topk, Dv): each entry's value row; with MLA's latent (v None) a view of the
    gathered keys ``k_sel`` (n, H_kv, topk, D), whose first d_v columns they are."""
    if s.v is None:
        return k_sel[..., : s.d_v]
    return s.v[s.rows[t], np.arange(s.v.shape[1])[None, :, None]]


def _scores(s: Sparse, t: slice, k_sel: np.ndarray) -> np.ndarray:
    """(n, H_kv, g, topk) scaled scores, -inf on the invalid entries."""
    n, kv_heads = t.stop - t.start, s.k.shape[1]
    q_t = s.q[t].reshape(n, kv_heads, -1, s.q.shape[2])
    scores = (q_t * s.scale) @ k_sel.swapaxes(-1, -2)
    return np.where(s.valid[t][:, :, None, :], scores, -np.inf)


def _probabilities(s: Sparse, t: slice, k_sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weights (n, H_kv, g, topk) of a block's entries (their keys ``k_sel``), the sink in
    their denominator, and its lse (n, H): a shift by each row's max (the sink's logit
    included), then one division."""
    n, kv_heads = t.stop - t.start, s.k.shape[1]
    scores = _scores(s, t, k_sel)
    top = np.max(scores, axis=-1, initial=-np.inf)
    if s.sinks is not None:
        sink = s.sinks.reshape(1, kv_heads, -1)
        top = np.maximum(top, sink)
    shift = np.where(np.isfinite(top), top, 0.0)  # a dead row: nothing to shift
    e = np.exp(scores - shift[..., None])
    total = np.sum(e, axis=-1)
    if s.sinks is not None:
        total = total + np.exp(sink - shift)
    with np.errstate(divide="ignore"):
        lse = shift + np.log(total)  # -inf for a dead row without a sink
    p = e / np.where(total > 0, total, 1.0)[..., None]
    return p, lse.reshape(n, -1)


def _weights(s: Sparse, t: slice, k_sel: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """The forward's weights recomputed from its lse: exp(S - lse), 0 on invalid entries and on
    dead rows (lse -inf)."""
    n, kv_heads = t.stop - t.start, s.k.shape[1]
    lse = lse.reshape(n, kv_heads, -1, 1)
    finite = np.isfinite(lse)
    return np.where(finite, np.exp(_scores(s, t, k_sel) - np.where(finite, lse, 0.0)), 0.0)


def _group_matmul(p: np.ndarray, v_sel: np.ndarray) -> np.ndarray:
    """(n, H_kv, g, topk) @ (n, H_kv, topk, Dv) -> (n, H, Dv)."""
    n = p.shape[0]
    return (p @ v_sel).reshape(n, -1, v_sel.shape[-1])


def _scatter_products(
    target: np.ndarray,
    rows: np.ndarray,
    valid: np.ndarray,
    weights: np.ndarray,
    vectors: np.ndarray,
    factor: Any,
) -> None:
    """target[rows[t, j]] += factor * sum_g weights[t, g, j] * vectors[t, g] over the valid
    entries (t, j): the key (or value) gradient of one kv head, every repeat of a row added.

    Rather than one vector per entry, scattered, the weights (scalars) are summed per named row
    and naming (token, head) by ``np.bincount`` (repeats add there), and the rows' gradients are
    matrix products, each distinct row written once per chunk of tokens. Chunks of
    ``_SCATTER_TOKENS`` tokens go by pattern (``_scatter_by_pattern``), so the products do the
    entries' own work however much or little the tokens share; where a token's entries are too
    little work to pay for a chunk's Python steps, a chunk of more tokens makes one product over
    all of them (``_scatter_dense``). target (S_kv, W) may be a view (a head of dk). rows,
    valid (n, topk); weights (n, g, topk); vectors (n, g, W) (g: the weights per entry, 2g when
    MLA's key and value gradients go together)."""
    n, group, topk = weights.shape
    per_token = max(1, topk * group * vectors.shape[-1])  # multiply-adds of a token's entries
    size = min(n, max(_SCATTER_TOKENS, -(-_SCATTER_WORK // per_token)))
    by_pattern = size <= _SCATTER_TOKENS
    # the sums (rows named x the chunk's tokens x g at most) stay under _BLOCK_ENTRIES / 2
    while size > 1 and size * group * min(target.shape[0], size * topk) > _BLOCK_ENTRIES // 2:
        size = (size + 1) // 2
    for start in range(0, n, size):
        chunk = slice(start, min(start + size, n))
        t_idx, j_idx = np.nonzero(valid[chunk])  # the valid entries, token by token
        if t_idx.size == 0:
            continue
        named, inverse = np.unique(rows[chunk][t_idx, j_idx], return_inverse=True)
        w = factor * weights[chunk][t_idx, :, j_idx]  # (entries, g)
        scatter = _scatter_by_pattern if by_pattern else _scatter_dense
        scatter(target, named, inverse, t_idx, w, vectors[chunk])


def _scatter_dense(
    target: np.ndarray,
    named: np.ndarray,
    inverse: np.ndarray,
    t_idx: np.ndarray,
    w: np.ndarray,
    vectors: np.ndarray,
) -> None:
    """One chunk of ``_scatter_products`` as one product: W (rows named, m * g) @ vectors (m * g,
    W), zero where a token does not name a row. named (rows,) the distinct rows; inverse,
    t_idx (entries,) each entry's place in named and its token; w (entries, g); vectors (m, g,
    W)."""
    m, group, _ = vectors.shape
    flat = (inverse[:, None] * (m * group) + t_idx[:, None] * group + np.arange(group)).ravel()
    sums = np.bincount(flat, weights=w.ravel(), minlength=named.size * m * group)
    matrix = sums.reshape(named.size, m * group).astype(vectors.dtype, copy=False)
    target[named] += matrix @ vectors.reshape(m * group, -1)


def _scatter_by_pattern(
    target: np.ndarray,
    named: np.ndarray,
    inverse: np.ndarray,
    t_idx: np.ndarray,
    w: np.ndarray,
    vectors: np.ndarray,
) -> None:
    """One chunk of ``_scatter_products`` by pattern: a row's pattern is the set of the chunk's
    tokens that name it, and the rows of one pattern p make one product (rows of p, |p| * g) @
    (|p| * g, W) with p's tokens' vectors only: the columns of W that would be zero are never
    built, so the products cost at most entries * g * W multiply-adds, shared or not. Arguments as
    ``_scatter_dense``; m <= 62 tokens (a pattern is an int64's bits)."""
    m, group, _ = vectors.shape
    naming = np.zeros((named.size, m), bool)  # naming[r, t]: token t names row named[r]
    naming[inverse, t_idx] = True
    pattern = naming @ (1 << np.arange(m))  # (rows,) the bits of the tokens naming a row
    order = np.argsort(pattern, kind="stable")  # the rows grouped by pattern
    place = np.empty_like(order)
    place[order] = np.arange(order.size)  # a row's place in that order
    # the sums: the rows in pattern order, each a run of (its tokens x g) columns
    offset = np.zeros(named.size + 1, np.int64)
    np.cumsum(naming[order].sum(axis=1) * group, out=offset[1:])
    column = np.cumsum(naming, axis=1) - 1  # column[r, t]: t's place among the tokens naming r
    first = offset[place[inverse]] + column[inverse, t_idx] * group  # (entries,)
    flat = (first[:, None] + np.arange(group)).ravel()  # (entries * g,), w's order
    sums = np.bincount(flat, weights=w.ravel(), minlength=offset[-1])
    edges = np.flatnonzero(np.diff(pattern[order])) + 1
    for lo, hi in zip([0, *edges], [*edges, named.size], strict=True):
        tokens = np.flatnonzero(naming[order[lo]])  # the pattern's tokens
        matrix = sums[offset[lo] : offset[hi]].reshape(hi - lo, tokens.size * group)
        pattern_vectors = vectors[tokens].reshape(tokens.size * group, -1)
        target[named[order[lo:hi]]] += matrix.astype(vectors.dtype) @ pattern_vectors
