"""Today's decoder attention: grouped-query attention with RoPE, optional QK-norm, a sliding window,
softcap, sinks, an output gate, a clip of q, k and v and a norm of the merged heads, and a KV cache
for decoding, named like Hugging Face's Llama family so that its attention state dicts load
without renaming.

Shape legend: B batch, H query heads, H_kv key/value heads (H % H_kv == 0), N tokens of this call,
M keys attended (N without a cache; the cache's length after this call with one), C model width
(``hidden_size``), D head width (``head_dim``), Dv value head width (``v_head_dim``, D by
default).

The layer holds the parameters, checks a call's inputs and keeps the last forward's ctx; its
chain, q, k and v through their projections, norms and RoPE into the attention and the merged
heads out through o_proj, and the backward walking it in reverse, is ``grouped_chain.py``.

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
``RMSNorm`` and ``LayerNorm`` (the QK-norm's, the output norm's) live on the layers floor
(``norms.py``).

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
Tests: tests/numpy_attention/test_grouped.py (decode equals the full sequence, the cache, the
parameters' names and shapes, module files, bad input); the chain's gradients in
tests/numpy_attention/test_grouped_chain.py; tests/numpy_attention/test_rope.py,
tests/numpy_attention/test_norms.py, tests/numpy_attention/test_shared_kv.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from . import grouped_options, validation
from .decode.cache import KVCache, PagedKVCache
from .differential import LAMBDA_NAMES, LAMBDA_STD
from .gate import gate_width
from .grad_mode import no_grad
from .grouped_chain import grouped_backward, grouped_forward
from .layers import Linear, dropout_keep_mask
from .module import Module
from .norms import LayerNorm, RMSNorm, WeightlessRMSNorm
from .rope import check_positions, rope_inv_freq
from .shared_kv import SharedKV, check_shared_grad, read_shared_kv

__all__ = ["GroupedQueryAttention"]

# -- the layer ----------------------------------------------------------------------------------


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
            out, ctx = grouped_forward(self, x, positions, padding, keep, cache, shared)
        self._save_ctx(_CachedForward() if inference else ctx, out)
        return out

    def backward(
        self, dout: np.ndarray, *, dkv: SharedKV | tuple[Any, Any] | None = None
    ) -> np.ndarray:
        """Gradient of x; adds the gradients of every parameter: ``grouped_backward``
        (``grouped_chain.py``, whose docstring states the math) after the checks of a call. A
        KV-shared layer leaves the gradient of the keys and values it read in ``self.dkv``.
        Derivation: docs/derivations/grouped.md, docs/derivations/shared-kv.md.

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
        return grouped_backward(self, dout, ctx, shared_grad)


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
