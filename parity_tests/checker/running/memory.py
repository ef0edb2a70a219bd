"""Where a kernel's q, k and v sit in memory: a case's ``memory`` layout, applied to copies.

The checker keeps a case's inputs contiguous; before each call it places fresh copies of q, k
and v in the spec's layout (same values, same shapes) as the case says:

- "contiguous": contiguous copies.
- "fused": permuted views of one token-major buffer (..., L, H*D + H_kv*D + H_kv*Dv), as the
  output of a fused QKV projection is split; when q has another length than k and v (N != M,
  or T_q != T_k), k and v are views of one fused KV buffer and q of its own token-major buffer.
- "kv-strides": k a view of a token-major buffer (..., M, H_kv*D), v a view of a head-major one
  (..., H_kv, M, Dv): k and v have different strides in every spec's layout (q contiguous).
- "offset": each a contiguous view that starts ``OFFSET`` elements into its buffer (a nonzero
  storage offset; the elements before it are NaN, so a kernel that reads from the start of the
  storage sees them).
- "broadcast": k and v stride-0 views, one head expanded over the key/value heads (or, with one
  head, one batch element over the batch), as ``expand`` gives them (PyTorch #191937: SDPA's
  efficient kernel wrong on them at key lengths 1 mod 32); their values are equal along that
  axis by construction (``case.make_inputs``), so the view holds the case's own values.

The last axis always has stride 1, as every library's kernels require. The copies are leaves
that do not require grad; the caller asks for grad on them.

Shape legend: B batch, H heads, H_kv key/value heads, L a sequence length (N for q, M for k
and v), D head width, Dv value width; a spec's layout puts the heads axis before L (SDPA,
FlexAttention: (B, H, L, W)) or after it (flash-attn: (B, L, H, W), packed (T, H, W)).

Tests: tests/checker/running/test_memory.py
"""

from __future__ import annotations

import math

import torch

OFFSET = 16  # elements: keeps 16-byte alignment in every dtype (a slice of a larger buffer)


def place(
    memory: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_first: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copies of q, k, v (in a spec's layout, the heads axis before the length axis when
    ``heads_first``) laid out in memory as ``memory`` says."""
    if memory == "contiguous":
        return _contiguous(q), _contiguous(k), _contiguous(v)
    if memory == "offset":
        return _at_offset(q), _at_offset(k), _at_offset(v)
    if memory == "kv-strides":
        return _contiguous(q), _token_major([k], heads_first)[0], _head_major(v, heads_first)
    if memory == "broadcast":
        return _contiguous(q), _broadcast(k, heads_first), _broadcast(v, heads_first)
    if memory == "fused":
        if _token_first(q, heads_first).shape[:-2] == _token_first(k, heads_first).shape[:-2]:
            fq, fk, fv = _token_major([q, k, v], heads_first)
            return fq, fk, fv
        fk, fv = _token_major([k, v], heads_first)
        return _token_major([q], heads_first)[0], fk, fv
    raise ValueError(
        f"memory must be contiguous, fused, kv-strides, offset or broadcast, got {memory!r}"
    )


def _broadcast(t: torch.Tensor, heads_first: bool) -> torch.Tensor:
    """A stride-0 view of t's first head expanded over its heads, or of its first batch element
    over the batch when it has one head (``case.make_inputs`` draws broadcast k and v equal along
    that axis, so the values are t's own)."""
    heads = -3 if heads_first else -2
    axis = heads if t.shape[heads] > 1 or t.dim() < 4 else 0
    first = _contiguous(t.narrow(axis, 0, 1))
    return first.expand(t.shape)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone(memory_format=torch.contiguous_format)


def _token_first(t: torch.Tensor, heads_first: bool) -> torch.Tensor:
    """t with its length axis before its heads axis: (..., L, H, W)."""
    return t.transpose(-3, -2) if heads_first else t


def _token_major(tensors: list[torch.Tensor], heads_first: bool) -> list[torch.Tensor]:
    """Views of one contiguous token-major buffer that holds ``tensors`` side by side on its
    last axis, each back in the caller's layout."""
    parts = [_token_first(t.detach(), heads_first) for t in tensors]  # (..., L, H, W) each
    buffer = torch.cat([part.flatten(-2) for part in parts], dim=-1)  # (..., L, sum of H * W)
    views, start = [], 0
    for part in parts:
        width = part.shape[-2] * part.shape[-1]
        view = buffer[..., start : start + width].unflatten(-1, part.shape[-2:])  # (..., L, H, W)
        views.append(_token_first(view, heads_first))
        start += width
    return views


def _head_major(t: torch.Tensor, heads_first: bool) -> torch.Tensor:
    """A view of a contiguous head-major buffer (..., H, L, W), back in the caller's layout."""
    if heads_first:
        return _contiguous(t)
    return t.detach().transpose(-3, -2).contiguous().transpose(-3, -2)  # (..., L, H, W) view


def _at_offset(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t that starts OFFSET elements into a buffer of NaN (or zeros for a
    type without NaN)."""
    fill = math.nan if t.is_floating_point() else 0
    buffer = torch.full((OFFSET + t.numel(),), fill, dtype=t.dtype, device=t.device)
    view = buffer[OFFSET:].view(t.shape)
    view.copy_(t.detach())
    return view
