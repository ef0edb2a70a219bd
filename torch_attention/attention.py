"""The book family in torch: the attention layers of chapter 3 of *Build a Large Language Model
(From Scratch)*, twins of ``numpy_attention.attention``.

SimpleSelfAttention (no weights) -> SelfAttentionV1 (weight matrices) -> SelfAttentionV2 (Linear
layers) -> CausalAttention (causal buffer, attention dropout) -> MultiHeadAttentionWrapper (stacked
heads) -> MultiHeadAttention (split weights, output projection). Parameters are created in the
book's order, so ``torch.manual_seed(123)`` reproduces the book's numbers. Every layer takes a
keyword ``backend`` passed to ``functional.attention``. Loading a ``mask`` buffer that is not
the causal triangle is a ``ValueError`` (``masks.check_causal_buffer``, registered as the buffer's
check, which ``module.Module`` runs before anything is loaded), as in NumPy.

Shape legend: B batch, H heads, N sequence length, C = d_in input width, D head width.

Derivation: docs/derivations/self-attention.md, docs/derivations/multi-head.md (backward by
autograd here; the pages derive the NumPy twins' hand-written ones).
Tests: tests/torch_attention/test_attention.py.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import masks, validation
from .functional import attention, check_backend, merge_heads, split_heads
from .layers import Linear, dropout_keep_mask
from .module import Module


def _param_dtype(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


class _CausalLayer(Module):
    """What the causal layers share: their checked sizes and the checks of their input and
    keep-mask."""

    mask: torch.Tensor  # the book's causal buffer (CausalAttention, MultiHeadAttention)

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, backend: str
    ) -> None:
        super().__init__()
        self.d_in = validation.positive_int("d_in", d_in)
        self.d_out = validation.positive_int("d_out", d_out)
        self.context_length = validation.positive_int("context_length", context_length)
        self.dropout_p = validation.dropout_p(dropout, "dropout")
        self.backend = check_backend(backend)

    def _checked_input(
        self, x: Any, attn_dropout_mask: Any, heads: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x checked as (B, N, d_in) with N <= context_length, and the explicit attention
        keep-mask checked as (B, *heads, N, N) (None when none is given)."""
        x = validation.layer_input("x", x, self.d_in, (3,), _param_dtype(self))
        n = x.shape[-2]
        if n > self.context_length:
            raise ValueError(
                f"x has N = {n} tokens (shape {tuple(x.shape)}), more than "
                f"context_length = {self.context_length}"
            )
        keep = dropout_keep_mask(
            "attn_dropout_mask",
            self.dropout_p,
            (x.shape[0], *heads, n, n),
            self.training,
            attn_dropout_mask,
            x.device,
        )
        return x, keep

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention masked by the book's ``mask`` buffer, ``mask[:N, :N]`` (so a loaded buffer
        is honoured), with attention dropout in train mode."""
        n = q.shape[-2]
        allowed = self.mask[:n, :n] == 0  # (N, N), True = may attend
        p = self.dropout_p if self.training else 0.0
        return attention(
            q, k, v, attn_mask=allowed, dropout_p=p, dropout_mask=keep, backend=self.backend
        )


# -- weight-free self-attention ---------------------------------------------------------------


class SimpleSelfAttention(Module):
    """Attention with no weights: x is query, key and value, and the scores are unscaled.

    out = softmax(x x^T) x, for x (N, C) or (B, N, C).
    """

    def __init__(self, *, backend: str = "auto") -> None:
        super().__init__()
        self.backend = check_backend(backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, C) or (B, N, C) -> out of the same shape."""
        x = validation.float_tensor("x", x)
        if x.ndim not in (2, 3):
            raise ValueError(
                f"x must have rank 2 or 3, (N, C) or (B, N, C), got shape {tuple(x.shape)}"
            )
        return attention(x, x, x, scale=1.0, backend=self.backend)


# -- self-attention with weight matrices ------------------------------------------------------


class SelfAttentionV1(Module):
    """Scaled self-attention with weight matrices ``W_query, W_key, W_value`` of shape (C, D).

    Initialised with ``torch.rand`` (uniform [0, 1)) in the order W_query, W_key, W_value.
    Scale 1/sqrt(d_out); no mask.
    """

    def __init__(self, d_in: int, d_out: int, *, backend: str = "auto") -> None:
        super().__init__()
        self.d_in = validation.positive_int("d_in", d_in)
        self.d_out = validation.positive_int("d_out", d_out)
        self.backend = check_backend(backend)
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, d_in) or (B, N, d_in) -> out (N, d_out) or (B, N, d_out)."""
        x = validation.layer_input("x", x, self.d_in, (2, 3), self.W_query.dtype)
        q = x @ self.W_query  # (..., N, C) @ (C, D) -> (..., N, D)
        k = x @ self.W_key  # (..., N, C) @ (C, D) -> (..., N, D)
        v = x @ self.W_value  # (..., N, C) @ (C, D) -> (..., N, D)
        return attention(q, k, v, backend=self.backend)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}"


# -- self-attention with Linear layers --------------------------------------------------------


class SelfAttentionV2(Module):
    """V1 with ``Linear(d_in, d_out, bias=qkv_bias)`` projections; weights are V1's transposed."""

    def __init__(
        self, d_in: int, d_out: int, qkv_bias: bool = False, *, backend: str = "auto"
    ) -> None:
        super().__init__()
        self.d_in = validation.positive_int("d_in", d_in)
        self.d_out = validation.positive_int("d_out", d_out)
        self.backend = check_backend(backend)
        self.W_query = Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, d_in) or (B, N, d_in) -> out (N, d_out) or (B, N, d_out)."""
        x = validation.layer_input("x", x, self.d_in, (2, 3), _param_dtype(self))
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)  # (..., N, C) -> (..., N, D)
        return attention(q, k, v, backend=self.backend)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}"


# -- causal attention with dropout ------------------------------------------------------------


class CausalAttention(_CausalLayer):
    """V2 plus the book's causal buffer and dropout on the attention weights.

    ``mask`` is a persistent float buffer triu(ones(L, L), diagonal=1), 1 = masked, exactly the
    book's; forward uses ``mask[:N, :N]``, so a loaded buffer is honoured (one with a hole, which
    would let the model see future tokens, is refused). ``dropout_p`` is the probability of
    dropping an attention weight in train mode.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        qkv_bias: bool = False,
        *,
        backend: str = "auto",
    ) -> None:
        super().__init__(d_in, d_out, context_length, dropout, backend)
        self.W_query = Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = Linear(d_in, d_out, bias=qkv_bias)
        self.register_buffer(
            "mask", masks.causal_buffer(context_length), check=masks.check_causal_buffer
        )

    def forward(self, x: torch.Tensor, attn_dropout_mask: Any = None) -> torch.Tensor:
        """x (B, N, d_in) -> out (B, N, d_out), N <= context_length.

        Args:
            x: (B, N, d_in) input.
            attn_dropout_mask: bool (B, N, N) keep-mask (True = kept), train mode and dropout > 0
                only. Without it, train mode draws one from torch's generator.
        """
        x, keep = self._checked_input(x, attn_dropout_mask, ())
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)  # (B, N, C) -> (B, N, D)
        return self._attend(q, k, v, keep)

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, context_length={self.context_length}, "
            f"dropout={self.dropout_p}"
        )


# -- multi-head attention ---------------------------------------------------------------------


class MultiHeadAttentionWrapper(_CausalLayer):
    """``num_heads`` independent CausalAttention heads, outputs concatenated on the last axis.

    Every head has width d_out, so the output is (B, N, num_heads * d_out).
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
        backend: str = "auto",
    ) -> None:
        super().__init__(d_in, d_out, context_length, dropout, backend)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        self.heads = nn.ModuleList(
            [
                CausalAttention(d_in, d_out, context_length, dropout, qkv_bias, backend=backend)
                for _ in range(num_heads)
            ]
        )

    def forward(self, x: torch.Tensor, attn_dropout_mask: Any = None) -> torch.Tensor:
        """x (B, N, d_in) -> out (B, N, num_heads * d_out).

        Args:
            x: (B, N, d_in) input.
            attn_dropout_mask: bool (B, H, N, N) keep-mask; head h uses ``[:, h]``. Without it,
                train mode draws one from torch's generator.
        """
        x, keep = self._checked_input(x, attn_dropout_mask, (self.num_heads,))
        outs = [head(x, None if keep is None else keep[:, h]) for h, head in enumerate(self.heads)]
        return torch.cat(outs, dim=-1)  # H x (B, N, D) -> (B, N, H*D)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


class MultiHeadAttention(_CausalLayer):
    """Causal multi-head attention with split weights: one projection per role, cut into heads.

    Q = x W_q^T (likewise K, V), each (B, N, d_out) -> (B, H, N, D) with D = d_out // num_heads
    (head h takes columns h*D:(h+1)*D); causal attention per head with the book's ``mask`` buffer
    and attention dropout; heads merged back to (B, N, d_out); then ``out_proj`` (with bias).
    Parameters are created in the order W_query, W_key, W_value, out_proj.
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
        backend: str = "auto",
    ) -> None:
        super().__init__(d_in, d_out, context_length, dropout, backend)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        if d_out % num_heads != 0:
            raise ValueError(f"d_out = {d_out} must be divisible by num_heads = {num_heads}")
        self.head_dim = d_out // num_heads
        self.W_query = Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = Linear(d_out, d_out)
        self.register_buffer(
            "mask", masks.causal_buffer(context_length), check=masks.check_causal_buffer
        )

    def forward(self, x: torch.Tensor, attn_dropout_mask: Any = None) -> torch.Tensor:
        """x (B, N, d_in) -> out (B, N, d_out).

        Args:
            x: (B, N, d_in) input.
            attn_dropout_mask: bool (B, H, N, N) keep-mask (True = kept), train mode and
                dropout > 0 only. Without it, train mode draws one from torch's generator.
        """
        x, keep = self._checked_input(x, attn_dropout_mask, (self.num_heads,))
        q = split_heads(self.W_query(x), self.num_heads)  # (B, N, d_out) -> (B, H, N, D)
        k = split_heads(self.W_key(x), self.num_heads)  # (B, N, d_out) -> (B, H, N, D)
        v = split_heads(self.W_value(x), self.num_heads)  # (B, N, d_out) -> (B, H, N, D)
        heads = self._attend(q, k, v, keep)  # (B, H, N, D)
        return self.out_proj(merge_heads(heads))  # (B, H, N, D) -> (B, N, d_out) -> (B, N, d_out)

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, context_length={self.context_length}, "
            f"dropout={self.dropout_p}, num_heads={self.num_heads}"
        )
