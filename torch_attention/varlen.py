"""Attention over packed variable-length sequences, in flash-attn's layout, in torch.

The twin of ``numpy_attention.varlen``, differentiable by autograd. Sequences of different
lengths are packed along one token axis with cumulative offsets: sequence s holds queries
``cu_seqlens_q[s]:cu_seqlens_q[s+1]`` and keys ``cu_seqlens_k[s]:cu_seqlens_k[s+1]``. Each
sequence is one call of ``functional.attention`` on the backend asked for (so every option and
every backend work as they do there; alignment is per sequence), and no sequence ever sees
another. An empty sequence is allowed (no queries, or no keys: output 0, lse -inf). With
``backend="triton"`` the packed sequences run in one launch of the project's kernel instead.

Shape legend: S sequences, T_q and T_k the packed query and key token counts, H query heads,
H_kv key/value heads, D head width, Dv value head width.

Derivation: docs/derivations/varlen.md. Tests: tests/torch_attention/test_varlen.py.
"""

from __future__ import annotations

from typing import Any

import torch

from . import validation
from .functional import attention
from .rules import prepare
from .scores import AttentionOutput

__all__ = ["varlen_attention"]


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    align: str = "top-left",
    scale: float | None = None,
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    sinks: torch.Tensor | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
    backend: str = "auto",
    return_lse: bool = False,
) -> Any:
    """Attention of each packed sequence over its own keys.

    Args:
        q: (T_q, H, D) packed queries.
        k: (T_k, H_kv, D) packed keys.
        v: (T_k, H_kv, Dv) packed values.
        cu_seqlens_q: (S + 1,) integer offsets into q: 0, non-decreasing, ending at T_q.
        cu_seqlens_k: (S + 1,) integer offsets into k and v: 0, non-decreasing, ending at T_k.
        causal, window, align, scale, softcap, sinks, enable_gqa, dropout_p, backend: as
            ``functional.attention``, per sequence (alignment is per sequence).
        alibi_slopes: (H,), or (S, H) with one row per sequence.
        return_lse: also return lse (H, T_q), as flash-attn's varlen kernels do.

    Returns:
        out (T_q, H, Dv) in the inputs' dtype; with ``return_lse``,
        ``AttentionOutput(out, lse)``.
    """
    q, k, v = (validation.float_tensor(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 3:
            raise ValueError(
                f"{name} must be packed (total, heads, width), got shape {tuple(t.shape)}"
            )
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
        alibi_slopes = validation.float_tensor("alibi_slopes", alibi_slopes)
        if alibi_slopes.ndim not in (1, 2) or alibi_slopes.shape[-1] != q.shape[1]:
            raise ValueError(
                f"alibi_slopes must be (H,) or (S, H) with H = {q.shape[1]} heads of q "
                f"{tuple(q.shape)}, got {tuple(alibi_slopes.shape)}"
            )
        if alibi_slopes.ndim == 2 and alibi_slopes.shape[0] != sequences:
            raise ValueError(
                f"alibi_slopes (S, H) must have one row per sequence, S = {sequences}, "
                f"got {tuple(alibi_slopes.shape)}"
            )
    return_lse = validation.flag("return_lse", return_lse)
    options: dict[str, Any] = {
        "causal": causal,
        "window": window,
        "align": align,
        "scale": scale,
        "softcap": softcap,
        "sinks": sinks,
        "enable_gqa": enable_gqa,
        "dropout_p": dropout_p,
        "backend": backend,
    }
    # Every option checked once, before any work, also when there is no sequence: the call on
    # empty sequences (S, H, 0, W) refuses what the backend would refuse.
    empty = [t.new_empty((sequences, t.shape[1], 0, t.shape[2])) for t in (q, k, v)]
    with torch.no_grad():
        attention(*empty, alibi_slopes=alibi_slopes, **options)
    if backend == "triton":  # one launch: the kernel finds each sequence through the offsets
        from .triton import launch

        del options["backend"]
        rules = prepare(*empty, alibi_slopes=alibi_slopes, **options).rules
        out, lse = launch.varlen_attention(
            q, k, v, cu_q, cu_k, rules, alibi_slopes, align == "bottom-right"
        )
        return AttentionOutput(out, lse) if return_lse else out
    outs, lses = [], []
    for s in range(sequences):
        rows, cols = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        slopes = alibi_slopes
        if alibi_slopes is not None and alibi_slopes.ndim == 2:
            slopes = alibi_slopes[s]
        result = attention(
            q[rows].transpose(0, 1),  # (n_s, H, D) -> (H, n_s, D)
            k[cols].transpose(0, 1),  # (m_s, H_kv, D) -> (H_kv, m_s, D)
            v[cols].transpose(0, 1),
            alibi_slopes=slopes,
            return_lse=True,
            **options,
        )
        outs.append(result.out.transpose(0, 1))  # (H, n_s, Dv) -> (n_s, H, Dv)
        lses.append(result.lse)  # (H, n_s)
    out = torch.cat(outs) if outs else q.new_zeros((0, q.shape[1], v.shape[2]))
    if not return_lse:
        return out
    lse_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros((q.shape[1], 0), dtype=lse_dtype)
    return AttentionOutput(out, lse)


def _check_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: Any) -> None:
    """q (T_q, H, D), k (T_k, H_kv, D), v (T_k, H_kv, Dv): the shapes as the caller passed them
    in every message (each sequence's call would name its own slice)."""
    q_shape, k_shape, v_shape = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    if q_shape[2] != k_shape[2]:
        raise ValueError(f"q and k must share the head width D, got q {q_shape} and k {k_shape}")
    if k_shape[:2] != v_shape[:2]:
        raise ValueError(
            f"k and v must share the packed length and the kv heads, got k {k_shape} and "
            f"v {v_shape}"
        )
    heads, kv_heads = q_shape[1], k_shape[1]
    if heads != kv_heads and not validation.flag("enable_gqa", enable_gqa):
        raise ValueError(
            f"q, k and v must share the heads axis, got q {q_shape}, k {k_shape}, v {v_shape}; "
            f"k and v with fewer heads (GQA/MQA) need enable_gqa=True"
        )
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {q_shape}, k {k_shape})"
        )


def _offsets(name: str, offsets: Any, total: int) -> list[int]:
    """Cumulative sequence offsets: 1-D integers, starting at 0, non-decreasing, ending at total."""
    offsets = torch.as_tensor(offsets)
    if offsets.dtype == torch.bool or offsets.dtype.is_floating_point or offsets.is_complex():
        raise TypeError(f"{name} must be an integer tensor, got dtype {offsets.dtype}")
    if offsets.ndim != 1 or len(offsets) < 1:
        raise ValueError(f"{name} must be 1-D (S + 1,) offsets, got shape {tuple(offsets.shape)}")
    values = offsets.tolist()
    decreasing = any(b < a for a, b in zip(values, values[1:], strict=False))
    if values[0] != 0 or values[-1] != total or decreasing:
        raise ValueError(
            f"{name} must start at 0, never decrease and end at the packed length {total}, "
            f"got {values}"
        )
    return values
