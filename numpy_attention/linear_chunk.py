"""The chunk form of ``linear_attention``'s variants: L tokens at once from the state entering the
chunk, through the WY/UT representation of the delta rule (a unit lower-triangular system per
chunk), and its backward, both derived by hand. ``linear_attention`` walks the chunks, keeps the
checkpoints and checks every argument; this module holds one chunk's algebra.

    U   = W0 - W S,  (W, W0) = T^-1 diag(beta) (e_q * K, V),  T = I + diag(beta) Akk
    O   = (e_q * Q) S + Aqk U
    S_L = e_end * S + (e_k * K)^T U

Shape legend: B batch, H heads, L chunk length, K key width, V value width, Kg gate width (1 for
a scalar gate per head, K for KDA).

Derivation: docs/derivations/linear-attention.md ("The chunk form").
Tests: tests/numpy_attention/test_linear_chunk.py (the chunk form against the recurrent one).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class Heads(NamedTuple):
    """The inputs head-major, in the compute dtype: what a form reads."""

    q: np.ndarray  # (B, H, T, K)
    k: np.ndarray  # (B, H, T, K)
    v: np.ndarray  # (B, H, T, V)
    g: np.ndarray  # (B, H, T, Kg)
    beta: np.ndarray | None  # (B, H, T); None: no delta rule (simple GLA)
    scale: Any  # compute-dtype scalar


def fold(x: np.ndarray, gate_width: int) -> np.ndarray:
    """A gradient per key channel (..., K) summed to the gate's width: (..., 1) for a scalar gate
    (it scales every channel), unchanged for KDA's (..., K)."""
    return np.sum(x, axis=-1, keepdims=True) if gate_width == 1 else x


class Chunk(NamedTuple):
    """One chunk's inputs, gates and pairwise products: what both chunk passes read."""

    q: np.ndarray  # (B, H, L, K), scaled
    k: np.ndarray  # (B, H, L, K)
    v: np.ndarray  # (B, H, L, V)
    gam: np.ndarray  # (B, H, L, Kg): Gamma_t = g_1 + ... + g_t, the log decay since the start
    e_q: np.ndarray  # (B, H, L, Kg): exp(Gamma_t), the decay from the chunk's start to t
    e_k: np.ndarray  # (B, H, L, Kg): exp(Gamma_L - Gamma_t), the decay from t to the end
    e_end: np.ndarray  # (B, H, Kg, 1): exp(Gamma_L)
    decay_qk: np.ndarray  # (B, H, L, L, Kg): exp(Gamma_t - Gamma_s) for s <= t, else 0
    aqk: np.ndarray  # (B, H, L, L): q_t^T diag(decay) k_s, s <= t
    delta: Delta | None  # the delta rule's part; None for simple GLA


class Delta(NamedTuple):
    """The delta rule's part of a chunk: its WY representation."""

    beta: np.ndarray  # (B, H, L)
    decay_kk: np.ndarray  # (B, H, L, L, Kg): exp(Gamma_t - Gamma_s) for s < t, else 0
    akk: np.ndarray  # (B, H, L, L): k_t^T diag(decay) k_s, s < t
    tri: np.ndarray  # (B, H, L, L): I + diag(beta) akk, unit lower triangular
    w: np.ndarray  # (B, H, L, K): tri^-1 diag(beta) (e_q * k), the WY representation's W
    u0: np.ndarray  # (B, H, L, V): tri^-1 diag(beta) v, its U


def _chunk(x: Heads, c0: int, c1: int) -> Chunk:
    """Everything of tokens c0:c1 that does not depend on the state entering the chunk."""
    q, k, v = x.scale * x.q[:, :, c0:c1], x.k[:, :, c0:c1], x.v[:, :, c0:c1]
    gam = np.cumsum(x.g[:, :, c0:c1], axis=2)  # (B, H, L, Kg)
    decay_qk = _decay(gam, strict=False)
    e_q = np.exp(gam)
    delta = None
    if x.beta is not None:
        beta = x.beta[:, :, c0:c1]
        decay_kk = _decay(gam, strict=True)
        akk = _pairwise(k, k, decay_kk)
        tri = np.eye(c1 - c0, dtype=akk.dtype) + beta[..., None] * akk
        # the UT transform: one triangular solve for W and U together, independent of the state
        wu = _solve_unit_lower(tri, beta[..., None] * np.concatenate([e_q * k, v], axis=-1))
        width = k.shape[-1]
        w, u0 = np.ascontiguousarray(wu[..., :width]), np.ascontiguousarray(wu[..., width:])
        delta = Delta(beta, decay_kk, akk, tri, w, u0)
    return Chunk(
        q, k, v, gam, e_q, np.exp(gam[:, :, -1:] - gam), np.exp(gam[:, :, -1])[..., None],
        decay_qk, _pairwise(q, k, decay_qk), delta,
    )  # fmt: skip


def _t(x: np.ndarray) -> np.ndarray:
    """x transposed in its last two axes, as a contiguous array: NumPy's stacked matmul takes
    its slow loop, not BLAS, for a transposed view (measured 100x slower at (16, 64, 128))."""
    return np.ascontiguousarray(np.swapaxes(x, -1, -2))


def _solve_unit_lower(tri: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """X with tri X = rhs, tri (..., L, L) unit lower triangular: forward substitution, row i
    from the rows before it. No pivoting, so no LU factorization's row swaps: the diagonal is
    exactly 1 whatever the keys, and a general solve's pivots can vanish in float32 where this
    never divides (and costs L^2 R, not L^3)."""
    out = np.empty(np.broadcast_shapes(tri.shape[:-1], rhs.shape[:-1]) + rhs.shape[-1:], rhs.dtype)
    for i in range(tri.shape[-1]):
        out[..., i, :] = rhs[..., i, :] - (tri[..., i : i + 1, :i] @ out[..., :i, :])[..., 0, :]
    return out


def _solve_unit_upper(tri: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """X with tri X = rhs, tri (..., L, L) unit upper triangular: back substitution."""
    out = np.empty(np.broadcast_shapes(tri.shape[:-1], rhs.shape[:-1]) + rhs.shape[-1:], rhs.dtype)
    size = tri.shape[-1]
    for i in reversed(range(size)):
        later = (tri[..., i : i + 1, i + 1 :] @ out[..., i + 1 :, :])[..., 0, :]
        out[..., i, :] = rhs[..., i, :] - later
    return out


def _decay(gam: np.ndarray, *, strict: bool) -> np.ndarray:
    """(B, H, L, L, Kg): exp(Gamma_t - Gamma_s) for s < t (s <= t unless strict), exactly 0
    elsewhere; each entry is formed from the difference, so no exp(+-Gamma) alone can overflow."""
    seen = np.tri(gam.shape[2], k=-1 if strict else 0, dtype=bool)[:, :, None]
    return np.exp(np.where(seen, gam[:, :, :, None, :] - gam[:, :, None, :, :], -np.inf))


def _pairwise(x: np.ndarray, y: np.ndarray, decay: np.ndarray) -> np.ndarray:
    """A_ts = sum_c x_tc y_sc decay_tsc: (B, H, L, K), (B, H, L, K), (B, H, L, L, Kg) ->
    (B, H, L, L)."""
    if decay.shape[-1] == 1:
        return (x @ _t(y)) * decay[..., 0]
    return np.einsum("bhtsc,bhsc->bhts", x[:, :, :, None, :] * decay, y)


def _pairwise_backward(
    da: np.ndarray, x: np.ndarray, y: np.ndarray, decay: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx, dy and dGamma (B, H, L, Kg) of ``_pairwise``, decay_tsc = exp(Gamma_tc - Gamma_sc):
    dx_t = sum_s da_ts (decay_ts * y_s), dy_s = sum_t da_ts (decay_ts * x_t), and with
    P_tsc = da_ts x_tc y_sc decay_tsc, dGamma_t = sum_s P_ts. - sum_s P_st. The diagonal's decay
    is exp(0) = 1 whatever Gamma: its P is left out, exactly, rather than added to dGamma_t and
    taken away again (with a = exp(-20) that pair of O(1) terms would bury dg's 1e-9 in their
    rounding)."""
    strict = np.tri(da.shape[-1], k=-1, dtype=bool)
    if decay.shape[-1] == 1:
        w = da * decay[..., 0]
        p = np.where(strict, w * (x @ _t(y)), 0.0)
        dgam = (np.sum(p, axis=-1) - np.sum(p, axis=-2))[..., None]
        return w @ y, _t(w) @ x, dgam
    w = da[..., None] * decay  # (B, H, L, L, K)
    p = np.where(strict[..., None], w * x[:, :, :, None, :] * y[:, :, None, :, :], 0.0)
    dx = np.einsum("bhtsc,bhsc->bhtc", w, y)
    dy = np.einsum("bhtsc,bhtc->bhsc", w, x)
    return dx, dy, np.sum(p, axis=3) - np.sum(p, axis=2)


def chunk_forward(x: Heads, c0: int, c1: int, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens c0:c1 at once from the state s entering the chunk (derivation, "The chunk form"):

        U   = W0 - W S,  (W, W0) = T^-1 diag(beta) (e_q * K, V),  T = I + diag(beta) Akk
        O   = (e_q * Q) S + Aqk U
        S_L = e_end * S + (e_k * K)^T U

    with U = V for simple GLA. Returns the outputs (B, H, L, V) and S_L."""
    c = _chunk(x, c0, c1)
    u = _writes(c, s)  # (B, H, L, V): the writes u_t of the recurrence
    out = (c.e_q * c.q) @ s + c.aqk @ u
    return out, c.e_end * s + _t(c.e_k * c.k) @ u


def _writes(c: Chunk, s: np.ndarray) -> np.ndarray:
    """(B, H, L, V): the writes u_t of the recurrence from the state s entering the chunk,
    U = W0 - W S (V itself for simple GLA)."""
    return c.v if c.delta is None else c.delta.u0 - c.delta.w @ s


def chunk_backward(
    x: Heads,
    c0: int,
    c1: int,
    s: np.ndarray,
    dout: np.ndarray,
    ds: np.ndarray,
    grads: dict[str, np.ndarray],
) -> np.ndarray:
    """``chunk_forward``'s lines differentiated in reverse: ds is dL/dS_L on entry, dL/dS (the
    state entering the chunk) on return; the chunk's gradients go into ``grads``."""
    c = _chunk(x, c0, c1)
    u = _writes(c, s)
    do = dout[:, :, c0:c1]
    gate_width = c.gam.shape[-1]
    kd = c.e_k * c.k  # (B, H, L, K)
    # forward: S_L = e_end * S + kd^T U
    du = kd @ ds
    dkd = u @ _t(ds)
    ds_in = c.e_end * ds
    dgam_end = fold(np.sum(ds * s, axis=-1), gate_width) * c.e_end[..., 0]  # (B, H, Kg)
    # forward: O = (e_q * Q) S + Aqk U
    du = du + _t(c.aqk) @ do
    dqg = do @ _t(s)
    ds_in = ds_in + _t(c.e_q * c.q) @ do
    dq, dk, dgam = _pairwise_backward(do @ _t(u), c.q, c.k, c.decay_qk)
    dq = dq + c.e_q * dqg  # forward: e_q = exp(Gamma), e_k = exp(Gamma_L - Gamma)
    dgam = dgam + fold(c.e_q * c.q * dqg, gate_width)
    dk = dk + c.e_k * dkd
    # e_k,t = exp(g_{t+1} + ... + g_L): its gradient reaches g_r for r > t only, summed forward
    # here rather than added at L and taken away at t (the same cancellation as the diagonal's)
    dk_gam = fold(kd * dkd, gate_width)
    dg_after = np.concatenate(
        [np.zeros_like(dk_gam[:, :, :1]), np.cumsum(dk_gam, axis=2)[:, :, :-1]], axis=2
    )
    if c.delta is None:
        dv = du  # simple GLA: U = V
    else:
        d = c.delta
        # forward: U = W0 - W S
        ds_in = ds_in - _t(d.w) @ du
        dw = -du @ _t(s)
        # forward: T (W, W0) = diag(beta) (e_q * K, V), T = I + diag(beta) Akk
        width = c.k.shape[-1]
        drhs = _solve_unit_upper(_t(d.tri), np.concatenate([dw, du], axis=-1))
        dwr, dvr = drhs[..., :width], drhs[..., width:]
        dtri = -(dwr @ _t(d.w) + dvr @ _t(d.u0))
        kg = c.e_q * c.k
        grads["beta"][:, :, c0:c1] = (
            np.sum(dwr * kg, axis=-1) + np.sum(dvr * c.v, axis=-1) + np.sum(dtri * d.akk, axis=-1)
        )
        dv = d.beta[..., None] * dvr
        dkg = d.beta[..., None] * dwr
        dk = dk + c.e_q * dkg
        dgam = dgam + fold(kg * dkg, gate_width)
        dk_t, dk_s, dgam_kk = _pairwise_backward(d.beta[..., None] * dtri, c.k, c.k, d.decay_kk)
        dk = dk + dk_t + dk_s
        dgam = dgam + dgam_kk
    dgam[:, :, -1] += dgam_end
    grads["q"][:, :, c0:c1] = x.scale * dq  # forward: Q scaled
    grads["k"][:, :, c0:c1] = dk
    grads["v"][:, :, c0:c1] = dv
    # forward: Gamma_t = g_1 + ... + g_t, so dg_s = dGamma_s + ... + dGamma_L
    grads["g"][:, :, c0:c1] = np.cumsum(dgam[:, :, ::-1], axis=2)[:, :, ::-1] + dg_after
    return ds_in
