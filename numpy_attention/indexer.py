"""DeepSeek-V3.2's lightning indexer, the selector of DSA: its scores, their hand-derived
backward, the top-k selection, and the indexer's training loss (a KL divergence to the main
attention) with its gradient.

    scores[t, s] = sum_j weights[t, j] * relu(scale * q_idx[t, j] . k_idx[s])

q_idx (S_q, HI, DI) are the indexer's query heads, k_idx (S_kv, DI) its one key head, weights
(S_q, HI) one weight per query head and token (transformers' ``weights_proj(x) * HI^-0.5``).
Under ``causal`` a query token t sits at position t + S_kv - S_q (the last query is the last key,
as when decoding over a cache) and keys past it are hidden: -inf. The indexer's RoPE (DeepSeek's
half-split layout, not the main attention's interleaved one) is applied to q_idx and k_idx
before they reach this module: see ``numpy_attention.rope`` and its ``interleaved`` option.

``topk_indices`` keeps each row's ``topk`` largest scores, in order of score, ties to the lower
key index, -1 where the row has fewer visible keys; its output is what
``sparse.sparse_attention_forward`` reads (one kv head: ``indices[:, None, :]``).

``indexer_kl_loss`` is the loss DSA trains the indexer with: for each query row, KL(p || softmax
of the row's scores), p the main attention's weights summed over its heads and L1-normalized,
held constant (the main attention is not trained by this loss); dense (over every visible key)
or restricted to the selected set (``indices``: softmax and p both renormalized over it).

Shape legend: S_q query tokens, S_kv key tokens, HI indexer heads, DI indexer head width, H the
main attention's heads.

Derivation: docs/derivations/indexer.md. Tests: tests/numpy_attention/test_indexer.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation
from .grad_mode import is_grad_enabled

# Query tokens per block: the block's (n, HI, S_kv) products stay near 2^23 numbers.
_BLOCK_ENTRIES = 1 << 23


class IndexerCtx(NamedTuple):
    q_idx: np.ndarray  # (S_q, HI, DI), compute dtype
    k_idx: np.ndarray  # (S_kv, DI)
    weights: np.ndarray  # (S_q, HI)
    scale: Any
    causal: bool
    dtype: np.dtype


class IndexerOutput(NamedTuple):
    scores: np.ndarray  # (S_q, S_kv), -inf where causal hides a key
    ctx: IndexerCtx | None


class IndexerGrads(NamedTuple):
    dq_idx: np.ndarray
    dk_idx: np.ndarray
    dweights: np.ndarray


class KLOutput(NamedTuple):
    loss: float  # summed over the query rows
    dscores: np.ndarray  # (S_q, S_kv), 0 where a key is hidden or not selected


def indexer_forward(
    q_idx: np.ndarray,
    k_idx: np.ndarray,
    weights: np.ndarray,
    *,
    scale: float | None = None,
    causal: bool = True,
) -> IndexerOutput:
    """The indexer's scores (S_q, S_kv) in the compute dtype (float32 for float16 inputs).

    Args:
        q_idx: (S_q, HI, DI) the indexer's queries (after its RoPE).
        k_idx: (S_kv, DI) its keys (after its RoPE); S_kv >= S_q under causal.
        weights: (S_q, HI) each query head's weight per token.
        scale: multiplies q . k inside the relu; None is DI^-0.5 (transformers' softmax_scale).
        causal: hide the keys past each query's position t + S_kv - S_q (-inf).
    """
    q_idx, k_idx, weights, scale, causal, dtype = _prepare(q_idx, k_idx, weights, scale, causal)
    s_q, s_kv = q_idx.shape[0], k_idx.shape[0]
    scores = np.empty((s_q, s_kv), q_idx.dtype)
    for t in _blocks(q_idx.shape[1], s_q, s_kv):
        u = scale * (q_idx[t] @ k_idx.T)  # (n, HI, S_kv)
        scores[t] = np.einsum("thk,th->tk", np.maximum(u, 0.0), weights[t])
    if causal:
        scores[hidden_keys(s_q, s_kv)] = -np.inf
    ctx = IndexerCtx(q_idx, k_idx, weights, scale, causal, dtype) if is_grad_enabled() else None
    return IndexerOutput(scores, ctx)


def indexer_backward(dscores: np.ndarray, ctx: IndexerCtx) -> IndexerGrads:
    """The gradients of ``indexer_forward``'s scores: with u = scale q . k and r = relu(u),

        dweights[t, j] = sum_s dscores[t, s] r[t, j, s]
        du[t, j, s]    = dscores[t, s] weights[t, j] [u > 0]     (relu's derivative: 0 at 0)
        dq_idx[t, j]   = scale sum_s du[t, j, s] k_idx[s]
        dk_idx[s]      = scale sum_{t, j} du[t, j, s] q_idx[t, j]

    over the visible keys only (a hidden score is a constant -inf). Derivation:
    docs/derivations/indexer.md.
    """
    if not isinstance(ctx, IndexerCtx):
        raise TypeError(
            "indexer_backward needs the ctx of a forward run outside no_grad(), got "
            f"{type(ctx).__name__}"
        )
    s_q, heads, _ = ctx.q_idx.shape
    s_kv = ctx.k_idx.shape[0]
    dscores = validation.grad_output(dscores, (s_q, s_kv), name="dscores")
    dscores = dscores.astype(ctx.q_idx.dtype)
    if ctx.causal:
        dscores = np.where(hidden_keys(s_q, s_kv), 0.0, dscores).astype(ctx.q_idx.dtype)
    dq = np.zeros_like(ctx.q_idx)
    dk = np.zeros_like(ctx.k_idx)
    dw = np.zeros_like(ctx.weights)
    for t in _blocks(heads, s_q, s_kv):
        u = ctx.scale * (ctx.q_idx[t] @ ctx.k_idx.T)  # (n, HI, S_kv)
        dw[t] = np.einsum("tk,thk->th", dscores[t], np.maximum(u, 0.0))
        du = np.where(u > 0, dscores[t][:, None, :] * ctx.weights[t][:, :, None], 0.0)
        dq[t] = ctx.scale * (du @ ctx.k_idx)
        dk += ctx.scale * np.einsum("thk,thd->kd", du, ctx.q_idx[t])
    return IndexerGrads(*(g.astype(ctx.dtype, copy=False) for g in (dq, dk, dw)))


def hidden_keys(s_q: int, s_kv: int) -> np.ndarray:
    """(S_q, S_kv) bool: the keys past query t's position t + S_kv - S_q."""
    return np.arange(s_kv)[None, :] > np.arange(s_q)[:, None] + (s_kv - s_q)


def topk_indices(scores: np.ndarray, topk: int) -> np.ndarray:
    """(S_q, topk) int64: each row's ``topk`` largest visible scores, largest first, ties to the
    lower key index; -1 past the row's visible keys (a -inf score is not visible; NaN is refused).
    """
    scores = validation.float_array("scores", scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be (S_q, S_kv), got shape {scores.shape}")
    topk = validation.positive_int("topk", topk)
    if np.isnan(scores).any():
        raise ValueError("scores hold NaN: no order to select by")
    order = np.argsort(-scores, axis=-1, kind="stable")[:, :topk]  # stable: ties keep index order
    chosen = np.take_along_axis(scores, order, axis=-1)
    picked = np.where(np.isneginf(chosen), -1, order)
    pad = topk - picked.shape[1]
    return np.pad(picked, ((0, 0), (0, pad)), constant_values=-1).astype(np.int64)


def indexer_kl_loss(
    scores: np.ndarray, attention: np.ndarray, indices: np.ndarray | None = None
) -> KLOutput:
    """DSA's indexer loss, sum over query rows of KL(p || softmax(scores)), and its gradient.

    Args:
        scores: (S_q, S_kv) the indexer's scores (-inf where hidden).
        attention: (S_q, H, S_kv) the main attention's weights (or (S_q, S_kv), already summed);
            p is their sum over heads, L1-normalized per row; held constant.
        indices: None for the dense loss over every visible key; or (S_q, topk) the selected
            keys (entries outside [0, S_kv) ignored): softmax and p renormalized over them.

    Returns:
        ``KLOutput(loss, dscores)``: dscores = softmax(scores) - p on the keys the loss reads
        (each row whose p sums to 0 is left out: loss 0, gradient 0), 0 elsewhere.

    Raises:
        ValueError: p puts weight on a key the indexer hides (-inf): the KL would be infinite.
    """
    scores = validation.float_array("scores", scores)
    attention = validation.float_array("attention", attention)
    if scores.ndim != 2:
        raise ValueError(f"scores must be (S_q, S_kv), got shape {scores.shape}")
    s_q, s_kv = scores.shape
    if attention.ndim == 3:
        attention = attention.sum(axis=1)
    if attention.shape != (s_q, s_kv):
        raise ValueError(
            f"attention must be (S_q, H, S_kv) or (S_q, S_kv) = ({s_q}, {s_kv}), got "
            f"{attention.shape}"
        )
    if np.any(attention < 0):
        raise ValueError("attention weights must be >= 0")
    read = ~np.isneginf(scores)
    if indices is not None:
        indices = np.asarray(indices)
        if indices.dtype == np.bool_ or not np.issubdtype(indices.dtype, np.integer):
            raise TypeError(f"indices must be an integer array, got dtype {indices.dtype}")
        if indices.ndim != 2 or indices.shape[0] != s_q:
            raise ValueError(f"indices must be (S_q, topk) = ({s_q}, topk), got {indices.shape}")
        selected = np.zeros((s_q, s_kv), bool)
        rows, cols = np.nonzero((indices >= 0) & (indices < s_kv))
        selected[rows, indices[rows, cols]] = True
        read &= selected
    if np.any((attention > 0) & np.isneginf(scores)):
        raise ValueError("attention puts weight on keys the indexer hides (-inf scores)")
    # restricted: p renormalized over the selected keys (weight elsewhere is not the loss's)
    mass = np.where(read, attention, 0.0).sum(axis=-1, keepdims=True)
    live = mass[:, 0] > 0
    p = np.where(read, attention, 0.0) / np.where(mass > 0, mass, 1.0)
    masked = np.where(read, scores, -np.inf)
    top = np.max(masked, axis=-1, keepdims=True, initial=-np.inf)
    shifted = masked - np.where(np.isfinite(top), top, 0.0)
    log_z = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True, where=read, initial=0.0))
    log_q = np.where(read, shifted - log_z, 0.0)
    q = np.where(read, np.exp(log_q), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - log_q), 0.0)
    loss = float(np.sum(terms[live]))
    dscores = np.where(live[:, None] & read, q - p, 0.0)
    return KLOutput(loss, dscores)


def _prepare(q_idx: Any, k_idx: Any, weights: Any, scale: Any, causal: Any) -> tuple:
    q_idx = validation.float_array("q_idx", q_idx)
    k_idx = validation.float_array("k_idx", k_idx)
    weights = validation.float_array("weights", weights)
    dtype = validation.same_dtype(q_idx=q_idx, k_idx=k_idx, weights=weights)
    if q_idx.ndim != 3:
        raise ValueError(f"q_idx must be (S_q, HI, DI), got shape {q_idx.shape}")
    s_q, heads, width = q_idx.shape
    if k_idx.ndim != 2 or k_idx.shape[1] != width:
        raise ValueError(f"k_idx must be (S_kv, DI) = (S_kv, {width}), got shape {k_idx.shape}")
    if weights.shape != (s_q, heads):
        raise ValueError(f"weights must be (S_q, HI) = ({s_q}, {heads}), got {weights.shape}")
    causal = validation.flag("causal", causal)
    if causal and k_idx.shape[0] < s_q:
        raise ValueError(
            f"causal needs S_kv >= S_q (the queries are the last S_q keys), got S_q = {s_q} "
            f"and S_kv = {k_idx.shape[0]}"
        )
    scale = width**-0.5 if scale is None else validation.finite_real("scale", scale)
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    cast = (t.astype(compute, copy=False) for t in (q_idx, k_idx, weights))
    return (*cast, compute.type(scale), causal, dtype)


def _blocks(heads: int, s_q: int, s_kv: int) -> list[slice]:
    size = max(1, _BLOCK_ENTRIES // max(1, heads * s_kv))
    return [slice(start, min(start + size, s_q)) for start in range(0, s_q, size)]
