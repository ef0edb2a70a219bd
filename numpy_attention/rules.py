"""The rules of one attention call: q, k, v and every option checked once, before any work
(``prepare``), and kept in the form the score pipeline's tiles read (``ScoreRules``): masks full
rank, causal and windows folded into one band of visible keys (``left``, ``right``, ``offset``),
ALiBi slopes and sinks one per flattened leading index of q, dropout as an explicit keep-mask or a
seed, and the bounds on the scores that let the softmax skip work (``score_bound``, ``top``,
``floor``). Every check raises ``TypeError``/``ValueError`` naming the argument and the shapes.

Shape legend: B batch, H query heads, H_kv key/value heads, N query length, M key length, D head
width, Dv value head width, G the product of q's leading axes (B * H).

Derivation: docs/derivations/attention.md (the pipeline the rules feed), windows.md (causal and
windows as one band, chunks), gqa.md (the group size), alibi.md, sinks.md, softcap.md, tiled.md (the
bounds). Tests: tests/numpy_attention/test_rules.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import masks, validation

ALIGNS = ("top-left", "bottom-right")


class ScoreRules(NamedTuple):
    """Every option of one attention call, checked, in the form the tiles read.

    Masks are kept "full rank" (one axis per axis of the scores (..., N, M), unit axes where they
    broadcast) so that ``_tile`` can slice them without materializing the broadcast.
    """

    lead: tuple[int, ...]  # q's leading axes (..., H); G = prod(lead)
    n: int
    m: int
    group: int  # query heads per kv head (1 without GQA)
    scale: Any  # compute-dtype scalar
    query_scale: Any  # what the paths multiply Q by: scale, or scale / softcap with softcap
    softcap: float  # 0.0: off
    slopes: np.ndarray | None  # ALiBi slope of every flattened leading index, (G,)
    bias: np.ndarray | None  # float attn_mask, full rank
    hidden: tuple[np.ndarray, ...]  # bool, full rank, True = hidden (replaced by -inf)
    left: int | None  # the band of visible keys around p_i: p_i - left <= j <= p_i + right,
    right: int | None  # None = unbounded on that side; causal makes right <= 0
    offset: int  # p_i = i + offset
    sinks: np.ndarray | None  # sink logit of every flattened leading index, (G,), compute dtype
    keep: np.ndarray | None  # explicit dropout keep-mask, full rank
    seed: int | None  # or: regenerate the keep-mask from this seed (DROPOUT_BLOCK grid)
    dropout_p: float
    rescale: Any  # 1 / (1 - dropout_p), compute dtype
    compute: np.dtype
    score_bound: float  # |S_ij| <= it for every score, ALiBi's term aside (inf/NaN: unknown)
    top: float  # the row max (a score or the sink) <= it: max(score_bound, |sink|)
    floor: float  # log(tiny / eps) of the compute dtype: weights below exp(floor) become 0
    chunk: int | None = None  # chunked attention: p_i and j must share a chunk of this size,
    chunk_start: np.ndarray | None = None  # counted from this key, int full rank; None: 0


class Inputs(NamedTuple):
    """q, k, v checked and cast to the compute dtype, with the rules of the call."""

    q: np.ndarray  # (..., H, N, D)
    k: np.ndarray  # (..., H_kv, M, D)
    v: np.ndarray  # (..., H_kv, M, Dv)
    dtype: np.dtype  # the inputs' dtype: outputs and gradients are returned in it
    rules: ScoreRules


def prepare(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: Any = False,
    window: Any = None,
    align: Any = "top-left",
    key_padding_mask: Any = None,
    attn_mask: Any = None,
    scale: Any = None,
    softcap: Any = 0.0,
    alibi_slopes: Any = None,
    sinks: Any = None,
    enable_gqa: Any = False,
    dropout_p: Any = 0.0,
    dropout_mask: Any = None,
    rng: Any = None,
    chunk_size: Any = None,
    chunk_start: Any = None,
) -> Inputs:
    """Check q, k, v and every option (before any work) and build the rules of the call.

    Raises ``TypeError``/``ValueError`` naming the argument and the shapes involved.
    """
    q, k, v = (validation.float_array(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    dtype = validation.same_dtype(q=q, k=k, v=v)
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    group = _check_shapes(q, k, v, validation.flag("enable_gqa", enable_gqa))
    lead, n, m, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    score_shape = lead + (n, m)
    rank = len(score_shape)

    causal = validation.flag("causal", causal)
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {ALIGNS}, got {align!r}")
    left, right = validation.window(window)
    if causal:
        right = 0 if right is None else min(right, 0)
    offset = m - n if align == "bottom-right" else 0
    chunk, start = _check_chunk(chunk_size, chunk_start, q.shape, rank)

    bias, hidden = None, []
    if attn_mask is not None:
        allowed, float_mask = masks.split_attn_mask(attn_mask, score_shape, compute)
        if allowed is not None:
            hidden.append(~allowed)
        if float_mask is not None:
            bias = float_mask
            if np.isneginf(float_mask).any():  # -inf in a float mask hides: replace, not add
                hidden.append(np.isneginf(float_mask))
    if key_padding_mask is not None:
        padded = ~masks.key_padding_allowed(key_padding_mask, q.shape, m)  # (B, 1, .., 1, M)
        hidden.append(padded)
        k, v = _unread(k, padded), _unread(v, padded)

    p = validation.dropout_p(dropout_p)
    keep, seed = None, None
    if dropout_mask is not None:
        keep = _full_rank(validation.keep_mask("dropout_mask", dropout_mask, p, score_shape), rank)
    elif p > 0.0:
        seed = int(np.random.default_rng(rng).integers(2**63))

    if d == 0:
        raise ValueError(f"q and k have head width D = 0 (q {q.shape}): nothing to attend with")
    scale_value = 1.0 / math.sqrt(d) if scale is None else validation.finite_real("scale", scale)
    cap = validation.finite_real("softcap", softcap)
    if cap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    slopes = _check_slopes(alibi_slopes, lead, compute)
    sink_logits = _check_sinks(sinks, lead, dtype, compute)
    q, k, v = (t.astype(compute, copy=False) for t in (q, k, v))
    return Inputs(
        q,
        k,
        v,
        dtype,
        ScoreRules(
            lead=lead,
            n=n,
            m=m,
            group=group,
            scale=compute.type(scale_value),
            query_scale=compute.type(scale_value / cap if cap else scale_value),
            softcap=cap,
            slopes=slopes,
            bias=None if bias is None else _full_rank(bias, rank),
            hidden=tuple(_full_rank(mask, rank) for mask in hidden),
            left=left,
            right=right,
            offset=offset,
            sinks=sink_logits,
            keep=keep,
            seed=seed,
            dropout_p=p,
            rescale=compute.type(1.0 / (1.0 - p)),
            compute=compute,
            **_score_bounds(q, k, scale_value, cap, bias, sink_logits),
            floor=float(np.log(np.finfo(compute).tiny / np.finfo(compute).eps)),
            chunk=chunk,
            chunk_start=start,
        ),
    )


def _score_bounds(
    q: np.ndarray,
    k: np.ndarray,
    scale: float,
    cap: float,
    bias: np.ndarray | None,
    sinks: np.ndarray | None,
) -> dict[str, float]:
    """Bounds known before any product: ``score_bound`` U >= |S_ij| for every score, ALiBi's term
    aside (``exp_floor`` adds it per tile), and ``top`` >= the row max, the sink included.

    U is the cap, or |scale| |q_i| |k_j| (Cauchy-Schwarz), plus the largest finite |float mask|;
    the row max is a score or the sink, so at most max(U, |sink|). O(N D) work, against the
    O(N M D) of the attention. Rows of q and k that are not finite are left out: their scores
    are NaN or infinite whatever the bound, and IEEE arithmetic carries them (a NaN or +inf
    key that a row sees makes that row NaN, on every path); so a bad key changes neither the
    bounds nor, through them, how the rows that do not see it are computed.
    """
    if cap:
        bound = cap
    else:
        q_norm = np.sqrt(_finite_max(np.einsum("...d,...d->...", q, q)))
        k_norm = np.sqrt(_finite_max(np.einsum("...d,...d->...", k, k)))
        bound = abs(scale) * float(q_norm) * float(k_norm)
    if bias is not None:
        bound += _finite_max(np.abs(bias))
    top = bound if sinks is None else max(bound, float(np.abs(sinks).max(initial=0.0)))
    return {"score_bound": bound, "top": top}


def _finite_max(values: np.ndarray) -> float:
    return float(np.max(values, where=np.isfinite(values), initial=0.0))


def _check_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray, enable_gqa: bool) -> int:
    """The number of query heads per kv head; ``ValueError`` naming the shapes otherwise."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must have at least 2 axes (..., length, width), got {t.shape}"
            )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head width D, got q {q.shape} and k {k.shape}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"k and v must share their leading axes and the key length M, got k {k.shape} and "
            f"v {v.shape}"
        )
    if q.shape[:-2] == k.shape[:-2]:
        return 1
    if not enable_gqa:
        raise ValueError(
            f"q, k and v must share their leading axes, got q {q.shape}, k {k.shape}, "
            f"v {v.shape}; k and v with fewer heads (GQA/MQA) need enable_gqa=True"
        )
    if q.ndim < 3 or q.ndim != k.ndim or q.shape[:-3] != k.shape[:-3]:
        raise ValueError(
            f"with enable_gqa, q (..., H, N, D) and k, v (..., H_kv, M, D) differ only in the "
            f"heads axis -3, got q {q.shape} and k {k.shape}"
        )
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {q.shape}, k {k.shape})"
        )
    return heads // kv_heads


def _check_slopes(slopes: Any, lead: tuple[int, ...], compute: np.dtype) -> np.ndarray | None:
    """ALiBi slopes (H,) or (B, H) as one slope per flattened leading index of q, (G,)."""
    if slopes is None:
        return None
    slopes = validation.float_array("alibi_slopes", slopes)
    if len(lead) < 1 or slopes.ndim not in (1, 2) or slopes.shape[-1] != lead[-1]:
        raise ValueError(
            f"alibi_slopes must be (H,) or (B, H) with H = the heads axis of q (..., H, N, D); "
            f"got alibi_slopes {slopes.shape} for q leading axes {lead}"
        )
    if slopes.ndim == 2 and (len(lead) < 2 or slopes.shape[0] != lead[0]):
        raise ValueError(
            f"alibi_slopes (B, H) = {slopes.shape} needs q (B, ..., H, N, D) with that B; "
            f"got q leading axes {lead}"
        )
    if not np.all(np.isfinite(slopes)):
        raise ValueError(f"alibi_slopes must be finite (None for no ALiBi), got {slopes}")
    if slopes.ndim == 2:  # (B, H) -> (B, 1, ..., 1, H), against q's leading axes (B, ..., H)
        slopes = slopes.reshape(slopes.shape[:1] + (1,) * (len(lead) - 2) + slopes.shape[1:])
    return np.broadcast_to(slopes, lead).reshape(-1).astype(compute)  # (G,)


def _check_sinks(
    sinks: Any, lead: tuple[int, ...], dtype: np.dtype, compute: np.dtype
) -> np.ndarray | None:
    """Sink logits (H,), one per query head, as one per flattened leading index of q, (G,)."""
    if sinks is None:
        return None
    sinks = validation.float_array("sinks", sinks)
    if len(lead) < 1 or sinks.shape != lead[-1:]:
        raise ValueError(
            f"sinks must be (H,), one logit per query head of q (..., H, N, D); got sinks "
            f"{sinks.shape} for q leading axes {lead}"
        )
    if sinks.dtype != dtype:
        raise TypeError(f"sinks must have the dtype of q, k and v ({dtype}), got {sinks.dtype}")
    if not np.all(np.isfinite(sinks)):
        raise ValueError(f"sinks must be finite logits (None for no sinks), got {sinks}")
    return np.broadcast_to(sinks.astype(compute), lead).reshape(-1)  # (G,)


def _check_chunk(
    chunk_size: Any, chunk_start: Any, q_shape: tuple[int, ...], rank: int
) -> tuple[int | None, np.ndarray | None]:
    """The chunk size C (None: no chunks) and where the chunks start on the key axis: None (key
    0), or int64 full rank, (1, ..., 1) for one start or (B, 1, ..., 1) for one per batch
    element (along q's first axis, as ``key_padding_mask``)."""
    if chunk_size is None:
        if chunk_start is not None:
            raise ValueError("chunk_start is given without chunk_size: it says where chunks start")
        return None, None
    chunk = validation.positive_int("chunk_size", chunk_size)
    if chunk_start is None:
        return chunk, None
    start = np.asarray(chunk_start)
    if start.dtype == np.bool_ or not np.issubdtype(start.dtype, np.integer):
        raise TypeError(f"chunk_start must be an int or (B,) ints, got dtype {start.dtype}")
    if start.ndim == 0:
        return chunk, start.astype(np.int64).reshape((1,) * rank)
    if start.ndim != 1 or len(q_shape) < 3 or start.shape[0] != q_shape[0]:
        raise ValueError(
            f"chunk_start must be an int or (B,) with B the first axis of a batched q "
            f"(B, ..., N, D), got chunk_start {start.shape} for q {q_shape}"
        )
    return chunk, start.astype(np.int64).reshape(start.shape + (1,) * (rank - 1))


def _unread(t: np.ndarray, padded: np.ndarray) -> np.ndarray:
    """``t`` (k or v, (..., M, W)) with its padded rows set to 0 if any of them is not finite.

    Padding is hidden from every query, so its scores are replaced, but the products P V (and
    dS K in the backward) still multiply its rows by exact zeros, and IEEE makes 0 x NaN = NaN:
    garbage in padding (an unwritten cache slot) would reach every row on the dense path and
    the rows of the tiles that hold it on the tiled path. Rows no query sees are never read
    instead, on both paths; finite padding is left as it is (the results do not change).
    """
    pad = padded[..., 0, :, None]  # scores (B, 1, .., 1, M) -> rows (B, 1, .., M, 1) of (..., M, W)
    garbage = pad & ~np.isfinite(t)
    return np.where(pad, t.dtype.type(0), t) if garbage.any() else t


def _full_rank(mask: np.ndarray, rank: int) -> np.ndarray:
    """Prepend unit axes so that ``mask`` has one axis per axis of the scores (..., N, M)."""
    return mask.reshape((1,) * (rank - mask.ndim) + mask.shape)
