"""The fused-QKV family in torch, twins of ``numpy_attention.fused``: one projection makes
queries, keys and values (single head, bidirectional, causal, cross).

Shape legend: B batch, H heads, N query length, M key/value length, C model width
(``hidden_size``), D head width (C // H; C // 4 for the single head).

Every layer runs ``x -> Wqkv -> split into q, k, v and heads -> attention -> merge heads -> Wo ->
output dropout``. Row layout of the fused projections, as in ``nn.MultiheadAttention``'s
``in_proj_weight``: Wqkv rows are [all query heads, all key heads, all value heads], Wkv rows [all
key heads, all value heads], and head h of a block is its rows h*D:(h+1)*D. No buffers: the causal
mask is the functional ``causal`` flag. Every layer takes a keyword ``backend`` passed to
``functional.attention``.

Derivation: docs/derivations/fused-qkv.md, docs/derivations/cross-attention.md (backward by
autograd here; the pages derive the NumPy twins' hand-written ones).
Tests: tests/torch_attention/test_fused.py.
"""

from __future__ import annotations

from typing import Any

import torch

from . import validation
from .functional import attention, check_backend, merge_heads, split_heads
from .layers import Linear, dropout, dropout_keep_mask
from .module import Module

# -- the fused projection split into q, k, v and heads ----------------------------------------


def split_projection(proj: torch.Tensor, parts: int, num_heads: int) -> list[torch.Tensor]:
    """Cut a fused projection (B, N, parts*C) into ``parts`` blocks, each split into heads.

    Returns ``parts`` tensors (B, H, N, D), in order (q, k, v for Wqkv; k, v for Wkv).
    """
    blocks = proj.chunk(parts, dim=-1)  # (B, N, parts*C) -> parts x (B, N, C)
    return [split_heads(block, num_heads) for block in blocks]  # -> parts x (B, H, N, D)


# -- shared pieces of the layers --------------------------------------------------------------


def _padding_mask(mask: Any, batch: int, length: int, device: torch.device) -> torch.Tensor | None:
    """The key padding mask checked as bool (B, M), True = padding (None passes through)."""
    if mask is None:
        return None
    mask = validation.bool_tensor("mask", mask, device)
    if tuple(mask.shape) != (batch, length):
        raise ValueError(
            f"mask is the key padding mask (B, M) = ({batch}, {length}), True = padding; "
            f"got shape {tuple(mask.shape)}"
        )
    return mask


class _FusedAttention(Module):
    """What every fused layer shares: heads, dropout probabilities, the backend, and the tail
    ``attention -> merge heads -> Wo -> output dropout``."""

    Wqkv: Linear  # the self-attention layers' fused projection
    Wo: Linear

    def __init__(
        self, hidden_size: int, num_heads: int, attn_drop: float, out_drop: float, backend: str
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        self.attn_drop = validation.dropout_p(attn_drop, "attn_drop")
        self.out_drop = validation.dropout_p(out_drop, "out_drop")
        self.backend = check_backend(backend)

    def _check_divisible(self) -> None:
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )

    def _keep_masks(
        self, x: torch.Tensor, m: int, attn_dropout_mask: Any, out_dropout_mask: Any
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The explicit attention (B, H, N, M) and output (B, N, C) keep-masks, checked."""
        b, n = x.shape[0], x.shape[1]
        attn_keep = dropout_keep_mask(
            "attn_dropout_mask",
            self.attn_drop,
            (b, self.num_heads, n, m),
            self.training,
            attn_dropout_mask,
            x.device,
        )
        out_keep = dropout_keep_mask(
            "out_dropout_mask",
            self.out_drop,
            (b, n, self.hidden_size),
            self.training,
            out_dropout_mask,
            x.device,
        )
        return attn_keep, out_keep

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        padding: torch.Tensor | None,
        attn_keep: torch.Tensor | None,
        out_keep: torch.Tensor | None,
    ) -> torch.Tensor:
        """q (B, H, N, D), k and v (B, H, M, D) -> out (B, N, C)."""
        heads = attention(
            q,
            k,
            v,
            causal=causal,
            key_padding_mask=padding,
            dropout_p=self.attn_drop if self.training else 0.0,
            dropout_mask=attn_keep,
            backend=self.backend,
        )  # (B, H, N, D)
        proj = self.Wo(merge_heads(heads))  # (B, H, N, D) -> (B, N, H*D) -> (B, N, C)
        return dropout(proj, self.out_drop, out_keep, self.training)

    def _self_attend(
        self,
        x: Any,
        mask: Any,
        *,
        causal: bool,
        attn_dropout_mask: Any,
        out_dropout_mask: Any,
        context_size: int | None = None,
    ) -> torch.Tensor:
        """Self-attention through one Wqkv: the forward shared by the three self layers."""
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.Wqkv.weight.dtype)
        b, n, _ = x.shape
        if context_size is not None and n > context_size:
            raise ValueError(
                f"x has N = {n} tokens (shape {tuple(x.shape)}) but context_size is {context_size}"
            )
        padding = _padding_mask(mask, b, n, x.device)
        attn_keep, out_keep = self._keep_masks(x, n, attn_dropout_mask, out_dropout_mask)
        qkv = self.Wqkv(x)  # (B, N, C) -> (B, N, 3*H*D)
        q, k, v = split_projection(qkv, 3, self.num_heads)  # 3 x (B, H, N, D)
        return self._attend(
            q, k, v, causal=causal, padding=padding, attn_keep=attn_keep, out_keep=out_keep
        )


# -- the four layers --------------------------------------------------------------------------


class SingleHeadAttention(_FusedAttention):
    """One bidirectional head of width C // 4 through a fused projection, without dropout.

    Parameters: ``Wqkv`` = Linear(C, 3 * (C // 4)), rows [query; key; value]; ``Wo`` =
    Linear(C // 4, C). Both carry a bias when ``bias`` is True.
    """

    def __init__(self, hidden_size: int, bias: bool = True, *, backend: str = "auto") -> None:
        super().__init__(hidden_size, 1, 0.0, 0.0, backend)
        if self.hidden_size % 4 != 0:
            raise ValueError(f"hidden_size must be a multiple of 4, got {hidden_size}")
        width = self.hidden_size // 4
        self.Wqkv = Linear(self.hidden_size, 3 * width, bias=bias)
        self.Wo = Linear(width, self.hidden_size, bias=bias)

    def forward(
        self, x: torch.Tensor, *, attn_dropout_mask: Any = None, out_dropout_mask: Any = None
    ) -> torch.Tensor:
        """x (B, N, C) -> (B, N, C), bidirectional. Both masks must be None: no dropout here."""
        for name, value in (
            ("attn_dropout_mask", attn_dropout_mask),
            ("out_dropout_mask", out_dropout_mask),
        ):
            if value is not None:
                raise ValueError(f"SingleHeadAttention has no dropout, so {name} must be None")
        return self._self_attend(
            x, None, causal=False, attn_dropout_mask=None, out_dropout_mask=None
        )

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}"


class BidirectionalAttention(_FusedAttention):
    """Multi-head self-attention where every token sees every non-padding token.

    Parameters: ``Wqkv`` = Linear(C, 3C), rows [query heads; key heads; value heads]; ``Wo`` =
    Linear(C, C).
    """

    causal = False  # CausalSelfAttention: True
    context_size: int | None = None  # CausalSelfAttention: the longest N

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        attn_drop: float = 0.1,
        out_drop: float = 0.1,
        bias: bool = True,
        *,
        backend: str = "auto",
    ) -> None:
        super().__init__(hidden_size, num_heads, attn_drop, out_drop, backend)
        self._check_divisible()
        self.Wqkv = Linear(self.hidden_size, 3 * self.hidden_size, bias=bias)
        self.Wo = Linear(self.hidden_size, self.hidden_size, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        mask: Any = None,
        *,
        attn_dropout_mask: Any = None,
        out_dropout_mask: Any = None,
    ) -> torch.Tensor:
        """Multi-head self-attention (causal for CausalSelfAttention) with an optional key
        padding mask.

        Args:
            x: (B, N, C), with N <= context_size for CausalSelfAttention.
            mask: bool (B, N), True = padding: that token is never attended to. A query whose
                visible keys are all padding gets attention output 0.
            attn_dropout_mask: bool (B, H, N, N), True = kept; train mode with attn_drop > 0 only.
            out_dropout_mask: bool (B, N, C), True = kept; train mode with out_drop > 0 only.

        Returns:
            (B, N, C).
        """
        return self._self_attend(
            x,
            mask,
            causal=self.causal,
            attn_dropout_mask=attn_dropout_mask,
            out_dropout_mask=out_dropout_mask,
            context_size=self.context_size,
        )

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
            f"attn_drop={self.attn_drop}, out_drop={self.out_drop}"
        )


class CausalSelfAttention(BidirectionalAttention):
    """Multi-head self-attention where token i sees tokens j <= i (and no padding).

    Same parameters and forward as ``BidirectionalAttention``; no mask buffer, and N may not
    exceed ``context_size``.
    """

    causal = True

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        context_size: int,
        attn_drop: float = 0.1,
        out_drop: float = 0.1,
        bias: bool = True,
        *,
        backend: str = "auto",
    ) -> None:
        context_size = validation.positive_int("context_size", context_size)
        super().__init__(hidden_size, num_heads, attn_drop, out_drop, bias, backend=backend)
        self.context_size = context_size

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, context_size={self.context_size}"


class CrossAttention(_FusedAttention):
    """Queries from x, keys and values from y (an encoder's output), which may be of another
    length.

    Parameters: ``Wq`` = Linear(C, C); ``Wkv`` = Linear(C, 2C), rows [key heads; value heads];
    ``Wo`` = Linear(C, C). ``causal``: query i sees keys j <= i (top-left, also when N != M).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        attn_drop: float = 0.1,
        out_drop: float = 0.1,
        bias: bool = True,
        causal: bool = False,
        *,
        backend: str = "auto",
    ) -> None:
        super().__init__(hidden_size, num_heads, attn_drop, out_drop, backend)
        self._check_divisible()
        self.causal = validation.flag("causal", causal)
        self.Wq = Linear(self.hidden_size, self.hidden_size, bias=bias)
        self.Wkv = Linear(self.hidden_size, 2 * self.hidden_size, bias=bias)
        self.Wo = Linear(self.hidden_size, self.hidden_size, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: Any = None,
        *,
        attn_dropout_mask: Any = None,
        out_dropout_mask: Any = None,
    ) -> torch.Tensor:
        """Cross-attention from x to y.

        Args:
            x: (B, N, C), the queries' source.
            y: (B, M, C), the keys' and values' source; same B and C as x, any M.
            mask: bool (B, M), True = padding in y.
            attn_dropout_mask: bool (B, H, N, M), True = kept; train mode with attn_drop > 0 only.
            out_dropout_mask: bool (B, N, C), True = kept; train mode with out_drop > 0 only.

        Returns:
            (B, N, C).
        """
        dtype = self.Wq.weight.dtype
        x = validation.layer_input("x", x, self.hidden_size, (3,), dtype)
        y = validation.layer_input("y", y, self.hidden_size, (3,), dtype)
        if x.shape[0] != y.shape[0]:
            raise ValueError(
                f"x and y must share the batch B, got x {tuple(x.shape)} and y {tuple(y.shape)}"
            )
        m = y.shape[1]
        padding = _padding_mask(mask, x.shape[0], m, x.device)
        attn_keep, out_keep = self._keep_masks(x, m, attn_dropout_mask, out_dropout_mask)
        (q,) = split_projection(self.Wq(x), 1, self.num_heads)  # (B, N, C) -> (B, H, N, D)
        k, v = split_projection(self.Wkv(y), 2, self.num_heads)  # (B, M, 2C) -> 2 x (B, H, M, D)
        return self._attend(
            q, k, v, causal=self.causal, padding=padding, attn_keep=attn_keep, out_keep=out_keep
        )

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
            f"attn_drop={self.attn_drop}, out_drop={self.out_drop}, causal={self.causal}"
        )
