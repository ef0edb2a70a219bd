"""Multi-head latent attention (MLA), DeepSeek-V2/V3's: every head's keys and values come out of
one small latent per token, which is all a decoding cache holds. Parameters are named like
Hugging Face's ``DeepseekV3Attention``, so its attention state dicts load without renaming.

Shape legend: B batch, H heads, N tokens of this call, M keys attended (N without a cache; the
cache's length after this call with one), C model width (``hidden_size``), Lq ``q_lora_rank``,
L ``kv_lora_rank``, P ``qk_nope_head_dim``, R ``qk_rope_head_dim``, Dv ``v_head_dim``.

The chain, as transformers 5 computes it:

    q = q_b_proj(q_a_layernorm(q_a_proj(x)))  or  q_proj(x)      (B, N, H*(P+R)) -> (B, H, N, P+R)
    q_nope, q_pe = q[..., :P], q[..., P:]
    c, k_pe = split(kv_a_proj_with_mqa(x), [L, R])                (B, N, L), (B, N, R)
    c = kv_a_layernorm(c) * latent_scale                           the latent, cached
    q_pe, k_pe = rope(q_pe), rope(k_pe)                            k_pe: one head, cached
    q_nope, q_pe = q_nope * t, q_pe * t                            query_temperature only
    expanded:  k_nope, v = split_heads(kv_b_proj(c), H)            (B, H, M, P), (B, H, M, Dv)
               o = attention([q_nope, q_pe], [k_nope, k_pe], v; causal, scaling)
    absorbed:  q_lat = W_UK^T q_nope per head                      (B, H, N, L)
               o_lat = attention([q_lat, q_pe], [c, k_pe], c; causal, scaling)  MQA, (B, H, N, L)
               o = W_UV o_lat per head                             (B, H, N, Dv)
    a = merge_heads(o) * act(g_proj(x))                            (B, N, H*Dv)  output_gate only
    out = o_proj(a)                                                (B, N, C)

W_UK (H, P, L) and W_UV (H, Dv, L) are the rows of ``kv_b_proj.weight`` (H*(P+Dv), L) that make
k_nope and v. Both forms compute the same scores, q_nope . (W_UK c) = (W_UK^T q_nope) . c, so the
scale stays the layer's ``scaling`` ((P + R)^-0.5 by default), not (L + R)^-0.5. With
``rope_interleave`` the rope dims are DeepSeek's interleaved pairs (x_2i, x_2i+1), gathered into
halves before the rotation as transformers does, so a cached k_pe reads like Hugging Face's.

The backward walks the chain in reverse through the parts' own backwards (Linear, RMSNorm, RoPE,
the core's); k_pe is shared by every head, so its gradient sums over heads, and c feeds the
keys and (absorbed) the values, so its gradient is the sum of both. The output gate (``gate.py``,
Bailing-hybrid's per head sigmoid) scales the merged heads after both forms have made the same o,
so it is one step for both; x feeds the gate too, and dx gets its term.

Decoding, the layer hands its cache this call's c and k_pe: the expanded form takes back every
cached row (``cache.append``) to expand, the absorbed form has the cache attend its queries over
them (``cache.attend``). A contiguous ``LatentCache`` or pages, ``PagedLatentCache``, both in
latent_cache.py (equal results; docs/decoding.md).

Derivation: docs/derivations/latent.md (the absorption, the scale, both backwards),
docs/derivations/rope.md, docs/derivations/rmsnorm.md, docs/derivations/linear.md,
docs/derivations/output-gate.md.
Tests: tests/numpy_attention/test_latent.py (the layer over either cache too); against
transformers in tests/parity/test_hf_latent.py.
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import numpy as np

from . import validation
from .functional import (
    HeadsCtx,
    attention_backward,
    attention_forward,
    merge_heads_backward,
    merge_heads_forward,
    split_heads_backward,
    split_heads_forward,
)
from .gate import GateCtx, check_gate, gate_width, output_gate_backward, output_gate_forward
from .grad_mode import no_grad
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
from .layers import (
    HeadLinearCtx,
    Linear,
    dropout_keep_mask,
    head_linear_backward,
    head_linear_forward,
)
from .module import Module
from .norms import RMSNorm
from .rope import (
    RopeCtx,
    check_positions,
    deinterleave,
    deinterleave_backward,
    rope_backward,
    rope_forward,
    rope_inv_freq,
)

__all__ = ["MultiHeadLatentAttention"]

# -- the query temperature --------------------------------------------------------------------


def query_temperature_table(
    positions: np.ndarray, beta: float, length: float, dtype: np.dtype
) -> np.ndarray:
    """t = 1 + beta * log(1 + floor(position / length)), shaped to scale q (B, H, N, W): (N, 1)
    or (B, 1, N, 1), computed in float64 and cast to ``dtype`` (Mistral 4's
    ``get_llama_4_attn_scale``)."""
    t = 1.0 + beta * np.log1p(np.floor(positions.astype(np.float64) / length))
    t = t.astype(dtype)[..., None]  # (..., N, 1)
    return t[:, None] if t.ndim == 3 else t  # (B, N, 1) -> (B, 1, N, 1)


# -- the layer ----------------------------------------------------------------------------------


class _ExpandedCtx(NamedTuple):
    kv_heads: HeadsCtx  # split of kv_b_proj(c) into H heads


class _AbsorbedCtx(NamedTuple):
    q_lat: HeadLinearCtx  # q_lat = W_UK^T q_nope
    o_up: HeadLinearCtx  # o = W_UV o_lat


class _LatentCtx(NamedTuple):
    q_heads: HeadsCtx
    q_rope: RopeCtx
    k_rope: RopeCtx
    temperature: np.ndarray | None  # t, (N, 1) or (B, 1, N, 1)
    form: _ExpandedCtx | _AbsorbedCtx
    attn: Any  # attention_forward's ctx
    out_heads: HeadsCtx
    gate: GateCtx | None  # with an output gate


class _CachedForward(NamedTuple):
    """What a forward with a cache leaves: nothing to differentiate."""


class MultiHeadLatentAttention(Module):
    """Causal multi-head latent attention with a decoupled shared RoPE key, as in DeepSeek-V2/V3,
    Kimi K2, GLM-4 MoE Lite, Mistral 4 and LongCat-Flash (module docstring for the chain).

    Parameters, created in this order: ``q_proj`` = Linear(C, H*(P+R), no bias) when
    ``q_lora_rank`` is None, else ``q_a_proj`` = Linear(C, Lq, bias), ``q_a_layernorm`` =
    RMSNorm(Lq), ``q_b_proj`` = Linear(Lq, H*(P+R), no bias); ``kv_a_proj_with_mqa`` =
    Linear(C, L + R, bias), ``kv_a_layernorm`` = RMSNorm(L), ``kv_b_proj`` = Linear(L, H*(P+Dv),
    no bias); ``o_proj`` = Linear(H*Dv, C, bias); with ``output_gate``, ``g_proj`` =
    Linear(C, H*Dv) per element or Linear(C, H) per head, bias by ``gate_bias``.

    Args:
        hidden_size: C.
        num_heads: H.
        kv_lora_rank: L, the latent's width.
        qk_nope_head_dim: P, the query/key width without RoPE.
        qk_rope_head_dim: R, the rotated width (even), one key head shared by all.
        v_head_dim: Dv.
        q_lora_rank: Lq, the query's low-rank bottleneck, or None for one ``q_proj``.
        bias: biases on q_a_proj, kv_a_proj_with_mqa and o_proj (Hugging Face's
            ``attention_bias``).
        rope_theta: the RoPE base when ``inv_freq`` is None.
        inv_freq: (R/2,) RoPE frequencies used as given (a model's own).
        rope_attention_factor: multiplies RoPE's cos and sin (YaRN's attention factor).
        rope_interleave: the rope dims are interleaved pairs, DeepSeek-V3's layout (gathered into
            halves, then rotated); False: ``rotate_half``'s halves.
        scaling: the score scale; None for (P + R)^-0.5 (a converted model passes its own, e.g.
            times YaRN's mscale^2).
        latent_scale: multiplies the normed latent before it is used and cached
            (LongCat-Flash's ``(hidden_size / kv_lora_rank) ** 0.5``); 1 elsewhere.
        query_temperature: (beta, length) scales each query by 1 + beta * log(1 + floor(
            position / length)) (Mistral 4's Llama-4 scaling), or None.
        output_gate: None, or ``"element"`` (the merged heads times act(x W_g), W_g giving H*Dv
            gates) or ``"head"`` (each head's Dv coordinates times one gate, W_g giving H:
            Bailing-hybrid, Ling 3.0), before o_proj: ``GroupedQueryAttention``'s gate.
        gate_activation: the gate's act, ``"sigmoid"`` or ``"softplus"``.
        gate_bias: whether g_proj has a bias.
        norm_eps: the eps of q_a_layernorm and kv_a_layernorm.
        dropout: dropout probability on the attention weights, in [0, 1) (train mode only).
        index_n_heads, index_head_dim, index_topk: DeepSeek Sparse Attention (DeepSeek-V3.2,
            GLM-5, HY-V4): a child ``indexer`` (``indexer.LightningIndexer``) keeps each query's
            ``index_topk`` best keys by its HI heads of width DI; all three or none, and
            ``q_lora_rank`` (the indexer reads the query latent). No gradient reaches the
            indexer (a selection is piecewise constant); decoding needs a cache built with
            ``index_head_dim``. The last selection is kept as ``.selection`` (B, N, M).
        index_rope_interleave: the indexer's RoPE pairs interleaved (GLM-5) or half-split.
        index_shared: no indexer of its own: the forward's ``index_selection`` (the previous
            layer's ``.selection``) says which keys each query reads (GLM-5's and HY-V4's
            "shared" layers).
        index_rope_position: ``"first"`` or ``"last"``: which R dims of each indexer head
            rotate (HY-V4's: the last).
        index_norm_eps: the eps of the indexer's k_norm (LayerNorm with bias).
        sinks: one learned logit per head (``sinks``, (H,)) in every row's softmax, the core's
            sinks, with its gradient (HY-V4).
        query_gate: AXK2's fused query projection: ``q_gate_proj`` = Linear(2 Lq, H*(P+R+Dv), no
            bias) of [q_a_layernorm(q_a), q_a] (q_a = q_a_proj(x)) gives each head's query and
            Dv gate pre-activations; the merged heads are times their sigmoid before o_proj.
            Replaces ``q_b_proj``; needs ``q_lora_rank``; not with ``output_gate``.
        rng: generator or seed for the initial weights and the keep-masks drawn in train mode.
    """

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
        rng: np.random.Generator | int | None = None,
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
        norm_eps = validation.finite_real("norm_eps", norm_eps)
        if norm_eps <= 0:
            raise ValueError(f"norm_eps must be > 0, got {norm_eps}")
        self.dropout = validation.dropout_p(dropout, "dropout")
        self.query_gate = check_query_gate(query_gate, self.q_lora_rank, self.output_gate)
        self.rng = np.random.default_rng(rng)

        bias = validation.flag("bias", bias)
        c, h = self.hidden_size, self.num_heads
        if self.q_lora_rank is None:
            self.q_proj = Linear(c, h * head, bias=False, rng=self.rng)
        else:
            self.q_a_proj = Linear(c, self.q_lora_rank, bias=bias, rng=self.rng)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, norm_eps)
        if (
            self.query_gate and self.q_lora_rank is not None
        ):  # AXK2: q and a gate from [q_resid, q_a]
            fused = h * (head + self.v_head_dim)
            self.q_gate_proj = Linear(2 * self.q_lora_rank, fused, bias=False, rng=self.rng)
        elif self.q_lora_rank is not None:
            self.q_b_proj = Linear(self.q_lora_rank, h * head, bias=False, rng=self.rng)
        latent = self.kv_lora_rank + self.qk_rope_head_dim
        self.kv_a_proj_with_mqa = Linear(c, latent, bias=bias, rng=self.rng)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, norm_eps)
        per_head = self.qk_nope_head_dim + self.v_head_dim
        self.kv_b_proj = Linear(self.kv_lora_rank, h * per_head, bias=False, rng=self.rng)
        self.o_proj = Linear(h * self.v_head_dim, c, bias=bias, rng=self.rng)
        if self.output_gate is not None:
            gates = gate_width(self.output_gate, h, self.v_head_dim)
            self.g_proj = Linear(c, gates, bias=gate_bias, rng=self.rng)
        index = check_index_options(index_n_heads, index_head_dim, index_topk, self.q_lora_rank)
        self.index_topk = None if index is None else index[2]
        self.index_shared = check_shared_selection(index_shared, index)
        self.has_sinks = validation.flag("sinks", sinks)
        if self.has_sinks:  # one logit per head in every row's softmax (HY-V4's)
            self.register_parameter("sinks", np.zeros(h, dtype=np.float32))
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
                rng=self.rng,
            )

    def constructor_args(self) -> dict[str, Any]:
        """The base's, in a form that survives JSON (``save_module``): ``inv_freq`` as a list
        of floats, ``query_temperature`` as a tuple whether given as a tuple or a list."""
        args = super().constructor_args()
        if args["inv_freq"] is not None:
            args["inv_freq"] = np.asarray(args["inv_freq"], dtype=np.float64).tolist()
        if args["query_temperature"] is not None:
            args["query_temperature"] = tuple(args["query_temperature"])
        return args

    def absorbs(self, n: int, m: int) -> bool:
        """What ``absorb=None`` picks for N queries over M keys taken from a cache: absorbed when
        it needs fewer multiply-adds, H N M (2L + R) + H N L (P + Dv), than expanding the cache,
        M L H (P + Dv) + H N M (P + R + Dv): decoding steps (few queries, a long cache)."""
        h, rank = self.num_heads, self.kv_lora_rank
        p, r, dv = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        absorbed = h * n * m * (2 * rank + r) + h * n * rank * (p + dv)
        expanded = m * rank * h * (p + dv) + h * n * m * (p + r + dv)
        return absorbed < expanded

    def forward(
        self,
        x: np.ndarray,
        *,
        positions: Any = None,
        key_padding_mask: np.ndarray | None = None,
        cache: LatentCache | PagedLatentCache | None = None,
        absorb: bool | None = None,
        attn_dropout_mask: np.ndarray | None = None,
        index_selection: Any = None,
    ) -> np.ndarray:
        """Causal self-attention of x's tokens over the cache's and their own.

        Args:
            x: (B, N, C).
            positions: RoPE positions, (N,) or (B, N) (left padding); default
                ``cache.length + arange(N)`` (``arange(N)`` without a cache).
            key_padding_mask: bool (B, M), True = padding, over the keys attended: x's N tokens,
                or with a cache all ``cache.length + N`` of them.
            cache: a ``LatentCache`` of this layer's B, L, R and dtype, or a
                ``PagedLatentCache`` of its L, R and dtype (equal results): this call's latents
                are appended and the queries attend with ``align="bottom-right"``. No backward
                follows a forward with a cache.
            absorb: True for the absorbed computation, False for the expanded one, None to
                choose: absorbed with a cache when it is cheaper (``absorbs``), else expanded.
                Both give the same numbers up to rounding.
            attn_dropout_mask: bool (B, H, N, M), True = kept; train mode with dropout > 0.
            index_selection: bool (B, N, M), True where a query may read a key: a shared DSA
                layer's (``index_shared``) keys, the ``selection`` of the layer before it
                (GLM-5's ``prev_topk_indices``); only there.

        Returns:
            (B, N, C).
        """
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.dtype)
        b, n, _ = x.shape
        start = 0
        if cache is not None:
            if not isinstance(cache, (LatentCache, PagedLatentCache)):
                raise TypeError(
                    f"cache must be a LatentCache or a PagedLatentCache, got {type(cache).__name__}"
                )
            cache.check_index(None if self.index_topk is None else self.indexer.head_dim)
            cache.check_append(b, n, self.kv_lora_rank, self.qk_rope_head_dim, x.dtype)
            start = cache.length
        m = start + n
        if absorb is None:
            absorb = cache is not None and self.absorbs(n, m)
        absorb = validation.flag("absorb", absorb)
        if positions is None:
            positions = start + np.arange(n)
        positions = check_positions(positions, (b, self.num_heads, n, self.qk_rope_head_dim))
        padding = _key_padding(key_padding_mask, b, m, cache is not None)
        keep = dropout_keep_mask(
            "attn_dropout_mask",
            self.dropout,
            (b, self.num_heads, n, m),
            self.training,
            attn_dropout_mask,
            self.rng,
        )
        selection = None
        check_selection_given(self.index_shared, index_selection is not None)
        if index_selection is not None:
            selection = validation.bool_array("index_selection", index_selection)
            check_selection_shape(selection.shape, (b, n, m))

        # With a cache there is no backward: keep nothing.
        with no_grad() if cache is not None else contextlib.nullcontext():
            out, ctx = self._chain(x, positions, padding, keep, cache, absorb, selection)
        self._save_ctx(_CachedForward() if cache is not None else ctx, out)
        return out

    def _chain(
        self,
        x: np.ndarray,
        positions: np.ndarray,
        padding: np.ndarray | None,
        keep: np.ndarray | None,
        cache: LatentCache | PagedLatentCache | None,
        absorb: bool,
        selection: np.ndarray | None,
    ) -> tuple[np.ndarray, _LatentCtx]:
        """The forward chain (module docstring); inputs already checked."""
        p, rank = self.qk_nope_head_dim, self.kv_lora_rank
        gate_pre = None
        if self.q_lora_rank is None:
            q = self.q_proj(x)  # (B, N, C) -> (B, N, H*(P+R))
        elif self.query_gate:  # one projection of [q_resid, q_a] gives q and the gate per head
            q_a = self.q_a_proj(x)  # C -> Lq
            q_resid = self.q_a_layernorm(q_a)  # the query latent
            fused = self.q_gate_proj(np.concatenate([q_resid, q_a], axis=-1))  # 2Lq -> H*(P+R+Dv)
            fused = fused.reshape(fused.shape[:2] + (self.num_heads, -1))  # (B, N, H, P+R+Dv)
            head = p + self.qk_rope_head_dim
            q = fused[..., :head].reshape(fused.shape[:2] + (-1,))  # (B, N, H*(P+R))
            gate_pre = fused[..., head:].reshape(fused.shape[:2] + (-1,))  # (B, N, H*Dv)
        else:
            q_resid = self.q_a_layernorm(self.q_a_proj(x))  # C -> Lq, the query latent
            q = self.q_b_proj(q_resid)  # Lq -> H*(P+R)
        q, q_heads = split_heads_forward(q, self.num_heads)  # -> (B, H, N, P+R)
        q_nope, q_pe = q[..., :p], q[..., p:]
        latent = self.kv_a_proj_with_mqa(x)  # (B, N, C) -> (B, N, L+R)
        c = self.kv_a_layernorm(latent[..., :rank])  # (B, N, L)
        if self.latent_scale != 1.0:
            c = c * self.latent_scale
        k_pe = latent[:, None, :, rank:]  # (B, 1, N, R): one key head
        if self.rope_interleave:
            q_pe, k_pe = deinterleave(q_pe), deinterleave(k_pe)
        rope: dict[str, Any] = {
            "inv_freq": self.inv_freq,
            "attention_factor": self.rope_attention_factor,
        }
        q_pe, q_rope = rope_forward(q_pe, positions, **rope)
        k_pe, k_rope = rope_forward(k_pe, positions, **rope)
        temperature = None
        if self.query_temperature is not None:
            temperature = query_temperature_table(positions, *self.query_temperature, x.dtype)
            q_nope, q_pe = q_nope * temperature, q_pe * temperature
        k_pe = k_pe[:, 0]  # (B, N, R)

        options: dict[str, Any] = {
            "causal": True,
            "align": "bottom-right",  # query i at key position M - N + i (i without a cache)
            "key_padding_mask": padding,
            "scale": self.scale,  # the layer's, also absorbed (not (L + R)^-0.5)
            "dropout_p": self.dropout if keep is not None else 0.0,
            "dropout_mask": keep,
            "sinks": self.sinks if self.has_sinks else None,
        }
        if self.index_topk is not None:  # DSA: each query reads only its top-k keys
            keys = self.indexer.keys(x, positions, rope)  # (B, N, DI)
            if cache is not None:  # the cached keys first: (B, M, DI)
                keys = cache.index_append(keys)
            selection = self.indexer(x, q_resid, keys, positions, rope, padding)  # (B, N, M)
        if selection is not None:  # this layer's top-k, or a shared layer's given one
            options["attn_mask"] = selection[:, None]  # one mask for every head
            self.selection = selection
        form: _ExpandedCtx | _AbsorbedCtx
        if absorb:
            w_uk, w_uv = self._up_projections()  # (H, P, L), (H, Dv, L)
            q_lat, lat_ctx = head_linear_forward(q_nope, w_uk.swapaxes(-1, -2))  # -> (B,H,N,L)
            queries = np.concatenate([q_lat, q_pe], axis=-1)  # (B, H, N, L+R)
            # With a cache: c, k_pe appended, the queries attending over every cached row
            attend = attend_latents if cache is None else cache.attend
            attn = attend(queries, c, k_pe, enable_gqa=True, **options)  # MQA over [c, k_pe]
            o, up_ctx = head_linear_forward(attn.out, w_uv)  # (B, H, N, L) -> (B, H, N, Dv)
            form = _AbsorbedCtx(lat_ctx, up_ctx)
        else:
            if cache is not None:
                rows = cache.append(c, k_pe)  # (B, M, L+R): everything cached so far
                c, k_pe = rows[..., :rank], rows[..., rank:]
            kv, kv_heads = split_heads_forward(self.kv_b_proj(c), self.num_heads)
            k_nope, v = kv[..., :p], kv[..., p:]  # (B, H, M, P), (B, H, M, Dv)
            k_pe = np.broadcast_to(k_pe[:, None], k_nope.shape[:-1] + k_pe.shape[-1:])  # all heads
            queries = np.concatenate([q_nope, q_pe], axis=-1)  # (B, H, N, P+R)
            keys = np.concatenate([k_nope, k_pe], axis=-1)  # (B, H, M, P+R)
            attn = attention_forward(queries, keys, v, **options)
            o = attn.out  # (B, H, N, Dv)
            form = _ExpandedCtx(kv_heads)
        merged, out_heads = merge_heads_forward(o)  # (B, H, N, Dv) -> (B, N, H*Dv)
        gate = None
        if self.output_gate is not None:  # (B, N, H*Dv) gated by (B, N, H*Dv) or (B, N, H)
            merged, gate = output_gate_forward(merged, self.g_proj(x), self.gate_activation)
        elif gate_pre is not None:  # AXK2: sigmoid of the query projection's gate part
            merged, gate = output_gate_forward(merged, gate_pre, "sigmoid")
        out = self.o_proj(merged)  # -> (B, N, C)
        ctx = _LatentCtx(q_heads, q_rope, k_rope, temperature, form, attn.ctx, out_heads, gate)
        return out, ctx

    def _up_projections(self) -> tuple[np.ndarray, np.ndarray]:
        """W_UK (H, P, L) and W_UV (H, Dv, L): views of kv_b_proj.weight's per-head rows."""
        p = self.qk_nope_head_dim
        weight = self.kv_b_proj.weight.reshape(self.num_heads, p + self.v_head_dim, -1)
        return weight[:, :p], weight[:, p:]

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Gradient of x; adds the gradients of every parameter.

        dA = o_proj^T(dY);  with a gate g = act(Z), Z = g_proj(x): dZ = act'(Z) * (dA * merged
        o, summed per head when per head), dxg = g_proj^T(dZ), dA = dA * g;  dO = split(dA);
        expanded: dQ, dK, dV = attention_backward(dO); dk_nope = dK[..., :P];
            dk_pe = sum over heads of dK[..., P:]; dc = kv_b_proj^T(merge([dk_nope, dV]));
        absorbed: do_lat = W_UV^T dO, dW_UV = dO^T o_lat; dQ', dK', dV' = attention_backward(
            do_lat) (dK', dV' summed over the heads sharing them); dc = dK'[..., :L] + dV';
            dk_pe = dK'[..., L:]; dq_nope = W_UK dq_lat, dW_UK = q_nope^T dq_lat;
        then dq, dk_pe through the temperature and RoPE (rotate by -angle, re-interleave);
        dc through latent_scale and kv_a_layernorm; dx = q path^T(dq) +
        kv_a_proj_with_mqa^T([dc, dk_pe]) (+ dxg). Derivation: docs/derivations/latent.md,
        docs/derivations/output-gate.md.

        Args:
            dout: (B, N, C) gradient of the output of the last forward (one without a cache).

        Returns:
            dx (B, N, C).
        """
        saved = self._ctx
        if saved is not None and isinstance(saved.ctx, _CachedForward):
            raise RuntimeError(
                "MultiHeadLatentAttention.backward follows a forward without a cache (the "
                "training path); the last forward appended to a LatentCache, which is inference "
                "only"
            )
        dout, ctx = self._pop_ctx(dout)
        p, rank = self.qk_nope_head_dim, self.kv_lora_rank
        dmerged = self.o_proj.backward(dout)  # (B, N, C) -> (B, N, H*Dv)
        dxg, dpre = None, None
        if ctx.gate is not None:  # forward: merged = merged * act(g_proj(x) or the query's gate)
            dmerged, dpre = output_gate_backward(dmerged, ctx.gate)
            if not self.query_gate:
                dxg = self.g_proj.backward(dpre)  # (B, N, H*Dv) or (B, N, H) -> (B, N, C)
        do = merge_heads_backward(dmerged, ctx.out_heads)  # -> (B, H, N, Dv)
        if isinstance(ctx.form, _AbsorbedCtx):
            do_lat, dw_uv = head_linear_backward(do, ctx.form.o_up)  # forward: o = W_UV o_lat
            grads = attention_backward(do_lat, ctx.attn)  # dk, dv (B, 1, M, .): sums over heads
            if grads.dsinks is not None:
                self._accumulate("sinks", grads.dsinks)
            dq_lat, dq_pe = grads.dq[..., :rank], grads.dq[..., rank:]
            dc = grads.dk[:, 0, :, :rank] + grads.dv[:, 0]  # c is both keys and values
            dk_pe = grads.dk[:, :, :, rank:]  # (B, 1, M, R)
            dq_nope, dw_uk_t = head_linear_backward(dq_lat, ctx.form.q_lat)  # q_lat = W_UK^T q
            dweight = np.concatenate([dw_uk_t.swapaxes(-1, -2), dw_uv], axis=1)  # (H, P+Dv, L)
            self.kv_b_proj._accumulate("weight", dweight.reshape(self.kv_b_proj.weight.shape))
        else:
            grads = attention_backward(do, ctx.attn)  # dq, dk (B, H, ., P+R), dv (B, H, M, Dv)
            if grads.dsinks is not None:
                self._accumulate("sinks", grads.dsinks)
            dq_nope, dq_pe = grads.dq[..., :p], grads.dq[..., p:]
            dk_pe = grads.dk[..., p:].sum(axis=1, keepdims=True)  # k_pe shared by every head
            dkv = np.concatenate([grads.dk[..., :p], grads.dv], axis=-1)  # (B, H, M, P+Dv)
            dc = self.kv_b_proj.backward(split_heads_backward(dkv, ctx.form.kv_heads))
        if ctx.temperature is not None:  # forward: q = q * t
            dq_nope, dq_pe = dq_nope * ctx.temperature, dq_pe * ctx.temperature
        dq_pe = rope_backward(dq_pe, ctx.q_rope)
        dk_pe = rope_backward(dk_pe, ctx.k_rope)[:, 0]  # (B, N, R)
        if self.rope_interleave:
            dq_pe, dk_pe = deinterleave_backward(dq_pe), deinterleave_backward(dk_pe)
        if self.latent_scale != 1.0:
            dc = dc * self.latent_scale
        dlatent = np.concatenate([self.kv_a_layernorm.backward(dc), dk_pe], axis=-1)
        dx_kv = self.kv_a_proj_with_mqa.backward(dlatent)  # (B, N, L+R) -> (B, N, C)
        dq = split_heads_backward(np.concatenate([dq_nope, dq_pe], axis=-1), ctx.q_heads)
        if self.q_lora_rank is None:
            dx_q = self.q_proj.backward(dq)  # (B, N, H*(P+R)) -> (B, N, C)
        elif self.query_gate and dpre is not None:  # forward: [q | gate] = q_gate_proj(...)
            lead, h = dq.shape[:2], self.num_heads
            dfused = np.concatenate(
                [dq.reshape(lead + (h, -1)), dpre.reshape(lead + (h, -1))], axis=-1
            ).reshape(lead + (-1,))  # (B, N, H*(P+R+Dv))
            dcat = self.q_gate_proj.backward(dfused)  # -> (B, N, 2Lq)
            lq = self.q_lora_rank
            dq_a = dcat[..., lq:] + self.q_a_layernorm.backward(dcat[..., :lq])  # q_a feeds both
            dx_q = self.q_a_proj.backward(dq_a)
        else:
            dx_q = self.q_a_proj.backward(self.q_a_layernorm.backward(self.q_b_proj.backward(dq)))
        dx = dx_q + dx_kv  # x feeds the query path and the latent path (and the gate's)
        return dx if dxg is None else dx + dxg


def _check_inv_freq(inv_freq: Any, rope_dim: int, rope_theta: Any) -> np.ndarray:
    """RoPE's (R/2,) frequencies in float64: given (finite, that length), or from rope_theta."""
    if inv_freq is None:
        return rope_inv_freq(rope_dim, rope_theta)
    validation.finite_real("rope_theta", rope_theta)
    freqs = validation.float_array("inv_freq", inv_freq)
    if freqs.shape != (rope_dim // 2,) or not np.all(np.isfinite(freqs)):
        raise ValueError(
            f"inv_freq must be finite and (qk_rope_head_dim / 2,) = ({rope_dim // 2},), got "
            f"shape {freqs.shape}"
        )
    return freqs.astype(np.float64)


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
