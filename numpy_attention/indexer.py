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

``LightningIndexer`` is the indexer as a layer's part (``MultiHeadLatentAttention``'s
``index_topk``), with transformers' parameter names (``wq_b``, ``wk``, ``k_norm``,
``weights_proj``): from the layer's input x and its query latent it selects, per query, the
keys the main attention may read. The selection is piecewise constant in every weight, so no
gradient flows through it (transformers runs it under ``no_grad``); the indexer trains by
``indexer_kl_loss`` instead.

Shape legend: S_q query tokens, S_kv key tokens, HI indexer heads, DI indexer head width, H the
main attention's heads; B batch, N tokens of a call, M keys, C model width, Lq query latent.

Derivation: docs/derivations/indexer.md. Tests: tests/numpy_attention/test_indexer.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation
from .grad_mode import is_grad_enabled, no_grad
from .layers import Linear
from .module import Module
from .norms import LayerNorm
from .rope import deinterleave, rope_forward

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


def check_index_options(
    heads: Any, head_dim: Any, topk: Any, q_lora_rank: int | None
) -> tuple[int, int, int, int] | None:
    """A latent layer's indexer options as (HI, DI, topk, Lq), or None without an indexer: all
    three given or none; it reads the query latent, so the layer needs ``q_lora_rank`` (pure
    Python: the torch twin checks them here too)."""
    given = {"index_n_heads": heads, "index_head_dim": head_dim, "index_topk": topk}
    if all(value is None for value in given.values()):
        return None
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} missing: DSA's indexer needs index_n_heads, index_head_dim "
            "and index_topk together"
        )
    if q_lora_rank is None:
        raise ValueError(
            "the indexer (index_topk) reads the query latent q_a_layernorm(q_a_proj(x)): it "
            "needs q_lora_rank"
        )
    return (
        validation.positive_int("index_n_heads", heads),
        validation.positive_int("index_head_dim", head_dim),
        validation.positive_int("index_topk", topk),
        q_lora_rank,
    )


class IndexerOptions(NamedTuple):
    """``LightningIndexer``'s options, checked once for both twins (pure Python)."""

    num_heads: int
    head_dim: int
    topk: int
    rope_dim: int
    rope_interleaved: bool
    rope_position: str
    norm_eps: float

    @classmethod
    def check(
        cls,
        num_heads: Any,
        head_dim: Any,
        topk: Any,
        rope_dim: Any,
        rope_interleaved: Any,
        rope_position: Any,
        norm_eps: Any,
    ) -> IndexerOptions:
        heads = validation.positive_int("index_n_heads", num_heads)
        width = validation.positive_int("index_head_dim", head_dim)
        rotated = validation.non_negative_int("qk_rope_head_dim", rope_dim)
        if rotated > width:
            raise ValueError(
                f"index_head_dim ({head_dim}) must be at least qk_rope_head_dim ({rope_dim}): "
                "the indexer rotates qk_rope_head_dim dims of each head"
            )
        eps = validation.finite_real("index_norm_eps", norm_eps)
        if eps <= 0:
            raise ValueError(f"index_norm_eps must be > 0, got {norm_eps}")
        return cls(
            heads,
            width,
            validation.positive_int("index_topk", topk),
            rotated,
            validation.flag("index_rope_interleave", rope_interleaved),
            check_rope_position(rope_position),
            eps,
        )


def check_rope_position(position: Any) -> str:
    """Which R dims of each indexer head rotate: "first" (DeepSeek-V3.2, GLM-5) or "last"
    (HY-V4's, "flipped")."""
    if position not in ("first", "last"):
        raise ValueError(f"index_rope_position must be 'first' or 'last', got {position!r}")
    return str(position)


def check_query_gate(query_gate: Any, q_lora_rank: int | None, output_gate: str | None) -> bool:
    """AXK2's fused query-and-gate projection reads the query latent and is the layer's gate."""
    query_gate = validation.flag("query_gate", query_gate)
    if query_gate and q_lora_rank is None:
        raise ValueError("query_gate projects [q_resid, q_a_proj(x)]: it needs q_lora_rank")
    if query_gate and output_gate is not None:
        raise ValueError(
            f"query_gate is the layer's output gate (from the query projection); output_gate="
            f"{output_gate!r} would be a second one, which no model has"
        )
    return query_gate


def check_shared_selection(shared: Any, index: tuple[int, int, int, int] | None) -> bool:
    """``index_shared`` as a flag: a shared DSA layer (GLM-5's ``indexer_types`` "shared") has
    no indexer of its own, so the indexer's options are refused with it."""
    shared = validation.flag("index_shared", shared)
    if shared and index is not None:
        raise ValueError(
            "index_shared reads the selection of the layer before it; index_n_heads, "
            "index_head_dim and index_topk describe an indexer of its own: give one or the other"
        )
    return shared


def check_selection_given(shared: bool, given: bool) -> None:
    """``index_selection`` is given to a shared DSA layer, and only to one."""
    if shared and not given:
        raise ValueError(
            "a shared DSA layer (index_shared) reads the keys the layer before it selected: pass "
            "index_selection=<that layer>.selection"
        )
    if given and not shared:
        raise ValueError(
            "index_selection is for a shared DSA layer (index_shared=True); this layer "
            "attends every key it sees or selects its own"
        )


def check_selection_shape(shape: tuple[int, ...], expected: tuple[int, int, int]) -> None:
    """A given selection is (B, N, M): the call's batch, queries and keys."""
    if tuple(shape) != expected:
        raise ValueError(
            f"index_selection must be (B, N, M) = {expected}, the call's batch, queries and keys, "
            f"got {tuple(shape)}"
        )


class LightningIndexer(Module):
    """DeepSeek-V3.2's indexer inside an attention layer (module docstring): its parameters and
    the selection, per query, of the keys the main attention reads.

        q = rope(wq_b(q_resid))          (B, N, HI, DI)   RoPE on the first R dims of each head
        k = rope(k_norm(wk(x)))          (B, M, DI)       one key head (the cache's rows first)
        w = weights_proj(x) * HI^-0.5    (B, N, HI)
        scores = indexer_forward(q, k, w, scale=DI^-0.5, causal), padded keys -inf
        selected = topk_indices(scores, topk)   as a (B, N, M) mask

    Parameters: ``wq_b`` = Linear(Lq, HI*DI), ``wk`` = Linear(C, DI), both without bias;
    ``k_norm`` = LayerNorm(DI, eps 1e-6, with bias); ``weights_proj`` = Linear(C, HI, no bias).

    Args:
        hidden_size: C.
        q_lora_rank: Lq, the width of the query latent the indexer reads.
        num_heads: HI.
        head_dim: DI.
        topk: how many keys each query keeps (all it sees when it sees fewer).
        rope_dim: R, the rotated width (the main attention's qk_rope_head_dim), at most DI.
        rope_interleaved: False: half-split pairs (x_i, x_{i+R/2}), DeepSeek-V3.2's layout for
            the indexer (unlike its main attention's); True: interleaved pairs (x_2i, x_2i+1),
            GLM-5's (``glm_moe_dsa``), gathered into halves and rotated as transformers does.
            Taking one layout for the other was a bug in several engines.
        rng: generator or seed for the initial weights.
    """

    def __init__(
        self,
        hidden_size: int,
        q_lora_rank: int,
        num_heads: int,
        head_dim: int,
        topk: int,
        rope_dim: int,
        *,
        rope_interleaved: bool = False,
        rope_position: str = "first",
        norm_eps: float = 1e-6,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        options = IndexerOptions.check(
            num_heads, head_dim, topk, rope_dim, rope_interleaved, rope_position, norm_eps
        )
        self.num_heads, self.head_dim, self.topk, self.rope_dim = options[:4]
        self.rope_interleaved, self.rope_position, norm_eps = options[4:]
        rng = np.random.default_rng(rng)
        self.wq_b = Linear(q_lora_rank, self.num_heads * self.head_dim, bias=False, rng=rng)
        self.wk = Linear(hidden_size, self.head_dim, bias=False, rng=rng)
        self.k_norm = LayerNorm(self.head_dim, norm_eps, bias=True)
        self.weights_proj = Linear(hidden_size, self.num_heads, bias=False, rng=rng)

    def keys(self, x: np.ndarray, positions: np.ndarray, rope: dict[str, Any]) -> np.ndarray:
        """This call's indexer keys (B, N, DI), rotated (what a decoding cache holds)."""
        with no_grad():
            k = self._rotate(self.k_norm(self.wk(x))[:, None], positions, rope)  # (B, 1, N, DI)
        return k[:, 0]

    def forward(
        self,
        x: np.ndarray,
        q_resid: np.ndarray,
        keys: np.ndarray,
        positions: np.ndarray,
        rope: dict[str, Any],
        padding: np.ndarray | None,
    ) -> np.ndarray:
        """The (B, N, M) bool mask, True where query t may read key s: its top-k keys.

        Args:
            x: (B, N, C), the layer's input.
            q_resid: (B, N, Lq), the query latent q_a_layernorm(q_a_proj(x)).
            keys: (B, M, DI), the indexer keys of every key (``keys``, cached ones first).
            positions: the queries' RoPE positions, as the layer checked them.
            rope: the layer's ``inv_freq`` and ``attention_factor``.
            padding: (B, M) bool, True = a padding key (never selected), or None.
        """
        b, n, _ = x.shape
        m = keys.shape[1]
        with no_grad():
            q = self.wq_b(q_resid).reshape(b, n, self.num_heads, self.head_dim)
            q = self._rotate(q.swapaxes(1, 2), positions, rope)  # (B, HI, N, DI)
            weights = self.weights_proj(x) * self.num_heads**-0.5  # (B, N, HI)
            selected = np.zeros((b, n, m), dtype=bool)
            for i in range(b):
                scores = indexer_forward(
                    q[i].swapaxes(0, 1), keys[i], weights[i], scale=self.head_dim**-0.5
                ).scores
                if padding is not None:
                    scores[:, padding[i]] = -np.inf
                picked = topk_indices(scores, self.topk)  # (N, topk), -1 past the visible
                rows = np.broadcast_to(np.arange(n)[:, None], picked.shape)
                valid = picked >= 0
                selected[i, rows[valid], picked[valid]] = True
        return selected

    def _rotate(self, x: np.ndarray, positions: np.ndarray, rope: dict[str, Any]) -> np.ndarray:
        """RoPE on the R rotated dims of each head, the first R or the last R
        (``rope_position``); interleaved pairs gathered into halves first, as transformers'
        interleaved RoPE does (GLM-5's indexer), so that the rotated keys, and a cache of
        them, read like its."""
        r, width = self.rope_dim, x.shape[-1]
        lo = 0 if self.rope_position == "first" else width - r
        part = x[..., lo : lo + r]
        if self.rope_interleaved:
            part = deinterleave(part)
        part, _ = rope_forward(part, positions, **rope)
        return np.concatenate([x[..., :lo], part, x[..., lo + r :]], axis=-1)


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
