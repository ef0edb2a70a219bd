"""The stateless core: softmax, scaled dot-product attention (the dense path), head split/merge.

Every op is a pair ``x_forward(...) -> (out, ..., ctx)`` / ``x_backward(dout, ctx)``; ``ctx`` is a
NamedTuple holding only what the backward needs, and the backward sits right below its forward,
walking it in reverse. ``attention_forward`` is the one entry point of attention: it checks
every option (``rules.prepare``), then runs the dense path below (one (..., N, M) array of
probabilities, the readable reference) or the tiled path (``tiled.py``: blocks, O(N * block)
memory, a thread pool), both reading the one score pipeline of ``scores.py``.

Shape legend: B batch, H query heads, H_kv key/value heads, N query length, M key/value length,
D head width (queries and keys), Dv value head width; "..." any leading axes of q (the last of
them is the heads axis H for GQA, ALiBi and sinks), G their product.

Dtypes: float64 in, float64 out; float32 in, float32 out with no float64 intermediate; float16
is computed in float32 and returned as float16 (lse stays float32). Integer or bool inputs are a
``TypeError``.

Derivation: docs/derivations/softmax.md, docs/derivations/attention.md and the pages it links
(softcap, ALiBi and masks, windows, GQA, sinks, lse).
Tests: tests/numpy_attention/test_functional.py, test_functional_ops.py (softmax, heads),
test_functional_options.py (today's options, edge rules), test_functional_properties.py
(random combinations), all under tests/numpy_attention/.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import scores, tiled, validation
from .grad_mode import is_grad_enabled, no_grad
from .rules import ScoreRules, prepare
from .scores import AttentionGrads, AttentionOutput, Tile, flush_underflow

# -- softmax ------------------------------------------------------------------------------------


class SoftmaxCtx(NamedTuple):
    probs: np.ndarray


def softmax_forward(scores: np.ndarray) -> tuple[np.ndarray, SoftmaxCtx]:
    """Softmax over the last axis; entries equal to -inf are masked out.

    A row whose entries are all -inf (nothing to attend to) gives probabilities 0, not NaN; a
    NaN anywhere in a row makes the whole row NaN.

    Args:
        scores: (..., M) float array.

    Returns:
        probs (..., M) and the ctx for ``softmax_backward``.
    """
    probs, _ = _softmax(scores, None)
    return probs, SoftmaxCtx(probs)


def softmax_backward(dprobs: np.ndarray, ctx: SoftmaxCtx) -> np.ndarray:
    """Gradient of the scores.

    P = softmax(S)  ->  dS = P * (dP - rowsum(dP * P)).
    Masked entries and fully masked rows have P = 0, hence dS = 0 there.
    Derivation: docs/derivations/softmax.md.
    """
    probs = ctx.probs
    row_dot = (dprobs * probs).sum(axis=-1, keepdims=True)  # rowsum(dP * P), (..., 1)
    return probs * (dprobs - row_dot)


def _softmax(
    scores: np.ndarray, sinks: np.ndarray | None, exp_floor: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """P = exp(S - lse) over the last axis, with lse = log(sum_j exp(S_j) + exp(sink)).

    The shift is the row max (the sink included), or 0 for a row that is all -inf: shifting by
    -inf would give -inf - (-inf) = NaN. Such a row gets P = 0 and lse = -inf (with a sink:
    lse = the sink logit, its whole weight on the sink). With an ``exp_floor``, weights below
    the smallest normal number are exact zeros (``scores.flush_underflow``).

    Returns:
        probs (..., M) and lse (..., 1), in the scores' dtype.
    """
    row_max = scores.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., 1); -inf when M = 0
    if sinks is not None:
        row_max = np.maximum(row_max, sinks)
    shift = np.where(np.isneginf(row_max), 0, row_max).astype(scores.dtype, copy=False)
    exps = np.exp(flush_underflow(scores - shift, exp_floor))
    total = exps.sum(axis=-1, keepdims=True)  # (..., 1)
    if sinks is not None:
        total += np.exp(sinks - shift)  # the sink's term: a logit with no value attached
    probs = exps / np.where(total == 0, 1, total).astype(scores.dtype, copy=False)
    with np.errstate(divide="ignore"):
        lse = shift + np.log(total)  # log(0) = -inf for a dead row
    return probs, lse


# -- attention ----------------------------------------------------------------------------------


class AttentionCtx(NamedTuple):
    """The dense path's ctx. q is grouped by kv head: the query heads of one kv head are rows of
    one matrix, (G_kv, group * N, D), so that each product is one BLAS call per kv head and the
    backward's sums over the group are inside the products."""

    q_scaled: np.ndarray  # (G_kv, group * N, D), Q * query_scale in the compute dtype
    k: np.ndarray  # (G_kv, M, D)
    v: np.ndarray  # (G_kv, M, Dv)
    probs: np.ndarray  # (G, N, M), softmax output before dropout
    keep: np.ndarray | None  # dropout keep-mask broadcasting to (G, N, M), or None
    capped: np.ndarray | None  # tanh(S1 / softcap), (G, N, M), or None without softcap
    lse: np.ndarray  # (G, N, 1)
    rules: ScoreRules
    shapes: tuple[tuple[int, ...], ...]  # the shapes of q, k and v as given
    dtype: np.dtype  # the inputs' dtype, which the gradients are returned in


def attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    align: str = "top-left",
    key_padding_mask: np.ndarray | None = None,
    attn_mask: np.ndarray | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
    dropout_mask: np.ndarray | None = None,
    rng: np.random.Generator | int | None = None,
    impl: str = "auto",
    return_lse: bool = False,
    chunk_size: int | None = None,
    chunk_start: Any = None,
) -> AttentionOutput:
    """Scaled dot-product attention with today's options, in the order of the score pipeline.

    S = (Q * scale) K^T; S = softcap * tanh(S / softcap); S -= slope_h * |p_i - j|; S += float
    attn_mask; S = -inf where hidden; P = softmax(S) with the sink in each row's denominator;
    P' = P * keep / (1 - dropout_p); O = P' V.

    Args:
        q: (..., H, N, D) queries (any leading axes; the last is the heads axis).
        k: (..., H_kv, M, D) keys; H_kv = H unless ``enable_gqa``.
        v: (..., H_kv, M, Dv) values.
        causal: query i sees keys j <= p_i (p_i = i, or i + M - N with ``align="bottom-right"``).
        window: (left, right): query i sees keys p_i - left <= j <= p_i + right; either side
            may be None (unbounded). Intersects with ``causal``.
        align: "top-left" (SDPA's is_causal) or "bottom-right" (flash-attn's; a KV-cache decode
            step): where query i sits on the key axis, for causal, windows and ALiBi.
        key_padding_mask: bool (B, M), True = padding, never attended. Needs a batched q.
        attn_mask: bool (True = may attend) or float (added to the scores; -inf hides),
            broadcasting to (..., H, N, M).
        scale: multiplies q k^T; a finite real number; defaults to 1 / sqrt(D).
        softcap: > 0 caps the scores with ``softcap * tanh(S / softcap)`` (Gemma 2); 0 = off.
        alibi_slopes: (H,) or (B, H): ALiBi, ``S -= slope_h * |p_i - j|``.
        sinks: (H,), one logit per query head that joins every row's softmax with no value
            (gpt-oss's attention sinks); in the inputs' dtype, used as given.
        enable_gqa: k and v may have H_kv heads with H % H_kv == 0; query head h reads kv head
            h // (H // H_kv).
        dropout_p: inverted dropout on the attention weights, in [0, 1).
        dropout_mask: bool keep-mask (True = kept) broadcasting to (..., H, N, M); needs
            dropout_p > 0. Without it, the keep-mask is regenerated from one seed drawn from
            ``rng`` (``scores.dropout_mask_from_seed``): the same on both paths.
        rng: a ``np.random.Generator`` or seed, used only when dropout draws its own mask.
        impl: ``"dense"`` (this module: one (..., N, M) array of probabilities), ``"tiled"``
            (``tiled.tiled_attention_forward``: blocks, online softmax, O(N * block) memory, a
            thread pool) or ``"auto"``: tiled from N * M >= 512 * 512 on, dense below (the
            crossover measured in docs/benchmarks.md). Both give the same results.
        return_lse: also return lse, the log-sum-exp of each row of scores (the sink's term
            included), as flash-attention does.
        chunk_size: C, chunked attention (Llama 4): query i sees key j only when both lie in
            the same chunk of C keys, (j - s) // C == (p_i - s) // C; intersects with causal,
            windows and masks. None: no chunks.
        chunk_start: s, the key where the first chunk starts: an int, or (B,) ints along q's
            first axis (each sequence's left padding, as transformers counts its chunks);
            None: 0. Needs ``chunk_size``.

    Returns:
        ``AttentionOutput(out, lse, ctx)``: out (..., H, N, Dv) in the inputs' dtype; lse
        (..., H, N) in the compute dtype when ``return_lse`` (else None): -inf for a row with
        nothing to attend to (the sink logit with sinks), whose output is 0; ``ctx`` for
        ``attention_backward`` (None under ``no_grad()``: nothing is kept).
    """
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    return_lse = validation.flag("return_lse", return_lse)
    options: dict[str, Any] = {
        "causal": causal,
        "window": window,
        "align": align,
        "key_padding_mask": key_padding_mask,
        "attn_mask": attn_mask,
        "scale": scale,
        "softcap": softcap,
        "alibi_slopes": alibi_slopes,
        "sinks": sinks,
        "enable_gqa": enable_gqa,
        "dropout_p": dropout_p,
        "dropout_mask": dropout_mask,
        "rng": rng,
        "chunk_size": chunk_size,
        "chunk_start": chunk_start,
    }
    if impl == "tiled" or (impl == "auto" and _is_large(q, k)):
        return tiled.tiled_attention_forward(q, k, v, return_lse=return_lse, **options)
    q, k, v, dtype, rules = prepare(q, k, v, **options)
    shapes = (q.shape, k.shape, v.shape)
    group, n, m = rules.group, rules.n, rules.m
    g_kv = math.prod(rules.lead) // group
    q_scaled = (q * rules.query_scale).reshape(g_kv, group * n, q.shape[-1])  # (G_kv, group*N, D)
    k, v = k.reshape(g_kv, m, k.shape[-1]), v.reshape(g_kv, m, v.shape[-1])  # (G_kv, M, W)

    logits = q_scaled @ k.swapaxes(-1, -2)  # (G_kv, group * N, D) @ (G_kv, D, M)
    logits = logits.reshape(g_kv * group, n, m)  # -> (G, N, M): S1 (S1 / softcap with softcap)
    tile = Tile(slice(0, len(logits)), slice(0, n), slice(0, m), transposed=False)
    capped = scores.apply(rules, logits, tile, keep_capped=is_grad_enabled())  # -> S
    sinks = scores.sink_logits(rules, tile.groups)
    probs, lse = _softmax(logits, sinks, scores.exp_floor(rules, tile))  # (G, N, M), (G, N, 1)
    keep = scores.keep_tile(rules, tile)
    weights = probs if keep is None else probs * keep * rules.rescale  # P'
    out = weights.reshape(g_kv, group * n, m) @ v  # (G_kv, group * N, M) @ (G_kv, M, Dv)
    out = out.reshape(rules.lead + (n, v.shape[-1])).astype(dtype, copy=False)  # (..., N, Dv)

    ctx = None
    if is_grad_enabled():
        ctx = AttentionCtx(q_scaled, k, v, probs, keep, capped, lse, rules, shapes, dtype)
    return AttentionOutput(out, lse.reshape(rules.lead + (n,)) if return_lse else None, ctx)


def attention_backward(
    dout: np.ndarray, ctx: AttentionCtx | tiled.TiledAttentionCtx, dlse: np.ndarray | None = None
) -> AttentionGrads:
    """Gradients of q, k, v (and of the sinks), given the output's and optionally lse's.

    P' = P * keep / (1 - p) (P' = P without dropout), then
    dV = sum over the group of P'^T dO;  dP' = dO V^T;  dP = dP' * keep / (1 - p);
    dS = P * (dP - rowsum(dP * P)) + dlse * P;
    dsink_h = sum over rows of P_sink * (dlse - rowsum(dP * P)), P_sink = exp(sink - lse);
    dS1 = dS * (1 - tanh^2(S1 / softcap)) (softcap only);
    dQ = dS1 K * scale;  dK = sum over the group of dS1^T (Q * scale).
    Hidden entries have P = 0, so dS = 0 there, and a row with nothing to attend to gets zero
    gradient. Derivation: docs/derivations/attention.md (and alibi.md, windows.md, softcap.md,
    gqa.md, sinks.md,
    lse.md).

    Args:
        dout: (..., H, N, Dv) gradient of the output.
        ctx: from ``attention_forward``; a tiled ctx goes to ``tiled.tiled_attention_backward``.
        dlse: (..., H, N), gradient of lse (attention composed through its lse, as in a merge);
            None for 0.

    Returns:
        ``AttentionGrads(dq, dk, dv, dsinks)`` in the inputs' dtype; dsinks (H,) with sinks,
        else None.
    """
    if isinstance(ctx, tiled.TiledAttentionCtx):
        return tiled.tiled_attention_backward(dout, ctx, dlse)
    if not isinstance(ctx, AttentionCtx):
        raise TypeError(
            "attention_backward needs the ctx of a forward run outside no_grad(), "
            f"got {type(ctx).__name__}"
        )
    q_scaled, k, v, probs, keep, capped, lse, rules, shapes, dtype = ctx
    n, m, group = rules.n, rules.m, rules.group
    compute = q_scaled.dtype
    dout = validation.grad_output(dout, rules.lead + (n, v.shape[-1]), compute)
    g_kv = len(v)
    dout = dout.reshape(g_kv, group * n, v.shape[-1])  # (G_kv, group * N, Dv)

    weights = probs if keep is None else probs * keep * rules.rescale  # P', (G, N, M)
    weights = weights.reshape(g_kv, group * n, m)  # (G_kv, group * N, M)
    # forward: out = P' V, V shared by the group: the product sums over the group's rows
    dv = weights.swapaxes(-1, -2) @ dout  # (G_kv, M, group * N) @ (G_kv, group * N, Dv)
    dweights = (dout @ v.swapaxes(-1, -2)).reshape(g_kv * group, n, m)  # dP' = dO V^T, (G, N, M)
    dprobs = dweights if keep is None else dweights * keep * rules.rescale
    delta = (dprobs * probs).sum(axis=-1, keepdims=True)  # rowsum(dP * P), (G, N, 1)
    dscores = softmax_backward(dprobs, SoftmaxCtx(probs))  # P * (dP - delta)
    dsinks = None
    if dlse is not None:
        dlse = validation.grad_output(dlse, rules.lead + (n,), compute, name="dlse")
        dlse = dlse.reshape(g_kv * group, n, 1)  # (G, N, 1)
        dscores += dlse * probs  # forward: lse = log(sum exp S), d lse / d S = P
    if rules.sinks is not None:
        sink_probs = np.exp(scores.sink_logits(rules, slice(0, len(lse))) - lse)  # (G, N, 1)
        upstream = -delta if dlse is None else dlse - delta
        dsinks = _sum_to_heads((sink_probs * upstream).sum(axis=(-2, -1)), rules, dtype)
    dscores = scores.backward(rules, dscores, capped)  # dS1, (G, N, M)
    dscores = dscores.reshape(g_kv, group * n, m)  # (G_kv, group * N, M)
    dq = (dscores @ k) * rules.scale  # forward: S1 = (Q * scale) K^T
    dk = dscores.swapaxes(-1, -2) @ q_scaled  # sums over the group: (G_kv, M, D)
    if rules.softcap:
        dk *= rules.compute.type(scores.key_grad_scale(rules))  # Q was scaled by scale / softcap
    return AttentionGrads(
        dq.reshape(shapes[0]).astype(dtype, copy=False),
        dk.reshape(shapes[1]).astype(dtype, copy=False),
        dv.reshape(shapes[2]).astype(dtype, copy=False),
        dsinks,
    )


def _sum_to_heads(per_group: np.ndarray, rules: ScoreRules, dtype: np.dtype) -> np.ndarray:
    """A sink's gradient per flattened leading index (G,) summed over all but the heads: (H,)."""
    per_group = per_group.reshape(rules.lead)
    return per_group.sum(axis=tuple(range(len(rules.lead) - 1))).astype(dtype, copy=False)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, **options: Any) -> np.ndarray:
    """``attention_forward(q, k, v, **options).out`` for inference: it runs under ``no_grad()``,
    so nothing is kept for a backward. Same keywords."""
    with no_grad():
        return attention_forward(q, k, v, **options).out


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


# -- heads --------------------------------------------------------------------------------------


class HeadsCtx(NamedTuple):
    num_heads: int


def split_heads_forward(x: np.ndarray, num_heads: int) -> tuple[np.ndarray, HeadsCtx]:
    """(..., N, H*D) -> (..., H, N, D): head h takes columns h*D:(h+1)*D."""
    x = validation.float_array("x", x)
    num_heads = validation.positive_int("num_heads", num_heads)
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
