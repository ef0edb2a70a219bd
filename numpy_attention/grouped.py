"""Today's decoder attention: grouped-query attention with RoPE, optional QK-norm, a sliding window,
softcap, sinks, an output gate, a clip of q, k and v and a norm of the merged heads, and a KV cache
for decoding, named like Hugging Face's Llama family so that its attention state dicts load
without renaming.

Shape legend: B batch, H query heads, H_kv key/value heads (H % H_kv == 0), N tokens of this call,
M keys attended (N without a cache; the cache's length after this call with one), C model width
(``hidden_size``), D head width (``head_dim``), Dv value head width (``v_head_dim``, D by
default).

The layer's chain, and its backward walking it in reverse through the parts' own backwards:

    q = rope(split_heads(q_norm(q_proj(x)), H))        (B, H, N, D)     q_norm: QK-norm only
    k = rope(split_heads(k_norm(k_proj(x)), H_kv))     (B, H_kv, N, D)  (appended to the cache)
    q = t(p) * q                                       (B, H, N, D)     query_temperature only
    v = s_v * v_norm(split_heads(v_proj(x), H_kv))     (B, H_kv, N, Dv) v_norm: value_norm only
    o = attention(q, k, v; causal, window, softcap, sinks, ALiBi, scale, GQA, dropout)
    o = (1 - li) rmsnorm(o_h - lambda o_(h+H/2))       (B, H/2, N, 2D)  differential only
    a = merge_heads(o) * act(g_proj(x))                (B, N, H*Dv)     gate: output_gate only
    a = o_norm(a)                                      (B, N, H*Dv)     output_norm only
    out = o_proj(a)                                    (B, N, C)

The values may be narrower than the queries and keys (``v_head_dim``, MiMo-V2-Flash) and scaled
by a constant s_v (``value_scale``, 1 by default: MiMo-V2-Flash's ``attention_value_scale``),
which the backward applies to dV again (docs/derivations/value-scale.md).

With ``clip_qkv = c`` each of q_proj(x), k_proj(x) and v_proj(x) is clamped to [-c, c]
(``clip.py``) before the QK-norm, or, with ``clip_after_norm``, q and k after it (OLMoE; v has
no norm and is clamped after its projection either way).

The QK-norm reads the projection (B, N, H*D): per head (each head's D coordinates, Qwen3, Gemma 3,
Cohere) or over the whole projection (OLMo 2), an RMSNorm or a LayerNorm, scale (offset + w), or
an RMSNorm without a weight (nanochat); before RoPE, or after it (``qk_norm_position``:
Hunyuan, nanochat), where the rotated heads are seen as the projection again and normed the same
way. The query temperature (``temperature.py``) scales each query row by a factor of its
position alone, after RoPE and the QK-norm (Ministral 3, Beam's NoPE layers).
RoPE turns the first ``rotary_dim`` coordinates of each head (all of them by default; fewer for
partial rotary, none for a NoPE layer), with the frequencies of the call (LongRoPE's long ones
past ``original_max_positions``). The output gate (``gate.py``) scales each coordinate, or each
head, of the merged heads by act(x W_g), act a sigmoid or a softplus. Differential attention
(``differential.py``, DiffLlama) attends over both halves of the value heads side by side (2D
wide) and subtracts head h + H/2 from head h, lambda-weighted, before a weightless RMSNorm.
x feeds the query, key and value paths (and the gate's), so dx = dxq + dxk + dxv (+ dxg).
``rope_forward``, ``rope_backward``, ``RMSNorm`` and ``LayerNorm`` live on the layers floor
(``rope.py``, ``norms.py``).

A layer built with ``kv_shared`` computes no k or v: it attends with another layer's
(``shared_kv.py``: Gemma 3n's and Gemma 4's last layers), and its backward leaves their
gradient in its ``dkv`` for the source layer's backward to add.

Decoding, the layer hands q, k, v to its cache's ``attend``, which appends k, v and attends over
everything cached: a contiguous ``KVCache`` or pages, ``PagedKVCache``, both in
``decode/cache.py`` (equal results; docs/decoding.md).

Derivation: docs/derivations/grouped.md (the chain, GQA's group sums, QK-norm's place and width,
LongRoPE's switch, the cache), docs/derivations/rope.md (partial rotary),
docs/derivations/rmsnorm.md, docs/derivations/layernorm.md, docs/derivations/output-gate.md,
docs/derivations/clip-qkv.md, docs/derivations/output-norm.md,
docs/derivations/qk-norm-after-rope.md, docs/derivations/query-temperature.md,
docs/derivations/value-scale.md, docs/derivations/differential.md,
docs/derivations/shared-kv.md.
Tests: tests/numpy_attention/test_grouped.py (gradcheck of every option, torch autograd, decode
equals the full sequence, the cache, bad input); tests/numpy_attention/test_rope.py,
tests/numpy_attention/test_norms.py, tests/numpy_attention/test_shared_kv.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from . import grouped_options, validation
from .clip import ClipCtx, clip_backward, clip_forward
from .decode.cache import KVCache, PagedKVCache
from .differential import (
    LAMBDA_NAMES,
    LAMBDA_STD,
    DifferentialCtx,
    differential_backward,
    differential_forward,
    differential_values_backward,
    differential_values_forward,
)
from .functional import (
    HeadsCtx,
    attention_backward,
    attention_forward,
    merge_heads_backward,
    merge_heads_forward,
    split_heads_backward,
    split_heads_forward,
)
from .gate import GateCtx, gate_width, output_gate_backward, output_gate_forward
from .grad_mode import no_grad
from .layers import Linear, dropout_keep_mask
from .module import Module
from .norms import LayerNorm, RMSNorm, WeightlessRMSNorm
from .rope import RopeCtx, check_positions, rope_backward, rope_forward, rope_inv_freq
from .shared_kv import SharedKV, check_shared_grad, read_shared_kv
from .temperature import (
    TemperatureCtx,
    query_temperature_backward,
    query_temperature_forward,
)

__all__ = ["GroupedQueryAttention"]

# -- the layer ----------------------------------------------------------------------------------


class _GroupedCtx(NamedTuple):
    q_heads: HeadsCtx
    k_heads: HeadsCtx | None  # None for a KV-shared layer (no keys or values of its own)
    v_heads: HeadsCtx | None
    q_rope: RopeCtx
    k_rope: RopeCtx | None
    attn: Any  # attention_forward's ctx (dense or tiled)
    out_heads: HeadsCtx
    gate: GateCtx | None  # with an output gate
    clips: tuple[ClipCtx, ClipCtx, ClipCtx] | None  # q, k, v's, with clip_qkv
    temperature: TemperatureCtx | None  # with a query temperature
    differential: DifferentialCtx | None  # with differential attention


class _CachedForward(NamedTuple):
    """What a forward with a cache leaves: nothing to differentiate."""


class GroupedQueryAttention(grouped_options.GroupedOptions, Module):
    """Causal grouped-query self-attention with RoPE, as in Llama, Mistral, Qwen2/3, Gemma 2/3,
    GPT-OSS, Phi-3, OLMo 2, Cohere 1/2, StarCoder 2, Granite, SmolLM 3, GLM and Falcon.

    Parameters, created in this order: ``q_proj`` = Linear(C, H*D, bias), ``k_proj`` =
    Linear(C, H_kv*D, bias), ``v_proj`` = Linear(C, H_kv*Dv, bias), ``o_proj`` = Linear(H*Dv,
    C, out_bias) (Dv = D unless ``v_head_dim`` says otherwise); with
    ``qk_norm``, ``q_norm`` and ``k_norm`` (an RMSNorm or LayerNorm, weight by
    ``qk_norm_shape``: (D,), (H, D) and (H_kv, D), or (H*D,) and (H_kv*D,), and for
    ``"layer_bias"`` a bias of the weight's shape beside it; none for ``"rms_weightless"``); with
    ``sinks``,
    ``sinks`` (H,), zeros at initialisation (a sink of logit 0 weighs like one key of score 0;
    trained or loaded values replace it); with ``differential``, ``lambda_q1``, ``lambda_k1``,
    ``lambda_q2``, ``lambda_k2`` (D,) (the layer's own, so first in its state dict, as in
    DiffLlama's); with ``output_gate``, ``g_proj`` = Linear(C, H*D)
    per element or Linear(C, H) per head, bias by ``gate_bias``; with ``output_norm``,
    ``o_norm`` = RMSNorm(H*D) (BitNet's ``attn_sub_norm``). With ``input_size``, q_proj,
    k_proj, v_proj and g_proj read that many features instead of C.

    Args:
        hidden_size: C.
        num_heads: H, a multiple of ``num_kv_heads``.
        num_kv_heads: H_kv; H_kv = H is multi-head attention, 1 multi-query.
        head_dim: D (even when RoPE turns the whole head); None for C // H (C must then divide
            by H).
        bias: whether q_proj, k_proj and v_proj have biases (Qwen2, GPT-OSS).
        out_bias: whether o_proj has a bias (GPT-OSS).
        rope_theta: the RoPE base when ``inv_freq`` is None: inv_freq = rope_theta^(-2i/R).
        inv_freq: (R/2,) RoPE frequencies used as given (a model's own; rope_theta is then
            unused).
        rope_attention_factor: multiplies RoPE's cos and sin (YaRN's, LongRoPE's factor).
        rope_interleaved: RoPE's pairs are (x_2i, x_2i+1) instead of (x_i, x_i+R/2).
        rotary_dim: R, the leading coordinates of each head that RoPE turns: None for D, fewer
            for partial rotary (GLM, Phi-3's ``partial_rotary_factor``), 0 for none (a NoPE
            layer: SmolLM 3, Cohere 2's full layers). Even, at most D.
        long_inv_freq: (R/2,) LongRoPE's long frequencies (Phi-3), used by a call whose largest
            position + 1 exceeds ``original_max_positions`` (``inv_freq`` otherwise), as Hugging
            Face's LongRoPE chooses per forward; None for one set of frequencies.
        original_max_positions: LongRoPE's ``original_max_position_embeddings``; given with
            ``long_inv_freq`` and only with it.
        qk_norm: a norm of q and k, before RoPE or after it (``qk_norm_position``).
        norm_eps: the QK-norm's eps.
        qk_norm_type: ``"rms"`` (RMSNorm: Qwen3, Gemma 3, OLMo 2, Hunyuan), ``"layer"``
            (LayerNorm without bias: Cohere), ``"layer_bias"`` (LayerNorm with a bias, parameters
            ``q_norm.bias`` and ``k_norm.bias`` of the weights' shapes: Persimmon, MPT's whole
            projection) or ``"rms_weightless"`` (RMSNorm without a weight,
            no parameter: nanochat, Llama 4's L2Norm; shape ``"head"`` or ``"all"``, no offset).
        qk_norm_shape: what is normalized and the weight's shape: ``"head"`` each head's D
            coordinates, one weight (D,) for all heads (Qwen3, Gemma 3); ``"per_head"`` each
            head's D coordinates, a weight (H, D) (Cohere); ``"all"`` the whole projection, H*D
            coordinates of q and H_kv*D of k, weights (H*D,) and (H_kv*D,) (OLMo 2).
        norm_weight_offset: the QK-norm scales by (offset + w): 0, or Gemma 3's 1.
        qk_norm_position: ``"before_rope"`` (the projections are normed, then rotated: Qwen3,
            Gemma 3, OLMo 2) or ``"after_rope"`` (the rotated heads are normed: Hunyuan,
            nanochat, Llama 4).
        query_temperature: None, or the queries' position-dependent factor t(p) applied after
            RoPE and the QK-norm, a mapping ``{"kind": "log_floor", "beta", "length",
            "offset"}`` (1 + beta * log(1 + floor((p + offset) / length)): Ministral 3, Llama
            4) or ``{"kind": "power", "exponent", "length", "offset"}`` ((1 + (p + offset) /
            length) ** exponent: Beam); ``temperature.py``.
        window: (left, right) as in ``attention_forward`` (query i sees keys i - left ..
            i + right, intersected with causal; None sides unbounded), or None. Hugging Face's
            ``sliding_window = W`` is (W - 1, 0).
        softcap: > 0 caps the scores, ``softcap * tanh(S / softcap)`` (Gemma 2); 0 = off.
        sinks: one learned sink logit per query head (GPT-OSS).
        output_gate: None, or ``"element"`` (the merged heads times act(x W_g), W_g giving H*D
            gates: Qwen3-Next, Qwen3.5, whose checkpoints fuse W_g into q_proj: the converter
            splits it) or ``"head"`` (each head's D coordinates times one gate, W_g giving H:
            LFM3, Laguna's per-head layers), before o_proj.
        gate_activation: the gate's act, ``"sigmoid"`` or ``"softplus"`` (Laguna).
        gate_bias: whether g_proj has a bias.
        clip_qkv: None, or c > 0: q_proj(x), k_proj(x) and v_proj(x) clamped to [-c, c]
            (OLMo, OLMoE, DBRX), before the QK-norm; the gradient passes where -c <= x <= c.
        clip_after_norm: q and k clamped after the QK-norm instead (OLMoE); needs clip_qkv
            and qk_norm.
        output_norm: an RMSNorm over the merged heads (H*D coordinates, weight ``o_norm``)
            before o_proj (BitNet's ``attn_sub_norm``). Not with an output gate (no model has
            both, and their order would be a guess).
        output_norm_eps: its eps; needs output_norm when not the default.
        scaling: the score scale; None for 1 / sqrt(D) (Gemma 2: query_pre_attn_scalar^-0.5).
        dropout: dropout probability on the attention weights, in [0, 1) (train mode only).
        input_size: the width of x that q_proj, k_proj, v_proj (and g_proj) read; None for
            hidden_size. o_proj writes hidden_size whatever it is (Zamba's shared attention
            reads its hidden states concatenated with the embeddings, 2 * hidden_size).
        alibi_slopes: None, or (H,) ALiBi slopes, one per query head: the scores get
            ``-slope_h * |p_i - j|`` (query i at key position M - N + i), on the training path
            and the cache's alike (MPT). A constant, no parameter; the backward is the core's
            (docs/derivations/alibi.md).
        v_head_dim: Dv, the values' head width, which v_proj gives per key/value head and
            o_proj reads per query head (H*Dv); None for D (MiMo-V2-Flash: 128 against D =
            192). The score scale stays 1 / sqrt(D) unless ``scaling`` is given.
        value_scale: s_v, a constant the values are multiplied by after v_proj (and its clamp)
            and before the cache: the cache holds s_v * v (MiMo-V2-Flash's
            ``attention_value_scale``); the backward scales dV by it. Finite.
        differential: differential attention (DiffLlama, ``differential.py``): each query
            head attends over both halves of the value heads side by side (2D wide), head h
            minus lambda times head h + H/2 (lambda = exp(lambda_q1 . lambda_k1) -
            exp(lambda_q2 . lambda_k2) + lambda_init), a weightless RMSNorm over each 2D, times
            1 - lambda_init, before o_proj; parameters ``lambda_q1``, ``lambda_k1``,
            ``lambda_q2``, ``lambda_k2`` (D,), drawn from N(0, 0.1^2). Needs an even H_kv; not
            with an output gate, the output norm or dropout.
        lambda_init: the differential constant, required with ``differential`` (DiffLlama's is
            ``differential.lambda_init_from_depth(layer_idx)``).
        differential_eps: the differential norm's eps; needs differential when not the default.
        chunk_size: None, or C: chunked attention (Llama 4's RoPE layers): a query sees only
            the keys of its own chunk of C positions, on the training path and the cache's
            alike; the chunks of a left-padded sequence start at its first unpadded key (the
            leading True entries of ``key_padding_mask``), as transformers counts them
            (docs/derivations/windows.md#chunks).
        value_norm: a weightless RMSNorm over each head's D coordinates of v, eps
            ``norm_eps``, before attention (Gemma 3n's and Gemma 4's ``v_norm``); no parameter.
        kv_shared: the layer attends with another layer's keys and values (Gemma 3n's and
            Gemma 4's last ``num_kv_shared_layers`` layers): it has no ``k_proj``, ``v_proj`` or
            ``k_norm``, and its forward takes ``shared_kv`` (``shared_kv.py``). Not with
            ``value_norm`` or ``clip_qkv`` (they act on its own values, which it has none of).
        values_from_keys: no ``v_proj``: the values are the key projection's output, taken
            before the key's QK-norm and RoPE (then normed by the value norm, if any): Gemma 4's
            ``attention_k_eq_v`` on its full layers. Not with ``kv_shared`` or ``clip_qkv``.
        rng: generator or seed for the projections' initial weights and the keep-masks drawn
            in train mode.
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
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        self.check_options(**grouped_options.option_args(locals()))  # the scalar options
        self.inv_freq = _check_inv_freq("inv_freq", inv_freq, self.rotary_dim, rope_theta)
        self.long_inv_freq, self.original_max_positions = _check_long_rope(
            long_inv_freq, original_max_positions, self.rotary_dim
        )
        self.alibi_slopes = _check_alibi(alibi_slopes, self.num_heads)
        self.kv: SharedKV | None = None  # the keys and values of the last forward, to share
        self.dkv: SharedKV | None = None  # a KV-shared layer's: their gradient, by backward
        self.rng = np.random.default_rng(rng)

        width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        v_width = self.num_kv_heads * self.v_head_dim  # v_proj's output, H_kv*Dv
        merged_width = self.num_heads * self.v_head_dim  # the merged heads o_proj reads, H*Dv
        bias = validation.flag("bias", bias)
        out_bias = validation.flag("out_bias", out_bias)
        self.q_proj = Linear(self.input_size, width, bias=bias, rng=self.rng)
        if not self.kv_shared:  # a KV-shared layer reads another layer's keys and values
            self.k_proj = Linear(self.input_size, kv_width, bias=bias, rng=self.rng)
        if not (self.kv_shared or self.values_from_keys):  # Gemma 4's full layers: v = k_proj
            self.v_proj = Linear(self.input_size, v_width, bias=bias, rng=self.rng)
        self.o_proj = Linear(merged_width, self.hidden_size, bias=out_bias, rng=self.rng)
        if self.value_norm:  # Gemma 3n, Gemma 4: each head of v over its Dv, no weight
            self.v_norm = WeightlessRMSNorm(self.v_head_dim, self.norm_eps)
        if self.qk_norm and qk_norm_type == "rms_weightless":  # no parameter
            self.q_norm: Module = WeightlessRMSNorm(
                grouped_options.norm_width(self.qk_norm_shape, self.num_heads, self.head_dim),
                self.norm_eps,
            )
            if not self.kv_shared:  # only the queries are its own
                self.k_norm: Module = WeightlessRMSNorm(
                    grouped_options.norm_width(
                        self.qk_norm_shape, self.num_kv_heads, self.head_dim
                    ),
                    self.norm_eps,
                )
        elif self.qk_norm:
            norm = _NORMS[qk_norm_type]
            offset: dict[str, Any] = {"weight_offset": norm_weight_offset}
            if qk_norm_type == "layer_bias":  # q_norm.bias, k_norm.bias beside the weights
                offset["bias"] = True
            self.q_norm = norm(
                grouped_options.norm_dim(self.qk_norm_shape, self.num_heads, self.head_dim),
                self.norm_eps,
                **offset,
            )
            if not self.kv_shared:  # only the queries are its own
                self.k_norm = norm(
                    grouped_options.norm_dim(self.qk_norm_shape, self.num_kv_heads, self.head_dim),
                    self.norm_eps,
                    **offset,
                )
        if self.has_sinks:
            self.register_parameter("sinks", np.zeros(self.num_heads, dtype=np.float32))
        if self.output_gate is not None:
            gates = gate_width(self.output_gate, self.num_heads, self.v_head_dim)
            self.g_proj = Linear(self.input_size, gates, bias=self.gate_bias, rng=self.rng)
        if self.output_norm:
            self.o_norm = RMSNorm(merged_width, float(output_norm_eps))
        if self.differential:  # Hugging Face's names and init: normal(0, 0.1), (D,) each
            for name in LAMBDA_NAMES:
                lambdas = self.rng.normal(0.0, LAMBDA_STD, self.head_dim).astype(np.float32)
                self.register_parameter(name, lambdas)

    def constructor_args(self) -> dict[str, Any]:
        """The base's, in a form that survives JSON (``save_module``): ``inv_freq``,
        ``long_inv_freq`` and ``alibi_slopes`` arrays as lists of floats (exact: float64 holds
        every float32 value), ``window`` as a tuple whether it was given as a tuple or as the
        list JSON reads back, ``query_temperature`` as a plain dict."""
        args = super().constructor_args()
        for name in ("inv_freq", "long_inv_freq", "alibi_slopes"):
            if args[name] is not None:
                args[name] = np.asarray(args[name], dtype=np.float64).tolist()
        if args["window"] is not None:
            args["window"] = tuple(args["window"])
        if args["query_temperature"] is not None:
            args["query_temperature"] = dict(args["query_temperature"])
        return args

    def forward(
        self,
        x: np.ndarray,
        *,
        positions: Any = None,
        key_padding_mask: np.ndarray | None = None,
        cache: KVCache | PagedKVCache | None = None,
        attn_dropout_mask: np.ndarray | None = None,
        shared_kv: SharedKV | tuple[Any, Any] | KVCache | PagedKVCache | None = None,
    ) -> np.ndarray:
        """Causal self-attention of x's tokens over the cache's and their own (over the shared
        keys and values, for a KV-shared layer).

        Args:
            x: (B, N, C), or (B, N, input_size) when given.
            positions: RoPE positions, (N,) or (B, N) (each batch element its own: left
                padding); default ``cache.length + arange(N)`` (``arange(N)`` without a cache).
            key_padding_mask: bool (B, M), True = padding, over the keys attended: x's N tokens,
                or with a cache all ``cache.length + N`` of them.
            cache: a ``KVCache`` of this layer's (B, H_kv, D), Dv and dtype, or a
                ``PagedKVCache`` of its (H_kv, D), Dv and dtype (equal results): this call's keys
                and values are appended and the queries attend with ``align="bottom-right"``
                (token i of x sits at position ``cache.length + i`` of the key axis). No
                backward follows a forward with a cache.
            attn_dropout_mask: bool (B, H, N, M), True = kept; train mode with dropout > 0.
            shared_kv: a KV-shared layer's keys and values, and only its: the source layer's
                ``kv`` (a ``SharedKV`` or (k, v) pair, (B, H_kv, M, D), M >= N: the queries are
                the last N positions of the key axis, attended with ``align="bottom-right"``),
                or the source layer's ``KVCache`` / ``PagedKVCache`` after its own call of this
                step (read, not appended to; no backward follows). The positions default to
                ``M - N + arange(N)``.

        Returns:
            (B, N, C).
        """
        x = validation.layer_input("x", x, self.input_size, (3,), self.dtype)
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
            shared, from_cache = read_shared_kv(shared_kv, shape, n, x.dtype)
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
            cache.check_append((b, self.num_kv_heads, n, self.head_dim), x.dtype)
            grouped_options.check_cache_values(cache.v.shape[-1], self.v_head_dim)
            start = cache.length
        m = start + n
        if positions is None:
            positions = start + np.arange(n)
        positions = check_positions(positions, (b, self.num_heads, n, self.head_dim))
        padding = _key_padding(key_padding_mask, b, m, cache is not None)
        keep = dropout_keep_mask(
            "attn_dropout_mask",
            self.dropout,
            (b, self.num_heads, n, m),
            self.training,
            attn_dropout_mask,
            self.rng,
        )

        # With a cache there is no backward: keep nothing (no probabilities, no projections' x).
        inference = cache is not None or from_cache
        with no_grad() if inference else contextlib.nullcontext():
            out, ctx = self._chain(x, positions, padding, keep, cache, shared)
        self._save_ctx(_CachedForward() if inference else ctx, out)
        return out

    def _chain(
        self,
        x: np.ndarray,
        positions: np.ndarray,
        padding: np.ndarray | None,
        keep: np.ndarray | None,
        cache: KVCache | PagedKVCache | None,
        shared: SharedKV | None = None,
    ) -> tuple[np.ndarray, _GroupedCtx]:
        """The forward chain (see the module docstring); inputs already checked. A KV-shared
        layer's keys and values are ``shared``'s, taken as they are (normed and rotated by
        their own layer)."""
        rope: dict[str, Any] = {
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
        clip, clips = self.clip_qkv, None  # (refused with shared keys and values)
        if clip is not None and not self.clip_after_norm:  # OLMo, DBRX
            (q, k, v), clips = _clip_qkv(clip, q, k, v)
        if self.qk_norm and self.qk_norm_position == "before_rope":  # per head or whole
            q = self._norm_forward(self.q_norm, q, self.num_heads)
            if own:
                k = self._norm_forward(self.k_norm, k, self.num_kv_heads)
        if clip is not None and self.clip_after_norm:  # OLMoE: q, k after their norm
            (q, k, v), clips = _clip_qkv(clip, q, k, v)
        q, q_heads = split_heads_forward(q, self.num_heads)  # -> (B, H, N, D)
        k_heads = v_heads = k_rope = None
        if own:
            k, k_heads = split_heads_forward(k, self.num_kv_heads)  # -> (B, H_kv, N, D)
            v, v_heads = split_heads_forward(v, self.num_kv_heads)  # -> (B, H_kv, N, Dv)
            if self.value_norm:  # Gemma 3n, Gemma 4: v / rms over each head's Dv
                v = self.v_norm(v)
            if self.value_scale != 1.0:  # MiMo-V2-Flash: the values times a constant, cached
                v = v * self.value_scale
        q, q_rope = rope_forward(q, positions, **rope)
        if own:
            k, k_rope = rope_forward(k, positions, **rope)
        if self.qk_norm and self.qk_norm_position == "after_rope":  # the rotated heads
            q = self._norm_heads_forward(self.q_norm, q)
            if own:
                k = self._norm_heads_forward(self.k_norm, k)
        if own:  # what a KV-shared layer reads: this call's keys and values (a cache's else)
            self.kv = SharedKV(k, v) if cache is None else None
        temperature = None
        if self.query_temperature is not None:  # q * t(p), row by row
            counted = _temperature_positions(self.query_temperature, positions, cache)
            q, temperature = query_temperature_forward(q, counted, self.query_temperature)
        # With a cache: k, v appended, q attending over everything cached (-> (B, H_kv, M, D),
        # (B, H_kv, M, Dv))
        attend = attention_forward if cache is None else cache.attend
        values: dict[str, Any] = {}  # differential: each query head reads both value halves
        if self.differential and cache is None:
            v = differential_values_forward(v)  # (B, H_kv, N, D) -> (B, H_kv, N, 2D)
        elif self.differential:  # the cache holds v; the values it reads are rearranged
            values["value_map"] = differential_values_forward
        attn = attend(
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
            dropout_p=self.dropout if keep is not None else 0.0,
            dropout_mask=keep,
            **values,
            chunk_size=self.chunk_size,
            chunk_start=None if self.chunk_size is None else _left_padding(padding),
        )  # (B, H, N, Dv), (B, H, N, 2D) differential
        heads, differential = attn.out, None
        if self.lambda_init is not None:  # head h minus lambda times head h + H/2, normed
            q1, k1, q2, k2 = (getattr(self, name) for name in LAMBDA_NAMES)
            lambdas = (q1, k1, q2, k2)
            heads, differential = differential_forward(
                heads, lambdas, self.lambda_init, self.differential_eps
            )  # (B, H, N, 2D) -> (B, H/2, N, 2D)
        merged, out_heads = merge_heads_forward(heads)  # (B, H, N, Dv) -> (B, N, H*Dv)
        gate = None
        if self.output_gate is not None:  # (B, N, H*Dv) gated by (B, N, H*Dv) or (B, N, H)
            merged, gate = output_gate_forward(merged, self.g_proj(x), self.gate_activation)
        if self.output_norm:  # BitNet: an RMSNorm over all H*D coordinates of each token
            merged = self.o_norm(merged)
        out = self.o_proj(merged)  # (B, N, H*Dv) -> (B, N, C)
        ctx = _GroupedCtx(
            q_heads,
            k_heads,
            v_heads,
            q_rope,
            k_rope,
            attn.ctx,
            out_heads,
            gate,
            clips,
            temperature,
            differential,
        )
        return out, ctx

    def _frequencies(self, positions: np.ndarray) -> np.ndarray:
        """The call's RoPE frequencies: LongRoPE's long ones when the largest position + 1
        exceeds ``original_max_positions`` (Hugging Face's rule, per forward), else
        ``inv_freq``."""
        long, switch = self.long_inv_freq, self.original_max_positions
        if long is None or switch is None or positions.size == 0:
            return self.inv_freq
        return long if positions.max() + 1 > switch else self.inv_freq

    def _norm_forward(self, norm: Module, y: np.ndarray, heads: int) -> np.ndarray:
        """QK-norm of a projection y (B, N, heads*D): per head on (B, N, heads, D), or over the
        whole width (``qk_norm_shape="all"``)."""
        if self.qk_norm_shape == "all":
            return norm(y)
        b, n, width = y.shape
        return norm(y.reshape(b, n, heads, self.head_dim)).reshape(b, n, width)

    def _norm_backward(self, norm: Module, dy: np.ndarray, heads: int) -> np.ndarray:
        """``_norm_forward``'s backward: the same reshapes around the norm's own backward."""
        if self.qk_norm_shape == "all":
            return norm.backward(dy)
        b, n, width = dy.shape
        return norm.backward(dy.reshape(b, n, heads, self.head_dim)).reshape(b, n, width)

    def _norm_heads_forward(self, norm: Module, y: np.ndarray) -> np.ndarray:
        """QK-norm after RoPE: the rotated heads y (B, heads, N, D) seen as the projection
        (B, N, heads*D) again and normed as ``_norm_forward`` norms it."""
        b, heads, n, d = y.shape
        flat = y.transpose(0, 2, 1, 3).reshape(b, n, heads * d)  # -> (B, N, heads*D)
        out = self._norm_forward(norm, flat, heads)
        return out.reshape(b, n, heads, d).transpose(0, 2, 1, 3)  # -> (B, heads, N, D)

    def _norm_heads_backward(self, norm: Module, dy: np.ndarray) -> np.ndarray:
        """``_norm_heads_forward``'s backward: the same reshapes around ``_norm_backward``."""
        b, heads, n, d = dy.shape
        flat = dy.transpose(0, 2, 1, 3).reshape(b, n, heads * d)  # -> (B, N, heads*D)
        dflat = self._norm_backward(norm, flat, heads)
        return dflat.reshape(b, n, heads, d).transpose(0, 2, 1, 3)  # -> (B, heads, N, D)

    def backward(
        self, dout: np.ndarray, *, dkv: SharedKV | tuple[Any, Any] | None = None
    ) -> np.ndarray:
        """Gradient of x; adds the gradients of every parameter.

        dA = o_proj^T(dY);  with the output norm dA = o_norm^T(dA) (RMSNorm's backward);
        with a gate g = act(Z), Z = g_proj(x): dZ = act'(Z) * (dA * merged
        o, summed per head when per head), dxg = g_proj^T(dZ), dA = dA * g;
        dO = split(dA);  differential: dC = rmsnorm^T((1 - li) dO), dO_h = dC_h,
        dO_(h+H/2) = -lambda dC_h, dlambda = -sum(dC * O_(h+H/2)) into the four lambdas,
        and after the attention dv = the two value halves' gradients summed back;
        dQr, dKr, dV, dsinks = attention_backward(dO)  (dKr and dV
        summed over each group of H / H_kv query heads);  dV = s_v * dV (value_scale);
        with a temperature dQr = t(p) * dQr;
        after RoPE, dQr = q_norm^T(dQr);  dQh = rope^T(dQr) (rotate by -angle,
        the coordinates past R pass through);  dQn = merge(dQh);  dQp = q_norm^T(dQn) (before
        RoPE);  with clip_qkv, dQp (or dQn, after the norm) and dV zeroed where the clamp bit
        (|x| > c);  dxq = q_proj^T(dQp), and likewise dxk, dxv; dx = dxq + dxk + dxv (+ dxg).
        With a value norm, dVh = v_norm^T(dV) (the weightless RMSNorm's backward per head).
        With values from the keys, dxk = k_proj^T(dKp + dVp) and there is no dxv.
        Keys and values shared with other layers: dKr += dkv.k and dV += dkv.v (their other
        uses) before the key and value chains; a KV-shared layer stops at dKr, dV and leaves
        them in ``self.dkv`` (dx is then dxq (+ dxg)).
        Derivation: docs/derivations/grouped.md, docs/derivations/shared-kv.md,
        docs/derivations/output-gate.md,
        docs/derivations/clip-qkv.md, docs/derivations/output-norm.md,
        docs/derivations/qk-norm-after-rope.md, docs/derivations/query-temperature.md,
        docs/derivations/value-scale.md, docs/derivations/differential.md.

        Args:
            dout: (B, N, C) gradient of the output of the last forward (one without a cache).
            dkv: the gradient of the ``kv`` that forward shared, (B, H_kv, N, D) each: the sum
                of its KV-shared layers' ``dkv``; None when no layer read it.

        Returns:
            dx (B, N, C).
        """
        saved = self._ctx
        if saved is not None and isinstance(saved.ctx, _CachedForward):
            raise RuntimeError(
                "GroupedQueryAttention.backward follows a forward without a cache (the training "
                "path); the last forward appended to a KVCache (or read one as shared_kv), "
                "which is inference only"
            )
        if dkv is not None and self.kv_shared:
            raise ValueError(
                "dkv: a KV-shared layer has no keys or values of its own to receive a gradient; "
                "its own gradient of the shared ones is left in its dkv"
            )
        shared_grad = None  # checked before the ctx is used (without one, _pop_ctx says so)
        if dkv is not None and saved is not None and self.kv is not None:
            shared_grad = check_shared_grad(dkv, self.kv)
        dout, ctx = self._pop_ctx(dout)
        dmerged = self.o_proj.backward(dout)  # (B, N, C) -> (B, N, H*Dv)
        if self.output_norm:  # forward: merged = o_norm(merged)
            dmerged = self.o_norm.backward(dmerged)
        dxg = None
        if ctx.gate is not None:  # forward: merged = merged * act(g_proj(x))
            dmerged, dpre = output_gate_backward(dmerged, ctx.gate)
            dxg = self.g_proj.backward(dpre)  # (B, N, H*Dv) or (B, N, H) -> (B, N, C)
        dattn = merge_heads_backward(dmerged, ctx.out_heads)  # -> (B, H, N, Dv)
        if ctx.differential is not None:  # forward: Y = (1 - li) norm(O_h - lambda O_h+H/2)
            dattn, dlambdas = differential_backward(dattn, ctx.differential)  # (B, H, N, 2D)
            for name, dlambda in zip(LAMBDA_NAMES, dlambdas, strict=True):
                self._accumulate(name, dlambda)
        grads = attention_backward(dattn, ctx.attn)  # dk, dv (B, H_kv, N, D | Dv): group sums
        if grads.dsinks is not None:  # with sinks
            self._accumulate("sinks", grads.dsinks)
        dq, dk, dv = grads.dq, grads.dk, grads.dv
        if ctx.differential is not None:  # forward: V' = both halves of v side by side
            dv = differential_values_backward(dv)  # (B, H_kv, N, 2D) -> (B, H_kv, N, D)
        if self.value_scale != 1.0:  # forward: v = s_v * v
            dv = dv * self.value_scale
        if ctx.temperature is not None:  # forward: q = t(p) * q
            dq = query_temperature_backward(dq, ctx.temperature)
        if self.kv_shared:  # the keys and values were another layer's: their gradient goes back
            self.dkv = SharedKV(dk, dv)
            return self._query_backward(dq, ctx, dxg)
        if shared_grad is not None:  # forward: k, v also attended by the KV-shared layers
            dk, dv = dk + shared_grad.k, dv + shared_grad.v
        if self.qk_norm and self.qk_norm_position == "after_rope":  # forward: q = q_norm(q_r)
            dq = self._norm_heads_backward(self.q_norm, dq)
            dk = self._norm_heads_backward(self.k_norm, dk)
        if self.value_norm:  # forward: v = v_norm(v_h)
            dv = self.v_norm.backward(dv)
        assert ctx.k_rope is not None and ctx.k_heads is not None and ctx.v_heads is not None
        dq = rope_backward(dq, ctx.q_rope)  # forward: q = rope(q_h)
        dk = rope_backward(dk, ctx.k_rope)
        dq = split_heads_backward(dq, ctx.q_heads)  # (B, H, N, D) -> (B, N, H*D)
        dk = split_heads_backward(dk, ctx.k_heads)  # (B, H_kv, N, D) -> (B, N, H_kv*D)
        dv = split_heads_backward(dv, ctx.v_heads)  # (B, H_kv, N, D) -> (B, N, H_kv*D)
        if ctx.clips is not None and self.clip_after_norm:  # forward: q = clip(q_norm(q))
            dq, dk, dv = _clip_qkv_backward(ctx.clips, dq, dk, dv)
        if self.qk_norm and self.qk_norm_position == "before_rope":  # q_n = q_norm(q_proj(x))
            dq = self._norm_backward(self.q_norm, dq, self.num_heads)
            dk = self._norm_backward(self.k_norm, dk, self.num_kv_heads)
        if ctx.clips is not None and not self.clip_after_norm:  # forward: q = clip(q_proj(x))
            dq, dk, dv = _clip_qkv_backward(ctx.clips, dq, dk, dv)
        dxq = self.q_proj.backward(dq)  # (B, N, H*D) -> (B, N, C)
        if self.values_from_keys:  # forward: v = k_proj(x) as well, so its gradients add
            dxk = self.k_proj.backward(dk + dv)  # (B, N, H_kv*D) -> (B, N, C)
            dx = dxq + dxk
        else:
            dxk = self.k_proj.backward(dk)  # (B, N, H_kv*D) -> (B, N, C)
            dxv = self.v_proj.backward(dv)
            dx = dxq + dxk + dxv
        return dx if dxg is None else dx + dxg

    def _query_backward(
        self, dq: np.ndarray, ctx: _GroupedCtx, dxg: np.ndarray | None
    ) -> np.ndarray:
        """A KV-shared layer's dx: the query chain's alone (and the gate's): ``backward``'s
        steps for q, from dQr (B, H, N, D) to dxq (B, N, C)."""
        if self.qk_norm and self.qk_norm_position == "after_rope":  # forward: q = q_norm(q_r)
            dq = self._norm_heads_backward(self.q_norm, dq)
        dq = rope_backward(dq, ctx.q_rope)  # forward: q = rope(q_h)
        dq = split_heads_backward(dq, ctx.q_heads)  # (B, H, N, D) -> (B, N, H*D)
        if self.qk_norm and self.qk_norm_position == "before_rope":  # q_n = q_norm(q_proj(x))
            dq = self._norm_backward(self.q_norm, dq, self.num_heads)
        dxq = self.q_proj.backward(dq)  # (B, N, H*D) -> (B, N, C)
        return dxq if dxg is None else dxq + dxg


_NORMS: dict[str, type[RMSNorm] | type[LayerNorm]] = {
    "rms": RMSNorm,
    "layer": LayerNorm,
    "layer_bias": LayerNorm,
}  # the QK-norm's class by qk_norm_type (the weightless one aside)


def _check_inv_freq(name: str, inv_freq: Any, rotary_dim: int, rope_theta: Any) -> np.ndarray:
    """RoPE's (R/2,) frequencies in float64: given (finite, that length), or from rope_theta
    (none for R = 0)."""
    theta = validation.finite_real("rope_theta", rope_theta)
    if inv_freq is None:
        return rope_inv_freq(rotary_dim, theta) if rotary_dim else np.zeros(0)
    freqs = validation.float_array(name, inv_freq)
    if freqs.shape != (rotary_dim // 2,):
        raise ValueError(
            f"{name} must be (rotary_dim / 2,) = ({rotary_dim // 2},), got shape {freqs.shape}"
        )
    if not np.all(np.isfinite(freqs)):
        raise ValueError(f"{name} must be finite")
    return freqs.astype(np.float64)


def _check_alibi(slopes: Any, heads: int) -> np.ndarray | None:
    """ALiBi's slopes as float64 (H,), one per query head, finite (None passes through)."""
    if slopes is None:
        return None
    slopes = validation.float_array("alibi_slopes", slopes)
    if slopes.shape != (heads,):
        raise ValueError(
            f"alibi_slopes must be (H,) = ({heads},), one slope per query head, got shape "
            f"{slopes.shape}"
        )
    if not np.all(np.isfinite(slopes)):
        raise ValueError("alibi_slopes must be finite (None for no ALiBi)")
    return slopes.astype(np.float64)


def _check_long_rope(
    long_inv_freq: Any, original_max_positions: Any, rotary_dim: int
) -> tuple[np.ndarray | None, int | None]:
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


def _clip_qkv(
    clip: float, q: np.ndarray, k: np.ndarray, v: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], tuple[ClipCtx, ClipCtx, ClipCtx]]:
    """q, k and v (B, N, width) each clamped to [-clip, clip], and their ctxs."""
    (q, q_ctx), (k, k_ctx), (v, v_ctx) = (clip_forward(y, clip) for y in (q, k, v))
    return (q, k, v), (q_ctx, k_ctx, v_ctx)


def _clip_qkv_backward(
    ctxs: tuple[ClipCtx, ClipCtx, ClipCtx], dq: np.ndarray, dk: np.ndarray, dv: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_clip_qkv``'s backward: each gradient zeroed where its clamp bit."""
    q_ctx, k_ctx, v_ctx = ctxs
    return clip_backward(dq, q_ctx), clip_backward(dk, k_ctx), clip_backward(dv, v_ctx)


def _left_padding(padding: np.ndarray | None) -> np.ndarray | None:
    """Each sequence's count of padded keys before its first real one, (B,), where its chunks
    start (transformers' chunked mask counts them from the attention mask so); None without
    padding."""
    if padding is None:
        return None
    return (np.cumsum(~padding, axis=1) == 0).sum(axis=1)  # (B, M) -> (B,)


def _temperature_positions(
    spec: Mapping[str, Any], positions: np.ndarray, cache: KVCache | PagedKVCache | None
) -> np.ndarray:
    """The positions the query temperature counts: the RoPE positions, or with
    ``"positions": "cache"`` the tokens' places on the cache, ``cache.length + arange(N)``."""
    if spec.get("positions") != "cache":
        return positions
    return (0 if cache is None else cache.length) + np.arange(positions.shape[-1])


def _key_padding(mask: Any, batch: int, m: int, cached: bool) -> np.ndarray | None:
    """The key padding mask checked as bool (B, M), True = padding (None passes through)."""
    if mask is None:
        return None
    mask = validation.bool_array("key_padding_mask", mask)
    if mask.shape != (batch, m):
        keys = "the cache's length after this call" if cached else "x's N"
        raise ValueError(
            f"key_padding_mask is (B, M) over the keys attended, M = {keys}: expected "
            f"{(batch, m)}, got {mask.shape}"
        )
    return mask
