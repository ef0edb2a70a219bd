"""Linear attention as a recurrence in torch (gated DeltaNet, KDA, lightning), the twin of
``numpy_attention.linear_attention``, differentiable by autograd.

flash-linear-attention's layout and names: q, k (B, T, H, K), v (B, T, H, V), g log-gates
(B, T, H) (KDA: (B, T, H, K), one per key channel), beta (B, T, H), state S (N, H, K, V) with
N = B, or N = the number of sequences of ``cu_seqlens`` (then B = 1 and the state restarts at
every sequence start). Per head, with a_t = exp(g_t) (KDA: diag(exp(g_t))):

    gated delta rule, forget before the error:
        S_t = a_t S_{t-1} + beta_t k_t (v_t - (a_t S_{t-1})^T k_t)^T     o_t = scale S_t^T q_t
    simple gated linear attention (lightning): S_t = a_t S_{t-1} + k_t v_t^T

Two forms, equal in exact arithmetic (float64: to ~1e-15): ``form="recurrent"``, a loop over
tokens that reads like the equations, and ``form="chunk"``, the WY/UT form that kernels run.
The chunked form, derived from the recurrent one: in a chunk of C tokens that starts from
S_0, let G_i = g_1 + ... + g_i (cumulative log gate, per key channel for KDA) and write the
delta update as S_i = a_i S_{i-1} + k_i u_i^T with u_i = beta_i (v_i - (a_i S_{i-1})^T k_i).
Unrolled, a_i S_{i-1} = exp(G_i) S_0 + sum_{j<i} exp(G_i - G_j) k_j u_j^T, so

    u_i + beta_i sum_{j<i} A_ij u_j = beta_i (v_i - S_0^T (exp(G_i) k_i)),
    A_ij = sum_d k_i[d] k_j[d] exp(G_i[d] - G_j[d])

a unit lower-triangular system (I + diag(beta) A) U = diag(beta) (V - (exp(G) * K) S_0). Its
solution splits as U = U~ - W S_0 with U~ = T diag(beta) V and W = T diag(beta) (exp(G) * K),
T = (I + diag(beta) A)^-1 (the UT transform; W, U~ are the WY representation): neither depends
on S_0, so every chunk's triangular solve runs at once and only U = U~ - W S_0 waits for the
state. Then, with P_ij = sum_d q_i[d] k_j[d] exp(G_i[d] - G_j[d]) for j <= i,

    O = scale ((exp(G) * Q) S_0 + P U)
    S_C = exp(G_C) S_0 + ((exp(G_C - G) * K)^T U)   (exp(G_C) scales the rows of S_0)

and simple gated linear attention is the same with U = V. Every exponent is G_i - G_j with
j <= i, or G_i alone: for log-gates <= 0 none exceeds 0, so nothing overflows, and a strongly
negative gate only underflows to 0. A scalar gate factors out of A and P (a (C, C) decay
matrix times k k^T); a per-channel gate forms the (C, C, K) products. The last chunk is padded
with zero tokens (gate 1, no key, no value, beta 0), which change nothing.

Dtypes: half inputs are computed, and the state kept, in float32 (``rules.compute_dtype``):
``out`` comes back in the inputs' dtype, ``final_state`` in the compute dtype (float32 for
half inputs, as fla's kernels return it; fla returns float32 for float32 and float64 inputs
too, this twin float64 for float64). g, beta and ``initial_state`` may have any float dtype;
they are read in the compute dtype of q, k and v.

Other implementations (measured in tests/torch_attention/test_linear_attention.py):
fla-core 0.6.0's naive references (``naive_recurrent_gated_delta_rule`` takes beta before g)
compute in float32. transformers 5.23's ``torch_chunk_gated_delta_rule`` and
``torch_recurrent_gated_delta_rule`` (models/qwen3_next) are wrapped by
``use_kernel_func_from_hub_with_fallback``: with fla installed the name calls fla's kernel;
without it, the torch path runs, and the wrapper drops every keyword the torch function does
not name (``scale`` among them: the torch path always scales by K^-0.5) and refuses
``cu_seqlens`` with a ValueError. Kimi Linear's KDA fallbacks do the same.

Derivation: docs/derivations/linear-attention.md (the NumPy twin's page).
Tests: tests/torch_attention/test_linear_attention.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from numpy_attention.linear_attention import check_shapes  # pure Python, shared

from . import validation
from .rules import compute_dtype
from .varlen import _offsets

__all__ = ["LinearOutput", "gated_delta_rule", "kda", "simple_gla"]

FORMS = ("recurrent", "chunk")


class LinearOutput(NamedTuple):
    """What each function returns: unpacks as fla's ``(o, final_state)``.

    out: (B, T, H, V) in the inputs' dtype. final_state: (N, H, K, V) in the compute dtype when
    ``output_final_state=True``, else None.
    """

    out: torch.Tensor
    final_state: torch.Tensor | None


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
    form: str = "chunk",
    chunk_size: int = 64,
) -> LinearOutput:
    """Gated DeltaNet (Qwen3-Next): S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T.

    Args:
        q, k: (B, T, H, K). fla's kernels and layers feed L2-normalized k; the rule is stable
            for beta_t |k_t|^2 <= 2.
        v: (B, T, H, V).
        g: (B, T, H) log-gates, a_t = exp(g_t), one per head (usually <= 0).
        beta: (B, T, H) write strengths (usually in [0, 1]).
        scale: multiplies S_t^T q_t; default K^-0.5.
        initial_state: (N, H, K, V), the state before each sequence's first token; default 0.
        output_final_state: also return the state after each sequence's last token.
        cu_seqlens: (N + 1,) integer offsets of packed sequences (B = 1): start at 0, never
            decrease, end at T; the state restarts at each offset.
        form: ``"recurrent"`` (a loop over tokens) or ``"chunk"`` (the WY/UT chunked form).
        chunk_size: tokens per chunk of the chunked form.

    Returns:
        ``LinearOutput(out, final_state)``: out (B, T, H, V) in the inputs' dtype,
        final_state (N, H, K, V) in the compute dtype or None.
    """
    options = (scale, initial_state, output_final_state, cu_seqlens, form, chunk_size)
    return _linear(q, k, v, g, beta, *options, per_channel=False)


def kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
    form: str = "chunk",
    chunk_size: int = 64,
) -> LinearOutput:
    """Kimi Delta Attention: the gated delta rule with one gate per key channel.

    S_t = D_t S_{t-1} + beta_t k_t (v_t - (D_t S_{t-1})^T k_t)^T with D_t = diag(exp(g_t)).
    A function of its own, as fla's ``chunk_kda`` beside ``chunk_gated_delta_rule``.

    Args:
        g: (B, T, H, K) log-gates, one per key channel.
        q, k, v, beta, scale, initial_state, output_final_state, cu_seqlens, form, chunk_size:
            as ``gated_delta_rule``.

    Returns:
        ``LinearOutput(out, final_state)`` as ``gated_delta_rule``.
    """
    options = (scale, initial_state, output_final_state, cu_seqlens, form, chunk_size)
    return _linear(q, k, v, g, beta, *options, per_channel=True)


def simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
    form: str = "chunk",
    chunk_size: int = 64,
) -> LinearOutput:
    """Simple gated linear attention (MiniMax's lightning attention): S_t = a_t S_{t-1} + k_t v_t^T.

    Args:
        g: (B, T, H) log-gates (lightning: a constant per head, -slope_h).
        q, k, v, scale, initial_state, output_final_state, cu_seqlens, form, chunk_size: as
            ``gated_delta_rule``.

    Returns:
        ``LinearOutput(out, final_state)`` as ``gated_delta_rule``.
    """
    options = (scale, initial_state, output_final_state, cu_seqlens, form, chunk_size)
    return _linear(q, k, v, g, None, *options, per_channel=False)


def _linear(
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
    *,
    per_channel: bool,
) -> LinearOutput:
    """Check the inputs once, then run each sequence (or the batch) through one form."""
    q, k, v = (validation.float_tensor(n, t) for n, t in (("q", q), ("k", k), ("v", v)))
    dtype = validation.same_dtype(q=q, k=k, v=v)
    g = validation.float_tensor("g", g)
    shapes = {"q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape), "g": tuple(g.shape)}
    if beta is not None:
        beta = validation.float_tensor("beta", beta)
        shapes["beta"] = tuple(beta.shape)
    variant = "kda" if per_channel else "gated_delta_rule" if beta is not None else "simple_gla"
    check_shapes(variant, **shapes)  # the NumPy twin's rules, pure Python
    batch, length, heads, width = q.shape
    if width == 0:
        raise ValueError(f"q and k have key width K = 0 (q {tuple(q.shape)}): no state to keep")
    scale = 1.0 / math.sqrt(width) if scale is None else validation.finite_real("scale", scale)
    keep_final = validation.flag("output_final_state", output_final_state)
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    chunk_size = validation.positive_int("chunk_size", chunk_size)
    if cu_seqlens is None:
        spans = [(slice(0, batch), 0, length)]
    else:
        if batch != 1:
            raise ValueError(
                f"with cu_seqlens the sequences are packed along T and B must be 1, got q "
                f"{tuple(q.shape)}"
            )
        offsets = _offsets("cu_seqlens", cu_seqlens, length)
        if len(offsets) < 2:
            raise ValueError(f"cu_seqlens must describe at least one sequence, got {offsets}")
        bounds = zip(offsets[:-1], offsets[1:], strict=True)
        spans = [(slice(n, n + 1), start, stop) for n, (start, stop) in enumerate(bounds)]
    state_shape = (len(spans) if cu_seqlens is not None else batch, heads, width, v.shape[3])
    compute = compute_dtype(dtype)
    if initial_state is None:
        state = q.new_zeros(state_shape, dtype=compute)
    else:
        state = validation.float_tensor("initial_state", initial_state)
        if tuple(state.shape) != state_shape:
            raise ValueError(
                f"initial_state must be (N, H, K, V) = {state_shape}, N = "
                f"{'the number of sequences' if cu_seqlens is not None else 'B'}, got "
                f"{tuple(state.shape)}"
            )
        state = state.to(compute)

    q, k, v, g = (t.to(compute) for t in (q, k, v, g))
    g = g if per_channel else g[..., None]  # (B, T, H, K or 1): a scalar gate broadcasts
    beta = None if beta is None else beta.to(compute)
    scan = _recurrent if form == "recurrent" else _chunked
    outs, finals = [], []
    for rows, start, stop in spans:  # rows: the sequences' rows of the state
        tokens = slice(start, stop)
        q_s, k_s, v_s, g_s = (x[:, tokens].transpose(1, 2) for x in (q, k, v, g))  # (B, H, T, .)
        beta_s = None if beta is None else beta[:, tokens].transpose(1, 2)  # (B, H, T)
        out, final = scan(q_s, k_s, v_s, g_s, beta_s, scale, state[rows], chunk_size)
        outs.append(out.transpose(1, 2))  # (B, H, T, V) -> (B, T, H, V)
        finals.append(final)
    out = torch.cat(outs, dim=1).to(dtype)
    return LinearOutput(out, torch.cat(finals) if keep_final else None)


def _recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor | None,
    scale: float,
    state: torch.Tensor,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence token by token, vectorized over B and H.

    q, k (B, H, T, K), v (B, H, T, V), g (B, H, T, K or 1), beta (B, H, T) or None (no delta),
    state (B, H, K, V). Returns out (B, H, T, V) and the last state. ``chunk_size`` is unused.
    """
    outs = []
    for t in range(q.shape[2]):
        a = g[:, :, t, :, None].exp()  # (B, H, K or 1, 1)
        k_t, v_t = k[:, :, t, None, :], v[:, :, t, None, :]  # (B, H, 1, K), (B, H, 1, V)
        state = a * state  # forget first: a S
        if beta is None:
            state = state + k_t.mT @ v_t  # S = a S + k v^T  (B, H, K, V)
        else:
            error = beta[:, :, t, None, None] * (v_t - k_t @ state)  # beta (v - (a S)^T k)
            state = state + k_t.mT @ error  # S = a S + beta k (v - (a S)^T k)^T  (B, H, K, V)
        outs.append(scale * (q[:, :, t, None, :] @ state))  # o = scale S^T q  (B, H, 1, V)
    out = torch.cat(outs, dim=2) if outs else v  # T = 0: v is the empty (B, H, 0, V)
    return out, state


def _chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor | None,
    scale: float,
    state: torch.Tensor,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The WY/UT chunked form (derived in the module docstring); arguments as ``_recurrent``."""
    batch, heads, length, _ = q.shape
    if length == 0:
        return v, state  # v is the empty (B, H, 0, V)
    pad = -length % chunk_size  # zero tokens: gate 1, no key, no value, beta 0
    q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
    n = (length + pad) // chunk_size
    q, k, v, g = (
        x.reshape(batch, heads, n, chunk_size, x.shape[-1]) for x in (q, k, v, g)
    )  # (B, H, T, .) -> (B, H, n, C, .)
    cum = g.cumsum(dim=3)  # G_i, the log of the decay from the chunk's start through token i
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    scores = scale * _decayed_products(q, k, cum, causal)  # scale P  (B, H, n, C, C)
    if beta is not None:
        beta = F.pad(beta, (0, pad)).reshape(batch, heads, n, chunk_size, 1)
        system = _decayed_products(k, k, cum, causal.tril(-1)) * beta  # diag(beta) A
        system = system + torch.eye(chunk_size, dtype=q.dtype, device=q.device)
        w = torch.linalg.solve_triangular(
            system, beta * cum.exp() * k, upper=False, unitriangular=True
        )  # W = T diag(beta) (exp(G) * K)  (B, H, n, C, K)
        u = torch.linalg.solve_triangular(system, beta * v, upper=False, unitriangular=True)
    outs = []
    for i in range(n):
        cum_i, k_i = cum[:, :, i], k[:, :, i]  # (B, H, C, K or 1), (B, H, C, K)
        new = v[:, :, i] if beta is None else u[:, :, i] - w[:, :, i] @ state  # U  (B, H, C, V)
        outs.append(scale * (q[:, :, i] * cum_i.exp()) @ state + scores[:, :, i] @ new)
        last = cum_i[:, :, -1:]  # G_C  (B, H, 1, K or 1)
        state = last.mT.exp() * state + (k_i * (last - cum_i).exp()).mT @ new  # (B, H, K, V)
    out = torch.cat(outs, dim=2)[:, :, :length]  # (B, H, n C, V) -> (B, H, T, V)
    return out, state


def _decayed_products(
    x: torch.Tensor, y: torch.Tensor, cum: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """sum_d x_i[d] y_j[d] exp(G_i[d] - G_j[d]) where ``mask[i, j]``, else 0.

    x, y (..., C, K), cum G (..., C, K or 1), mask (C, C) bool, lower triangular; returns
    (..., C, C). The exponent is masked before exp: above the diagonal it would overflow.
    """
    if cum.shape[-1] == 1:  # a scalar gate factors out of the sum over d
        decay = (cum - cum.mT).masked_fill(~mask, -math.inf).exp()  # (..., C, C)
        return (x @ y.mT) * decay
    gap = cum[..., :, None, :] - cum[..., None, :, :]  # G_i - G_j  (..., C, C, K)
    decay = gap.masked_fill(~mask[..., None], -math.inf).exp()
    return (x[..., :, None, :] * y[..., None, :, :] * decay).sum(dim=-1)
