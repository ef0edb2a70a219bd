"""The stateless core: softmax, scaled dot-product attention, and head split/merge.

Every op is a pair ``x_forward(...) -> (out, ctx)`` / ``x_backward(dout, ctx)``; ``ctx`` is a
NamedTuple holding only what the backward needs. The backward sits right below its forward and
walks it in reverse.

Shape legend: B batch, H heads, N query length, M key/value length, C model width, D head width
(queries and keys), Dv value head width. "..." is any number of leading batch axes.

Dtypes: float64 in, float64 out; float32 in, float32 out with no float64 intermediate; float16 is
computed in float32 and returned as float16. Integer or bool inputs are a ``TypeError``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import masks, validation
from .grad_mode import is_grad_enabled, no_grad
from .scores import AttentionGrads, AttentionOutput

# -- softmax ----------------------------------------------------------------------------------


class SoftmaxCtx(NamedTuple):
    probs: np.ndarray


def softmax_forward(scores: np.ndarray) -> tuple[np.ndarray, SoftmaxCtx]:
    """Softmax over the last axis; entries equal to -inf are masked out.

    A row whose entries are all -inf (nothing to attend to) gives probabilities 0, not NaN.

    Args:
        scores: (..., M) float array.

    Returns:
        probs (..., M) and the ctx for ``softmax_backward``.
    """
    exps = np.exp(scores - _row_shift(scores))
    total = exps.sum(axis=-1, keepdims=True)
    probs = exps / np.where(total == 0, 1, total).astype(scores.dtype, copy=False)
    return probs, SoftmaxCtx(probs)


def _row_shift(scores: np.ndarray) -> np.ndarray:
    """The row max (..., 1) that keeps exp(scores - shift) <= 1; 0 for a fully masked row, whose
    max is -inf: shifting by it would give -inf - (-inf) = NaN, by 0 keeps exp(-inf) = 0."""
    row_max = scores.max(axis=-1, keepdims=True)
    return np.where(np.isneginf(row_max), 0, row_max).astype(scores.dtype, copy=False)


def softmax_backward(dprobs: np.ndarray, ctx: SoftmaxCtx) -> np.ndarray:
    """Gradient of the scores.

    P = softmax(S)  ->  dS = P * (dP - rowsum(dP * P)).
    Masked entries and fully masked rows have P = 0, hence dS = 0 there.
    Derivation: docs/derivations/softmax.md.
    """
    probs = ctx.probs
    row_dot = (dprobs * probs).sum(axis=-1, keepdims=True)  # rowsum(dP * P), (..., 1)
    return probs * (dprobs - row_dot)


# -- attention --------------------------------------------------------------------------------


class AttentionCtx(NamedTuple):
    q: np.ndarray  # (..., N, D), compute dtype
    k: np.ndarray  # (..., M, D)
    v: np.ndarray  # (..., M, Dv)
    probs: np.ndarray  # (..., N, M), softmax output before dropout
    keep: np.ndarray | None  # dropout keep-mask broadcasting to (..., N, M), or None
    rescale: Any  # 1 / (1 - dropout_p), in the compute dtype
    scale: Any  # the scores' scale, in the compute dtype
    dtype: np.dtype  # the inputs' dtype, which the gradients are returned in


def attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    key_padding_mask: np.ndarray | None = None,
    attn_mask: np.ndarray | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    dropout_mask: np.ndarray | None = None,
    rng: np.random.Generator | int | None = None,
    impl: str = "auto",
    return_lse: bool = False,
) -> AttentionOutput:
    """Scaled dot-product attention: ``softmax(q k^T * scale + masks) v``.

    S = Q K^T * scale (+ float attn_mask); S = -inf where masked; P = softmax(S);
    P' = P * keep / (1 - dropout_p) in dropout; O = P' V.

    Args:
        q: (..., N, D) queries.
        k: (..., M, D) keys; same leading axes and dtype as q.
        v: (..., M, Dv) values; same leading axes and dtype as q.
        causal: top-left aligned causal mask, query i sees keys j <= i (as SDPA's is_causal).
        key_padding_mask: bool (B, M), True = padding, never attended. Needs a batched q.
        attn_mask: bool (True = may attend) or float (added to the scores), broadcasting to
            (..., N, M).
        scale: multiplies q k^T; defaults to 1 / sqrt(D).
        dropout_p: inverted dropout on the attention weights, in [0, 1).
        dropout_mask: bool keep-mask (True = kept) broadcasting to (..., N, M); needs
            dropout_p > 0. Without it, the keep-mask is drawn from ``rng``.
        rng: a ``np.random.Generator`` or seed, used only when dropout draws its own mask.
        impl: ``"dense"`` (this function's math, one (..., N, M) array of probabilities),
            ``"tiled"`` (``tiled.tiled_attention_forward``: blocks, online softmax, O(N * block)
            memory, a thread pool) or ``"auto"``: tiled from N * M >= 512 * 512 on, dense
            below (the crossover measured in docs/benchmarks.md). Both give the same results;
            only dropout without an explicit ``dropout_mask`` draws a different keep-mask.
        return_lse: also return the log-sum-exp of each row of the masked scores, as
            flash-attention does.

    Returns:
        ``(out, ctx)``, or ``(out, lse, ctx)`` with ``return_lse``. out (..., N, Dv) is in the
        inputs' dtype; lse (..., N) in the compute dtype (float32 for float16 inputs). A query
        row with nothing to attend to gets output 0 and lse -inf. ``ctx`` is for
        ``attention_backward``, which dispatches on its type; under ``no_grad()`` it is None and
        nothing is kept.
    """
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if impl == "tiled" or (impl == "auto" and _is_large(q, k)):
        from .tiled import tiled_attention_forward  # tiled.py imports this module's checks

        return tiled_attention_forward(
            q,
            k,
            v,
            causal=causal,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            scale=scale,
            dropout_p=dropout_p,
            dropout_mask=dropout_mask,
            rng=rng,
            return_lse=return_lse,
        )
    q, k, v, dtype = _check_qkv(q, k, v)
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    score_shape = q.shape[:-1] + (m,)

    allowed, bias = None, None
    if attn_mask is not None:
        allowed, bias = masks.split_attn_mask(attn_mask, score_shape, compute)
    allowed = masks.combine(
        allowed,
        masks.causal_mask(n, m) if causal else None,
        None
        if key_padding_mask is None
        else masks.key_padding_allowed(key_padding_mask, q.shape, m),
    )
    keep, rescale = _dropout_keep(dropout_p, dropout_mask, score_shape, rng, compute)
    scale = compute.type(1.0 / math.sqrt(d) if scale is None else _check_scale(scale))

    q, k, v = (t.astype(compute, copy=False) for t in (q, k, v))
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (..., N, D) @ (..., D, M) -> (..., N, M)
    if bias is not None:
        scores += bias
    if allowed is not None:
        scores = np.where(allowed, scores, compute.type(-np.inf))
    probs, _ = softmax_forward(scores)
    weights = probs if keep is None else probs * keep * rescale
    out = weights @ v  # (..., N, M) @ (..., M, Dv) -> (..., N, Dv)
    ctx = AttentionCtx(q, k, v, probs, keep, rescale, scale, dtype) if is_grad_enabled() else None
    lse = _logsumexp(scores) if return_lse else None
    return AttentionOutput(out.astype(dtype, copy=False), lse, ctx)


def attention_backward(dout: np.ndarray, ctx: Any) -> AttentionGrads:
    """Gradients of q, k and v.

    P' = P * keep / (1 - p) (P' = P without dropout), then
    dV = P'^T dO;  dP' = dO V^T;  dP = dP' * keep / (1 - p);
    dS = P * (dP - rowsum(dP * P));  dQ = dS K * scale;  dK = dS^T Q * scale.
    Masked entries have P = 0, so dS = 0 there and a fully masked row gets zero gradient.
    Derivation: docs/derivations/attention.md.

    Args:
        dout: (..., N, Dv) gradient of the output.
        ctx: from ``attention_forward``; a tiled ctx goes to ``tiled.tiled_attention_backward``.

    Returns:
        dq (..., N, D), dk (..., M, D), dv (..., M, Dv), in the inputs' dtype.
    """
    if not isinstance(ctx, AttentionCtx):
        from .tiled import tiled_attention_backward  # tiled.py imports this module's checks

        return tiled_attention_backward(dout, ctx)
    q, k, v, probs, keep, rescale, scale, dtype = ctx
    dout = validation.float_array("dout", dout).astype(q.dtype, copy=False)
    expected = probs.shape[:-1] + v.shape[-1:]
    if dout.shape != expected:
        raise ValueError(f"dout must have the output's shape {expected}, got {dout.shape}")

    weights = probs if keep is None else probs * keep * rescale
    dv = weights.swapaxes(-1, -2) @ dout  # (..., M, N) @ (..., N, Dv) -> (..., M, Dv)
    dweights = dout @ v.swapaxes(-1, -2)  # (..., N, Dv) @ (..., Dv, M) -> (..., N, M)
    dprobs = dweights if keep is None else dweights * keep * rescale
    dscores = softmax_backward(dprobs, SoftmaxCtx(probs))
    dq = (dscores @ k) * scale  # (..., N, M) @ (..., M, D) -> (..., N, D)
    dk = (dscores.swapaxes(-1, -2) @ q) * scale  # (..., M, N) @ (..., N, D) -> (..., M, D)
    return AttentionGrads(
        dq.astype(dtype, copy=False),
        dk.astype(dtype, copy=False),
        dv.astype(dtype, copy=False),
        None,
    )


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, **kwargs: Any) -> np.ndarray:
    """``attention_forward`` without the ctx, for inference: it runs under ``no_grad()``, so
    nothing is kept for a backward. Same keywords."""
    with no_grad():
        return attention_forward(q, k, v, **kwargs).out


_IMPLS = ("auto", "dense", "tiled")

# impl="auto" switches to the tiled path from this many score entries per head (N * M) on.
# Measured on a 2-core AVX-512 machine, float32 (docs/benchmarks.md): with a causal mask the tiled
# path overtakes the dense one between N = 384 and 512 (it skips hidden tiles); without one the
# dense path, one BLAS call per product, stays as fast up to N ~ 768. Here either choice is
# within ~25% of the faster one, and from here on the tiled path holds no (N, M) array. The
# parity suite's cases (N * M at most 203 * 113) stay on the dense path.
_TILED_FROM = 512 * 512


def _is_large(q: Any, k: Any) -> bool:
    q_shape, k_shape = np.shape(q), np.shape(k)
    return len(q_shape) >= 2 and len(k_shape) >= 2 and q_shape[-2] * k_shape[-2] >= _TILED_FROM


def _logsumexp(scores: np.ndarray) -> np.ndarray:
    """log(sum(exp(scores))) over the last axis, shifted by the row max; -inf for a row that is
    all -inf. (..., N, M) -> (..., N), in the scores' dtype."""
    shift = _row_shift(scores)
    with np.errstate(divide="ignore"):
        return (shift + np.log(np.exp(scores - shift).sum(axis=-1, keepdims=True)))[..., 0]


def _check_qkv(q: Any, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.dtype]:
    q, k, v = (validation.float_array(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    dtype = validation.same_dtype(q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must have at least 2 axes (..., length, width), got {t.shape}"
            )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"q, k and v must share their leading axes, got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head width D, got q {q.shape} and k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share the key length M, got k {k.shape} and v {v.shape}")
    return q, k, v, dtype


def _check_scale(scale: Any) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a real number or None, got {scale!r}")
    return float(scale)


def _dropout_keep(
    dropout_p: Any,
    dropout_mask: Any,
    score_shape: tuple[int, ...],
    rng: np.random.Generator | int | None,
    compute: np.dtype,
) -> tuple[np.ndarray | None, Any]:
    """The keep-mask (or None when there is no dropout) and the 1 / (1 - p) rescale."""
    p = validation.dropout_p(dropout_p)
    if dropout_mask is not None:
        dropout_mask = validation.bool_array("dropout_mask", dropout_mask)
        if p == 0.0:
            raise ValueError("dropout_mask was given with dropout_p == 0; set dropout_p > 0")
        validation.broadcasts_to("dropout_mask", dropout_mask, score_shape)
        return dropout_mask, compute.type(1.0 / (1.0 - p))
    if p == 0.0:
        return None, compute.type(1.0)
    keep = np.random.default_rng(rng).random(score_shape) >= p
    return keep, compute.type(1.0 / (1.0 - p))


# -- heads ------------------------------------------------------------------------------------


class HeadsCtx(NamedTuple):
    num_heads: int


def split_heads_forward(x: np.ndarray, num_heads: int) -> tuple[np.ndarray, HeadsCtx]:
    """(..., N, H*D) -> (..., H, N, D): head h takes columns h*D:(h+1)*D."""
    x = validation.float_array("x", x)
    if x.ndim < 2 or x.shape[-1] % num_heads != 0:
        raise ValueError(f"x of shape {x.shape}: last axis must split into {num_heads} heads")
    *lead, n, width = x.shape
    heads = x.reshape(*lead, n, num_heads, width // num_heads)  # (..., N, H, D)
    return heads.swapaxes(-3, -2), HeadsCtx(num_heads)  # (..., H, N, D)


def split_heads_backward(dout: np.ndarray, ctx: HeadsCtx) -> np.ndarray:
    """A pure re-indexing, so the gradient is the inverse re-indexing: merge the heads back."""
    return merge_heads_forward(dout)[0]


def merge_heads_forward(x: np.ndarray) -> tuple[np.ndarray, HeadsCtx]:
    """(..., H, N, D) -> (..., N, H*D), the inverse of ``split_heads_forward``."""
    x = validation.float_array("x", x)
    if x.ndim < 3:
        raise ValueError(f"x must be (..., H, N, D), got shape {x.shape}")
    *lead, num_heads, n, d = x.shape
    merged = x.swapaxes(-3, -2).reshape(*lead, n, num_heads * d)  # (..., N, H, D) -> (..., N, H*D)
    return merged, HeadsCtx(num_heads)


def merge_heads_backward(dout: np.ndarray, ctx: HeadsCtx) -> np.ndarray:
    """The gradient of merging is splitting again."""
    return split_heads_forward(dout, ctx.num_heads)[0]
