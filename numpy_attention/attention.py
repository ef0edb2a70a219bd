"""The book family: the attention layers of chapter 3 of *Build a Large Language Model (From
Scratch)*, each forward beside its hand-derived backward.

SimpleSelfAttention (no weights) -> SelfAttentionV1 (weight matrices) -> SelfAttentionV2 (Linear
layers) -> CausalAttention (causal buffer, attention dropout) -> MultiHeadAttentionWrapper (stacked
heads) -> MultiHeadAttention (split weights, output projection). The math lives in the pure pairs of
``functional`` and ``layers``; the layers hold parameters, call those pairs and keep the last ctx.

Shape legend: B batch, H heads, N sequence length, C = d_in input width, D head width.

Derivation: docs/derivations/self-attention.md and docs/derivations/multi-head.md.
Tests: tests/numpy_attention/test_attention.py (oracle, gradcheck, the book's transfers, errors);
with every layer's Module contract in test_module.py and its module file in test_state.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import masks, validation
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
from .layers import Linear, dropout_keep_mask
from .module import Module, ModuleList


def _causal_input(
    layer: CausalAttention | MultiHeadAttentionWrapper | MultiHeadAttention,
    x: np.ndarray,
    attn_dropout_mask: np.ndarray | None,
    heads: tuple[int, ...],
) -> tuple[np.ndarray, int, np.ndarray | None]:
    """The checks the three causal layers share: x (B, N, d_in) with N <= context_length, and
    the attention keep-mask (B, *heads, N, N), given, drawn in train mode, or None.

    Returns:
        x, N and the keep-mask.
    """
    x = validation.layer_input("x", x, layer.d_in, (3,), layer.dtype)
    n = x.shape[1]
    if n > layer.context_length:
        raise ValueError(
            f"x has N = {n} tokens (shape {x.shape}), more than context_length = "
            f"{layer.context_length}"
        )
    shape = (x.shape[0], *heads, n, n)
    keep = dropout_keep_mask(
        "attn_dropout_mask", layer.dropout_p, shape, layer.training, attn_dropout_mask, layer.rng
    )
    return x, n, keep


# -- weight-free self-attention ---------------------------------------------------------------


class SimpleSelfAttention(Module):
    """Attention with no weights: x is query, key and value, and the scores are unscaled.

    out = softmax(x x^T) x, for x (N, C) or (B, N, C).
    """

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (N, C) or (B, N, C) -> out of the same shape."""
        x = validation.float_array("x", x)
        if x.ndim not in (2, 3):
            raise ValueError(f"x must have rank 2 or 3, (N, C) or (B, N, C), got shape {x.shape}")
        result = attention_forward(x, x, x, scale=1.0)
        self._save_ctx(result.ctx, result.out)
        return result.out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """x feeds query, key and value, so its gradient is the sum of three paths.

        S = X X^T; P = softmax(S); O = P X  ->  dxq = dS X;  dxk = dS^T X;  dxv = P^T dO;
        dx = dxq + dxk + dxv. Derivation: docs/derivations/self-attention.md.
        """
        grads = attention_backward(*self._pop_ctx(dout))
        return grads.dq + grads.dk + grads.dv  # dxq + dxk + dxv


# -- self-attention with weight matrices ------------------------------------------------------


class ProjectionCtx(NamedTuple):
    x: np.ndarray  # (..., N, C)
    weight: np.ndarray  # (C, D)


def projection_forward(x: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, ProjectionCtx]:
    """y = x W with the book's V1 layout: weight (C, D), no bias."""
    out = x @ weight  # (..., N, C) @ (C, D) -> (..., N, D)
    return out, ProjectionCtx(x, weight)


def projection_backward(dout: np.ndarray, ctx: ProjectionCtx) -> tuple[np.ndarray, np.ndarray]:
    """dx = dy W^T;  dW = x^T dy, summed over every leading axis.

    Derivation: docs/derivations/self-attention.md (V1 vs V2).

    Returns:
        dx (..., N, C) and dweight (C, D).
    """
    x, weight = ctx
    dx = dout @ weight.T  # (..., N, D) @ (D, C) -> (..., N, C)
    flat_x = x.reshape(-1, x.shape[-1])  # (..., N, C) -> (R, C)
    flat_dout = dout.reshape(-1, dout.shape[-1])  # (..., N, D) -> (R, D)
    dweight = flat_x.T @ flat_dout  # (C, R) @ (R, D) -> (C, D)
    return dx, dweight


class SelfAttentionV1Ctx(NamedTuple):
    query: ProjectionCtx
    key: ProjectionCtx
    value: ProjectionCtx
    attn: AttentionCtx


class SelfAttentionV1(Module):
    """Scaled self-attention with weight matrices ``W_query, W_key, W_value`` of shape (C, D).

    Initialised like the book's ``torch.rand``: uniform in [0, 1), float32, drawn from ``rng`` in
    the order W_query, W_key, W_value. Scale 1/sqrt(d_out); no mask.
    """

    def __init__(
        self, d_in: int, d_out: int, *, rng: np.random.Generator | int | None = None
    ) -> None:
        super().__init__()
        self.d_in = validation.positive_int("d_in", d_in)
        self.d_out = validation.positive_int("d_out", d_out)
        rng = np.random.default_rng(rng)
        for name in ("W_query", "W_key", "W_value"):
            self.register_parameter(name, rng.random((d_in, d_out)).astype(np.float32))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (N, d_in) or (B, N, d_in) -> out (N, d_out) or (B, N, d_out)."""
        x = validation.layer_input("x", x, self.d_in, (2, 3), self.dtype)
        q, q_ctx = projection_forward(x, self.W_query)  # (..., N, C) -> (..., N, D)
        k, k_ctx = projection_forward(x, self.W_key)
        v, v_ctx = projection_forward(x, self.W_value)
        attn = attention_forward(q, k, v)
        self._save_ctx(SelfAttentionV1Ctx(q_ctx, k_ctx, v_ctx, attn.ctx), attn.out)
        return attn.out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Q = X W_q, K = X W_k, V = X W_v, O = attention(Q, K, V), walked in reverse:

        dQ, dK, dV = attention_backward(dO);  dW_q = X^T dQ (likewise dW_k, dW_v);
        dx = dQ W_q^T + dK W_k^T + dV W_v^T. Derivation: docs/derivations/self-attention.md.
        """
        dout, (q_ctx, k_ctx, v_ctx, attn_ctx) = self._pop_ctx(dout)
        grads = attention_backward(dout, attn_ctx)
        dxq, dw_query = projection_backward(grads.dq, q_ctx)
        dxk, dw_key = projection_backward(grads.dk, k_ctx)
        dxv, dw_value = projection_backward(grads.dv, v_ctx)
        self._accumulate("W_query", dw_query)
        self._accumulate("W_key", dw_key)
        self._accumulate("W_value", dw_value)
        return dxq + dxk + dxv


# -- self-attention with Linear layers --------------------------------------------------------


class SelfAttentionV2(Module):
    """V1 with ``Linear(d_in, d_out, bias=qkv_bias)`` projections; weights are V1's transposed."""

    def __init__(
        self,
        d_in: int,
        d_out: int,
        qkv_bias: bool = False,
        *,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        self.d_in = validation.positive_int("d_in", d_in)
        self.d_out = validation.positive_int("d_out", d_out)
        rng = np.random.default_rng(rng)
        self.W_query = Linear(d_in, d_out, bias=qkv_bias, rng=rng)
        self.W_key = Linear(d_in, d_out, bias=qkv_bias, rng=rng)
        self.W_value = Linear(d_in, d_out, bias=qkv_bias, rng=rng)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (N, d_in) or (B, N, d_in) -> out (N, d_out) or (B, N, d_out)."""
        x = validation.layer_input("x", x, self.d_in, (2, 3), self.dtype)
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)  # (..., N, C) -> (..., N, D)
        attn = attention_forward(q, k, v)
        self._save_ctx(attn.ctx, attn.out)
        return attn.out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dQ, dK, dV = attention_backward(dO); each Linear adds dW = dQ^T X (V1's X^T dQ
        transposed); dx = dxq + dxk + dxv. Derivation: docs/derivations/self-attention.md.
        """
        grads = attention_backward(*self._pop_ctx(dout))
        dxq = self.W_query.backward(grads.dq)
        dxk = self.W_key.backward(grads.dk)
        dxv = self.W_value.backward(grads.dv)
        return dxq + dxk + dxv


# -- causal attention with dropout ------------------------------------------------------------


class CausalAttention(SelfAttentionV2):
    """V2 plus the book's causal buffer and dropout on the attention weights; V2's backward.

    ``mask`` is a persistent float32 buffer triu(ones(L, L), diagonal=1), 1 = masked, exactly the
    book's, so torch state dicts load; forward uses ``mask[:N, :N]``, and ``load_state_dict``
    accepts only that triangle. ``dropout`` is the probability of dropping an attention weight
    in train mode.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        qkv_bias: bool = False,
        *,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        generator = np.random.default_rng(rng)
        super().__init__(d_in, d_out, qkv_bias, rng=generator)  # it draws the weights first,
        self.rng = generator  # then the keep-masks of dropout
        self.context_length = validation.positive_int("context_length", context_length)
        self.dropout_p = validation.dropout_p(dropout, "dropout")
        self.register_buffer(
            "mask", masks.causal_buffer(context_length), check=masks.check_causal_buffer
        )

    def forward(self, x: np.ndarray, attn_dropout_mask: np.ndarray | None = None) -> np.ndarray:
        """x (B, N, d_in) -> out (B, N, d_out), N <= context_length.

        Args:
            x: (B, N, d_in) input.
            attn_dropout_mask: bool (B, N, N) keep-mask (True = kept), train mode and dropout > 0
                only. Without it, train mode draws one from the layer's generator.
        """
        x, n, keep = _causal_input(self, x, attn_dropout_mask, heads=())
        allowed = self.mask[:n, :n] == 0  # (N, N), True = may attend
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)  # (B, N, C) -> (B, N, D)
        p = 0.0 if keep is None else self.dropout_p  # no keep-mask: dropout is the identity
        attn = attention_forward(q, k, v, attn_mask=allowed, dropout_p=p, dropout_mask=keep)
        self._save_ctx(attn.ctx, attn.out)
        return attn.out

    # backward: V2's. Masked and dropped weights carry no gradient (attention_backward handles
    # both). Derivation: docs/derivations/self-attention.md.


# -- multi-head attention ---------------------------------------------------------------------


class MultiHeadAttentionWrapper(Module):
    """``num_heads`` independent CausalAttention heads, outputs concatenated on the last axis.

    Every head has width d_out, so the output is (B, N, num_heads * d_out). Heads are built in
    order from one shared generator, as torch's ModuleList builds them.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        *,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        self.d_in = validation.positive_int("d_in", d_in)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        self.context_length = validation.positive_int("context_length", context_length)
        self.dropout_p = validation.dropout_p(dropout, "dropout")
        self.rng = np.random.default_rng(rng)
        self.heads = ModuleList(
            [
                CausalAttention(d_in, d_out, context_length, dropout, qkv_bias, rng=self.rng)
                for _ in range(num_heads)
            ]
        )

    def forward(self, x: np.ndarray, attn_dropout_mask: np.ndarray | None = None) -> np.ndarray:
        """x (B, N, d_in) -> out (B, N, num_heads * d_out).

        Args:
            x: (B, N, d_in) input.
            attn_dropout_mask: bool (B, H, N, N) keep-mask; head h uses ``[:, h]``. Without it,
                train mode draws one from the layer's generator.
        """
        x, n, keep = _causal_input(self, x, attn_dropout_mask, heads=(self.num_heads,))
        outs = [head(x, None if keep is None else keep[:, h]) for h, head in enumerate(self.heads)]
        out = np.concatenate(outs, axis=-1)  # H x (B, N, D) -> (B, N, H*D)
        self._save_ctx(None, out)  # the heads keep their own contexts
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Concatenation routes each slice of dO back to its head; x feeds every head, so
        dx = sum over h of head_h.backward(dO[..., h*D:(h+1)*D]).
        Derivation: docs/derivations/multi-head.md.
        """
        dout, _ = self._pop_ctx(dout)
        douts = np.split(dout, self.num_heads, axis=-1)  # (B, N, H*D) -> H x (B, N, D)
        dxs = [head.backward(dout_h) for head, dout_h in zip(self.heads, douts, strict=True)]
        return np.sum(dxs, axis=0)  # H x (B, N, d_in) -> (B, N, d_in)


class MultiHeadAttentionCtx(NamedTuple):
    split: HeadsCtx  # how q, k and v were split into heads
    attn: AttentionCtx
    merge: HeadsCtx


class MultiHeadAttention(Module):
    """Causal multi-head attention with split weights: one projection per role, cut into heads.

    Q = x W_q^T (likewise K, V), each (B, N, d_out) -> (B, H, N, D) with D = d_out // num_heads
    (head h takes columns h*D:(h+1)*D); causal attention per head with the book's ``mask`` buffer
    and attention dropout; heads merged back to (B, N, d_out); then ``out_proj`` (with bias).
    Parameters are drawn in the order W_query, W_key, W_value, out_proj.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        *,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        self.d_in = validation.positive_int("d_in", d_in)
        self.d_out = validation.positive_int("d_out", d_out)
        self.context_length = validation.positive_int("context_length", context_length)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        if d_out % num_heads != 0:
            raise ValueError(f"d_out = {d_out} must be divisible by num_heads = {num_heads}")
        self.head_dim = d_out // num_heads
        self.dropout_p = validation.dropout_p(dropout, "dropout")
        self.rng = np.random.default_rng(rng)
        self.W_query = Linear(d_in, d_out, bias=qkv_bias, rng=self.rng)
        self.W_key = Linear(d_in, d_out, bias=qkv_bias, rng=self.rng)
        self.W_value = Linear(d_in, d_out, bias=qkv_bias, rng=self.rng)
        self.out_proj = Linear(d_out, d_out, rng=self.rng)
        self.register_buffer(
            "mask", masks.causal_buffer(context_length), check=masks.check_causal_buffer
        )

    def forward(self, x: np.ndarray, attn_dropout_mask: np.ndarray | None = None) -> np.ndarray:
        """x (B, N, d_in) -> out (B, N, d_out).

        Args:
            x: (B, N, d_in) input.
            attn_dropout_mask: bool (B, H, N, N) keep-mask (True = kept), train mode and
                dropout > 0 only. Without it, train mode draws one from the layer's generator.
        """
        x, n, keep = _causal_input(self, x, attn_dropout_mask, heads=(self.num_heads,))
        allowed = self.mask[:n, :n] == 0  # (N, N), True = may attend
        q, split_ctx = split_heads_forward(self.W_query(x), self.num_heads)  # -> (B, H, N, D)
        k, _ = split_heads_forward(self.W_key(x), self.num_heads)  # -> (B, H, N, D)
        v, _ = split_heads_forward(self.W_value(x), self.num_heads)  # -> (B, H, N, D)
        p = 0.0 if keep is None else self.dropout_p  # no keep-mask: dropout is the identity
        attn = attention_forward(q, k, v, attn_mask=allowed, dropout_p=p, dropout_mask=keep)
        merged, merge_ctx = merge_heads_forward(attn.out)  # (B, H, N, D) -> (B, N, d_out)
        out = self.out_proj(merged)
        self._save_ctx(MultiHeadAttentionCtx(split_ctx, attn.ctx, merge_ctx), out)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """The forward in reverse: out_proj, merge (its gradient is a split), attention, split
        (its gradient is a merge), projections; x feeds all three, so dx = dxq + dxk + dxv.
        Derivation: docs/derivations/multi-head.md.
        """
        dout, (split_ctx, attn_ctx, merge_ctx) = self._pop_ctx(dout)
        dmerged = self.out_proj.backward(dout)  # (B, N, d_out)
        dheads = merge_heads_backward(dmerged, merge_ctx)  # (B, N, d_out) -> (B, H, N, D)
        grads = attention_backward(dheads, attn_ctx)
        dq = split_heads_backward(grads.dq, split_ctx)  # (B, H, N, D) -> (B, N, d_out)
        dk = split_heads_backward(grads.dk, split_ctx)  # (B, H, N, D) -> (B, N, d_out)
        dv = split_heads_backward(grads.dv, split_ctx)  # (B, H, N, D) -> (B, N, d_out)
        dxq = self.W_query.backward(dq)
        dxk = self.W_key.backward(dk)
        dxv = self.W_value.backward(dv)
        return dxq + dxk + dxv
