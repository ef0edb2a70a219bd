"""The fused-QKV family: one projection makes queries, keys and values, as in the blog post on the
three flavours of attention (single head, bidirectional, causal, cross).

Shape legend: B batch, H heads, N query length, M key/value length, C model width
(``hidden_size``), D head width (C // H; C // 4 for the single head).

Every layer runs ``x -> Wqkv -> split into q, k, v and heads -> attention -> merge heads -> Wo ->
output dropout``, and its backward walks that chain in reverse through the parts' own backwards.
Row layout of the fused projections, as in ``nn.MultiheadAttention``'s ``in_proj_weight``: Wqkv
rows are [all query heads, all key heads, all value heads], Wkv rows [all key heads, all value
heads], and head h of a block is its rows h*D:(h+1)*D.

Derivation: docs/derivations/fused-qkv.md and docs/derivations/cross-attention.md.
Tests: tests/numpy_attention/test_fused.py (oracle, gradcheck, masks, dropout, dtypes, errors);
the Module contract of each layer in test_module.py, its module file in test_state.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation
from .functional import (
    AttentionCtx,
    HeadsCtx,
    attention_backward,
    attention_forward,
    merge_heads_backward,
    merge_heads_forward,
    split_heads_backward,
    split_heads_forward,
)
from .layers import DropoutCtx, Linear, dropout_backward, dropout_forward, dropout_keep_mask
from .module import Module

# -- the fused projection split into q, k, v and heads ----------------------------------------


def split_projection_forward(
    proj: np.ndarray, parts: int, num_heads: int
) -> tuple[list[np.ndarray], HeadsCtx]:
    """Cut a fused projection into ``parts`` blocks along the last axis, each split into heads.

    Args:
        proj: (B, N, parts*C), e.g. the output of Wqkv (parts = 3) or Wkv (parts = 2).
        parts: how many equal blocks the last axis holds, in order (q, k, v or k, v).
        num_heads: H; head h of a block is its columns h*D:(h+1)*D.

    Returns:
        ``parts`` arrays (B, H, N, D), and the ctx for ``split_projection_backward``.
    """
    blocks = np.split(proj, parts, axis=-1)  # (B, N, parts*C) -> parts x (B, N, C)
    heads = [split_heads_forward(block, num_heads)[0] for block in blocks]  # -> (B, H, N, D)
    return heads, HeadsCtx(num_heads)


def split_projection_backward(dheads: list[np.ndarray], ctx: HeadsCtx) -> np.ndarray:
    """Slicing only re-indexes, so each block's gradient goes back to its own columns:
    dproj = [dq | dk | dv], the blocks' gradients (heads merged) side by side."""
    dblocks = [split_heads_backward(dblock, ctx) for dblock in dheads]  # (B, H, N, D) -> (B, N, C)
    return np.concatenate(dblocks, axis=-1)  # parts x (B, N, C) -> (B, N, parts*C)


# -- shared pieces of the layers --------------------------------------------------------------


class _OutputCtx(NamedTuple):
    attn: AttentionCtx
    heads: HeadsCtx
    out_dropout: DropoutCtx


def _padding_mask(mask: Any, batch: int, length: int) -> np.ndarray | None:
    """The key padding mask checked as bool (B, M), True = padding (None passes through)."""
    if mask is None:
        return None
    mask = validation.bool_array("mask", mask)
    if mask.shape != (batch, length):
        raise ValueError(
            f"mask is the key padding mask (B, M) = ({batch}, {length}), True = padding; "
            f"got shape {mask.shape}"
        )
    return mask


class _FusedAttention(Module):
    """Holds what every fused layer shares: heads, dropout probabilities and the generator that
    draws keep-masks, plus the tail ``attention -> merge heads -> Wo -> output dropout``."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        attn_drop: float,
        out_drop: float,
        rng: np.random.Generator | int | None,
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})"
            )
        self.attn_drop = validation.dropout_p(attn_drop, "attn_drop")
        self.out_drop = validation.dropout_p(out_drop, "out_drop")
        self.rng = np.random.default_rng(rng)

    def _keep_masks(
        self, b: int, n: int, m: int, attn_dropout_mask: Any, out_dropout_mask: Any
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The attention (B, H, N, M) and output (B, N, C) keep-masks: given, drawn, or None."""
        attn_keep = dropout_keep_mask(
            "attn_dropout_mask",
            self.attn_drop,
            (b, self.num_heads, n, m),
            self.training,
            attn_dropout_mask,
            self.rng,
        )
        out_keep = dropout_keep_mask(
            "out_dropout_mask",
            self.out_drop,
            (b, n, self.hidden_size),
            self.training,
            out_dropout_mask,
            self.rng,
        )
        return attn_keep, out_keep

    def _attend_forward(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        *,
        causal: bool,
        padding: np.ndarray | None,
        attn_keep: np.ndarray | None,
        out_keep: np.ndarray | None,
    ) -> tuple[np.ndarray, _OutputCtx]:
        """q (B, H, N, D), k and v (B, H, M, D) -> out (B, N, C)."""
        attn = attention_forward(
            q,
            k,
            v,
            causal=causal,
            key_padding_mask=padding,
            dropout_p=0.0 if attn_keep is None else self.attn_drop,
            dropout_mask=attn_keep,
        )  # (B, H, N, D)
        merged, heads_ctx = merge_heads_forward(attn.out)  # (B, H, N, D) -> (B, N, H*D)
        proj = self.Wo(merged)  # (B, N, H*D) -> (B, N, C)
        out, drop_ctx = dropout_forward(proj, self.out_drop, out_keep)
        return out, _OutputCtx(attn.ctx, heads_ctx, drop_ctx)

    def _attend_backward(
        self, dout: np.ndarray, ctx: _OutputCtx
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """dout (B, N, C), checked by ``_pop_ctx`` -> dq (B, H, N, D), dk and dv (B, H, M, D);
        adds Wo's gradients."""
        dproj = dropout_backward(dout, ctx.out_dropout)  # dproj = dout * keep / (1 - p)
        dmerged = self.Wo.backward(dproj)  # (B, N, C) -> (B, N, H*D)
        dheads = merge_heads_backward(dmerged, ctx.heads)  # (B, N, H*D) -> (B, H, N, D)
        grads = attention_backward(dheads, ctx.attn)
        return grads.dq, grads.dk, grads.dv


class _FusedSelfAttention(_FusedAttention):
    """Self-attention through one Wqkv: the forward/backward shared by the three self layers.
    ``causal`` and ``context_size`` (the longest N accepted) are set by the causal layer."""

    causal = False
    context_size: int | None = None

    def _self_forward(
        self, x: Any, mask: Any, *, attn_dropout_mask: Any, out_dropout_mask: Any
    ) -> np.ndarray:
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.dtype)
        b, n, _ = x.shape
        if self.context_size is not None and n > self.context_size:
            raise ValueError(
                f"x has N = {n} tokens (shape {x.shape}) but context_size is {self.context_size}"
            )
        padding = _padding_mask(mask, b, n)
        attn_keep, out_keep = self._keep_masks(b, n, n, attn_dropout_mask, out_dropout_mask)

        qkv = self.Wqkv(x)  # (B, N, C) -> (B, N, 3*H*D)
        (q, k, v), split_ctx = split_projection_forward(qkv, 3, self.num_heads)  # 3 x (B, H, N, D)
        out, out_ctx = self._attend_forward(
            q, k, v, causal=self.causal, padding=padding, attn_keep=attn_keep, out_keep=out_keep
        )
        self._save_ctx((split_ctx, out_ctx), out)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Gradient of x; adds the gradients of Wqkv and Wo.

        Y = dropout(Wo(merge(attention(Q, K, V)))) with [Q | K | V] = split(Wqkv(X)):
        dQ, dK, dV = attention_backward(merge^T(Wo^T(dropout^T(dY))));
        dWqkv = the three blocks' gradients stacked as rows [dWq; dWk; dWv];  dX = [dQ|dK|dV] Wqkv.
        Derivation: docs/derivations/fused-qkv.md.

        Args:
            dout: (B, N, C) gradient of the output.

        Returns:
            dx (B, N, C).
        """
        dout, (split_ctx, out_ctx) = self._pop_ctx(dout)
        dq, dk, dv = self._attend_backward(dout, out_ctx)  # 3 x (B, H, N, D)
        dqkv = split_projection_backward([dq, dk, dv], split_ctx)  # -> (B, N, 3*H*D)
        return self.Wqkv.backward(dqkv)  # (B, N, 3*H*D) -> (B, N, C)


# -- the four layers --------------------------------------------------------------------------


class SingleHeadAttention(_FusedSelfAttention):
    """One bidirectional head of width C // 4 through a fused projection, without dropout.

    Parameters: ``Wqkv`` = Linear(C, 3 * (C // 4)), rows [query; key; value]; ``Wo`` =
    Linear(C // 4, C). Both carry a bias when ``bias`` is True.

    Args:
        hidden_size: C, a multiple of 4.
        bias: whether Wqkv and Wo have biases.
        rng: generator or seed for the parameters (Wqkv first, then Wo).
    """

    def __init__(
        self, hidden_size: int, bias: bool = True, *, rng: np.random.Generator | int | None = None
    ) -> None:
        super().__init__(hidden_size, 1, 0.0, 0.0, rng)
        if self.hidden_size % 4 != 0:
            raise ValueError(f"hidden_size must be a multiple of 4, got {hidden_size}")
        width = self.hidden_size // 4
        self.Wqkv = Linear(self.hidden_size, 3 * width, bias=bias, rng=self.rng)
        self.Wo = Linear(width, self.hidden_size, bias=bias, rng=self.rng)

    def forward(
        self,
        x: np.ndarray,
        *,
        attn_dropout_mask: np.ndarray | None = None,
        out_dropout_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Bidirectional single-head attention.

        Args:
            x: (B, N, C).
            attn_dropout_mask: must be None: this layer has no dropout.
            out_dropout_mask: must be None: this layer has no dropout.

        Returns:
            (B, N, C).
        """
        for name, value in (
            ("attn_dropout_mask", attn_dropout_mask),
            ("out_dropout_mask", out_dropout_mask),
        ):
            if value is not None:
                raise ValueError(f"SingleHeadAttention has no dropout, so {name} must be None")
        return self._self_forward(x, None, attn_dropout_mask=None, out_dropout_mask=None)


class BidirectionalAttention(_FusedSelfAttention):
    """Multi-head self-attention where every token sees every non-padding token.

    Parameters: ``Wqkv`` = Linear(C, 3C), rows [query heads; key heads; value heads]; ``Wo`` =
    Linear(C, C).

    Args:
        hidden_size: C, a multiple of ``num_heads``.
        num_heads: H; head width D = C // H.
        attn_drop: dropout probability on the attention weights, in [0, 1).
        out_drop: dropout probability on Wo's output, in [0, 1).
        bias: whether Wqkv and Wo have biases.
        rng: generator or seed for the parameters and the keep-masks drawn in train mode.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        attn_drop: float = 0.1,
        out_drop: float = 0.1,
        bias: bool = True,
        *,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__(hidden_size, num_heads, attn_drop, out_drop, rng)
        self.Wqkv = Linear(self.hidden_size, 3 * self.hidden_size, bias=bias, rng=self.rng)
        self.Wo = Linear(self.hidden_size, self.hidden_size, bias=bias, rng=self.rng)

    def forward(
        self,
        x: np.ndarray,
        mask: np.ndarray | None = None,
        *,
        attn_dropout_mask: np.ndarray | None = None,
        out_dropout_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Multi-head self-attention with an optional key padding mask; causal (top-left
        aligned) in ``CausalSelfAttention``, where both masks apply.

        Args:
            x: (B, N, C), N <= context_size in ``CausalSelfAttention``.
            mask: bool (B, N), True = padding: that token is never attended to. A query whose
                visible keys are all padding gets attention output 0, so its output is Wo's bias
                (before output dropout).
            attn_dropout_mask: bool (B, H, N, N), True = kept; train mode with attn_drop > 0 only.
            out_dropout_mask: bool (B, N, C), True = kept; train mode with out_drop > 0 only.

        Returns:
            (B, N, C).
        """
        return self._self_forward(
            x, mask, attn_dropout_mask=attn_dropout_mask, out_dropout_mask=out_dropout_mask
        )


class CausalSelfAttention(BidirectionalAttention):
    """Multi-head self-attention where token i sees tokens j <= i (and no padding).

    Same parameters, arguments and forward as ``BidirectionalAttention``, plus ``context_size``,
    the longest sequence accepted. No mask buffer: the causal mask is built for each N (top-left
    aligned).
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
        rng: np.random.Generator | int | None = None,
    ) -> None:
        context_size = validation.positive_int("context_size", context_size)
        super().__init__(hidden_size, num_heads, attn_drop, out_drop, bias, rng=rng)
        self.context_size = context_size

    # forward: BidirectionalAttention's, which reads ``causal`` and ``context_size``.


class CrossAttention(_FusedAttention):
    """Queries from x, keys and values from y (an encoder's output), which may be of another
    length.

    Parameters: ``Wq`` = Linear(C, C); ``Wkv`` = Linear(C, 2C), rows [key heads; value heads];
    ``Wo`` = Linear(C, C).

    Args:
        hidden_size: C, a multiple of ``num_heads``.
        num_heads: H; head width D = C // H.
        attn_drop: dropout probability on the attention weights, in [0, 1).
        out_drop: dropout probability on Wo's output, in [0, 1).
        bias: whether Wq, Wkv and Wo have biases.
        causal: query i sees keys j <= i (top-left aligned, also when N != M).
        rng: generator or seed for the parameters and the keep-masks drawn in train mode.
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
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__(hidden_size, num_heads, attn_drop, out_drop, rng)
        self.causal = validation.flag("causal", causal)
        self.Wq = Linear(self.hidden_size, self.hidden_size, bias=bias, rng=self.rng)
        self.Wkv = Linear(self.hidden_size, 2 * self.hidden_size, bias=bias, rng=self.rng)
        self.Wo = Linear(self.hidden_size, self.hidden_size, bias=bias, rng=self.rng)

    def forward(
        self,
        x: np.ndarray,
        y: np.ndarray,
        mask: np.ndarray | None = None,
        *,
        attn_dropout_mask: np.ndarray | None = None,
        out_dropout_mask: np.ndarray | None = None,
    ) -> np.ndarray:
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
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.dtype)
        y = validation.layer_input("y", y, self.hidden_size, (3,), self.dtype)
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x and y must share the batch B, got x {x.shape} and y {y.shape}")
        b, n, _ = x.shape
        m = y.shape[1]
        padding = _padding_mask(mask, b, m)
        attn_keep, out_keep = self._keep_masks(b, n, m, attn_dropout_mask, out_dropout_mask)

        (q,), q_ctx = split_projection_forward(self.Wq(x), 1, self.num_heads)  # (B, H, N, D)
        (k, v), kv_ctx = split_projection_forward(self.Wkv(y), 2, self.num_heads)  # (B, H, M, D)
        out, out_ctx = self._attend_forward(
            q, k, v, causal=self.causal, padding=padding, attn_keep=attn_keep, out_keep=out_keep
        )
        self._save_ctx((q_ctx, kv_ctx, out_ctx), out)
        return out

    def backward(self, dout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gradients of x and y; adds the gradients of Wq, Wkv and Wo.

        Q = Wq(X) feeds only the queries, [K | V] = Wkv(Y) only the keys and values, so
        dX = dQ Wq  (through the query path alone)  and  dY = [dK | dV] Wkv = dK Wk + dV Wv
        (the key path and the value path summed); dWkv = [dWk; dWv] stacked by rows.
        Derivation: docs/derivations/cross-attention.md.

        Args:
            dout: (B, N, C) gradient of the output.

        Returns:
            dx (B, N, C) and dy (B, M, C).
        """
        dout, (q_ctx, kv_ctx, out_ctx) = self._pop_ctx(dout)
        dq, dk, dv = self._attend_backward(dout, out_ctx)  # (B, H, N, D), 2 x (B, H, M, D)
        dx = self.Wq.backward(split_projection_backward([dq], q_ctx))  # (B, N, C)
        dy = self.Wkv.backward(
            split_projection_backward([dk, dv], kv_ctx)
        )  # (B, M, 2C) -> (B, M, C)
        return dx, dy
