"""Sparse attention by indices in torch (DeepSeek-V3.2's DSA, FlashMLA's sparse kernels), the twin
of ``numpy_attention.sparse``, differentiable by autograd.

Token-major: q (S_q, H, D), k (S_kv, H_kv, D), v (S_kv, H_kv, Dv) or None with ``d_v`` (V =
``k[..., :d_v]``, MLA's latent), indices (S_q, H_kv, topk) integers. Query token t, head h attends
the key rows ``indices[t, h // (H / H_kv), :topk_length[t]]``; an entry outside [0, S_kv) is
invalid and contributes, reads and writes nothing; a row repeated within a list counts once per
entry; scale, sinks, lse and dead rows follow the core's rules (out 0, lse -inf or the sink).
The shapes are checked by the NumPy twin's pure-Python rules.

The gather ``k[rows]`` is differentiated by autograd as an index_put with accumulation: a key
row named by several queries (or twice by one) receives the sum of their gradients. The queries
run in blocks so that the gathered keys stay small.

Derivation: docs/derivations/sparse.md. Tests: tests/torch_attention/test_sparse.py.
"""

from __future__ import annotations

import math

import torch

from numpy_attention.sparse import check_shapes, check_topk_length  # pure Python, shared

from . import validation
from .rules import compute_dtype
from .scores import AttentionOutput

__all__ = ["sparse_attention"]

# A block of query tokens holds at most this many gathered key entries (NumPy's constant).
_BLOCK_ENTRIES = 1 << 23


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    indices: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    sinks: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    d_v: int | None = None,
    return_lse: bool = False,
) -> torch.Tensor | AttentionOutput:
    """Attention of each query token over the key rows its indices name.

    Args:
        q, k, v, indices, softmax_scale, sinks, topk_length, d_v: as
            ``numpy_attention.sparse.sparse_attention_forward``.
        return_lse: also return lse (S_q, H) in the compute dtype.

    Returns:
        out (S_q, H, Dv) in the inputs' dtype, or ``AttentionOutput(out, lse)`` with return_lse.
    """
    q = validation.float_tensor("q", q)
    k = validation.float_tensor("k", k)
    tensors = {"q": q, "k": k}
    if v is not None:
        v = validation.float_tensor("v", v)
        tensors["v"] = v
    dtype = validation.same_dtype(**tensors)
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be an integer tensor, got {type(indices).__name__}")
    if indices.dtype == torch.bool or indices.is_floating_point() or indices.is_complex():
        raise TypeError(f"indices must be an integer tensor, got dtype {indices.dtype}")
    d_v = check_shapes(
        tuple(q.shape), tuple(k.shape), None if v is None else tuple(v.shape),
        tuple(indices.shape), d_v,
    )  # fmt: skip
    (s_q, heads, width), (s_kv, kv_heads) = q.shape, k.shape[:2]
    topk = indices.shape[2]
    valid = (indices >= 0) & (indices < s_kv)
    if topk_length is not None:
        if not isinstance(topk_length, torch.Tensor) or (
            topk_length.dtype == torch.bool or topk_length.is_floating_point()
        ):
            raise TypeError("topk_length must be an integer tensor")
        lo, hi = (int(topk_length.min()), int(topk_length.max())) if s_q else (0, 0)
        check_topk_length(tuple(topk_length.shape), s_q, topk, lo, hi)
        valid &= torch.arange(topk, device=q.device) < topk_length.to(q.device)[:, None, None]
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(width) if width else 1.0
    else:
        scale = validation.finite_real("softmax_scale", softmax_scale)
    compute = compute_dtype(dtype)
    if sinks is not None:
        sinks = validation.float_tensor("sinks", sinks)
        if tuple(sinks.shape) != (heads,):
            raise ValueError(
                f"sinks must be (H,) = ({heads},), one per query head, got {tuple(sinks.shape)}"
            )
        if sinks.dtype != dtype:
            raise TypeError(f"sinks must have the dtype of q, k and v ({dtype}), got {sinks.dtype}")
        if not bool(torch.isfinite(sinks).all()):
            raise ValueError("sinks must be finite")
        sinks = sinks.to(compute).reshape(kv_heads, heads // kv_heads)
    rows = torch.where(valid, indices, 0).long()  # an invalid entry reads row 0, masked
    qc, kc = q.to(compute), k.to(compute)
    vc = None if v is None else v.to(compute)
    per_token = max(1, kv_heads * topk * (width + d_v))
    size = max(1, _BLOCK_ENTRIES // per_token)
    outs, lses = [], []
    head_index = torch.arange(kv_heads, device=q.device)[None, :, None]
    for start in range(0, s_q, size):
        t = slice(start, min(start + size, s_q))
        n = t.stop - t.start
        k_sel = kc[rows[t], head_index]  # (n, H_kv, topk, D)
        v_sel = kc[rows[t], head_index, :d_v] if vc is None else vc[rows[t], head_index]
        q_t = qc[t].reshape(n, kv_heads, heads // kv_heads, width)
        scores = (q_t * scale) @ k_sel.transpose(-1, -2)  # (n, H_kv, g, topk)
        scores = scores.masked_fill(~valid[t][:, :, None, :], -math.inf)
        top = (
            scores.detach().amax(dim=-1) if topk else scores.new_full(scores.shape[:-1], -math.inf)
        )
        if sinks is not None:
            top = torch.maximum(top, sinks.detach())
        shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        e = torch.exp(scores - shift[..., None])
        total = e.sum(dim=-1)
        if sinks is not None:
            total = total + torch.exp(sinks - shift)
        alive = total > 0
        safe = torch.where(alive, total, torch.ones_like(total))
        lse = torch.where(alive, shift + torch.log(safe), torch.full_like(total, -math.inf))
        p = e / safe[..., None]
        outs.append((p @ v_sel).reshape(n, heads, d_v))
        lses.append(lse.reshape(n, heads))
    if outs:
        out, lse = torch.cat(outs), torch.cat(lses)
    else:
        out = qc.new_zeros((0, heads, d_v))
        lse = qc.new_zeros((0, heads))
    out = out.to(dtype)
    return AttentionOutput(out, lse) if return_lse else out
