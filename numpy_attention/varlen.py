"""Attention over packed variable-length sequences, in flash-attn's layout.

Sequences of different lengths are packed along one token axis, with cumulative offsets:
sequence s holds queries ``cu_seqlens_q[s]:cu_seqlens_q[s+1]`` and keys
``cu_seqlens_k[s]:cu_seqlens_k[s+1]``. Each sequence is one attention call of
``functional.attention_forward`` (so every option works the same; alignment is per sequence), and
no sequence ever sees another. An empty sequence is allowed (no queries, or no keys: output 0).

Shape legend: S sequences, T_q and T_k the packed query and key token counts, H query heads,
H_kv key/value heads, D head width, Dv value head width.

Derivation: docs/derivations/varlen.md. Tests: tests/numpy_attention/test_varlen.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation
from .functional import attention_backward, attention_forward
from .grad_mode import is_grad_enabled, no_grad
from .scores import AttentionGrads, AttentionOutput


class VarlenCtx(NamedTuple):
    ctxs: tuple[Any, ...]  # one attention ctx per sequence
    cu_seqlens_q: np.ndarray  # (S + 1,)
    cu_seqlens_k: np.ndarray  # (S + 1,)
    shapes: tuple[tuple[int, ...], ...]  # q, k, v as given
    dtype: np.dtype


def varlen_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cu_seqlens_q: np.ndarray,
    cu_seqlens_k: np.ndarray,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    align: str = "top-left",
    scale: float | None = None,
    softcap: float = 0.0,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
    rng: np.random.Generator | int | None = None,
    impl: str = "auto",
    return_lse: bool = False,
) -> AttentionOutput:
    """Attention of each packed sequence over its own keys.

    Args:
        q: (T_q, H, D) packed queries.
        k: (T_k, H_kv, D) packed keys.
        v: (T_k, H_kv, Dv) packed values.
        cu_seqlens_q: (S + 1,) integer offsets into q: 0, non-decreasing, ending at T_q.
        cu_seqlens_k: (S + 1,) integer offsets into k and v: 0, non-decreasing, ending at T_k.
        causal, window, align, scale, softcap, sinks, enable_gqa, dropout_p, impl: as
            ``functional.attention_forward``, per sequence (alignment is per sequence).
        alibi_slopes: (H,), or (S, H) with one row per sequence.
        rng: a generator or seed; each sequence's dropout draws its own seed from it, in order.
        return_lse: also return lse (H, T_q), as flash-attn's varlen kernels do.

    Returns:
        ``AttentionOutput(out, lse, ctx)``: out (T_q, H, Dv) in the inputs' dtype, lse (H, T_q).
    """
    q, k, v = (validation.float_array(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 3:
            raise ValueError(f"{name} must be packed (total, heads, width), got shape {t.shape}")
    cu_q = _offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    cu_k = _offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0])
    if len(cu_q) != len(cu_k):
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe as many sequences, got {len(cu_q) - 1} "
            f"and {len(cu_k) - 1}"
        )
    _check_packed(q, k, v, enable_gqa)
    sequences = len(cu_q) - 1
    if alibi_slopes is not None:
        alibi_slopes = validation.float_array("alibi_slopes", alibi_slopes)
        if alibi_slopes.ndim not in (1, 2) or alibi_slopes.shape[-1] != q.shape[1]:
            raise ValueError(
                f"alibi_slopes must be (H,) or (S, H) with H = {q.shape[1]} heads of q "
                f"{q.shape}, got {alibi_slopes.shape}"
            )
        if alibi_slopes.ndim == 2 and alibi_slopes.shape[0] != sequences:
            raise ValueError(
                f"alibi_slopes (S, H) must have one row per sequence, S = {sequences}, "
                f"got {alibi_slopes.shape}"
            )
    generator = np.random.default_rng(rng)
    options: dict[str, Any] = {
        "causal": causal,
        "window": window,
        "align": align,
        "scale": scale,
        "softcap": softcap,
        "sinks": sinks,
        "enable_gqa": enable_gqa,
        "dropout_p": dropout_p,
        "impl": impl,
    }
    with no_grad():  # every option checked once, before any work, even with no sequence
        empty = (np.empty((sequences, t.shape[1], 0, t.shape[2]), t.dtype) for t in (q, k, v))
        attention_forward(*empty, alibi_slopes=alibi_slopes, rng=0, **options)
    outs: list[np.ndarray] = []
    lses: list[np.ndarray] = []
    ctxs: list[Any] = []
    for s in range(sequences):
        rows, cols = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        slopes = alibi_slopes
        if alibi_slopes is not None and alibi_slopes.ndim == 2:
            slopes = alibi_slopes[s]
        result = attention_forward(
            q[rows].swapaxes(0, 1),  # (n_s, H, D) -> (H, n_s, D)
            k[cols].swapaxes(0, 1),  # (m_s, H_kv, D) -> (H_kv, m_s, D)
            v[cols].swapaxes(0, 1),
            alibi_slopes=slopes,
            rng=generator,
            return_lse=True,
            **options,
        )
        outs.append(result.out.swapaxes(0, 1))  # (H, n_s, Dv) -> (n_s, H, Dv)
        lses.append(np.asarray(result.lse))  # (H, n_s)
        ctxs.append(result.ctx)
    out = _concat(outs, (0, q.shape[1], v.shape[2]), q.dtype, axis=0)  # (T_q, H, Dv)
    lse = _concat(lses, (q.shape[1], 0), np.result_type(np.float32, q.dtype), axis=1)  # (H, T_q)
    ctx = None
    if is_grad_enabled():
        ctx = VarlenCtx(tuple(ctxs), cu_q, cu_k, (q.shape, k.shape, v.shape), q.dtype)
    return AttentionOutput(out, lse if return_lse else None, ctx)


def varlen_attention_backward(
    dout: np.ndarray, ctx: VarlenCtx, dlse: np.ndarray | None = None
) -> AttentionGrads:
    """Each sequence's ``attention_backward``, packed again; dsinks sums over the sequences.

    dQ, dK, dV of sequence s are its own attention's (no sequence sees another, so no gradient
    crosses a boundary); dsink_h = sum over s of its sequences' dsink_h. Derivation:
    docs/derivations/varlen.md.

    Args:
        dout: (T_q, H, Dv) gradient of the output.
        ctx: from ``varlen_attention_forward``.
        dlse: (H, T_q) gradient of lse, or None.

    Returns:
        ``AttentionGrads(dq, dk, dv, dsinks)``: (T_q, H, D), (T_k, H_kv, D), (T_k, H_kv, Dv),
        and (H,) with sinks.
    """
    if not isinstance(ctx, VarlenCtx):
        raise TypeError(
            "varlen_attention_backward needs the ctx of a forward run outside no_grad(), "
            f"got {type(ctx).__name__}"
        )
    (q_shape, k_shape, v_shape), cu_q, cu_k = ctx.shapes, ctx.cu_seqlens_q, ctx.cu_seqlens_k
    dout = validation.grad_output(dout, q_shape[:2] + v_shape[2:])
    if dlse is not None:
        dlse = validation.grad_output(dlse, (q_shape[1], q_shape[0]), name="dlse")
    dq, dk, dv = (
        np.zeros(q_shape, ctx.dtype),
        np.zeros(k_shape, ctx.dtype),
        np.zeros(v_shape, ctx.dtype),
    )
    dsinks = None
    for s, seq_ctx in enumerate(ctx.ctxs):
        rows, cols = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        grads = attention_backward(
            dout[rows].swapaxes(0, 1),  # (n_s, H, Dv) -> (H, n_s, Dv)
            seq_ctx,
            None if dlse is None else dlse[:, rows],
        )
        dq[rows] = grads.dq.swapaxes(0, 1)
        dk[cols] = grads.dk.swapaxes(0, 1)
        dv[cols] = grads.dv.swapaxes(0, 1)
        if grads.dsinks is not None:
            dsinks = grads.dsinks if dsinks is None else dsinks + grads.dsinks
    return AttentionGrads(dq, dk, dv, dsinks)


def _check_packed(q: np.ndarray, k: np.ndarray, v: np.ndarray, enable_gqa: Any) -> None:
    """q (T_q, H, D), k (T_k, H_kv, D), v (T_k, H_kv, Dv): the shapes as the caller passed them
    in every message (each sequence's call would name its own slice)."""
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must share the head width D, got q {q.shape} and k {k.shape}")
    if k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"k and v must share the packed length and the kv heads, got k {k.shape} and "
            f"v {v.shape}"
        )
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads and not validation.flag("enable_gqa", enable_gqa):
        raise ValueError(
            f"q, k and v must share the heads axis, got q {q.shape}, k {k.shape}, v {v.shape}; "
            f"k and v with fewer heads (GQA/MQA) need enable_gqa=True"
        )
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {q.shape}, k {k.shape})"
        )


def _offsets(name: str, offsets: Any, total: int) -> np.ndarray:
    """Cumulative sequence offsets: 1-D integers, starting at 0, non-decreasing, ending at total."""
    offsets = np.asarray(offsets)
    if offsets.dtype == np.bool_ or not np.issubdtype(offsets.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {offsets.dtype}")
    if offsets.ndim != 1 or len(offsets) < 1:
        raise ValueError(f"{name} must be 1-D (S + 1,) offsets, got shape {offsets.shape}")
    if offsets[0] != 0 or offsets[-1] != total or np.any(np.diff(offsets) < 0):
        raise ValueError(
            f"{name} must start at 0, never decrease and end at the packed length {total}, "
            f"got {offsets.tolist()}"
        )
    return offsets.astype(np.int64)


def _concat(parts: list[np.ndarray], empty: tuple[int, ...], dtype: Any, axis: int) -> np.ndarray:
    return np.concatenate(parts, axis=axis) if parts else np.zeros(empty, dtype)
