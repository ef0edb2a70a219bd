"""Today's decoder attention: grouped-query attention with RoPE, optional QK-norm, a sliding window,
softcap, sinks and an output gate, and a KV cache for decoding, named like Hugging Face's Llama
family so that its attention state dicts load without renaming.

Shape legend: B batch, H query heads, H_kv key/value heads (H % H_kv == 0), N tokens of this call,
M keys attended (N without a cache; the cache's length after this call with one), C model width
(``hidden_size``), D head width (``head_dim``).

The layer's chain, and its backward walking it in reverse through the parts' own backwards:

    q = rope(split_heads(q_norm(q_proj(x)), H))        (B, H, N, D)     q_norm: QK-norm only
    k = rope(split_heads(k_norm(k_proj(x)), H_kv))     (B, H_kv, N, D)  (appended to the cache)
    v = split_heads(v_proj(x), H_kv)                   (B, H_kv, N, D)  (appended to the cache)
    o = attention(q, k, v; causal, window, softcap, sinks, scale, GQA, dropout)   (B, H, N, D)
    a = merge_heads(o) * act(g_proj(x))                (B, N, H*D)      gate: output_gate only
    out = o_proj(a)                                    (B, N, C)

The QK-norm reads the projection (B, N, H*D): per head (each head's D coordinates, Qwen3, Gemma 3,
Cohere) or over the whole projection (OLMo 2), an RMSNorm or a LayerNorm, scale (offset + w).
RoPE turns the first ``rotary_dim`` coordinates of each head (all of them by default; fewer for
partial rotary, none for a NoPE layer), with the frequencies of the call (LongRoPE's long ones
past ``original_max_positions``). The output gate (``gate.py``) scales each coordinate, or each
head, of the merged heads by act(x W_g), act a sigmoid or a softplus. x feeds the query, key and
value paths (and the gate's), so dx = dxq + dxk + dxv (+ dxg). ``rope_forward``,
``rope_backward``, ``RMSNorm`` and ``LayerNorm`` live on the layers floor (``rope.py``,
``norms.py``).

Decoding, the layer hands q, k, v to its cache's ``attend``, which appends k, v and attends over
everything cached: a contiguous ``KVCache`` or pages, ``PagedKVCache``, both in
``decode/cache.py`` (equal results; docs/decoding.md).

Derivation: docs/derivations/grouped.md (the chain, GQA's group sums, QK-norm's place and width,
LongRoPE's switch, the cache), docs/derivations/rope.md (partial rotary),
docs/derivations/rmsnorm.md, docs/derivations/layernorm.md, docs/derivations/output-gate.md.
Tests: tests/numpy_attention/test_grouped.py (gradcheck of every option, torch autograd, decode
equals the full sequence, the cache, bad input); tests/numpy_attention/test_rope.py,
tests/numpy_attention/test_norms.py.
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import numpy as np

from . import validation
from .decode.cache import KVCache, PagedKVCache
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
from .layers import Linear, dropout_keep_mask
from .module import Module
from .norms import LayerNorm, RMSNorm
from .rope import RopeCtx, check_positions, rope_backward, rope_forward, rope_inv_freq

__all__ = ["GroupedQueryAttention"]

# -- the layer ----------------------------------------------------------------------------------


class _GroupedCtx(NamedTuple):
    q_heads: HeadsCtx
    k_heads: HeadsCtx
    v_heads: HeadsCtx
    q_rope: RopeCtx
    k_rope: RopeCtx
    attn: Any  # attention_forward's ctx (dense or tiled)
    out_heads: HeadsCtx
    gate: GateCtx | None  # with an output gate


class _CachedForward(NamedTuple):
    """What a forward with a cache leaves: nothing to differentiate."""


class GroupedQueryAttention(Module):
    """Causal grouped-query self-attention with RoPE, as in Llama, Mistral, Qwen2/3, Gemma 2/3,
    GPT-OSS, Phi-3, OLMo 2, Cohere 1/2, StarCoder 2, Granite, SmolLM 3, GLM and Falcon.

    Parameters, created in this order: ``q_proj`` = Linear(C, H*D, bias), ``k_proj`` and
    ``v_proj`` = Linear(C, H_kv*D, bias), ``o_proj`` = Linear(H*D, C, out_bias); with
    ``qk_norm``, ``q_norm`` and ``k_norm`` (an RMSNorm or LayerNorm, weight by
    ``qk_norm_shape``: (D,), (H, D) and (H_kv, D), or (H*D,) and (H_kv*D,)); with ``sinks``,
    ``sinks`` (H,), zeros at initialisation (a sink of logit 0 weighs like one key of score 0;
    trained or loaded values replace it); with ``output_gate``, ``g_proj`` = Linear(C, H*D)
    per element or Linear(C, H) per head, bias by ``gate_bias``. With ``input_size``, q_proj,
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
        qk_norm: a norm of q and k before RoPE.
        norm_eps: the QK-norm's eps.
        qk_norm_type: ``"rms"`` (RMSNorm: Qwen3, Gemma 3, OLMo 2) or ``"layer"`` (LayerNorm
            without bias: Cohere).
        qk_norm_shape: what is normalized and the weight's shape: ``"head"`` each head's D
            coordinates, one weight (D,) for all heads (Qwen3, Gemma 3); ``"per_head"`` each
            head's D coordinates, a weight (H, D) (Cohere); ``"all"`` the whole projection, H*D
            coordinates of q and H_kv*D of k, weights (H*D,) and (H_kv*D,) (OLMo 2).
        norm_weight_offset: the QK-norm scales by (offset + w): 0, or Gemma 3's 1.
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
        scaling: the score scale; None for 1 / sqrt(D) (Gemma 2: query_pre_attn_scalar^-0.5).
        dropout: dropout probability on the attention weights, in [0, 1) (train mode only).
        input_size: the width of x that q_proj, k_proj, v_proj (and g_proj) read; None for
            hidden_size. o_proj writes hidden_size whatever it is (Zamba's shared attention
            reads its hidden states concatenated with the embeddings, 2 * hidden_size).
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
        window: tuple[int | None, int | None] | None = None,
        softcap: float = 0.0,
        sinks: bool = False,
        output_gate: str | None = None,
        gate_activation: str = "sigmoid",
        gate_bias: bool = False,
        scaling: float | None = None,
        dropout: float = 0.0,
        input_size: int | None = None,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.input_size = (  # x's width: q, k, v (and the gate) read it, o_proj writes C
            self.hidden_size
            if input_size is None
            else validation.positive_int("input_size", input_size)
        )
        self.num_heads = validation.positive_int("num_heads", num_heads)
        self.num_kv_heads = validation.positive_int("num_kv_heads", num_kv_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        if head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}) "
                    "when head_dim is None"
                )
            head_dim = self.hidden_size // self.num_heads
        self.head_dim = validation.positive_int("head_dim", head_dim)
        self.rotary_dim = _check_rotary_dim(rotary_dim, self.head_dim)
        self.inv_freq = _check_inv_freq("inv_freq", inv_freq, self.rotary_dim, rope_theta)
        self.long_inv_freq, self.original_max_positions = _check_long_rope(
            long_inv_freq, original_max_positions, self.rotary_dim
        )
        self.rope_attention_factor = validation.finite_real(
            "rope_attention_factor", rope_attention_factor
        )
        self.rope_interleaved = validation.flag("rope_interleaved", rope_interleaved)
        self.qk_norm = validation.flag("qk_norm", qk_norm)
        norm_eps = validation.finite_real("norm_eps", norm_eps)
        if norm_eps <= 0:
            raise ValueError(f"norm_eps must be > 0, got {norm_eps}")
        self.qk_norm_shape = _check_qk_norm(
            self.qk_norm, qk_norm_type, qk_norm_shape, norm_weight_offset
        )
        self.window = None if window is None else validation.window(window)
        self.softcap = validation.finite_real("softcap", softcap)
        if self.softcap < 0:
            raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
        self.has_sinks = validation.flag("sinks", sinks)
        gate_bias = validation.flag("gate_bias", gate_bias)
        self.output_gate = check_gate(output_gate, gate_activation, gate_bias)
        self.gate_activation = str(gate_activation)
        self.scaling = None if scaling is None else validation.finite_real("scaling", scaling)
        self.dropout = validation.dropout_p(dropout, "dropout")
        self.rng = np.random.default_rng(rng)

        width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = validation.flag("bias", bias)
        out_bias = validation.flag("out_bias", out_bias)
        self.q_proj = Linear(self.input_size, width, bias=bias, rng=self.rng)
        self.k_proj = Linear(self.input_size, kv_width, bias=bias, rng=self.rng)
        self.v_proj = Linear(self.input_size, kv_width, bias=bias, rng=self.rng)
        self.o_proj = Linear(width, self.hidden_size, bias=out_bias, rng=self.rng)
        if self.qk_norm:
            norm = LayerNorm if qk_norm_type == "layer" else RMSNorm
            offset = {"weight_offset": norm_weight_offset}
            self.q_norm = norm(
                _norm_dim(self.qk_norm_shape, self.num_heads, self.head_dim), norm_eps, **offset
            )
            self.k_norm = norm(
                _norm_dim(self.qk_norm_shape, self.num_kv_heads, self.head_dim), norm_eps, **offset
            )
        if self.has_sinks:
            self.register_parameter("sinks", np.zeros(self.num_heads, dtype=np.float32))
        if self.output_gate is not None:
            gates = gate_width(self.output_gate, self.num_heads, self.head_dim)
            self.g_proj = Linear(self.input_size, gates, bias=gate_bias, rng=self.rng)

    def constructor_args(self) -> dict[str, Any]:
        """The base's, in a form that survives JSON (``save_module``): ``inv_freq`` and
        ``long_inv_freq`` arrays as lists of floats (exact: float64 holds every float32 value),
        ``window`` as a tuple whether it was given as a tuple or as the list JSON reads back."""
        args = super().constructor_args()
        for name in ("inv_freq", "long_inv_freq"):
            if args[name] is not None:
                args[name] = np.asarray(args[name], dtype=np.float64).tolist()
        if args["window"] is not None:
            args["window"] = tuple(args["window"])
        return args

    def forward(
        self,
        x: np.ndarray,
        *,
        positions: Any = None,
        key_padding_mask: np.ndarray | None = None,
        cache: KVCache | PagedKVCache | None = None,
        attn_dropout_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Causal self-attention of x's tokens over the cache's and their own.

        Args:
            x: (B, N, C), or (B, N, input_size) when given.
            positions: RoPE positions, (N,) or (B, N) (each batch element its own: left
                padding); default ``cache.length + arange(N)`` (``arange(N)`` without a cache).
            key_padding_mask: bool (B, M), True = padding, over the keys attended: x's N tokens,
                or with a cache all ``cache.length + N`` of them.
            cache: a ``KVCache`` of this layer's (B, H_kv, D) and dtype, or a
                ``PagedKVCache`` of its (H_kv, D) and dtype (equal results): this call's keys
                and values are appended and the queries attend with ``align="bottom-right"``
                (token i of x sits at position ``cache.length + i`` of the key axis). No
                backward follows a forward with a cache.
            attn_dropout_mask: bool (B, H, N, M), True = kept; train mode with dropout > 0.

        Returns:
            (B, N, C).
        """
        x = validation.layer_input("x", x, self.input_size, (3,), self.dtype)
        b, n, _ = x.shape
        start = 0
        if cache is not None:
            if not isinstance(cache, (KVCache, PagedKVCache)):
                raise TypeError(
                    f"cache must be a KVCache or a PagedKVCache, got {type(cache).__name__}"
                )
            cache.check_append((b, self.num_kv_heads, n, self.head_dim), x.dtype)
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
        with no_grad() if cache is not None else contextlib.nullcontext():
            out, ctx = self._chain(x, positions, padding, keep, cache)
        self._save_ctx(_CachedForward() if cache is not None else ctx, out)
        return out

    def _chain(
        self,
        x: np.ndarray,
        positions: np.ndarray,
        padding: np.ndarray | None,
        keep: np.ndarray | None,
        cache: KVCache | PagedKVCache | None,
    ) -> tuple[np.ndarray, _GroupedCtx]:
        """The forward chain (see the module docstring); inputs already checked."""
        rope: dict[str, Any] = {
            "inv_freq": self._frequencies(positions),
            "interleaved": self.rope_interleaved,
            "attention_factor": self.rope_attention_factor,
            "rotary_dim": self.rotary_dim,
        }
        q, k = self.q_proj(x), self.k_proj(x)  # (B, N, H*D), (B, N, H_kv*D)
        if self.qk_norm:  # per head or over the whole projection, before RoPE
            q = self._norm_forward(self.q_norm, q, self.num_heads)
            k = self._norm_forward(self.k_norm, k, self.num_kv_heads)
        q, q_heads = split_heads_forward(q, self.num_heads)  # -> (B, H, N, D)
        k, k_heads = split_heads_forward(k, self.num_kv_heads)  # -> (B, H_kv, N, D)
        v, v_heads = split_heads_forward(self.v_proj(x), self.num_kv_heads)  # -> (B, H_kv, N, D)
        q, q_rope = rope_forward(q, positions, **rope)
        k, k_rope = rope_forward(k, positions, **rope)
        # With a cache: k, v appended, q attending over everything cached (-> (B, H_kv, M, D))
        attend = attention_forward if cache is None else cache.attend
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
            enable_gqa=True,
            dropout_p=self.dropout if keep is not None else 0.0,
            dropout_mask=keep,
        )  # (B, H, N, D)
        merged, out_heads = merge_heads_forward(attn.out)  # (B, H, N, D) -> (B, N, H*D)
        gate = None
        if self.output_gate is not None:  # (B, N, H*D) gated by (B, N, H*D) or (B, N, H)
            merged, gate = output_gate_forward(merged, self.g_proj(x), self.gate_activation)
        out = self.o_proj(merged)  # (B, N, H*D) -> (B, N, C)
        ctx = _GroupedCtx(q_heads, k_heads, v_heads, q_rope, k_rope, attn.ctx, out_heads, gate)
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

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Gradient of x; adds the gradients of every parameter.

        dA = o_proj^T(dY);  with a gate g = act(Z), Z = g_proj(x): dZ = act'(Z) * (dA * merged
        o, summed per head when per head), dxg = g_proj^T(dZ), dA = dA * g;
        dO = split(dA);  dQr, dKr, dV, dsinks = attention_backward(dO)  (dKr and dV
        summed over each group of H / H_kv query heads);  dQh = rope^T(dQr) (rotate by -angle,
        the coordinates past R pass through);  dQn = merge(dQh);  dQp = q_norm^T(dQn);
        dxq = q_proj^T(dQp), and likewise dxk, dxv; dx = dxq + dxk + dxv (+ dxg).
        Derivation: docs/derivations/grouped.md, docs/derivations/output-gate.md.

        Args:
            dout: (B, N, C) gradient of the output of the last forward (one without a cache).

        Returns:
            dx (B, N, C).
        """
        saved = self._ctx
        if saved is not None and isinstance(saved.ctx, _CachedForward):
            raise RuntimeError(
                "GroupedQueryAttention.backward follows a forward without a cache (the training "
                "path); the last forward appended to a KVCache, which is inference only"
            )
        dout, ctx = self._pop_ctx(dout)
        dmerged = self.o_proj.backward(dout)  # (B, N, C) -> (B, N, H*D)
        dxg = None
        if ctx.gate is not None:  # forward: merged = merged * act(g_proj(x))
            dmerged, dpre = output_gate_backward(dmerged, ctx.gate)
            dxg = self.g_proj.backward(dpre)  # (B, N, H*D) or (B, N, H) -> (B, N, C)
        dattn = merge_heads_backward(dmerged, ctx.out_heads)  # -> (B, H, N, D)
        grads = attention_backward(dattn, ctx.attn)  # dk, dv (B, H_kv, N, D): group sums inside
        if grads.dsinks is not None:  # with sinks
            self._accumulate("sinks", grads.dsinks)
        dq = rope_backward(grads.dq, ctx.q_rope)  # forward: q = rope(q_h)
        dk = rope_backward(grads.dk, ctx.k_rope)
        dq = split_heads_backward(dq, ctx.q_heads)  # (B, H, N, D) -> (B, N, H*D)
        dk = split_heads_backward(dk, ctx.k_heads)  # (B, H_kv, N, D) -> (B, N, H_kv*D)
        if self.qk_norm:  # forward: q_n = q_norm(q_proj(x))
            dq = self._norm_backward(self.q_norm, dq, self.num_heads)
            dk = self._norm_backward(self.k_norm, dk, self.num_kv_heads)
        dxq = self.q_proj.backward(dq)  # (B, N, H*D) -> (B, N, C)
        dxk = self.k_proj.backward(dk)  # (B, N, H_kv*D) -> (B, N, C)
        dxv = self.v_proj.backward(split_heads_backward(grads.dv, ctx.v_heads))
        dx = dxq + dxk + dxv
        return dx if dxg is None else dx + dxg


QK_NORM_TYPES = ("rms", "layer")
QK_NORM_SHAPES = ("head", "per_head", "all")


def _check_rotary_dim(rotary_dim: Any, head_dim: int) -> int:
    """R: even, at most D; D when None (which must then be even)."""
    if rotary_dim is None:
        if head_dim % 2:
            raise ValueError(
                f"RoPE rotates pairs of coordinates: head_dim must be even, got {head_dim} "
                "(or give an even rotary_dim below it)"
            )
        return head_dim
    rotary = validation.non_negative_int("rotary_dim", rotary_dim)
    if rotary % 2 or rotary > head_dim:
        raise ValueError(
            f"rotary_dim must be even (RoPE rotates pairs) and at most head_dim = {head_dim}, "
            f"got {rotary}"
        )
    return rotary


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


def _check_qk_norm(qk_norm: bool, norm_type: Any, shape: Any, offset: Any) -> str:
    """The QK-norm's options checked; its shape returned. Options given without qk_norm are
    refused (they would do nothing)."""
    if norm_type not in QK_NORM_TYPES:
        raise ValueError(f"qk_norm_type must be one of {list(QK_NORM_TYPES)}, got {norm_type!r}")
    if shape not in QK_NORM_SHAPES:
        raise ValueError(f"qk_norm_shape must be one of {list(QK_NORM_SHAPES)}, got {shape!r}")
    offset = validation.finite_real("norm_weight_offset", offset)
    if not qk_norm and (norm_type, shape, offset) != ("rms", "head", 0.0):
        raise ValueError(
            f"qk_norm_type={norm_type!r}, qk_norm_shape={shape!r} and norm_weight_offset="
            f"{offset} describe a QK-norm, but qk_norm is False"
        )
    return str(shape)


def _norm_dim(shape: str, heads: int, head_dim: int) -> int | tuple[int, int]:
    """The QK-norm weight's shape for a projection of ``heads`` heads."""
    if shape == "per_head":
        return (heads, head_dim)
    return heads * head_dim if shape == "all" else head_dim


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
