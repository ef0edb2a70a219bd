"""Gated DeltaNet in torch, the twin of ``numpy_attention.gated_deltanet``: Qwen3-Next's and
Qwen3.5's linear-attention layer (projections, causal short convolution with SiLU, L2-normed q and
k, the gated delta rule, a gated RMSNorm per value head, the output projection), parameters named
like Hugging Face's. The backward is autograd's.

Shape legend: B batch, T tokens, C model width, Hk key heads, Hv value heads (r = Hv / Hk),
Dk, Dv head widths, Kd = Hk Dk, Vd = Hv Dv, F = 2 Kd + Vd, W the convolution's width.

    x = x * keep;  [q | k | v], z, b, a from the projections ("fused": rows grouped per key head)
    [q | k | v] = silu(conv1d([q | k | v]));  q, k = l2norm(q), l2norm(k), repeated r times
    beta = sigmoid(b);  g = -exp(A_log) softplus(a + dt_bias)
    o = gated_delta_rule(q, k, v, g, beta, scale = Dk^-0.5);  out = out_proj(rmsnorm(o) silu(z))

Derivation: docs/derivations/gated-deltanet-layer.md (the NumPy twin's backward; autograd here).
Tests: tests/torch_attention/test_gated_deltanet.py (against the NumPy layer);
tests/parity/test_hf_gated_deltanet.py (against transformers and the NumPy layer).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from numpy_attention.gated_deltanet import PROJECTIONS, fused_orders

from . import validation
from .gate import output_gate
from .layers import Linear
from .linear_attention import FORMS, gated_delta_rule
from .linear_cache import LinearStateCache, PagedLinearStateCache, padding_keep
from .module import Module
from .norms import RMSNorm, l2norm
from .short_conv import ShortConv

__all__ = ["GatedDeltaNet"]


class GatedDeltaNet(Module):
    """Qwen3-Next's and Qwen3.5's gated DeltaNet layer: the NumPy twin's constructor (``rng``
    aside), parameters and forward; module docstring for the chain."""

    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        *,
        conv_kernel_size: int = 4,
        projections: str = "fused",
        norm_eps: float = 1e-6,
        form: str = "chunk",
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.num_k_heads = validation.positive_int("num_k_heads", num_k_heads)
        self.num_v_heads = validation.positive_int("num_v_heads", num_v_heads)
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"num_v_heads ({num_v_heads}) must be a multiple of num_k_heads ({num_k_heads}): "
                "each key head serves num_v_heads // num_k_heads value heads"
            )
        self.head_k_dim = validation.positive_int("head_k_dim", head_k_dim)
        self.head_v_dim = validation.positive_int("head_v_dim", head_v_dim)
        self.conv_kernel_size = validation.positive_int("conv_kernel_size", conv_kernel_size)
        if self.conv_kernel_size < 2:
            raise ValueError(f"conv_kernel_size must be >= 2, got {conv_kernel_size}")
        if projections not in PROJECTIONS:
            raise ValueError(f"projections must be one of {list(PROJECTIONS)}, got {projections!r}")
        self.projections = str(projections)
        norm_eps = validation.finite_real("norm_eps", norm_eps)
        if form not in FORMS:
            raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
        self.form = str(form)
        self.chunk_size = validation.positive_int("chunk_size", chunk_size)

        c, hv = self.hidden_size, self.num_v_heads
        key_dim, value_dim = self.key_dim, self.value_dim
        if self.projections == "fused":
            self.in_proj_qkvz = Linear(c, 2 * key_dim + 2 * value_dim, bias=False)
            self.in_proj_ba = Linear(c, 2 * hv, bias=False)
        else:
            self.in_proj_qkv = Linear(c, self.conv_dim, bias=False)
            self.in_proj_z = Linear(c, value_dim, bias=False)
            self.in_proj_b = Linear(c, hv, bias=False)
            self.in_proj_a = Linear(c, hv, bias=False)
        self.conv1d = ShortConv(self.conv_dim, self.conv_kernel_size)
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.A_log = nn.Parameter(torch.log(torch.empty(hv).uniform_(1.0, 16.0)))
        self.norm = RMSNorm(self.head_v_dim, norm_eps)
        self.out_proj = Linear(value_dim, c, bias=False)
        qkvz_order, ba_order = fused_orders(
            self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        )
        self.register_buffer("qkvz_order", torch.from_numpy(qkvz_order), persistent=False)
        self.register_buffer("ba_order", torch.from_numpy(ba_order), persistent=False)

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def forward(
        self,
        x: torch.Tensor,
        *,
        key_padding_mask: Any = None,
        cache: LinearStateCache | PagedLinearStateCache | None = None,
    ) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); ``key_padding_mask`` bool (B, M), True = padding, M = T or
        ``cache.length + T``; ``cache`` read before and written after (NumPy twin's forward)."""
        x = validation.layer_input(
            "x", x, self.hidden_size, (3,), self.out_proj.weight.dtype, "GatedDeltaNet"
        )
        b, t, _ = x.shape
        hk, hv, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        conv_state = state = None
        start = 0
        if cache is not None:
            if not isinstance(cache, (LinearStateCache, PagedLinearStateCache)):
                raise TypeError(
                    "cache must be a LinearStateCache or a PagedLinearStateCache, got "
                    f"{type(cache).__name__}"
                )
            cache.check(b, hv, dk, dv, self.conv_dim, self.conv_kernel_size)
            start = cache.length
            conv_state, state = cache.read()
            conv_state = None if conv_state is None else conv_state.to(x.dtype)
        keep = padding_keep(key_padding_mask, b, start + t, t, x, cache is not None)
        if keep is not None:
            x = x * keep  # padded tokens zeroed
        if self.projections == "fused":
            qkvz = self.in_proj_qkvz(x)[..., self.qkvz_order]  # rows regrouped: [q; k; v; z]
            ba = self.in_proj_ba(x)[..., self.ba_order]  # [b; a]
            mixed, z = qkvz[..., : self.conv_dim], qkvz[..., self.conv_dim :]
            b_pre, a = ba[..., :hv], ba[..., hv:]
        else:
            mixed, z = self.in_proj_qkv(x), self.in_proj_z(x)
            b_pre, a = self.in_proj_b(x), self.in_proj_a(x)
        conv, new_conv = self.conv1d(mixed, conv_state=conv_state)  # (B, T, F)
        kd = self.key_dim
        q = l2norm(conv[..., :kd].reshape(b, t, hk, dk))  # (B, T, Hk, Dk)
        k = l2norm(conv[..., kd : 2 * kd].reshape(b, t, hk, dk))
        v = conv[..., 2 * kd :].reshape(b, t, hv, dv)
        q = q.repeat_interleave(hv // hk, dim=2)  # key head h serves value heads h r .. h r + r-1
        k = k.repeat_interleave(hv // hk, dim=2)
        beta = torch.sigmoid(b_pre)
        g = -self.A_log.exp() * F.softplus(a + self.dt_bias)  # (B, T, Hv)
        out, final_state = gated_delta_rule(
            q, k, v, g, beta, scale=dk**-0.5, initial_state=state,
            output_final_state=cache is not None, form=self.form, chunk_size=self.chunk_size,
        )  # fmt: skip
        y = output_gate(self.norm(out).reshape(b, t, -1), z, "silu")  # (B, T, Vd)
        if cache is not None and final_state is not None:  # detached: the cache's states are
            cache.write(new_conv, final_state, t)  # constants to the next call
        return self.out_proj(y)
