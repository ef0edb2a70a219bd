"""Multi-head latent attention (MLA) in torch, the twin of ``numpy_attention.latent``: the
attention of DeepSeek-V2/V3, every head's keys and values made from one small latent per token,
which is all the decoding cache holds; parameters named like Hugging Face's
``DeepseekV3Attention``.

Shape legend: B batch, H heads, N tokens of this call, M keys attended (N without a cache; the
cache's length after this call with one), C model width (``hidden_size``), Lq ``q_lora_rank``,
L ``kv_lora_rank``, P ``qk_nope_head_dim``, R ``qk_rope_head_dim``, Dv ``v_head_dim``.

The chain (backward by autograd here; the page derives the NumPy twin's):

    q = q_b_proj(q_a_layernorm(q_a_proj(x)))  or  q_proj(x)      (B, N, H*(P+R)) -> (B, H, N, P+R)
    c, k_pe = split(kv_a_proj_with_mqa(x), [L, R]);  c = kv_a_layernorm(c) * latent_scale
    q_pe, k_pe = rope(q_pe), rope(k_pe)                            k_pe: one head, cached with c
    expanded:  k_nope, v = split_heads(kv_b_proj(c), H);  o = attention([q_nope, q_pe],
               [k_nope, k_pe], v)
    absorbed:  o = W_UV attention([W_UK^T q_nope, q_pe], [c, k_pe], c)   (MQA over the latent)
    out = o_proj(merge_heads(o) * act(g_proj(x)))                 the gate: output_gate only

Both forms use the layer's ``scaling`` ((P + R)^-0.5 by default). The attention runs on
``backend`` (``functional.attention``); absorbed, its values are the whole rows [c, k_pe] and the
output's first L columns are kept (the same numbers; torch's CPU SDPA is fast only with V as wide
as K). The output gate (per element or per head, sigmoid or softplus, ``gate.py``) is the NumPy
twin's.

Decoding, the layer hands its cache this call's c and k_pe, as the NumPy twin does: the expanded
form takes back every cached row (``cache.append``), the absorbed form has the cache attend
(``cache.attend``); a ``LatentCache`` or a ``PagedLatentCache`` (latent_cache.py, equal results).

Derivation: docs/derivations/latent.md, docs/derivations/output-gate.md.
Tests: tests/torch_attention/test_latent.py (the layer over either cache too); against the NumPy
twin in tests/parity/test_run.py; against transformers in tests/parity/test_hf_latent.py.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
from torch import nn

from . import validation
from .functional import attention, check_backend, merge_heads, split_heads
from .gate import check_gate, gate_width, output_gate
from .grouped import _key_padding
from .indexer import (
    LightningIndexer,
    check_index_options,
    check_query_gate,
    check_selection_given,
    check_selection_shape,
    check_shared_selection,
)
from .latent_cache import LatentCache, PagedLatentCache, attend_latents
from .layers import Linear, dropout_keep_mask
from .module import Module
from .norms import RMSNorm
from .rope import check_positions, deinterleave, rope, rope_inv_freq

__all__ = ["MultiHeadLatentAttention"]


# -- the layer --------------------------------------------------------------------------------


class MultiHeadLatentAttention(Module):
    """Causal multi-head latent attention with a decoupled shared RoPE key, as in DeepSeek-V2/V3;
    the twin of ``numpy_attention.latent.MultiHeadLatentAttention``.

    Parameters, created in this order: ``q_proj`` (``q_lora_rank`` None) or ``q_a_proj``,
    ``q_a_layernorm``, ``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``;
    ``o_proj``; with ``output_gate``, ``g_proj``. RoPE's frequencies are no parameter or buffer
    (Hugging Face's attention state dicts have none): ``inv_freq`` is kept in float64 on the CPU
    and moved per call.

    Args: those of the NumPy twin (``rng`` aside: torch's generator draws the weights), and
        backend: the attention backend, ``functional.attention``'s ``backend``.
    """

    # Parameters no gradient of the output reaches, by design: DSA's indexer selects its keys
    # under no_grad (it trains by ``indexer_kl_loss``); their .grad stays None.
    NO_GRADIENT = ("indexer.",)

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        bias: bool = False,
        rope_theta: float = 10000.0,
        inv_freq: Any = None,
        rope_attention_factor: float = 1.0,
        rope_interleave: bool = True,
        scaling: float | None = None,
        latent_scale: float = 1.0,
        query_temperature: tuple[float, float] | None = None,
        output_gate: str | None = None,
        gate_activation: str = "sigmoid",
        gate_bias: bool = False,
        norm_eps: float = 1e-6,
        dropout: float = 0.0,
        index_n_heads: int | None = None,
        index_head_dim: int | None = None,
        index_topk: int | None = None,
        index_rope_interleave: bool = False,
        index_shared: bool = False,
        index_rope_position: str = "first",
        index_norm_eps: float = 1e-6,
        sinks: bool = False,
        query_gate: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        self.kv_lora_rank = validation.positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_nope_head_dim = validation.positive_int("qk_nope_head_dim", qk_nope_head_dim)
        self.qk_rope_head_dim = validation.positive_int("qk_rope_head_dim", qk_rope_head_dim)
        if self.qk_rope_head_dim % 2:
            raise ValueError(
                f"RoPE rotates pairs of coordinates: qk_rope_head_dim must be even, got "
                f"{qk_rope_head_dim}"
            )
        self.v_head_dim = validation.positive_int("v_head_dim", v_head_dim)
        self.q_lora_rank = (
            None if q_lora_rank is None else validation.positive_int("q_lora_rank", q_lora_rank)
        )
        self.inv_freq = _check_inv_freq(inv_freq, self.qk_rope_head_dim, rope_theta)
        self.rope_attention_factor = validation.finite_real(
            "rope_attention_factor", rope_attention_factor
        )
        self.rope_interleave = validation.flag("rope_interleave", rope_interleave)
        head = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.scale = head**-0.5 if scaling is None else validation.finite_real("scaling", scaling)
        self.latent_scale = validation.finite_real("latent_scale", latent_scale)
        self.query_temperature = _check_temperature(query_temperature)
        gate_bias = validation.flag("gate_bias", gate_bias)
        self.output_gate = check_gate(output_gate, gate_activation, gate_bias)
        self.gate_activation = str(gate_activation)
        self.norm_eps = validation.finite_real("norm_eps", norm_eps)
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps must be > 0, got {norm_eps}")
        self.dropout = validation.dropout_p(dropout, "dropout")
        self.backend = check_backend(backend)

        bias = validation.flag("bias", bias)
        c, h = self.hidden_size, self.num_heads
        if self.q_lora_rank is None:
            self.q_proj = Linear(c, h * head, bias=False)
        else:
            self.q_a_proj = Linear(c, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, self.norm_eps)
        self.query_gate = check_query_gate(query_gate, self.q_lora_rank, self.output_gate)
        if self.query_gate and self.q_lora_rank is not None:  # AXK2: q and a gate, one proj
            fused = h * (head + self.v_head_dim)
            self.q_gate_proj = Linear(2 * self.q_lora_rank, fused, bias=False)
        elif self.q_lora_rank is not None:
            self.q_b_proj = Linear(self.q_lora_rank, h * head, bias=False)
        self.kv_a_proj_with_mqa = Linear(c, self.kv_lora_rank + self.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, self.norm_eps)
        self.kv_b_proj = Linear(
            self.kv_lora_rank, h * (self.qk_nope_head_dim + self.v_head_dim), bias=False
        )
        self.o_proj = Linear(h * self.v_head_dim, c, bias=bias)
        if self.output_gate is not None:
            gates = gate_width(self.output_gate, h, self.v_head_dim)
            self.g_proj = Linear(c, gates, bias=gate_bias)
        index = check_index_options(index_n_heads, index_head_dim, index_topk, self.q_lora_rank)
        self.index_topk = None if index is None else index[2]
        self.index_shared = check_shared_selection(index_shared, index)
        self.has_sinks = validation.flag("sinks", sinks)
        if self.has_sinks:  # one logit per head in every row's softmax (HY-V4's)
            self.sinks = nn.Parameter(torch.zeros(h))
        self.selection: Any = None  # the last forward's (B, N, M) selection, DSA layers only
        if index is not None:  # DeepSeek-V3.2's DSA: the indexer picks the keys per query
            self.indexer = LightningIndexer(
                c,
                index[3],
                index[0],
                index[1],
                index[2],
                self.qk_rope_head_dim,
                rope_interleaved=index_rope_interleave,
                rope_position=index_rope_position,
                norm_eps=index_norm_eps,
            )

    def absorbs(self, n: int, m: int) -> bool:
        """What ``absorb=None`` picks for N queries over M cached keys (the NumPy twin's rule):
        absorbed when H N M (2L + R) + H N L (P + Dv) < M L H (P + Dv) + H N M (P + R + Dv)."""
        h, rank = self.num_heads, self.kv_lora_rank
        p, r, dv = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        absorbed = h * n * m * (2 * rank + r) + h * n * rank * (p + dv)
        expanded = m * rank * h * (p + dv) + h * n * m * (p + r + dv)
        return absorbed < expanded

    def forward(
        self,
        x: torch.Tensor,
        *,
        positions: Any = None,
        key_padding_mask: Any = None,
        cache: LatentCache | PagedLatentCache | None = None,
        absorb: bool | None = None,
        attn_dropout_mask: Any = None,
        index_selection: Any = None,
    ) -> torch.Tensor:
        """Causal self-attention of x's tokens over the cache's and their own.

        Args:
            x: (B, N, C).
            positions: RoPE positions, (N,) or (B, N); default ``cache.length + arange(N)``.
            key_padding_mask: bool (B, M), True = padding, over the keys attended.
            cache: a ``LatentCache`` of this layer's B, L, R, dtype and device, or a
                ``PagedLatentCache`` of its L, R, dtype and device (equal results): this call's
                latents are appended and the queries attend with ``align="bottom-right"``. A
                forward with a cache runs under ``torch.no_grad()`` (inference only).
            absorb: True absorbed, False expanded, None: absorbed with a cache when cheaper
                (``absorbs``), else expanded.
            attn_dropout_mask: bool (B, H, N, M), True = kept; train mode with dropout > 0.
            index_selection: bool (B, N, M), True where a query may read a key: a shared DSA
                layer's (``index_shared``) keys, the ``selection`` of the layer before it
                (GLM-5's ``prev_topk_indices``); only there.

        Returns:
            (B, N, C).
        """
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.o_proj.weight.dtype)
        b, n, _ = x.shape
        start = 0
        if cache is not None:
            if not isinstance(cache, (LatentCache, PagedLatentCache)):
                raise TypeError(
                    f"cache must be a LatentCache or a PagedLatentCache, got {type(cache).__name__}"
                )
            cache.check_index(None if self.index_topk is None else self.indexer.head_dim)
            cache.check_append(b, n, self.kv_lora_rank, self.qk_rope_head_dim, x.dtype, x.device)
            start = cache.length
        m = start + n
        if absorb is None:
            absorb = cache is not None and self.absorbs(n, m)
        absorb = validation.flag("absorb", absorb)
        if positions is None:
            positions = start + torch.arange(n, device=x.device)
        shape = (b, self.num_heads, n, self.qk_rope_head_dim)
        positions = check_positions(positions, shape, x.device)
        padding = _key_padding(key_padding_mask, b, m, cache is not None, x.device)
        keep = dropout_keep_mask(
            "attn_dropout_mask",
            self.dropout,
            (b, self.num_heads, n, m),
            self.training,
            attn_dropout_mask,
            x.device,
        )
        selection = None
        check_selection_given(self.index_shared, index_selection is not None)
        if index_selection is not None:
            selection = validation.bool_tensor("index_selection", index_selection, x.device)
            check_selection_shape(tuple(selection.shape), (b, n, m))
        with torch.no_grad() if cache is not None else contextlib.nullcontext():
            return self._chain(x, positions, padding, keep, cache, absorb, selection)

    def _chain(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        padding: torch.Tensor | None,
        keep: torch.Tensor | None,
        cache: LatentCache | PagedLatentCache | None,
        absorb: bool,
        selection: torch.Tensor | None,
    ) -> torch.Tensor:
        """The forward chain (module docstring); inputs already checked."""
        p, rank, h = self.qk_nope_head_dim, self.kv_lora_rank, self.num_heads
        if self.q_lora_rank is None:
            q = self.q_proj(x)  # (B, N, C) -> (B, N, H*(P+R))
        elif self.query_gate:  # the NumPy twin's: [q | gate] per head from [q_resid, q_a]
            q_a = self.q_a_proj(x)
            q_resid = self.q_a_layernorm(q_a)
            fused = self.q_gate_proj(torch.cat([q_resid, q_a], dim=-1))
            fused = fused.view(*fused.shape[:2], h, -1)  # (B, N, H, P+R+Dv)
            head = p + self.qk_rope_head_dim
            q = fused[..., :head].reshape(*fused.shape[:2], -1)  # (B, N, H*(P+R))
            gate_pre = fused[..., head:].reshape(*fused.shape[:2], -1)  # (B, N, H*Dv)
        else:
            q_resid = self.q_a_layernorm(self.q_a_proj(x))  # C -> Lq, the query latent
            q = self.q_b_proj(q_resid)  # Lq -> H*(P+R)
        q = split_heads(q, h)  # -> (B, H, N, P+R)
        q_nope, q_pe = q[..., :p], q[..., p:]
        latent = self.kv_a_proj_with_mqa(x)  # (B, N, C) -> (B, N, L+R)
        c = self.kv_a_layernorm(latent[..., :rank])  # (B, N, L)
        if self.latent_scale != 1.0:
            c = c * self.latent_scale
        k_pe = latent[:, None, :, rank:]  # (B, 1, N, R): one key head
        if self.rope_interleave:
            q_pe, k_pe = deinterleave(q_pe), deinterleave(k_pe)
        rotation: dict[str, Any] = {
            "inv_freq": self.inv_freq,
            "attention_factor": self.rope_attention_factor,
        }
        q_pe, k_pe = rope(q_pe, positions, **rotation), rope(k_pe, positions, **rotation)
        if self.query_temperature is not None:
            t = _temperature(positions, *self.query_temperature, x.dtype)
            q_nope, q_pe = q_nope * t, q_pe * t
        k_pe = k_pe[:, 0]  # (B, N, R)
        options: dict[str, Any] = {
            "causal": True,
            "align": "bottom-right",
            "key_padding_mask": padding,
            "scale": self.scale,  # the layer's, also absorbed (not (L + R)^-0.5)
            "dropout_p": self.dropout if self.training else 0.0,
            "dropout_mask": keep,
            "backend": self.backend,
            "sinks": self.sinks if self.has_sinks else None,
        }
        if self.index_topk is not None:  # DSA: each query reads only its top-k keys
            keys = self.indexer.keys(x, positions, rotation)  # (B, N, DI)
            if cache is not None:  # the cached keys first: (B, M, DI)
                keys = cache.index_append(keys)
            selection = self.indexer(x, q_resid, keys, positions, rotation, padding)  # (B, N, M)
        if selection is not None:  # this layer's top-k, or a shared layer's given one
            options["attn_mask"] = selection[:, None]  # one mask for every head
            self.selection = selection
        if absorb:
            weight = self.kv_b_proj.weight.view(h, p + self.v_head_dim, rank)
            w_uk, w_uv = weight[:, :p], weight[:, p:]  # (H, P, L), (H, Dv, L)
            q_lat = q_nope @ w_uk  # (B, H, N, P) @ (H, P, L) -> (B, H, N, L)
            queries = torch.cat([q_lat, q_pe], dim=-1)  # (B, H, N, L+R)
            # With a cache: c, k_pe appended, the queries attending over every cached row
            attend = attend_latents if cache is None else cache.attend
            o_lat = attend(queries, c, k_pe, enable_gqa=True, **options)  # (B, H, N, L)
            o = o_lat @ w_uv.transpose(-1, -2)  # (B, H, N, L) @ (H, L, Dv) -> (B, H, N, Dv)
        else:
            if cache is not None:
                rows = cache.append(c, k_pe)  # (B, M, L+R): everything cached so far
                c, k_pe = rows[..., :rank], rows[..., rank:]
            kv = split_heads(self.kv_b_proj(c), h)  # (B, M, L) -> (B, H, M, P+Dv)
            k_nope, v = kv[..., :p], kv[..., p:]
            k_pe = k_pe[:, None].expand(-1, h, -1, -1)  # every head reads the one k_pe
            queries = torch.cat([q_nope, q_pe], dim=-1)  # (B, H, N, P+R)
            keys = torch.cat([k_nope, k_pe], dim=-1)  # (B, H, M, P+R)
            o = attention(queries, keys, v, **options)  # (B, H, N, Dv)
        merged = merge_heads(o)  # (B, H, N, Dv) -> (B, N, H*Dv)
        if self.output_gate is not None:  # (B, N, H*Dv) gated by (B, N, H*Dv) or (B, N, H)
            merged = output_gate(merged, self.g_proj(x), self.gate_activation)
        elif self.query_gate:  # AXK2: sigmoid of the query projection's gate part
            merged = output_gate(merged, gate_pre, "sigmoid")
        return self.o_proj(merged)  # (B, N, H*Dv) -> (B, N, C)

    def extra_repr(self) -> str:
        options = [
            f"hidden_size={self.hidden_size}",
            f"num_heads={self.num_heads}",
            f"kv_lora_rank={self.kv_lora_rank}",
            f"qk_nope_head_dim={self.qk_nope_head_dim}",
            f"qk_rope_head_dim={self.qk_rope_head_dim}",
            f"v_head_dim={self.v_head_dim}",
        ]
        if self.q_lora_rank is not None:
            options.append(f"q_lora_rank={self.q_lora_rank}")
        if self.latent_scale != 1.0:
            options.append(f"latent_scale={self.latent_scale}")
        if self.query_temperature is not None:
            options.append(f"query_temperature={self.query_temperature}")
        if self.output_gate is not None:
            options.append(f"output_gate={self.output_gate!r} ({self.gate_activation})")
        if self.dropout:
            options.append(f"dropout={self.dropout}")
        return ", ".join(options + [f"scaling={self.scale}", f"backend={self.backend!r}"])


def _temperature(
    positions: torch.Tensor, beta: float, length: float, dtype: torch.dtype
) -> torch.Tensor:
    """t = 1 + beta * log(1 + floor(position / length)) in float64, cast to ``dtype``, shaped
    (N, 1) or (B, 1, N, 1) to scale q (B, H, N, W)."""
    t = 1.0 + beta * torch.log1p(torch.floor(positions.to(torch.float64) / length))
    t = t.to(dtype)[..., None]  # (..., N, 1)
    return t[:, None] if t.ndim == 3 else t


def _check_inv_freq(inv_freq: Any, rope_dim: int, rope_theta: Any) -> torch.Tensor:
    """RoPE's (R/2,) frequencies, float64 on the CPU: given (finite, that length), or from
    rope_theta."""
    if inv_freq is None:
        return rope_inv_freq(rope_dim, rope_theta)
    validation.finite_real("rope_theta", rope_theta)
    if isinstance(inv_freq, torch.Tensor):
        inv_freq = inv_freq.detach().cpu()
    freqs = torch.as_tensor(np.asarray(inv_freq))
    if not freqs.is_floating_point():
        raise TypeError(f"inv_freq must be a floating-point array, got dtype {freqs.dtype}")
    if tuple(freqs.shape) != (rope_dim // 2,) or not bool(torch.isfinite(freqs).all()):
        raise ValueError(
            f"inv_freq must be finite and (qk_rope_head_dim / 2,) = ({rope_dim // 2},), got "
            f"shape {tuple(freqs.shape)}"
        )
    return freqs.to(torch.float64)


def _check_temperature(value: Any) -> tuple[float, float] | None:
    """``query_temperature`` as (beta, length): beta finite, length > 0; or None."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"query_temperature must be (beta, length) or None, got {value!r}")
    beta = validation.finite_real("query_temperature[0]", value[0])
    length = validation.finite_real("query_temperature[1]", value[1])
    if length <= 0:
        raise ValueError(f"query_temperature[1] (the length) must be > 0, got {length}")
    return beta, length
