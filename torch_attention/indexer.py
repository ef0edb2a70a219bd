"""DeepSeek-V3.2's lightning indexer in torch, the twin of ``numpy_attention.indexer``,
differentiable by autograd: its scores, the top-k selection (ties to the lower index, -1 past the
visible keys) and the KL training loss; and ``LightningIndexer``, the indexer as
``MultiHeadLatentAttention``'s part (``index_topk``): the NumPy twin's parameters, rules and
selection (no gradient flows through a selection: it runs under ``torch.no_grad()``).

    scores[t, s] = sum_j weights[t, j] * relu(scale * q_idx[t, j] . k_idx[s])

Derivation: docs/derivations/indexer.md. Tests: tests/torch_attention/test_indexer.py.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# The options are pure Python: the NumPy twin's rules.
from numpy_attention.indexer import (
    IndexerOptions,
    check_index_options,
    check_query_gate,
    check_rope_position,
    check_selection_given,
    check_selection_shape,
    check_shared_selection,
)

from . import validation
from .layers import Linear
from .module import Module
from .norms import LayerNorm
from .rope import deinterleave, rope
from .rules import compute_dtype

__all__ = [
    "LightningIndexer",
    "check_index_options",
    "check_query_gate",
    "check_rope_position",
    "check_selection_given",
    "check_selection_shape",
    "check_shared_selection",
    "indexer_kl_loss",
    "indexer_scores",
    "topk_indices",
]


def indexer_scores(
    q_idx: torch.Tensor,
    k_idx: torch.Tensor,
    weights: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """(S_q, S_kv) scores in the compute dtype, -inf past each query's position t + S_kv - S_q
    under ``causal``; the arguments as ``numpy_attention.indexer.indexer_forward``'s."""
    q_idx = validation.float_tensor("q_idx", q_idx)
    k_idx = validation.float_tensor("k_idx", k_idx)
    weights = validation.float_tensor("weights", weights)
    validation.same_dtype(q_idx=q_idx, k_idx=k_idx, weights=weights)
    if q_idx.dim() != 3:
        raise ValueError(f"q_idx must be (S_q, HI, DI), got shape {tuple(q_idx.shape)}")
    s_q, heads, width = q_idx.shape
    if k_idx.dim() != 2 or k_idx.shape[1] != width:
        raise ValueError(
            f"k_idx must be (S_kv, DI) = (S_kv, {width}), got shape {tuple(k_idx.shape)}"
        )
    if tuple(weights.shape) != (s_q, heads):
        raise ValueError(
            f"weights must be (S_q, HI) = ({s_q}, {heads}), got {tuple(weights.shape)}"
        )
    causal = validation.flag("causal", causal)
    s_kv = k_idx.shape[0]
    if causal and s_kv < s_q:
        raise ValueError(
            f"causal needs S_kv >= S_q (the queries are the last S_q keys), got S_q = {s_q} "
            f"and S_kv = {s_kv}"
        )
    scale = width**-0.5 if scale is None else validation.finite_real("scale", scale)
    compute = compute_dtype(q_idx.dtype)
    u = scale * (q_idx.to(compute) @ k_idx.to(compute).T)  # (S_q, HI, S_kv)
    scores = torch.einsum("thk,th->tk", torch.relu(u), weights.to(compute))
    if causal:
        position = torch.arange(s_q, device=q_idx.device)[:, None] + (s_kv - s_q)
        hidden = torch.arange(s_kv, device=q_idx.device)[None, :] > position
        scores = scores.masked_fill(hidden, -math.inf)
    return scores


def topk_indices(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """(S_q, topk) int64: the largest visible scores first, ties to the lower key index, -1 past
    the row's visible keys (``numpy_attention.indexer.topk_indices``)."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be (S_q, S_kv), got shape {tuple(scores.shape)}")
    topk = validation.positive_int("topk", topk)
    if bool(torch.isnan(scores).any()):
        raise ValueError("scores hold NaN: no order to select by")
    order = torch.sort(-scores.detach(), dim=-1, stable=True).indices[:, :topk]
    chosen = torch.gather(scores.detach(), -1, order)
    picked = torch.where(torch.isneginf(chosen), torch.full_like(order, -1), order)
    pad = topk - picked.shape[1]
    return torch.nn.functional.pad(picked, (0, pad), value=-1).long()


def indexer_kl_loss(
    scores: torch.Tensor, attention: torch.Tensor, indices: torch.Tensor | None = None
) -> torch.Tensor:
    """Sum over query rows of KL(p || softmax(scores)), p the main attention's weights summed
    over heads and L1-normalized, held constant (detached); dense, or over the selected keys
    ``indices`` (S_q, topk) with both renormalized there. Rows whose p sums to 0 add nothing."""
    if attention.dim() == 3:
        attention = attention.sum(dim=1)
    attention = attention.detach().to(scores.dtype)
    if bool(((attention > 0) & torch.isneginf(scores)).any()):
        raise ValueError("attention puts weight on keys the indexer hides (-inf scores)")
    read = ~torch.isneginf(scores)
    if indices is not None:
        s_kv = scores.shape[1]
        valid = (indices >= 0) & (indices < s_kv)
        selected = torch.zeros_like(read)
        rows = torch.arange(scores.shape[0], device=scores.device)[:, None].expand_as(indices)
        selected[rows[valid], indices[valid].long()] = True
        read = read & selected
    p = torch.where(read, attention, torch.zeros_like(attention))
    mass = p.sum(dim=-1, keepdim=True)
    live = mass[:, 0] > 0
    p = p / torch.where(mass > 0, mass, torch.ones_like(mass))
    masked = scores.masked_fill(~read, -math.inf)
    safe = torch.where(live[:, None], masked, torch.zeros_like(masked))  # dead rows: no NaN
    log_q = torch.log_softmax(safe, dim=-1)
    log_p = torch.log(torch.where(p > 0, p, torch.ones_like(p)))
    terms = torch.where(p > 0, p * (log_p - torch.where(read, log_q, torch.zeros_like(log_q))), 0)
    return terms[live].sum()


class LightningIndexer(Module):
    """DeepSeek-V3.2's indexer inside an attention layer: the twin of
    ``numpy_attention.indexer.LightningIndexer`` (its docstring has the chain), the same
    arguments, parameters and selection."""

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
    ) -> None:
        super().__init__()
        options = IndexerOptions.check(
            num_heads, head_dim, topk, rope_dim, rope_interleaved, rope_position, norm_eps
        )
        self.num_heads, self.head_dim, self.topk, self.rope_dim = options[:4]
        self.rope_interleaved, self.rope_position, norm_eps = options[4:]
        self.wq_b = Linear(q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.wk = Linear(hidden_size, self.head_dim, bias=False)
        self.k_norm = LayerNorm(self.head_dim, norm_eps, bias=True)
        self.weights_proj = Linear(hidden_size, self.num_heads, bias=False)

    @torch.no_grad()
    def keys(self, x: torch.Tensor, positions: Any, rotation: dict[str, Any]) -> torch.Tensor:
        """This call's indexer keys (B, N, DI), rotated."""
        k = self.k_norm(self.wk(x))[:, None]  # (B, 1, N, DI)
        return self._rotate(k, positions, rotation)[:, 0]

    @torch.no_grad()
    def forward(
        self,
        x: torch.Tensor,
        q_resid: torch.Tensor,
        keys: torch.Tensor,
        positions: Any,
        rotation: dict[str, Any],
        padding: torch.Tensor | None,
    ) -> torch.Tensor:
        """The (B, N, M) bool mask, True where query t may read key s (the NumPy twin's)."""
        b, n, _ = x.shape
        m = keys.shape[1]
        q = self.wq_b(q_resid).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        q = self._rotate(q, positions, rotation).transpose(1, 2)  # (B, N, HI, DI)
        weights = self.weights_proj(x) * self.num_heads**-0.5  # (B, N, HI)
        selected = torch.zeros(b, n, m, dtype=torch.bool, device=x.device)
        for i in range(b):
            scores = indexer_scores(q[i], keys[i], weights[i], scale=self.head_dim**-0.5)
            if padding is not None:
                scores = scores.masked_fill(padding[i], -math.inf)
            picked = topk_indices(scores, self.topk)  # (N, topk), -1 past the visible
            rows = torch.arange(n, device=x.device)[:, None].expand_as(picked)
            valid = picked >= 0
            selected[i, rows[valid], picked[valid]] = True
        return selected

    def _rotate(self, x: torch.Tensor, positions: Any, rotation: dict[str, Any]) -> torch.Tensor:
        """RoPE on the first or last R dims of each head (the NumPy twin's ``_rotate``)."""
        r, width = self.rope_dim, x.shape[-1]
        lo = 0 if self.rope_position == "first" else width - r
        part = x[..., lo : lo + r]
        if self.rope_interleaved:
            part = deinterleave(part)
        part = rope(part, positions, **rotation)
        return torch.cat([x[..., :lo], part, x[..., lo + r :]], dim=-1)
