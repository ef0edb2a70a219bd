"""Linear attention as a recurrence: the gated delta rule (Qwen3-Next's gated DeltaNet), KDA (Kimi
Linear) and simple gated linear attention (MiniMax's lightning), forward and hand-derived backward,
each in two forms: ``form="recurrent"`` (a loop over tokens) and ``form="chunk"`` (the chunked
WY/UT form). Named ``linear_attention`` because ``linear`` is the Linear layer here.

flash-linear-attention's layout and conventions: token-major inputs, a state S (K, V) per head,
g the log of the gate (a = exp(g)), the gate applied before the delta rule's error is read:

    gated delta rule  S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T   a_t = exp(g_t)
    KDA               the same with diag(exp(g_t)) (one gate per key channel) in place of a_t
    simple GLA        S_t = a_t S_{t-1} + k_t v_t^T
    every variant     o_t = scale S_t^T q_t

    q, k  (B, T, H, K)      v (B, T, H, V)      beta (B, T, H)
    g     (B, T, H), or (B, T, H, K) for KDA
    initial_state, final_state  (N, H, K, V): N = B, or the number of sequences of cu_seqlens

With ``cu_seqlens`` (B = 1), tokens ``cu_seqlens[n]:cu_seqlens[n + 1]`` are sequence n: its state
starts at ``initial_state[n]`` (or 0) and its last state is ``final_state[n]``; no state crosses a
boundary. Inputs are computed in their dtype (float16 in float32, as the core); the state and
``final_state`` are kept in that compute dtype, never in half precision.

Both forms keep the state at every chunk start (every ``chunk_size`` tokens) and nothing else; each
backward walks the chunks in reverse from those checkpoints, the recurrent form by a reverse scan
over the chunk's tokens, the chunk form by the chunk's own backward (``linear_chunk.py``, one
chunk's WY/UT algebra): both derived by hand.

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states, L chunk length,
Kg gate width (1 for a scalar gate per head, K for KDA).

Derivation: docs/derivations/linear-attention.md.
Tests: tests/numpy_attention/test_linear_attention.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import validation
from .grad_mode import is_grad_enabled
from .linear_chunk import Heads, chunk_backward, chunk_forward, fold

FORMS = ("recurrent", "chunk")
# The two forms compute the same sums in another order (exp of a cumulative sum against a product
# of exps, a triangular solve against a scan): in float64 they agree to ~1e-15 relative on the
# tests' sizes (docs/derivations/linear-attention.md, "Measured"); 1e-12 is the contract's bound
# (design.md, "Linear attention"), and a wrong term reads 1e-3 or worse.
FORMS_RTOL = 1e-12
_KDA, _GDR, _GLA = "kda", "gated_delta_rule", "simple_gla"


class LinearOutput(NamedTuple):
    """out (B, T, H, V) in the inputs' dtype; final_state (N, H, K, V) in the compute dtype, or
    None; ctx None under ``no_grad()``."""

    out: np.ndarray
    final_state: np.ndarray | None
    ctx: LinearCtx | None


class LinearGrads(NamedTuple):
    """One gradient per input, in its dtype and shape; dbeta is None for simple GLA and
    dinitial_state None when no initial state was given."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dg: np.ndarray
    dbeta: np.ndarray | None
    dinitial_state: np.ndarray | None


class LinearCtx(NamedTuple):
    """What the backward needs: the inputs, the state at every chunk start of every sequence."""

    variant: str
    x: Heads
    form: str
    chunk_size: int
    spans: tuple[tuple[int, int], ...]  # (start, stop) of each sequence along T
    varlen: bool  # cu_seqlens was given: sequence n is state row n (else one span, B rows)
    checkpoints: tuple[tuple[np.ndarray, ...], ...]  # per sequence: (b, H, K, V) per chunk
    output_final_state: bool
    dtype: np.dtype  # the inputs'
    g_shape: tuple[int, ...]
    state_dtype: np.dtype | None  # initial_state's; None: none was given


def gated_delta_rule_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    *,
    scale: float | None = None,
    initial_state: np.ndarray | None = None,
    output_final_state: bool = False,
    cu_seqlens: np.ndarray | None = None,
    form: str = "chunk",
    chunk_size: int = 64,
) -> LinearOutput:
    """The gated delta rule: ``S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T``,
    ``o_t = scale S_t^T q_t``, ``a_t = exp(g_t)``.

    Args:
        q: (B, T, H, K) queries.
        k: (B, T, H, K) keys (models L2-normalize them; nothing here does).
        v: (B, T, H, V) values.
        g: (B, T, H) log gates.
        beta: (B, T, H) write strengths.
        scale: multiplies q; None is K^-0.5.
        initial_state: (N, H, K, V) the state before the first token of each sequence; None is 0.
        output_final_state: also return the state after each sequence's last token.
        cu_seqlens: (N + 1,) integer offsets of packed sequences (B must be 1), or None.
        form: "recurrent" or "chunk"; equal up to rounding.
        chunk_size: the chunk length, and the spacing of the backward's checkpoints.

    Returns:
        ``LinearOutput(out, final_state, ctx)``.
    """
    return _forward(
        _GDR, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, form,
        chunk_size,
    )  # fmt: skip


def gated_delta_rule_backward(
    dout: np.ndarray, ctx: LinearCtx, dfinal_state: np.ndarray | None = None
) -> LinearGrads:
    """The gradients of ``gated_delta_rule_forward``, by a reverse walk over the chunks.

    Per token, backward (P = a S_{t-1}, r = v - P^T k, u = beta r, S_t = P + k u^T):
    ``dS += scale q dO^T; dq = scale S_t dO; dk = dS u - P (beta du); du = dS^T k;
    dbeta = du . r; dv = beta du; dP = dS - k (beta du)^T; dg = sum(dP * P); dS_{t-1} = a dP``,
    dS starting at dfinal_state (or 0) and ending as dinitial_state. Derivation:
    docs/derivations/linear-attention.md.

    Args:
        dout: (B, T, H, V) gradient of out.
        ctx: from ``gated_delta_rule_forward``.
        dfinal_state: (N, H, K, V) gradient of final_state (only when it was output), or None.

    Returns:
        ``LinearGrads(dq, dk, dv, dg, dbeta, dinitial_state)``.
    """
    return _backward(_GDR, dout, ctx, dfinal_state)


def kda_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    *,
    scale: float | None = None,
    initial_state: np.ndarray | None = None,
    output_final_state: bool = False,
    cu_seqlens: np.ndarray | None = None,
    form: str = "chunk",
    chunk_size: int = 64,
) -> LinearOutput:
    """Kimi Delta Attention: the gated delta rule with one gate per key channel,
    ``S_t = D_t S_{t-1} + beta_t k_t (v_t - (D_t S_{t-1})^T k_t)^T``, ``D_t = diag(exp(g_t))``.

    The arguments of ``gated_delta_rule_forward``, but g is (B, T, H, K).
    """
    return _forward(
        _KDA, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, form,
        chunk_size,
    )  # fmt: skip


def kda_backward(
    dout: np.ndarray, ctx: LinearCtx, dfinal_state: np.ndarray | None = None
) -> LinearGrads:
    """The gradients of ``kda_forward``: ``gated_delta_rule_backward``'s scan with a the vector
    exp(g_t) scaling the state's rows; dg_t = sum over V of dP * P, one per key channel."""
    return _backward(_KDA, dout, ctx, dfinal_state)


def simple_gla_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    *,
    scale: float | None = None,
    initial_state: np.ndarray | None = None,
    output_final_state: bool = False,
    cu_seqlens: np.ndarray | None = None,
    form: str = "chunk",
    chunk_size: int = 64,
) -> LinearOutput:
    """Simple gated linear attention (lightning): ``S_t = a_t S_{t-1} + k_t v_t^T``,
    ``o_t = scale S_t^T q_t``, ``a_t = exp(g_t)``, g (B, T, H); no beta, no delta rule. The other
    arguments as ``gated_delta_rule_forward``'s."""
    return _forward(
        _GLA, q, k, v, g, None, scale, initial_state, output_final_state, cu_seqlens, form,
        chunk_size,
    )  # fmt: skip


def simple_gla_backward(
    dout: np.ndarray, ctx: LinearCtx, dfinal_state: np.ndarray | None = None
) -> LinearGrads:
    """The gradients of ``simple_gla_forward``: ``dS += scale q dO^T; dq = scale S_t dO;
    dk = dS v; dv = dS^T k; dg = sum(dS * P); dS_{t-1} = a dS``, P = a S_{t-1}; dbeta is None."""
    return _backward(_GLA, dout, ctx, dfinal_state)


def _forward(
    variant: str,
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    scale: Any,
    initial_state: Any,
    output_final_state: Any,
    cu_seqlens: Any,
    form: Any,
    chunk_size: Any,
) -> LinearOutput:
    """Both forms over every sequence, a chunk at a time, the state at each chunk start kept."""
    p = _prepare(
        variant, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, form,
        chunk_size,
    )  # fmt: skip
    x = p.x
    step = chunk_forward if p.form == "chunk" else _recurrent_forward
    out = np.empty_like(x.v)  # (B, H, T, V)
    finals, checkpoints = [], []
    for n, (start, stop) in enumerate(p.spans):
        s = p.states[n : n + 1] if p.varlen else p.states  # (b, H, K, V)
        kept = []
        for c0 in range(start, stop, p.chunk_size):
            c1 = min(c0 + p.chunk_size, stop)
            kept.append(s)
            out[:, :, c0:c1], s = step(x, c0, c1, s)
        finals.append(s)
        checkpoints.append(tuple(kept))
    ctx = None
    if is_grad_enabled():
        ctx = LinearCtx(
            variant, x, p.form, p.chunk_size, p.spans, p.varlen, tuple(checkpoints),
            p.output_final_state, p.dtype, p.g_shape, p.state_dtype,
        )  # fmt: skip
    final_state = np.concatenate(finals, axis=0) if p.output_final_state else None
    out = out.transpose(0, 2, 1, 3)  # (B, H, T, V) -> (B, T, H, V)
    return LinearOutput(out.astype(p.dtype, copy=False), final_state, ctx)


def _backward(variant: str, dout: Any, ctx: Any, dfinal_state: Any) -> LinearGrads:
    """The forward's chunks walked in reverse, each from its checkpoint, dS carried between."""
    if not isinstance(ctx, LinearCtx) or ctx.variant != variant:
        got = f"the ctx of {ctx.variant}" if isinstance(ctx, LinearCtx) else type(ctx).__name__
        raise TypeError(
            f"{variant}_backward needs the ctx of a {variant}_forward run outside no_grad(), "
            f"got {got}"
        )
    x = ctx.x
    batch, heads, tokens, width = x.q.shape
    compute = x.q.dtype
    dout = validation.grad_output(dout, (batch, tokens, heads, x.v.shape[-1]), compute)
    dout = np.ascontiguousarray(dout.transpose(0, 2, 1, 3))  # (B, T, H, V) -> (B, H, T, V)
    state_shape = (len(ctx.spans) if ctx.varlen else batch, heads, width, x.v.shape[-1])
    if dfinal_state is None:
        dfinal_state = np.zeros(state_shape, compute)
    elif not ctx.output_final_state:
        raise ValueError("dfinal_state was given, but the forward did not output final_state")
    else:
        dfinal_state = validation.grad_output(dfinal_state, state_shape, compute, "dfinal_state")
    step = chunk_backward if ctx.form == "chunk" else _recurrent_backward
    grads = {name: np.zeros_like(getattr(x, name)) for name in ("q", "k", "v", "g")}
    if x.beta is not None:
        grads["beta"] = np.zeros_like(x.beta)
    dinitial = np.empty(state_shape, compute)
    for n, (start, stop) in enumerate(ctx.spans):
        rows = slice(n, n + 1) if ctx.varlen else slice(None)
        ds = dfinal_state[rows]  # dL/dS at the sequence's end, then at each chunk's start
        starts = range(start, stop, ctx.chunk_size)
        for c0, s in reversed(list(zip(starts, ctx.checkpoints[n], strict=True))):
            ds = step(x, c0, min(c0 + ctx.chunk_size, stop), s, dout, ds, grads)
        dinitial[rows] = ds

    def token_major(name: str) -> np.ndarray:
        return np.swapaxes(grads[name], 1, 2).astype(ctx.dtype)  # (B, H, T, ...) -> (B, T, H, ...)

    return LinearGrads(
        token_major("q"),
        token_major("k"),
        token_major("v"),
        token_major("g").reshape(ctx.g_shape),  # (B, T, H, Kg) -> g's shape
        token_major("beta") if x.beta is not None else None,
        None if ctx.state_dtype is None else dinitial.astype(ctx.state_dtype),
    )


# ---- the recurrent form: one token at a time -------------------------------------------------


def _step(
    x: Heads, t: int, s: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """One token of the recurrence: the new state, and the gate a, the forgotten state P, the
    write u and the error r (None without the delta rule) that the backward reads."""
    k = x.k[:, :, t]  # (B, H, K)
    a = np.exp(x.g[:, :, t])[..., None]  # (B, H, Kg, 1): the gate of each key channel (row of S)
    p = a * s  # P = a S_{t-1}: forget first
    if x.beta is None:
        r, u = None, x.v[:, :, t]  # simple GLA writes v itself
    else:
        r = x.v[:, :, t] - _read(p, k)  # r = v - P^T k: the error of what P recalls for k
        u = x.beta[:, :, t, None] * r  # u = beta r
    s = p + k[..., None] * u[..., None, :]  # S = a S + beta k (v - a S^T k)^T  (B, H, K, V)
    return s, a, p, u, r


def _read(s: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """S^T vec per (B, H): (B, H, K, V), (B, H, K) -> (B, H, V)."""
    return np.einsum("bhkv,bhk->bhv", s, vec)


def _recurrent_forward(x: Heads, c0: int, c1: int, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens c0:c1 one at a time from the state s: their outputs (B, H, L, V), the last state."""
    out = np.empty(x.v[:, :, c0:c1].shape, x.v.dtype)
    for t in range(c0, c1):
        s = _step(x, t, s)[0]
        out[:, :, t - c0] = x.scale * _read(s, x.q[:, :, t])  # o = scale S^T q
    return out, s


def _recurrent_backward(
    x: Heads,
    c0: int,
    c1: int,
    s: np.ndarray,
    dout: np.ndarray,
    ds: np.ndarray,
    grads: dict[str, np.ndarray],
) -> np.ndarray:
    """The reverse scan over tokens c0:c1: their states recomputed from the checkpoint s, then
    each token's forward lines differentiated in reverse order; ds is dL/dS_{c1 - 1} on entry,
    dL/dS_{c0 - 1} on return. Writes the tokens' gradients into ``grads``."""
    states = [s]
    for t in range(c0, c1):
        states.append(_step(x, t, states[-1])[0])
    for t in reversed(range(c0, c1)):
        s_t, a, p, u, r = _step(x, t, states[t - c0])
        q, k, do = x.q[:, :, t], x.k[:, :, t], dout[:, :, t]
        ds = ds + x.scale * q[..., None] * do[..., None, :]  # forward: o = scale S_t^T q
        grads["q"][:, :, t] = x.scale * np.einsum("bhkv,bhv->bhk", s_t, do)
        du = _read(ds, k)  # forward: S_t = P + k u^T
        dk = np.einsum("bhkv,bhv->bhk", ds, u)
        dp = ds
        if x.beta is None or r is None:
            grads["v"][:, :, t] = du  # simple GLA: u = v
        else:
            grads["beta"][:, :, t] = np.sum(du * r, axis=-1)  # forward: u = beta r
            dr = x.beta[:, :, t, None] * du
            grads["v"][:, :, t] = dr  # forward: r = v - P^T k
            dk = dk - np.einsum("bhkv,bhv->bhk", p, dr)
            dp = ds - k[..., None] * dr[..., None, :]
        grads["k"][:, :, t] = dk
        # forward: P = diag(a) S_{t-1}, a = exp(g): dg_c = a_c sum_v dP_cv S_cv = sum_v dP_cv P_cv
        grads["g"][:, :, t] = fold(np.sum(dp * p, axis=-1), x.g.shape[-1])
        ds = a * dp
    return ds


# ---- the boundary: every argument checked once -------------------------------------------------


class Prepared(NamedTuple):
    x: Heads
    states: np.ndarray  # (N, H, K, V), compute dtype
    spans: tuple[tuple[int, int], ...]
    varlen: bool
    form: str
    chunk_size: int
    output_final_state: bool
    dtype: np.dtype
    g_shape: tuple[int, ...]
    state_dtype: np.dtype | None


def _prepare(
    variant: str,
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    scale: Any,
    initial_state: Any,
    output_final_state: Any,
    cu_seqlens: Any,
    form: Any,
    chunk_size: Any,
) -> Prepared:
    """Every argument checked before any work, the arrays cast to the compute dtype (float32 for
    float16 inputs, as the core) and made head-major."""
    arrays = {"q": q, "k": k, "v": v, "g": g} | ({} if variant == _GLA else {"beta": beta})
    arrays = {name: validation.float_array(name, value) for name, value in arrays.items()}
    dtype = validation.same_dtype(**arrays)
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    check_shapes(variant, **{name: array.shape for name, array in arrays.items()})
    batch, tokens, heads, width = arrays["q"].shape
    if form not in FORMS:
        raise ValueError(f"form must be 'recurrent' or 'chunk', got {form!r}")
    chunk_size = validation.positive_int("chunk_size", chunk_size)
    output_final_state = validation.flag("output_final_state", output_final_state)
    if scale is None:
        scale = 1.0 / math.sqrt(width) if width else 1.0
    else:
        scale = validation.finite_real("scale", scale)
    spans = _spans(cu_seqlens, batch, tokens)
    varlen = cu_seqlens is not None
    state_shape = (len(spans) if varlen else batch, heads, width, arrays["v"].shape[-1])
    state_dtype = None
    if initial_state is None:
        states = np.zeros(state_shape, compute)
    else:
        states = validation.float_array("initial_state", initial_state)
        if states.shape != state_shape:
            what = "sequences of cu_seqlens" if varlen else "batch B"
            raise ValueError(
                f"initial_state must be (N, H, K, V) = {state_shape}, N the {what}, got "
                f"{states.shape}"
            )
        state_dtype = states.dtype
        states = states.astype(compute)

    def head_major(name: str) -> np.ndarray:
        # (B, T, H, ...) -> (B, H, T, ...), contiguous: a chunk's rows are then a plain matrix
        # for BLAS (a strided view of the token-major array sends matmul down its slow loop)
        return np.ascontiguousarray(np.swapaxes(arrays[name], 1, 2), dtype=compute)

    gate = arrays["g"] if variant == _KDA else arrays["g"][..., None]  # (B, T, H, Kg)
    x = Heads(
        head_major("q"), head_major("k"), head_major("v"),
        np.ascontiguousarray(np.swapaxes(gate, 1, 2), dtype=compute),
        None if variant == _GLA else head_major("beta"),
        compute.type(scale),
    )  # fmt: skip
    return Prepared(
        x, states, spans, varlen, form, chunk_size, output_final_state, dtype,
        arrays["g"].shape, state_dtype,
    )  # fmt: skip


def check_shapes(variant: str, **shapes: tuple[int, ...]) -> None:
    """The shapes of q, k, v, g (and beta) checked against fla's layout (pure Python: the torch
    twin can run the same rules)."""
    for name in ("q", "k", "v"):
        if len(shapes[name]) != 4:
            raise ValueError(f"{name} must be (B, T, H, width), got shape {shapes[name]}")
    q, k, v = shapes["q"], shapes["k"], shapes["v"]
    if k != q:
        raise ValueError(f"q and k must both be (B, T, H, K), got q {q} and k {k}")
    if v[:3] != q[:3]:
        raise ValueError(f"v must be (B, T, H, V) with q's (B, T, H) = {q[:3]}, got v {v}")
    gate = q if variant == _KDA else q[:3]
    if shapes["g"] != gate:
        hint = {
            _KDA: "KDA's gate is per key channel",
            _GDR: "a gate per key channel is KDA: kda_forward",
            _GLA: "one gate per head and token",
        }[variant]
        raise ValueError(
            f"g must be {'(B, T, H, K)' if variant == _KDA else '(B, T, H)'} = {gate} ({hint}), "
            f"got {shapes['g']}"
        )
    if "beta" in shapes and shapes["beta"] != q[:3]:
        raise ValueError(f"beta must be (B, T, H) = {q[:3]}, got {shapes['beta']}")


def _spans(cu_seqlens: Any, batch: int, tokens: int) -> tuple[tuple[int, int], ...]:
    """The (start, stop) of each sequence along T: the whole of T without cu_seqlens."""
    if cu_seqlens is None:
        return ((0, tokens),)
    offsets = np.asarray(cu_seqlens)
    if offsets.dtype == np.bool_ or not np.issubdtype(offsets.dtype, np.integer):
        raise TypeError(f"cu_seqlens must be an integer array, got dtype {offsets.dtype}")
    if offsets.ndim != 1 or len(offsets) < 2:
        raise ValueError(f"cu_seqlens must be 1-D (N + 1,) offsets, got shape {offsets.shape}")
    if batch != 1:
        raise ValueError(
            f"with cu_seqlens the sequences are packed along T, so B must be 1, got B = {batch}"
        )
    if offsets[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {offsets.tolist()}")
    if np.any(np.diff(offsets) < 0):
        raise ValueError(f"cu_seqlens must never decrease, got {offsets.tolist()}")
    if offsets[-1] != tokens:
        raise ValueError(f"cu_seqlens must end at T = {tokens}, got {offsets.tolist()}")
    return tuple((int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:], strict=True))
