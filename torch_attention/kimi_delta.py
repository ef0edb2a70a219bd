"""Kimi Delta Attention (KDA) in torch, the twin of ``numpy_attention.kimi_delta``: Kimi Linear's
linear-attention layer (transformers' ``KimiLinearDeltaAttention``), parameters named as there.

Shape legend: B batch, T tokens of this call, C model width, H heads, K head width (keys and
values alike), W the short convolution's width.

The chain (backward by autograd here; the page derives the NumPy twin's):

    q, k, v = split(silu(causal depthwise conv([q_proj(x), k_proj(x), v_proj(x)])))  (B, T, H, K)
    q, k = q / sqrt(|q|^2 + 1e-6), k / sqrt(|k|^2 + 1e-6)
    g = -exp(A_log) * softplus(f_b_proj(f_a_proj(x)) + dt_bias)  softplus(z) = z past 20
    beta = sigmoid(b_proj(x))
    o = kda(q, k, v, g, beta; scale K^-0.5)                          linear_attention.kda
    out = o_proj(merge_heads(rmsnorm(o; o_norm.weight) * sigmoid(g_b_proj(g_a_proj(x)))))

Decoding over a ``LinearStateCache`` or ``PagedLinearStateCache`` (linear_cache.py) as the NumPy
twin does: the convolution's last W-1 inputs and the state S read, used, written back.

Derivation: docs/derivations/kimi-delta-layer.md (the NumPy twin's backward).
Tests: tests/torch_attention/test_kimi_delta.py (against the NumPy twin);
tests/parity/test_hf_kimi_delta.py (against transformers and the NumPy twin).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from numpy_attention.linear_attention import FORMS

from . import validation
from .gate import output_gate
from .layers import Linear
from .linear_attention import kda
from .linear_cache import LinearStateCache, PagedLinearStateCache, padding_keep
from .module import Module
from .norms import RMSNorm, l2norm
from .short_conv import ShortConv

__all__ = ["KimiDeltaAttention", "KimiForgetGate"]

SOFTPLUS_THRESHOLD = 20.0  # softplus(z) = z past it (KimiLinearForgetGate)


class KimiForgetGate(Module):
    """``KimiLinearForgetGate``: g = -exp(A_log) * softplus(f_b_proj(f_a_proj(x)) + dt_bias),
    softplus(z) = z past 20; x (B, T, C) -> g (B, T, H, K). Parameters ``f_a_proj``,
    ``f_b_proj``, ``dt_bias`` (H*K,), ``A_log`` (1, 1, H, 1), initialised as transformers does."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.f_a_proj = Linear(hidden_size, head_dim, bias=False)
        self.f_b_proj = Linear(head_dim, num_heads * head_dim, bias=False)
        dt = torch.empty(num_heads * head_dim).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log = nn.Parameter(torch.empty(1, 1, num_heads, 1).uniform_(1.0, 16.0).log())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.f_b_proj(self.f_a_proj(x))  # (B, T, C) -> (B, T, K) -> (B, T, H*K)
        z = (pre + self.dt_bias).unflatten(-1, (self.num_heads, self.head_dim))  # (B, T, H, K)
        capped = z.clamp(max=SOFTPLUS_THRESHOLD)  # no inf in the branch not taken
        softplus = torch.where(z > SOFTPLUS_THRESHOLD, z, torch.log1p(torch.exp(capped)))
        return -torch.exp(self.A_log) * softplus


class KimiDeltaAttention(Module):
    """Kimi Linear's KDA layer; the NumPy twin's arguments and parameters (its docstring).

    Args:
        hidden_size: C.
        num_heads: H.
        head_dim: K.
        conv_kernel_size: W.
        norm_eps: o_norm's eps.
        form: the core's form, ``"chunk"`` or ``"recurrent"``.
        chunk_size: the core's chunk length.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        *,
        conv_kernel_size: int = 4,
        norm_eps: float = 1e-5,
        form: str = "chunk",
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        self.head_dim = validation.positive_int("head_dim", head_dim)
        self.conv_kernel_size = validation.positive_int("conv_kernel_size", conv_kernel_size)
        norm_eps = validation.finite_real("norm_eps", norm_eps)
        if norm_eps <= 0:
            raise ValueError(f"norm_eps must be > 0, got {norm_eps}")
        if form not in FORMS:
            raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
        self.form = str(form)
        self.chunk_size = validation.positive_int("chunk_size", chunk_size)
        c, h, k = self.hidden_size, self.num_heads, self.head_dim
        self.q_proj = Linear(c, h * k, bias=False)
        self.k_proj = Linear(c, h * k, bias=False)
        self.v_proj = Linear(c, h * k, bias=False)
        self.conv1d = ShortConv(3 * h * k, self.conv_kernel_size)
        self.forget_gate = KimiForgetGate(c, h, k)
        self.b_proj = Linear(c, h, bias=False)
        self.g_a_proj = Linear(c, k, bias=False)
        self.g_b_proj = Linear(k, h * k, bias=False)
        self.o_norm = RMSNorm(k, norm_eps)
        self.o_proj = Linear(h * k, c, bias=False)

    @property
    def conv_dim(self) -> int:
        """The short convolution's channels, 3HK: [q, k, v]."""
        return 3 * self.num_heads * self.head_dim

    def forward(
        self,
        x: torch.Tensor,
        *,
        key_padding_mask: Any = None,
        cache: LinearStateCache | PagedLinearStateCache | None = None,
    ) -> torch.Tensor:
        """The layer over x's tokens, continuing the cache's sequence when one is given.

        Args:
            x: (B, T, C).
            key_padding_mask: bool (B, M), True = padding, M = T or ``cache.length + T``:
                padded tokens' inputs zeroed (transformers' ``apply_mask_to_padding_states``).
            cache: a ``LinearStateCache`` or ``PagedLinearStateCache`` of this layer's B, H, K
                and convolution (3HK channels, width W): read as the initial states, this
                call's final ones written back. Differentiable; the states read are constants.

        Returns:
            (B, T, C).
        """
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.o_proj.weight.dtype)
        batch, tokens, _ = x.shape
        h, k = self.num_heads, self.head_dim
        conv0, s0, start = None, None, 0
        if cache is not None:
            if not isinstance(cache, (LinearStateCache, PagedLinearStateCache)):
                raise TypeError(
                    "cache must be a LinearStateCache or a PagedLinearStateCache, got "
                    f"{type(cache).__name__}"
                )
            cache.check(batch, h, k, k, self.conv_dim, self.conv_kernel_size)
            start = cache.length
            conv0, s0 = cache.read()
            s0 = s0.to(x.dtype)
        keep = padding_keep(key_padding_mask, batch, start + tokens, tokens, x, cache is not None)
        if keep is not None:
            x = x * keep  # padded tokens zeroed
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        mixed, conv1 = self.conv1d(mixed, conv_state=conv0)  # (B, T, 3HK), causal, SiLU
        q, kk, v = (part.unflatten(-1, (h, k)) for part in mixed.chunk(3, dim=-1))
        g = self.forget_gate(x)  # (B, T, H, K)
        beta = torch.sigmoid(self.b_proj(x))  # (B, T, H)
        out, final = kda(
            l2norm(q), l2norm(kk), v, g, beta, initial_state=s0,
            output_final_state=cache is not None, form=self.form, chunk_size=self.chunk_size,
        )  # fmt: skip
        if cache is not None and final is not None:  # final: output_final_state with a cache
            cache.write(conv1, final, tokens)
        gate_pre = self.g_b_proj(self.g_a_proj(x)).unflatten(-1, (h, k))  # (B, T, H, K)
        y = output_gate(self.o_norm(out), gate_pre, "sigmoid")  # per element
        return self.o_proj(y.flatten(-2))  # (B, T, H*K) -> (B, T, C)
