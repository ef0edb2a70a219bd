"""Native sparse attention (NSA; flash-linear-attention's ``naive_nsa``) in torch, the twin of
``numpy_attention.nsa``, differentiable by autograd through the torch sparse core:

    out = g_cmp * O_cmp + g_slc * O_slc + g_swa * O_swa

the compressed branch over the blocks' mean keys and values (block c seen once
(c + 1) * block_size - 1 <= t), the selected blocks (ranked by the compressed probabilities
summed over the GQA group, block 0 and the current and previous blocks forced in, ties to the
lower block), the sliding window of ``window_size`` tokens. Token-major with ``cu_seqlens``, as
the NumPy twin, whose pure rules (shapes, the integer layout of blocks and windows) it runs. The
selection runs under ``torch.no_grad()``: a block choice carries no gradient.

Derivation: docs/derivations/nsa.md. Tests: tests/torch_attention/test_nsa.py.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

# The shapes and the integer layout are pure NumPy on shapes: the NumPy twin's rules.
from numpy_attention.nsa import (
    Layout,
    block_layout,
    check_block_counts_shape,
    check_options,
    compressed_rows,
    selected_rows,
    window_rows,
)

from . import validation
from .indexer import topk_indices
from .sparse import sparse_attention
from .varlen import _offsets

__all__ = ["nsa"]


def nsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g_cmp: torch.Tensor,
    g_slc: torch.Tensor,
    g_swa: torch.Tensor | None = None,
    *,
    block_size: int,
    block_counts: int | torch.Tensor = 16,
    window_size: int = 0,
    softmax_scale: float | None = None,
    block_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    return_block_indices: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Native sparse attention, causal, over one or several packed sequences.

    Args:
        q, k, v, g_cmp, g_slc, g_swa, block_size, block_counts, window_size, softmax_scale,
            block_indices, cu_seqlens: as ``numpy_attention.nsa.nsa_forward``.
        return_block_indices: also return the blocks attended, (S, H_kv, n).

    Returns:
        out (S, H, Dv) in the inputs' dtype, or ``(out, block_indices)``.
    """
    tensors = {"q": q, "k": k, "v": v, "g_cmp": g_cmp, "g_slc": g_slc}
    if g_swa is not None:
        tensors["g_swa"] = g_swa
    tensors = {name: validation.float_tensor(name, t) for name, t in tensors.items()}
    validation.same_dtype(**tensors)
    if block_indices is not None:
        if not isinstance(block_indices, torch.Tensor):
            raise TypeError(f"block_indices must be a tensor, got {type(block_indices).__name__}")
        if block_indices.dtype == torch.bool or block_indices.is_floating_point():
            raise TypeError(
                f"block_indices must be an integer tensor, got dtype {block_indices.dtype}"
            )
    check_options(
        tuple(q.shape), tuple(k.shape), tuple(v.shape), tuple(g_cmp.shape), tuple(g_slc.shape),
        None if g_swa is None else tuple(g_swa.shape),
        block_size, window_size, None if block_indices is None else tuple(block_indices.shape),
    )  # fmt: skip
    s, kv_heads = q.shape[0], k.shape[1]
    offsets = None if cu_seqlens is None else np.array(_offsets("cu_seqlens", cu_seqlens, s))
    layout = block_layout(offsets, s, block_size)
    device = q.device

    def rows_on_device(rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(rows)).to(device)

    block = rows_on_device(layout.block)
    counts = rows_on_device(layout.counts)
    k_cmp, v_cmp = _mean_pool(k, block, counts), _mean_pool(v, block, counts)  # (S_c, H_kv, *)
    cmp_rows = compressed_rows(layout, block_size)  # (S, W)
    cmp_index = rows_on_device(cmp_rows)[:, None].expand(-1, kv_heads, -1)
    o_cmp, lse = sparse_attention(
        q, k_cmp, v_cmp, cmp_index, softmax_scale=softmax_scale, return_lse=True
    )
    if block_indices is None:
        n = _check_block_counts(block_counts, (s, kv_heads))
        with torch.no_grad():
            block_indices = _select_blocks(
                q, k_cmp, rows_on_device(cmp_rows), lse, layout, block_size, block_counts, n,
                softmax_scale,
            )  # fmt: skip
    slc_rows = selected_rows(block_indices.cpu().numpy(), layout, block_size)
    o_slc = sparse_attention(q, k, v, rows_on_device(slc_rows), softmax_scale=softmax_scale)
    assert isinstance(o_slc, torch.Tensor)
    out = g_cmp[..., None] * o_cmp + g_slc[..., None] * o_slc
    if g_swa is not None:  # window_size > 0
        swa_index = rows_on_device(window_rows(layout, window_size))[:, None]
        o_swa = sparse_attention(
            q, k, v, swa_index.expand(-1, kv_heads, -1), softmax_scale=softmax_scale
        )
        assert isinstance(o_swa, torch.Tensor)
        out = out + g_swa[..., None] * o_swa
    return (out, block_indices) if return_block_indices else out


def _mean_pool(x: torch.Tensor, block: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(S, H_kv, W) -> (S_c, H_kv, W): each block's mean (autograd gives the adjoint)."""
    pooled = x.new_zeros((counts.shape[0],) + tuple(x.shape[1:])).index_add(0, block, x)
    return pooled / counts[:, None, None].to(x.dtype)


def _check_block_counts(block_counts: Any, shape: tuple[int, int]) -> int:
    """The most blocks of any token; the NumPy twin's rules and words."""
    if isinstance(block_counts, (int, np.integer)) and not isinstance(block_counts, bool):
        return validation.positive_int("block_counts", block_counts)
    if not isinstance(block_counts, torch.Tensor):
        dtype = np.asarray(block_counts).dtype
        raise TypeError(f"block_counts must be an int or an integer tensor, got dtype {dtype}")
    if block_counts.dtype == torch.bool or block_counts.is_floating_point():
        raise TypeError(
            f"block_counts must be an int or an integer tensor, got dtype {block_counts.dtype}"
        )
    lo = int(block_counts.min()) if block_counts.numel() else 0
    check_block_counts_shape(tuple(block_counts.shape), shape, lo)
    return int(block_counts.max()) if block_counts.numel() else 0


def _select_blocks(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    cmp_rows: torch.Tensor,
    lse: torch.Tensor,
    layout: Layout,
    block_size: int,
    block_counts: int | torch.Tensor,
    n: int,
    softmax_scale: float | None,
) -> torch.Tensor:
    """(S, H_kv, n): ``numpy_attention.nsa.select_blocks`` in torch."""
    s, heads, width = q.shape
    kv_heads = k_cmp.shape[1]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(width) if softmax_scale is None else softmax_scale
    k_sel = k_cmp[cmp_rows.clamp(min=0)]  # (S, W, H_kv, D)
    q_g = q.reshape(s, kv_heads, group, width).to(lse.dtype)
    scores = scale * torch.einsum("tcgd,twcd->tcgw", q_g, k_sel.to(lse.dtype))
    finite = torch.isfinite(lse).reshape(s, kv_heads, group, 1)
    lse_g = torch.where(
        finite, lse.reshape(s, kv_heads, group, 1), torch.zeros_like(scores[..., :1])
    )
    seen = finite & (cmp_rows[:, None, None, :] >= 0)
    probs = torch.where(seen, torch.exp(scores - lse_g), torch.zeros_like(scores))
    importance = scores.new_zeros((s, kv_heads, layout.blocks_max))
    width_c = min(cmp_rows.shape[1], layout.blocks_max)
    importance[..., :width_c] = probs.sum(dim=2)[..., :width_c]
    c = np.arange(layout.blocks_max)
    current = (layout.pos // block_size)[:, None]
    visible = c < ((layout.pos + 1) // block_size)[:, None]
    forced = torch.from_numpy((c == 0) | (c == current) | (c == current - 1)).to(q.device)
    allowed = forced | torch.from_numpy(visible).to(q.device)
    importance = torch.where(forced[:, None], torch.full_like(importance, group), importance)
    ranked = torch.where(allowed[:, None], importance, torch.full_like(importance, -math.inf))
    chosen = topk_indices(ranked.reshape(s * kv_heads, -1), max(1, n)).reshape(s, kv_heads, -1)
    quota = torch.arange(chosen.shape[-1], device=q.device)
    if isinstance(block_counts, torch.Tensor):
        keep = quota < block_counts.to(q.device)[..., None]
    else:
        keep = quota < block_counts
    return torch.where(keep, chosen, torch.full_like(chosen, -1))
