"""Today's decoder attention in torch, the twin of ``numpy_attention.grouped`` (and of the RoPE and
RMSNorm it uses, ``numpy_attention.rope`` and ``numpy_attention.norms``): grouped-query attention
with RoPE, optional QK-norm, a sliding window, softcap, sinks, an output gate, a clip of q, k and v
and a norm of the merged heads, and a KV cache for decoding, named like Hugging Face's Llama
family so that its attention state dicts load without renaming.

Shape legend: B batch, H query heads, H_kv key/value heads (H % H_kv == 0), N tokens of this call,
M keys attended (N without a cache; the cache's length after this call with one), C model width
(``hidden_size``), D head width (``head_dim``), Dv value head width (``v_head_dim``, D by
default).

The layer's chain (backward by autograd here; the pages derive the NumPy twin's):

    q = rope(split_heads(q_norm(q_proj(x)), H))        (B, H, N, D)     q_norm: QK-norm only
    k = rope(split_heads(k_norm(k_proj(x)), H_kv))     (B, H_kv, N, D)  (appended to the cache)
    q = t(p) * q                                       (B, H, N, D)     query_temperature only
    v = s_v * v_norm(split_heads(v_proj(x), H_kv))     (B, H_kv, N, Dv) v_norm: value_norm only
    o = attention(q, k, v; causal, window, softcap, sinks, ALiBi, scale, GQA, dropout)
    o = (1 - li) rmsnorm(o_h - lambda o_(h+H/2))       (B, H/2, N, 2D)  differential only
    a = merge_heads(o) * act(g_proj(x))                (B, N, H*Dv)     gate: output_gate only
    a = o_norm(a)                                      (B, N, H*Dv)     output_norm only
    out = o_proj(a)                                    (B, N, C)

The QK-norm (RMSNorm or LayerNorm, per head or over the whole projection, scale (offset + w),
or a weightless RMSNorm; before RoPE or after it), the query temperature (``temperature.py``),
partial rotary and NoPE (``rotary_dim``), LongRoPE's frequency switch, the output gate (per
element or per head, sigmoid or softplus, ``gate.py``), the clip of q, k and v (``clip_qkv``,
before the QK-norm or, ``clip_after_norm``, q and k after it; ``clip.py``), the output norm
(an RMSNorm over the H*Dv merged coordinates, ``o_norm``), the value width Dv and the value
scale s_v (``v_head_dim``, ``value_scale``: MiMo-V2-Flash), differential attention (the value
halves side by side, paired heads subtracted and normed; ``differential.py``), the value norm
(``value_norm``), values taken from the key projection (``values_from_keys``) and keys and
values shared across layers (``kv_shared``, ``shared_kv.py``: the source's ``kv`` are tensors
of the graph, so autograd adds the consumers' gradients) are the NumPy twin's.

Precision as in the NumPy twin: RoPE's angles are computed in float64 from float64 positions and
frequencies, and only the cos and sin tables are cast to x's dtype; RMSNorm computes in its
input's dtype. The attention itself runs on ``backend`` (``functional.attention``): ``"sdpa"``
refuses softcap and sinks, and ``"flex"`` runs every option but, on CPU, only without a backward
(decoding with the cache runs under ``torch.no_grad()``).

Decoding, the layer hands q, k, v to its cache's ``attend``: a contiguous ``KVCache`` or pages,
``PagedKVCache``, both in ``decode/cache.py`` (equal results; docs/decoding.md).

Derivation: docs/derivations/grouped.md, docs/derivations/rope.md, docs/derivations/rmsnorm.md,
docs/derivations/layernorm.md, docs/derivations/output-gate.md, docs/derivations/clip-qkv.md,
docs/derivations/output-norm.md, docs/derivations/qk-norm-after-rope.md,
docs/derivations/query-temperature.md, docs/derivations/value-scale.md,
docs/derivations/differential.md, docs/derivations/shared-kv.md.
Tests: tests/torch_attention/test_grouped.py, tests/torch_attention/test_shared_kv.py; against
the NumPy twin in tests/parity/test_run.py; against transformers in
tests/parity/test_hf_models.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from numpy_attention import grouped_options

from . import validation
from .clip import clip
from .decode.cache import KVCache, PagedKVCache
from .differential import (
    LAMBDA_NAMES,
    LAMBDA_STD,
    differential,
    differential_values,
)
from .functional import attention, check_backend, merge_heads, split_heads
from .gate import gate_width, output_gate
from .layers import Linear, dropout_keep_mask
from .module import Module
from .norms import LayerNorm, RMSNorm, WeightlessRMSNorm
from .rope import check_positions, rope, rope_inv_freq
from .shared_kv import SharedKV, read_shared_kv
from .temperature import query_temperature

__all__ = ["GroupedQueryAttention"]

# -- the layer --------------------------------------------------------------------------------


class GroupedQueryAttention(grouped_options.GroupedOptions, Module):
    """Causal grouped-query self-attention with RoPE, as in Llama, Mistral, Qwen2/3, Gemma 2/3,
    GPT-OSS, Phi-3, OLMo 2, Cohere 1/2, StarCoder 2, Granite, SmolLM 3, GLM and Falcon; the twin
    of ``numpy_attention.grouped.GroupedQueryAttention``.

    Parameters, created in this order: ``q_proj`` = Linear(C, H*D, bias), ``k_proj`` =
    Linear(C, H_kv*D, bias), ``v_proj`` = Linear(C, H_kv*Dv, bias), ``o_proj`` = Linear(H*Dv,
    C, out_bias) (Dv = D unless ``v_head_dim`` says otherwise); with
    ``qk_norm``, ``q_norm`` and ``k_norm`` (RMSNorm or LayerNorm, weights by
    ``qk_norm_shape``, with a bias beside for ``"layer_bias"``; none for ``"rms_weightless"``);
    with ``sinks``, ``sinks`` (H,), zeros;
    with ``output_gate``, ``g_proj`` = Linear(C, H*Dv) per element or Linear(C, H) per head,
    bias by ``gate_bias``; with ``output_norm``, ``o_norm`` = RMSNorm(H*Dv); with
    ``differential``, ``lambda_q1``, ``lambda_k1``, ``lambda_q2``, ``lambda_k2`` (D,). RoPE's
    frequencies are no parameter or buffer (Hugging Face's attention state dicts have none):
    ``inv_freq``, ``long_inv_freq`` and ``alibi_slopes`` are kept in float64 on the CPU and
    moved per call, so ``.to(dtype)`` never rounds them.

    Args: those of the NumPy twin (``rng`` aside: torch's generator draws the weights), and
        backend: the attention backend, ``functional.attention``'s ``backend``.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        *,
        head_dim: int | None = None,
        bias: bool = False,
        out_bias: bool = False,
        rope_theta: float = 10000.0,
        inv_freq: Any = None,
        rope_attention_factor: float = 1.0,
        rope_interleaved: bool = False,
        rotary_dim: int | None = None,
        long_inv_freq: Any = None,
        original_max_positions: int | None = None,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        qk_norm_type: str = "rms",
        qk_norm_shape: str = "head",
        norm_weight_offset: float = 0.0,
        qk_norm_position: str = "before_rope",
        query_temperature: Mapping[str, Any] | None = None,
        window: tuple[int | None, int | None] | None = None,
        softcap: float = 0.0,
        sinks: bool = False,
        output_gate: str | None = None,
        gate_activation: str = "sigmoid",
        gate_bias: bool = False,
        scaling: float | None = None,
        dropout: float = 0.0,
        clip_qkv: float | None = None,
        clip_after_norm: bool = False,
        output_norm: bool = False,
        output_norm_eps: float = 1e-6,
        input_size: int | None = None,
        alibi_slopes: Any = None,
        v_head_dim: int | None = None,
        value_scale: float = 1.0,
        differential: bool = False,
        lambda_init: float | None = None,
        differential_eps: float = 1e-6,
        chunk_size: int | None = None,
        value_norm: bool = False,
        kv_shared: bool = False,
        values_from_keys: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.check_options(**grouped_options.option_args(locals()))  # the scalar options
        self.inv_freq = _check_inv_freq("inv_freq", inv_freq, self.rotary_dim, rope_theta)
        self.long_inv_freq, self.original_max_positions = _check_long_rope(
            long_inv_freq, original_max_positions, self.rotary_dim
        )
        self.alibi_slopes = _check_alibi(alibi_slopes, self.num_heads)
        self.kv: SharedKV | None = None  # the keys and values of the last forward, to share
        self.backend = check_backend(backend)

        width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        v_width = self.num_kv_heads * self.v_head_dim  # v_proj's output, H_kv*Dv
        merged_width = self.num_heads * self.v_head_dim  # the merged heads o_proj reads, H*Dv
        bias = validation.flag("bias", bias)
        out_bias = validation.flag("out_bias", out_bias)
        self.q_proj = Linear(self.input_size, width, bias=bias)
        if not self.kv_shared:  # a KV-shared layer reads another layer's keys and values
            self.k_proj = Linear(self.input_size, kv_width, bias=bias)
        if not (self.kv_shared or self.values_from_keys):  # Gemma 4's full layers: v = k_proj
            self.v_proj = Linear(self.input_size, v_width, bias=bias)
        self.o_proj = Linear(merged_width, self.hidden_size, bias=out_bias)
        if self.value_norm:  # Gemma 3n, Gemma 4: each head of v over its Dv, no weight
            self.v_norm = WeightlessRMSNorm(self.v_head_dim, self.norm_eps)
        if self.qk_norm and qk_norm_type == "rms_weightless":  # no parameter
            q_width = grouped_options.norm_width(self.qk_norm_shape, self.num_heads, self.head_dim)
            k_width = grouped_options.norm_width(
                self.qk_norm_shape, self.num_kv_heads, self.head_dim
            )
            self.q_norm: nn.Module = WeightlessRMSNorm(q_width, self.norm_eps)
            if not self.kv_shared:  # only the queries are its own
                self.k_norm: nn.Module = WeightlessRMSNorm(k_width, self.norm_eps)
        elif self.qk_norm:
            norm = _NORMS[qk_norm_type]
            q_dim = grouped_options.norm_dim(self.qk_norm_shape, self.num_heads, self.head_dim)
            k_dim = grouped_options.norm_dim(self.qk_norm_shape, self.num_kv_heads, self.head_dim)
            options: dict[str, Any] = {"weight_offset": norm_weight_offset}
            if qk_norm_type == "layer_bias":  # q_norm.bias, k_norm.bias beside the weights
                options["bias"] = True
            self.q_norm = norm(q_dim, self.norm_eps, **options)
            if not self.kv_shared:
                self.k_norm = norm(k_dim, self.norm_eps, **options)
        if self.has_sinks:
            self.sinks = nn.Parameter(torch.zeros(self.num_heads))
        if self.output_gate is not None:
            gates = gate_width(self.output_gate, self.num_heads, self.v_head_dim)
            self.g_proj = Linear(self.input_size, gates, bias=self.gate_bias)
        if self.output_norm:
            self.o_norm = RMSNorm(merged_width, float(output_norm_eps))
        if self.differential:  # Hugging Face's names and init: normal(0, 0.1), (D,) each
            for name in LAMBDA_NAMES:
                lambdas = torch.normal(0.0, LAMBDA_STD, size=(self.head_dim,))
                self.register_parameter(name, nn.Parameter(lambdas))

    def forward(
        self,
        x: torch.Tensor,
        *,
        positions: Any = None,
        key_padding_mask: Any = None,
        cache: KVCache | PagedKVCache | None = None,
        attn_dropout_mask: Any = None,
        shared_kv: SharedKV | tuple[Any, Any] | KVCache | PagedKVCache | None = None,
    ) -> torch.Tensor:
        """Causal self-attention of x's tokens over the cache's and their own (over the shared
        keys and values, for a KV-shared layer).

        Args:
            x: (B, N, C).
            positions: RoPE positions, (N,) or (B, N) (each batch element its own: left
                padding); default ``cache.length + arange(N)`` (``arange(N)`` without a cache).
            key_padding_mask: bool (B, M), True = padding, over the keys attended: x's N tokens,
                or with a cache all ``cache.length + N`` of them.
            cache: a ``KVCache`` of this layer's (B, H_kv, D), Dv, dtype and device, or a
                ``PagedKVCache`` of its (H_kv, D), Dv, dtype and device (equal results): this call's
                keys and values are appended and the queries attend with
                ``align="bottom-right"``.
                A forward with a cache runs under ``torch.no_grad()`` (inference only).
            attn_dropout_mask: bool (B, H, N, M), True = kept; train mode with dropout > 0.
            shared_kv: a KV-shared layer's keys and values, and only its: the source layer's
                ``kv`` (a ``SharedKV`` or (k, v) pair, (B, H_kv, M, D), M >= N, the queries the
                last N positions of the key axis), or the source layer's ``KVCache`` /
                ``PagedKVCache`` after its own call of this step (read, not appended to; run
                under ``torch.no_grad()``). Positions default to ``M - N + arange(N)``.

        Returns:
            (B, N, C).
        """
        x = validation.layer_input("x", x, self.input_size, (3,), self.q_proj.weight.dtype)
        b, n, _ = x.shape
        start, shared, from_cache = 0, None, False
        if self.kv_shared:  # another layer's keys and values: nothing of its own to cache
            if cache is not None:
                raise ValueError(
                    "cache: a KV-shared layer appends no keys or values of its own; pass the "
                    "source layer's cache as shared_kv"
                )
            if shared_kv is None:
                raise ValueError(
                    "shared_kv is missing: a KV-shared layer attends with the source layer's kv "
                    "(or, decoding, its cache)"
                )
            shape = (b, self.num_kv_heads, self.head_dim)
            shared, from_cache = read_shared_kv(shared_kv, shape, n, x.dtype, x.device)
            start = shared.k.shape[2] - n
        elif shared_kv is not None:
            raise ValueError(
                "shared_kv is given but the layer computes its own keys and values "
                "(kv_shared=False)"
            )
        if cache is not None:
            if not isinstance(cache, (KVCache, PagedKVCache)):
                raise TypeError(
                    f"cache must be a KVCache or a PagedKVCache, got {type(cache).__name__}"
                )
            cache.check_append((b, self.num_kv_heads, n, self.head_dim), x.dtype, x.device)
            grouped_options.check_cache_values(cache.v.shape[-1], self.v_head_dim)
            start = cache.length
        m = start + n
        if positions is None:
            positions = start + torch.arange(n, device=x.device)
        positions = check_positions(positions, (b, self.num_heads, n, self.head_dim), x.device)
        padding = _key_padding(key_padding_mask, b, m, cache is not None, x.device)
        keep = dropout_keep_mask(
            "attn_dropout_mask",
            self.dropout,
            (b, self.num_heads, n, m),
            self.training,
            attn_dropout_mask,
            x.device,
        )
        with torch.no_grad() if cache is not None or from_cache else contextlib.nullcontext():
            return self._chain(x, positions, padding, keep, cache, shared)

    def _chain(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        padding: torch.Tensor | None,
        keep: torch.Tensor | None,
        cache: KVCache | PagedKVCache | None,
        shared: SharedKV | None = None,
    ) -> torch.Tensor:
        """The forward chain (see the module docstring); inputs already checked. A KV-shared
        layer's keys and values are ``shared``'s, taken as they are."""
        rotation: dict[str, Any] = {
            "inv_freq": self._frequencies(positions),
            "interleaved": self.rope_interleaved,
            "attention_factor": self.rope_attention_factor,
            "rotary_dim": self.rotary_dim,
        }
        own = shared is None  # a KV-shared layer's keys and values are another layer's
        q = self.q_proj(x)  # (B, N, H*D)
        if shared is None:
            k = self.k_proj(x)  # (B, N, H_kv*D)
            v = k if self.values_from_keys else self.v_proj(x)  # (B, N, H_kv*Dv)
        else:
            k, v = shared  # (B, H_kv, M, D) each, normed and rotated by their own layer
        c = self.clip_qkv  # (refused with shared keys and values)
        if c is not None and not self.clip_after_norm:  # OLMo, DBRX
            q, k, v = clip(q, c), clip(k, c), clip(v, c)
        if self.qk_norm and self.qk_norm_position == "before_rope":  # per head or whole
            q = self._norm(self.q_norm, q, self.num_heads)
            if own:
                k = self._norm(self.k_norm, k, self.num_kv_heads)
        if c is not None and self.clip_after_norm:  # OLMoE: q and k after their norm
            q, k, v = clip(q, c), clip(k, c), clip(v, c)
        q = split_heads(q, self.num_heads)  # (B, N, H*D) -> (B, H, N, D)
        if own:
            k = split_heads(k, self.num_kv_heads)  # -> (B, H_kv, N, D)
            v = split_heads(v, self.num_kv_heads)  # -> (B, H_kv, N, Dv)
            if self.value_norm:  # Gemma 3n, Gemma 4: v / rms over each head's Dv
                v = self.v_norm(v)
            if self.value_scale != 1.0:  # MiMo-V2-Flash: the values times a constant, cached
                v = v * self.value_scale
        q = rope(q, positions, **rotation)
        if own:
            k = rope(k, positions, **rotation)
        if self.qk_norm and self.qk_norm_position == "after_rope":  # the rotated heads
            q = self._norm_heads(self.q_norm, q)
            if own:
                k = self._norm_heads(self.k_norm, k)
        if own:  # what a KV-shared layer reads: this call's keys and values (a cache's else)
            self.kv = SharedKV(k, v) if cache is None else None
        if self.query_temperature is not None:  # q * t(p), row by row
            counted = _temperature_positions(self.query_temperature, positions, cache)
            q = query_temperature(q, counted, self.query_temperature)
        # With a cache: k, v appended, q attending over everything cached (-> (B, H_kv, M, D),
        # (B, H_kv, M, Dv))
        attend = attention if cache is None else cache.attend
        values: dict[str, Any] = {}  # differential: each query head reads both value halves
        if self.differential and cache is None:
            v = differential_values(v)  # (B, H_kv, N, D) -> (B, H_kv, N, 2D)
        elif self.differential:  # the cache holds v; the values it reads are rearranged
            values["value_map"] = differential_values
        heads = attend(
            q,
            k,
            v,
            causal=True,
            window=self.window,
            align="bottom-right",  # query i at key position M - N + i (i without a cache)
            key_padding_mask=padding,
            scale=self.scaling,
            softcap=self.softcap,
            sinks=self.sinks if self.has_sinks else None,
            alibi_slopes=self.alibi_slopes,
            enable_gqa=True,
            dropout_p=self.dropout if self.training else 0.0,
            dropout_mask=keep,
            backend=self.backend,
            **values,
            chunk_size=self.chunk_size,
            chunk_start=None if self.chunk_size is None else _left_padding(padding),
        )  # (B, H, N, Dv), (B, H, N, 2D) differential
        if self.lambda_init is not None:  # head h minus lambda times head h + H/2, normed
            q1, k1, q2, k2 = (getattr(self, name) for name in LAMBDA_NAMES)
            lambdas = (q1, k1, q2, k2)
            heads = differential(heads, lambdas, self.lambda_init, self.differential_eps)
        merged = merge_heads(heads)  # (B, H, N, Dv) -> (B, N, H*Dv)
        if self.output_gate is not None:  # (B, N, H*Dv) gated by (B, N, H*Dv) or (B, N, H)
            merged = output_gate(merged, self.g_proj(x), self.gate_activation)
        if self.output_norm:  # BitNet: an RMSNorm over all H*D coordinates of each token
            merged = self.o_norm(merged)
        return self.o_proj(merged)  # (B, N, H*Dv) -> (B, N, C)

    def _frequencies(self, positions: torch.Tensor) -> torch.Tensor:
        """The call's RoPE frequencies: LongRoPE's long ones when the largest position + 1
        exceeds ``original_max_positions``, else ``inv_freq`` (the NumPy twin's rule)."""
        long, switch = self.long_inv_freq, self.original_max_positions
        if long is None or switch is None or positions.numel() == 0:
            return self.inv_freq
        return long if int(positions.max()) + 1 > switch else self.inv_freq

    def _norm(self, norm: nn.Module, y: torch.Tensor, heads: int) -> torch.Tensor:
        """QK-norm of a projection y (B, N, heads*D): per head on (B, N, heads, D), or over the
        whole width (``qk_norm_shape="all"``)."""
        if self.qk_norm_shape == "all":
            return norm(y)
        b, n, width = y.shape
        return norm(y.reshape(b, n, heads, self.head_dim)).reshape(b, n, width)

    def _norm_heads(self, norm: nn.Module, y: torch.Tensor) -> torch.Tensor:
        """QK-norm after RoPE: the rotated heads y (B, heads, N, D) seen as the projection
        (B, N, heads*D) again and normed as ``_norm`` norms it."""
        b, heads, n, d = y.shape
        flat = y.transpose(1, 2).reshape(b, n, heads * d)  # -> (B, N, heads*D)
        return self._norm(norm, flat, heads).reshape(b, n, heads, d).transpose(1, 2)

    def extra_repr(self) -> str:
        options = [
            f"hidden_size={self.hidden_size}",
            *([f"input_size={self.input_size}"] if self.input_size != self.hidden_size else []),
            f"num_heads={self.num_heads}",
            f"num_kv_heads={self.num_kv_heads}",
            f"head_dim={self.head_dim}",
        ]
        if self.v_head_dim != self.head_dim:
            options.append(f"v_head_dim={self.v_head_dim}")
        if self.value_scale != 1.0:
            options.append(f"value_scale={self.value_scale}")
        if self.rotary_dim != self.head_dim:
            options.append(f"rotary_dim={self.rotary_dim}")
        if self.original_max_positions is not None:
            options.append(f"original_max_positions={self.original_max_positions}")
        if self.qk_norm:
            norm = f"{type(self.q_norm).__name__}, {self.qk_norm_shape}"
            options.append(f"qk_norm=True ({norm}), norm_eps={self.norm_eps}")
            if self.qk_norm_position != "before_rope":
                options.append(f"qk_norm_position={self.qk_norm_position!r}")
        if self.query_temperature is not None:
            options.append(f"query_temperature={self.query_temperature}")
        if self.window is not None:
            options.append(f"window={self.window}")
        if self.chunk_size is not None:
            options.append(f"chunk_size={self.chunk_size}")
        if self.softcap:
            options.append(f"softcap={self.softcap}")
        if self.has_sinks:
            options.append("sinks=True")
        if self.output_gate is not None:
            options.append(f"output_gate={self.output_gate!r} ({self.gate_activation})")
        if self.clip_qkv is not None:
            after = " after the QK-norm" if self.clip_after_norm else ""
            options.append(f"clip_qkv={self.clip_qkv}{after}")
        if self.output_norm:
            options.append(f"output_norm=True, output_norm_eps={self.o_norm.eps}")
        if self.differential:
            eps = self.differential_eps
            options.append(f"differential=True, lambda_init={self.lambda_init}, eps={eps}")
        if self.value_norm:
            options.append("value_norm=True")
        if self.kv_shared:
            options.append("kv_shared=True")
        if self.values_from_keys:
            options.append("values_from_keys=True")
        if self.scaling is not None:
            options.append(f"scaling={self.scaling}")
        if self.dropout:
            options.append(f"dropout={self.dropout}")
        return ", ".join(options + [f"backend={self.backend!r}"])


_NORMS: dict[str, type[RMSNorm] | type[LayerNorm]] = {
    "rms": RMSNorm,
    "layer": LayerNorm,
    "layer_bias": LayerNorm,
}  # the QK-norm's class by qk_norm_type (the weightless one aside)


def _check_inv_freq(name: str, inv_freq: Any, rotary_dim: int, rope_theta: Any) -> torch.Tensor:
    """RoPE's (R/2,) frequencies, float64 on the CPU: given (finite, that length), or from
    rope_theta (none for R = 0)."""
    if inv_freq is None:
        if rotary_dim == 0:
            return torch.zeros(0, dtype=torch.float64)
        return rope_inv_freq(rotary_dim, rope_theta)
    if isinstance(inv_freq, torch.Tensor):
        inv_freq = inv_freq.detach().cpu()
    freqs = torch.as_tensor(np.asarray(inv_freq))
    if not freqs.is_floating_point():
        raise TypeError(f"{name} must be a floating-point array, got dtype {freqs.dtype}")
    if tuple(freqs.shape) != (rotary_dim // 2,):
        raise ValueError(
            f"{name} must be (rotary_dim / 2,) = ({rotary_dim // 2},), got shape "
            f"{tuple(freqs.shape)}"
        )
    if not bool(torch.isfinite(freqs).all()):
        raise ValueError(f"{name} must be finite")
    return freqs.to(torch.float64)


def _check_alibi(slopes: Any, heads: int) -> torch.Tensor | None:
    """ALiBi's slopes (H,), one per query head, float64 on the CPU like ``inv_freq`` (moved per
    call, never rounded by ``.to(dtype)``), finite (None passes through)."""
    if slopes is None:
        return None
    if isinstance(slopes, torch.Tensor):
        slopes = slopes.detach().cpu()
    tensor = torch.as_tensor(np.asarray(slopes))
    if not tensor.is_floating_point():
        raise TypeError(f"alibi_slopes must be a floating-point array, got dtype {tensor.dtype}")
    if tuple(tensor.shape) != (heads,):
        raise ValueError(
            f"alibi_slopes must be (H,) = ({heads},), one slope per query head, got shape "
            f"{tuple(tensor.shape)}"
        )
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError("alibi_slopes must be finite (None for no ALiBi)")
    return tensor.to(torch.float64)


def _check_long_rope(
    long_inv_freq: Any, original_max_positions: Any, rotary_dim: int
) -> tuple[torch.Tensor | None, int | None]:
    """LongRoPE's long frequencies and switch length: both given, or neither."""
    if (long_inv_freq is None) != (original_max_positions is None):
        raise ValueError(
            "long_inv_freq and original_max_positions go together (LongRoPE): got "
            f"long_inv_freq {'None' if long_inv_freq is None else 'given'} and "
            f"original_max_positions {original_max_positions!r}"
        )
    if long_inv_freq is None:
        return None, None
    if rotary_dim == 0:
        raise ValueError("long_inv_freq needs RoPE: rotary_dim is 0")
    freqs = _check_inv_freq("long_inv_freq", long_inv_freq, rotary_dim, 1.0)
    return freqs, validation.positive_int("original_max_positions", original_max_positions)


def _left_padding(padding: torch.Tensor | None) -> torch.Tensor | None:
    """Each sequence's count of padded keys before its first real one, (B,), where its chunks
    start (transformers' chunked mask counts them from the attention mask so); None without
    padding."""
    if padding is None:
        return None
    return ((~padding).cumsum(dim=1) == 0).sum(dim=1)  # (B, M) -> (B,)


def _temperature_positions(
    spec: Mapping[str, Any], positions: torch.Tensor, cache: KVCache | PagedKVCache | None
) -> torch.Tensor:
    """The positions the query temperature counts: the RoPE positions, or with
    ``"positions": "cache"`` the tokens' places on the cache, ``cache.length + arange(N)``."""
    if spec.get("positions") != "cache":
        return positions
    start = 0 if cache is None else cache.length
    return start + torch.arange(positions.shape[-1], device=positions.device)


def _key_padding(
    mask: Any, batch: int, m: int, cached: bool, device: torch.device
) -> torch.Tensor | None:
    """The key padding mask checked as bool (B, M), True = padding (None passes through)."""
    if mask is None:
        return None
    mask = validation.bool_tensor("key_padding_mask", mask, device)
    if tuple(mask.shape) != (batch, m):
        keys = "the cache's length after this call" if cached else "x's N"
        raise ValueError(
            f"key_padding_mask is (B, M) over the keys attended, M = {keys}: expected "
            f"{(batch, m)}, got {tuple(mask.shape)}"
        )
    return mask
