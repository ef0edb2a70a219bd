"""The chain of ``GroupedQueryAttention`` (``grouped.py``), forward and backward side by side:
the layer holds the parameters and checks a call's inputs; ``grouped_forward`` runs its steps
and ``grouped_backward`` walks them in reverse through the parts' own backwards, both reading the
layer's options and parameters and the backward adding into its gradients. Functions of the
layer rather than its methods, so that the layer's file reads as its options and its boundary
and this one as its math.

Shape legend: B batch, H query heads, H_kv key/value heads (H % H_kv == 0), N tokens of this call,
M keys attended (N without a cache; the cache's length after this call with one), C model width
(``hidden_size``), D head width (``head_dim``), Dv value head width (``v_head_dim``, D by
default).

The chain, forward; the backward runs it in reverse:

    q = rope(split_heads(q_norm(q_proj(x)), H))        (B, H, N, D)     q_norm: QK-norm only
    k = rope(split_heads(k_norm(k_proj(x)), H_kv))     (B, H_kv, N, D)  (appended to the cache)
    q = t(p) * q                                       (B, H, N, D)     query_temperature only
    v = s_v * v_norm(split_heads(v_proj(x), H_kv))     (B, H_kv, N, Dv) v_norm: value_norm only
    o = attention(q, k, v; causal, window, softcap, sinks, ALiBi, scale, GQA, dropout)
    o = (1 - li) rmsnorm(o_h - lambda o_(h+H/2))       (B, H/2, N, 2D)  differential only
    a = merge_heads(o) * act(g_proj(x))                (B, N, H*Dv)     gate: output_gate only
    a = o_norm(a)                                      (B, N, H*Dv)     output_norm only
    out = o_proj(a)                                    (B, N, C)

The clamp of ``clip_qkv`` sits before the QK-norm, or after it (``clip_after_norm``); the QK-norm
before RoPE, or after it on the rotated heads (``qk_norm_position``); RoPE turns with LongRoPE's
long frequencies past ``original_max_positions``, chosen per call. x feeds the query, key and
value paths (and the gate's), so dx = dxq + dxk + dxv (+ dxg). A KV-shared layer's keys and
values are another layer's, taken as they are: its backward leaves their gradient in the layer's
``dkv`` and runs the query path alone. With a cache the attention is the cache's ``attend``,
which appends k and v first, and nothing is kept for a backward. The parts live on the floors
below: ``rope.py``, ``norms.py``, ``functional.py``, ``clip.py``, ``gate.py``,
``temperature.py``, ``differential.py``, ``shared_kv.py``.

Derivation: docs/derivations/grouped.md (the chain, GQA's group sums, QK-norm's place and width,
LongRoPE's switch), docs/derivations/rope.md (partial rotary), docs/derivations/rmsnorm.md,
docs/derivations/layernorm.md, docs/derivations/output-gate.md, docs/derivations/clip-qkv.md,
docs/derivations/output-norm.md, docs/derivations/qk-norm-after-rope.md,
docs/derivations/query-temperature.md, docs/derivations/value-scale.md,
docs/derivations/differential.md, docs/derivations/shared-kv.md.
Tests: tests/numpy_attention/test_grouped_chain.py (torch autograd and gradcheck of every option,
GQA's group sums, float32); through the layer in tests/numpy_attention/test_grouped.py (decoding
equals the full sequence, LongRoPE's switch per call, differential attention, a wider input) and
tests/numpy_attention/test_shared_kv.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .clip import ClipCtx, clip_backward, clip_forward
from .decode.cache import KVCache, PagedKVCache
from .differential import (
    LAMBDA_NAMES,
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
from .gate import GateCtx, output_gate_backward, output_gate_forward
from .module import Module
from .rope import RopeCtx, rope_backward, rope_forward
from .shared_kv import SharedKV
from .temperature import (
    TemperatureCtx,
    query_temperature_backward,
    query_temperature_forward,
)

# A GroupedQueryAttention (grouped.py), which imports this module: named by this alias rather
# than imported, even for type checking, so that no import cycle forms (test_import_isolation).
Layer = Any

__all__ = ["GroupedCtx", "grouped_backward", "grouped_forward"]


class GroupedCtx(NamedTuple):
    """What ``grouped_backward`` needs of a forward: each step's ctx (None where the step was
    off)."""

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


def grouped_forward(
    layer: Layer,
    x: np.ndarray,
    positions: np.ndarray,
    padding: np.ndarray | None,
    keep: np.ndarray | None,
    cache: KVCache | PagedKVCache | None,
    shared: SharedKV | None = None,
) -> tuple[np.ndarray, GroupedCtx]:
    """The forward chain of ``layer`` (see the module docstring) on the inputs its ``forward``
    checked: x (B, N, C), positions (N,) or (B, N), padding (B, M), keep (B, H, N, M). A
    KV-shared layer's keys and values are ``shared``'s, taken as they are (normed and rotated by
    their own layer). Sets ``layer.kv`` to this call's keys and values (None with a cache).

    Returns:
        out (B, N, C) and the ctx ``grouped_backward`` reads.
    """
    rope: dict[str, Any] = {
        "inv_freq": _frequencies(layer, positions),
        "interleaved": layer.rope_interleaved,
        "attention_factor": layer.rope_attention_factor,
        "rotary_dim": layer.rotary_dim,
    }
    own = shared is None  # a KV-shared layer's keys and values are another layer's
    q = layer.q_proj(x)  # (B, N, H*D)
    if shared is None:
        k = layer.k_proj(x)  # (B, N, H_kv*D)
        v = k if layer.values_from_keys else layer.v_proj(x)  # (B, N, H_kv*Dv)
    else:
        k, v = shared  # (B, H_kv, M, D) each, normed and rotated by their own layer
    clip, clips = layer.clip_qkv, None  # (refused with shared keys and values)
    if clip is not None and not layer.clip_after_norm:  # OLMo, DBRX
        (q, k, v), clips = _clip_qkv(clip, q, k, v)
    if layer.qk_norm and layer.qk_norm_position == "before_rope":  # per head or whole
        q = _norm_forward(layer, layer.q_norm, q, layer.num_heads)
        if own:
            k = _norm_forward(layer, layer.k_norm, k, layer.num_kv_heads)
    if clip is not None and layer.clip_after_norm:  # OLMoE: q, k after their norm
        (q, k, v), clips = _clip_qkv(clip, q, k, v)
    q, q_heads = split_heads_forward(q, layer.num_heads)  # -> (B, H, N, D)
    k_heads = v_heads = k_rope = None
    if own:
        k, k_heads = split_heads_forward(k, layer.num_kv_heads)  # -> (B, H_kv, N, D)
        v, v_heads = split_heads_forward(v, layer.num_kv_heads)  # -> (B, H_kv, N, Dv)
        if layer.value_norm:  # Gemma 3n, Gemma 4: v / rms over each head's Dv
            v = layer.v_norm(v)
        if layer.value_scale != 1.0:  # MiMo-V2-Flash: the values times a constant, cached
            v = v * layer.value_scale
    q, q_rope = rope_forward(q, positions, **rope)
    if own:
        k, k_rope = rope_forward(k, positions, **rope)
    if layer.qk_norm and layer.qk_norm_position == "after_rope":  # the rotated heads
        q = _norm_heads_forward(layer, layer.q_norm, q)
        if own:
            k = _norm_heads_forward(layer, layer.k_norm, k)
    if own:  # what a KV-shared layer reads: this call's keys and values (a cache's else)
        layer.kv = SharedKV(k, v) if cache is None else None
    temperature = None
    if layer.query_temperature is not None:  # q * t(p), row by row
        counted = _temperature_positions(layer.query_temperature, positions, cache)
        q, temperature = query_temperature_forward(q, counted, layer.query_temperature)
    # With a cache: k, v appended, q attending over everything cached (-> (B, H_kv, M, D),
    # (B, H_kv, M, Dv))
    attend = attention_forward if cache is None else cache.attend
    values: dict[str, Any] = {}  # differential: each query head reads both value halves
    if layer.differential and cache is None:
        v = differential_values_forward(v)  # (B, H_kv, N, D) -> (B, H_kv, N, 2D)
    elif layer.differential:  # the cache holds v; the values it reads are rearranged
        values["value_map"] = differential_values_forward
    attn = attend(
        q,
        k,
        v,
        causal=True,
        window=layer.window,
        align="bottom-right",  # query i at key position M - N + i (i without a cache)
        key_padding_mask=padding,
        scale=layer.scaling,
        softcap=layer.softcap,
        sinks=layer.sinks if layer.has_sinks else None,
        alibi_slopes=layer.alibi_slopes,
        enable_gqa=True,
        dropout_p=layer.dropout if keep is not None else 0.0,
        dropout_mask=keep,
        **values,
        chunk_size=layer.chunk_size,
        chunk_start=None if layer.chunk_size is None else _left_padding(padding),
    )  # (B, H, N, Dv), (B, H, N, 2D) differential
    heads, differential = attn.out, None
    if layer.lambda_init is not None:  # head h minus lambda times head h + H/2, normed
        q1, k1, q2, k2 = (getattr(layer, name) for name in LAMBDA_NAMES)
        lambdas = (q1, k1, q2, k2)
        heads, differential = differential_forward(
            heads, lambdas, layer.lambda_init, layer.differential_eps
        )  # (B, H, N, 2D) -> (B, H/2, N, 2D)
    merged, out_heads = merge_heads_forward(heads)  # (B, H, N, Dv) -> (B, N, H*Dv)
    gate = None
    if layer.output_gate is not None:  # (B, N, H*Dv) gated by (B, N, H*Dv) or (B, N, H)
        merged, gate = output_gate_forward(merged, layer.g_proj(x), layer.gate_activation)
    if layer.output_norm:  # BitNet: an RMSNorm over all H*D coordinates of each token
        merged = layer.o_norm(merged)
    out = layer.o_proj(merged)  # (B, N, H*Dv) -> (B, N, C)
    ctx = GroupedCtx(
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


def grouped_backward(
    layer: Layer,
    dout: np.ndarray,
    ctx: GroupedCtx,
    shared_grad: SharedKV | None = None,
) -> np.ndarray:
    """``layer``'s gradient of x from dout (B, N, C) and the ctx of its forward; adds the
    gradients of every parameter into the layer's.

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
    uses, ``shared_grad``: the layer's ``dkv`` argument, checked) before the key and value
    chains; a KV-shared layer stops at dKr, dV and leaves them in ``layer.dkv`` (dx is then
    dxq (+ dxg)).
    Derivation: docs/derivations/grouped.md, docs/derivations/shared-kv.md,
    docs/derivations/output-gate.md,
    docs/derivations/clip-qkv.md, docs/derivations/output-norm.md,
    docs/derivations/qk-norm-after-rope.md, docs/derivations/query-temperature.md,
    docs/derivations/value-scale.md, docs/derivations/differential.md.

    Returns:
        dx (B, N, C).
    """
    dmerged = layer.o_proj.backward(dout)  # (B, N, C) -> (B, N, H*Dv)
    if layer.output_norm:  # forward: merged = o_norm(merged)
        dmerged = layer.o_norm.backward(dmerged)
    dxg = None
    if ctx.gate is not None:  # forward: merged = merged * act(g_proj(x))
        dmerged, dpre = output_gate_backward(dmerged, ctx.gate)
        dxg = layer.g_proj.backward(dpre)  # (B, N, H*Dv) or (B, N, H) -> (B, N, C)
    dattn = merge_heads_backward(dmerged, ctx.out_heads)  # -> (B, H, N, Dv)
    if ctx.differential is not None:  # forward: Y = (1 - li) norm(O_h - lambda O_h+H/2)
        dattn, dlambdas = differential_backward(dattn, ctx.differential)  # (B, H, N, 2D)
        for name, dlambda in zip(LAMBDA_NAMES, dlambdas, strict=True):
            layer._accumulate(name, dlambda)
    grads = attention_backward(dattn, ctx.attn)  # dk, dv (B, H_kv, N, D | Dv): group sums
    if grads.dsinks is not None:  # with sinks
        layer._accumulate("sinks", grads.dsinks)
    dq, dk, dv = grads.dq, grads.dk, grads.dv
    if ctx.differential is not None:  # forward: V' = both halves of v side by side
        dv = differential_values_backward(dv)  # (B, H_kv, N, 2D) -> (B, H_kv, N, D)
    if layer.value_scale != 1.0:  # forward: v = s_v * v
        dv = dv * layer.value_scale
    if ctx.temperature is not None:  # forward: q = t(p) * q
        dq = query_temperature_backward(dq, ctx.temperature)
    if layer.kv_shared:  # the keys and values were another layer's: their gradient goes back
        layer.dkv = SharedKV(dk, dv)
        return _query_backward(layer, dq, ctx, dxg)
    if shared_grad is not None:  # forward: k, v also attended by the KV-shared layers
        dk, dv = dk + shared_grad.k, dv + shared_grad.v
    if layer.qk_norm and layer.qk_norm_position == "after_rope":  # forward: q = q_norm(q_r)
        dq = _norm_heads_backward(layer, layer.q_norm, dq)
        dk = _norm_heads_backward(layer, layer.k_norm, dk)
    if layer.value_norm:  # forward: v = v_norm(v_h)
        dv = layer.v_norm.backward(dv)
    assert ctx.k_rope is not None and ctx.k_heads is not None and ctx.v_heads is not None
    dq = rope_backward(dq, ctx.q_rope)  # forward: q = rope(q_h)
    dk = rope_backward(dk, ctx.k_rope)
    dq = split_heads_backward(dq, ctx.q_heads)  # (B, H, N, D) -> (B, N, H*D)
    dk = split_heads_backward(dk, ctx.k_heads)  # (B, H_kv, N, D) -> (B, N, H_kv*D)
    dv = split_heads_backward(dv, ctx.v_heads)  # (B, H_kv, N, D) -> (B, N, H_kv*D)
    if ctx.clips is not None and layer.clip_after_norm:  # forward: q = clip(q_norm(q))
        dq, dk, dv = _clip_qkv_backward(ctx.clips, dq, dk, dv)
    if layer.qk_norm and layer.qk_norm_position == "before_rope":  # q_n = q_norm(q_proj(x))
        dq = _norm_backward(layer, layer.q_norm, dq, layer.num_heads)
        dk = _norm_backward(layer, layer.k_norm, dk, layer.num_kv_heads)
    if ctx.clips is not None and not layer.clip_after_norm:  # forward: q = clip(q_proj(x))
        dq, dk, dv = _clip_qkv_backward(ctx.clips, dq, dk, dv)
    dxq = layer.q_proj.backward(dq)  # (B, N, H*D) -> (B, N, C)
    if layer.values_from_keys:  # forward: v = k_proj(x) as well, so its gradients add
        dxk = layer.k_proj.backward(dk + dv)  # (B, N, H_kv*D) -> (B, N, C)
        dx = dxq + dxk
    else:
        dxk = layer.k_proj.backward(dk)  # (B, N, H_kv*D) -> (B, N, C)
        dxv = layer.v_proj.backward(dv)
        dx = dxq + dxk + dxv
    return dx if dxg is None else dx + dxg


def _query_backward(
    layer: Layer, dq: np.ndarray, ctx: GroupedCtx, dxg: np.ndarray | None
) -> np.ndarray:
    """A KV-shared layer's dx: the query chain's alone (and the gate's): ``grouped_backward``'s
    steps for q, from dQr (B, H, N, D) to dxq (B, N, C)."""
    if layer.qk_norm and layer.qk_norm_position == "after_rope":  # forward: q = q_norm(q_r)
        dq = _norm_heads_backward(layer, layer.q_norm, dq)
    dq = rope_backward(dq, ctx.q_rope)  # forward: q = rope(q_h)
    dq = split_heads_backward(dq, ctx.q_heads)  # (B, H, N, D) -> (B, N, H*D)
    if layer.qk_norm and layer.qk_norm_position == "before_rope":  # q_n = q_norm(q_proj(x))
        dq = _norm_backward(layer, layer.q_norm, dq, layer.num_heads)
    dxq = layer.q_proj.backward(dq)  # (B, N, H*D) -> (B, N, C)
    return dxq if dxg is None else dxq + dxg


def _frequencies(layer: Layer, positions: np.ndarray) -> np.ndarray:
    """The call's RoPE frequencies: LongRoPE's long ones when the largest position + 1
    exceeds ``original_max_positions`` (Hugging Face's rule, per forward), else
    ``inv_freq``."""
    long, switch = layer.long_inv_freq, layer.original_max_positions
    if long is None or switch is None or positions.size == 0:
        return layer.inv_freq
    return long if positions.max() + 1 > switch else layer.inv_freq


def _norm_forward(layer: Layer, norm: Module, y: np.ndarray, heads: int) -> np.ndarray:
    """QK-norm of a projection y (B, N, heads*D): per head on (B, N, heads, D), or over the
    whole width (``qk_norm_shape="all"``)."""
    if layer.qk_norm_shape == "all":
        return norm(y)
    b, n, width = y.shape
    return norm(y.reshape(b, n, heads, layer.head_dim)).reshape(b, n, width)


def _norm_backward(layer: Layer, norm: Module, dy: np.ndarray, heads: int) -> np.ndarray:
    """``_norm_forward``'s backward: the same reshapes around the norm's own backward."""
    if layer.qk_norm_shape == "all":
        return norm.backward(dy)
    b, n, width = dy.shape
    return norm.backward(dy.reshape(b, n, heads, layer.head_dim)).reshape(b, n, width)


def _norm_heads_forward(layer: Layer, norm: Module, y: np.ndarray) -> np.ndarray:
    """QK-norm after RoPE: the rotated heads y (B, heads, N, D) seen as the projection
    (B, N, heads*D) again and normed as ``_norm_forward`` norms it."""
    b, heads, n, d = y.shape
    flat = y.transpose(0, 2, 1, 3).reshape(b, n, heads * d)  # -> (B, N, heads*D)
    out = _norm_forward(layer, norm, flat, heads)
    return out.reshape(b, n, heads, d).transpose(0, 2, 1, 3)  # -> (B, heads, N, D)


def _norm_heads_backward(layer: Layer, norm: Module, dy: np.ndarray) -> np.ndarray:
    """``_norm_heads_forward``'s backward: the same reshapes around ``_norm_backward``."""
    b, heads, n, d = dy.shape
    flat = dy.transpose(0, 2, 1, 3).reshape(b, n, heads * d)  # -> (B, N, heads*D)
    dflat = _norm_backward(layer, norm, flat, heads)
    return dflat.reshape(b, n, heads, d).transpose(0, 2, 1, 3)  # -> (B, heads, N, D)


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
