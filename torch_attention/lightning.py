"""MiniMax's lightning attention layer in torch, the twin of ``numpy_attention.lightning``:
linear attention with a fixed decay per head, an RMSNorm over every head and a sigmoid output
gate; parameters named like transformers' ``MiniMaxLightningAttention``.

Shape legend: B batch, T tokens of this call, C model width, H heads, D head width.

The chain (backward by autograd here; the page derives the NumPy twin's):

    z = qkv_proj(x);  u = silu(z) * keep                  (B, T, 3*H*D), keep 0 on padding
    q, k, v = split(u.reshape(B, T, H, 3*D), D)           (B, T, H, D) each
    S_t = exp(-slope_h) S_{t-1} + k_t v_t^T;  o_t = S_t^T q_t     simple GLA, g = -slope, scale 1
    out = out_proj(rmsnorm(merge(o)) * sigmoid(output_gate(x)))

The slopes (H,) are the NumPy twin's ``slope_rates`` (float64, on the CPU, moved per call).
Decoding, a ``LinearStateCache`` or ``PagedLinearStateCache`` (``linear_cache.py``) holds each
head's (D, D) state: read as the initial state, the final state written back; a cached call
stays differentiable (the state it read is a constant).

Derivation: docs/derivations/lightning-layer.md.
Tests: tests/torch_attention/test_lightning.py (against the NumPy layer);
tests/parity/test_hf_lightning.py (against transformers and the NumPy layer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from numpy_attention.lightning import slope_rates

from . import validation
from .gate import output_gate
from .layers import Linear
from .linear_attention import FORMS, simple_gla
from .linear_cache import LinearStateCache, PagedLinearStateCache, padding_keep
from .module import Module
from .norms import RMSNorm

__all__ = ["LightningAttention"]


class LightningAttention(Module):
    """MiniMax's lightning attention; the twin of ``numpy_attention.lightning.LightningAttention``.

    Parameters, created in this order (transformers'): ``norm``, ``qkv_proj``, ``out_proj``,
    ``output_gate``. The slopes are no parameter or buffer: ``slope_rate`` (H,) float64 on the CPU.

    Args: those of the NumPy twin but ``rng`` (torch's generator draws the weights).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        layer_idx: int = 0,
        num_hidden_layers: int = 1,
        slope_rate: Any = None,
        norm_eps: float = 1e-6,
        form: str = "chunk",
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        if head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"head_dim None is hidden_size // num_heads, but hidden_size {hidden_size} "
                    f"is not divisible by num_heads {num_heads}: give head_dim"
                )
            head_dim = self.hidden_size // self.num_heads
        self.head_dim = validation.positive_int("head_dim", head_dim)
        self.layer_idx = validation.non_negative_int("layer_idx", layer_idx)
        self.num_hidden_layers = validation.positive_int("num_hidden_layers", num_hidden_layers)
        if self.layer_idx >= self.num_hidden_layers:
            raise ValueError(
                f"layer_idx {layer_idx} must be below num_hidden_layers {num_hidden_layers}"
            )
        if slope_rate is None:
            slopes = slope_rates(self.num_heads, self.layer_idx, self.num_hidden_layers)
        else:
            given = (
                slope_rate.detach().cpu() if isinstance(slope_rate, torch.Tensor) else slope_rate
            )
            slopes = np.asarray(given, dtype=np.float64)
            if slopes.shape != (self.num_heads,) or not np.all(np.isfinite(slopes) & (slopes > 0)):
                raise ValueError(
                    f"slope_rate must hold num_heads = {self.num_heads} finite decays > 0, shape "
                    f"({self.num_heads},), got shape {slopes.shape}"
                )
        self.slope_rate = torch.from_numpy(slopes.copy())  # (H,) float64, CPU
        if form not in FORMS:
            raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
        self.form = str(form)
        self.chunk_size = validation.positive_int("chunk_size", chunk_size)

        c, width = self.hidden_size, self.num_heads * self.head_dim
        self.norm = RMSNorm(width, norm_eps)
        self.qkv_proj = Linear(c, 3 * width, bias=False)
        self.out_proj = Linear(width, c, bias=False)
        self.output_gate = Linear(c, width, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        *,
        key_padding_mask: Any = None,
        cache: LinearStateCache | PagedLinearStateCache | None = None,
    ) -> torch.Tensor:
        """Causal lightning attention over x's tokens, after the cache's state when given.

        Args:
            x: (B, T, C).
            key_padding_mask: bool (B, M), True = padding, M = T or ``cache.length + T``
                (their q, k and v are zeroed).
            cache: a ``LinearStateCache`` or ``PagedLinearStateCache`` of this layer's B, H, D,
                D and no convolution.

        Returns:
            (B, T, C).
        """
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.qkv_proj.weight.dtype)
        b, t, _ = x.shape
        s0, start = None, 0
        if cache is not None:
            if not isinstance(cache, (LinearStateCache, PagedLinearStateCache)):
                raise TypeError(
                    "cache must be a LinearStateCache or a PagedLinearStateCache, got "
                    f"{type(cache).__name__}"
                )
            cache.check(b, self.num_heads, self.head_dim, self.head_dim, None, None)
            _, s0 = cache.read()  # (B, H, D, D); no convolution state
            start = cache.length
        keep = padding_keep(key_padding_mask, b, start + t, t, x, cache is not None)

        qkv = F.silu(self.qkv_proj(x))  # (B, T, C) -> (B, T, 3*H*D)
        if keep is not None:
            qkv = qkv * keep  # padded tokens: q = k = v = 0
        qkv = qkv.reshape(b, t, self.num_heads, 3 * self.head_dim)  # -> (B, T, H, 3*D)
        q, k, v = qkv.split(self.head_dim, dim=-1)  # (B, T, H, D) each
        g = -self.slope_rate.to(device=x.device, dtype=x.dtype).expand(b, t, self.num_heads)
        out, final_state = simple_gla(
            q, k, v, g, scale=1.0, initial_state=s0, output_final_state=cache is not None,
            form=self.form, chunk_size=self.chunk_size,
        )  # fmt: skip
        normed = self.norm(out.reshape(b, t, -1))  # (B, T, H*D), over the whole width
        gated = output_gate(normed, self.output_gate(x), "sigmoid")
        if cache is not None and final_state is not None:  # output_final_state with a cache
            cache.write(None, final_state, t)  # stored detached
        return self.out_proj(gated)  # (B, T, H*D) -> (B, T, C)
