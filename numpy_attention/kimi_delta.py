"""Kimi Delta Attention (KDA), Kimi Linear's linear-attention layer: transformers'
``KimiLinearDeltaAttention`` with its ``KimiLinearForgetGate`` and ``KimiLinearRMSNormGated``,
parameters named as there, so a layer's state dict loads without renaming.

Shape legend: B batch, T tokens of this call, C model width (``hidden_size``), H heads, K head
width (``linear_head_dim``; keys and values alike, V = K), W the short convolution's width.

The chain, as transformers 5 computes it:

    x = x * keep                                                 padded tokens zeroed
    q, k, v = q_proj(x), k_proj(x), v_proj(x)                    (B, T, C) -> (B, T, H*K) each
    q, k, v = split(silu(causal depthwise conv([q, k, v])))        conv1d.weight (3HK, 1, W)
    q, k = q / sqrt(|q|^2 + 1e-6), k / sqrt(|k|^2 + 1e-6)          per head, (B, T, H, K)
    z = f_b_proj(f_a_proj(x)) + dt_bias                            (B, T, H, K): C -> K -> H*K
    g = -exp(A_log) * softplus(z)      softplus(z) = z past 20       the log gate per key channel
    beta = sigmoid(b_proj(x))                                      (B, T, H)
    o = kda(q, k, v, g, beta; scale K^-0.5)                        (B, T, H, K), linear_attention
    y = rmsnorm(o; o_norm.weight) * sigmoid(g_b_proj(g_a_proj(x))) per head, gate (B, T, H, K)
    out = o_proj(merge_heads(y))                                   (B, T, H*K) -> (B, T, C)

The L2 norm's eps (1e-6) is added under the root, ``x / sqrt(sum x^2 + eps)``, as transformers'
``l2norm`` and fla's kernels do (not ``F.normalize``'s max(|x|, eps)); the scale is K^-0.5, the
core's default, as both of transformers' fallbacks take it. The softplus is transformers':
``where(z > 20, z, log(1 + exp(z)))`` (``log1p`` here). Whether the shortcut matters in float64:
log(1 + exp(z)) - z = log1p(exp(-z)) is 2.1e-9 at z = 20, and softplus' slope there 1 - 2.1e-9
against the shortcut's 1: a gradient through a z just past 20 moves by ~2e-9 relative, past the
float64 tolerance (1e-10) where such a gate matters (measured: 9.6e-10 on f_b_proj's gradient);
so the layer takes the shortcut as transformers does, in both passes.

The backward walks the chain in reverse through the parts' own backwards (Linear, the short
convolution, RMSNorm, the output gate, the core's ``kda_backward``) and this module's three
small pairs (L2 norm, forget gate, sigmoid); x feeds six projections, and dx is their sum.

Decoding: a ``LinearStateCache`` (contiguous) or a ``PagedLinearStateCache`` (a pool of state
rows, one per sequence by its slot), from linear_cache.py, holds the convolution's last W-1
inputs (B, 3HK, W-1) and the state S (B, H, K, K); a call reads both, runs the convolution from
that state and the core from that S, and writes back the new ones: prefill and token by token
decode equal the full forward. A call with a cache may still be differentiated, the states read
treated as constants.

Derivation: docs/derivations/kimi-delta-layer.md (the chain and each backward line),
docs/derivations/linear-attention.md (the core), docs/derivations/rmsnorm.md,
docs/derivations/output-gate.md, docs/derivations/short-conv.md, docs/derivations/linear.md.
Tests: tests/numpy_attention/test_kimi_delta.py; against transformers in
tests/parity/test_hf_kimi_delta.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import validation
from .gate import GateCtx, _sigmoid, output_gate_backward, output_gate_forward
from .layers import Linear
from .linear_attention import FORMS, LinearCtx, kda_backward, kda_forward
from .linear_cache import LinearStateCache, PagedLinearStateCache, padding_keep
from .module import Module
from .norms import L2NormCtx, RMSNorm, l2norm_backward, l2norm_forward
from .short_conv import ShortConv

__all__ = ["KimiDeltaAttention", "KimiForgetGate"]

SOFTPLUS_THRESHOLD = 20.0  # softplus(z) = z past it (KimiLinearForgetGate)


# -- the forget gate ----------------------------------------------------------------------------


class ForgetGateCtx(NamedTuple):
    z: np.ndarray  # f_b_proj(f_a_proj(x)) + dt_bias, (B, T, H, K)
    g: np.ndarray  # the log gate, (B, T, H, K)
    decay: np.ndarray  # exp(A_log), (1, 1, H, 1)


def forget_gate_forward(
    pre: np.ndarray, dt_bias: np.ndarray, a_log: np.ndarray
) -> tuple[np.ndarray, ForgetGateCtx]:
    """g = -exp(A_log) * softplus(pre + dt_bias), softplus(z) = z past 20 (transformers').

    Args:
        pre: (B, T, H, K), f_b_proj(f_a_proj(x)) split into heads.
        dt_bias: (H*K,).
        a_log: (1, 1, H, 1).

    Returns:
        g (B, T, H, K) and the backward's ctx.
    """
    z = pre + dt_bias.reshape(pre.shape[2:])  # (B, T, H, K)
    softplus = np.where(
        z > SOFTPLUS_THRESHOLD, z, np.log1p(np.exp(np.minimum(z, SOFTPLUS_THRESHOLD)))
    )
    decay = np.exp(a_log)  # (1, 1, H, 1)
    g = -decay * softplus
    return g, ForgetGateCtx(z, g, decay)


def forget_gate_backward(
    dg: np.ndarray, ctx: ForgetGateCtx
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dA_log = sum(dg * g) over B, T, K (dg/dA_log = -exp(A_log) softplus = g);
    dz = -exp(A_log) dg * softplus'(z), softplus' = sigmoid(z), 1 past 20;
    dpre = dz, ddt_bias = dz summed over B and T.

    Returns:
        dpre (B, T, H, K), ddt_bias (H*K,), dA_log (1, 1, H, 1).
    """
    z, g, decay = ctx
    da_log = np.sum(dg * g, axis=(0, 1, 3), keepdims=True)  # forward: g = -exp(A_log) sp
    slope = np.where(z > SOFTPLUS_THRESHOLD, 1.0, _sigmoid(z))  # forward: sp = softplus(z)
    dz = -decay * dg * slope
    return dz, dz.sum(axis=(0, 1)).reshape(-1), da_log  # forward: z = pre + dt_bias


class KimiForgetGate(Module):
    """``KimiLinearForgetGate``: parameters ``f_a_proj`` = Linear(C, K, no bias), ``f_b_proj`` =
    Linear(K, H*K, no bias), ``dt_bias`` (H*K,), ``A_log`` (1, 1, H, 1); x (B, T, C) -> g
    (B, T, H, K) (``forget_gate_forward``). Initialised as transformers does: A = exp(A_log)
    uniform in [1, 16], dt_bias the inverse softplus of a dt log-uniform in [1e-3, 1e-1]."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        *,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        rng = np.random.default_rng(rng)
        self.num_heads, self.head_dim = num_heads, head_dim
        self.f_a_proj = Linear(hidden_size, head_dim, bias=False, rng=rng)
        self.f_b_proj = Linear(head_dim, num_heads * head_dim, bias=False, rng=rng)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), num_heads * head_dim))
        self.register_parameter("dt_bias", (dt + np.log(-np.expm1(-dt))).astype(np.float32))
        a_log = np.log(rng.uniform(1.0, 16.0, (1, 1, num_heads, 1)))
        self.register_parameter("A_log", a_log.astype(np.float32))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (B, T, C) -> g (B, T, H, K)."""
        pre = self.f_b_proj(self.f_a_proj(x))  # (B, T, C) -> (B, T, K) -> (B, T, H*K)
        pre = pre.reshape(pre.shape[:2] + (self.num_heads, self.head_dim))  # (B, T, H, K)
        g, ctx = forget_gate_forward(pre, self.dt_bias, self.A_log)
        self._save_ctx(ctx, g)
        return g

    def backward(self, dg: np.ndarray) -> np.ndarray:
        """dg (B, T, H, K) -> dx (B, T, C); adds every parameter's gradient."""
        dg, ctx = self._pop_ctx(dg)
        dpre, ddt_bias, da_log = forget_gate_backward(dg, ctx)
        self._accumulate("dt_bias", ddt_bias)
        self._accumulate("A_log", da_log)
        dpre = dpre.reshape(dpre.shape[:2] + (-1,))  # (B, T, H, K) -> (B, T, H*K)
        return self.f_a_proj.backward(self.f_b_proj.backward(dpre))


# -- the layer ----------------------------------------------------------------------------------


class _KimiDeltaCtx(NamedTuple):
    keep: np.ndarray | None  # (B, T, 1), 1 on real tokens, 0 on padding; None: no padding
    q_norm: L2NormCtx
    k_norm: L2NormCtx
    beta: np.ndarray  # sigmoid(b_proj(x)), (B, T, H)
    core: LinearCtx
    gate: GateCtx


class KimiDeltaAttention(Module):
    """Kimi Linear's KDA layer (module docstring for the chain).

    Parameters, named as transformers names them: ``q_proj``, ``k_proj``, ``v_proj`` =
    Linear(C, H*K, no bias); ``conv1d`` = ShortConv over 3HK channels of width W (``weight``
    (3HK, 1, W), no bias); ``forget_gate`` (``KimiForgetGate``: ``f_a_proj``, ``f_b_proj``,
    ``dt_bias``, ``A_log``); ``b_proj`` = Linear(C, H, no bias); ``g_a_proj`` = Linear(C, K),
    ``g_b_proj`` = Linear(K, H*K), no biases; ``o_norm`` = RMSNorm(K, norm_eps); ``o_proj`` =
    Linear(H*K, C, no bias).

    Args:
        hidden_size: C.
        num_heads: H (``linear_num_heads``).
        head_dim: K (``linear_head_dim``), the key and value width.
        conv_kernel_size: W (``linear_conv_kernel_dim``).
        norm_eps: o_norm's eps (``rms_norm_eps``).
        form: the core's form, ``"chunk"`` or ``"recurrent"`` (equal up to rounding).
        chunk_size: the core's chunk length.
        rng: generator or seed for the initial weights.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        *,
        conv_kernel_size: int = 4,
        norm_eps: float = 1e-5,
        form: str = "chunk",
        chunk_size: int = 64,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        self.head_dim = validation.positive_int("head_dim", head_dim)
        self.conv_kernel_size = validation.positive_int("conv_kernel_size", conv_kernel_size)
        norm_eps = validation.finite_real("norm_eps", norm_eps)
        if norm_eps <= 0:
            raise ValueError(f"norm_eps must be > 0, got {norm_eps}")
        if form not in FORMS:
            raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
        self.form = str(form)
        self.chunk_size = validation.positive_int("chunk_size", chunk_size)
        rng = np.random.default_rng(rng)
        c, h, k = self.hidden_size, self.num_heads, self.head_dim
        self.q_proj = Linear(c, h * k, bias=False, rng=rng)
        self.k_proj = Linear(c, h * k, bias=False, rng=rng)
        self.v_proj = Linear(c, h * k, bias=False, rng=rng)
        self.conv1d = ShortConv(3 * h * k, self.conv_kernel_size, rng=rng)
        self.forget_gate = KimiForgetGate(c, h, k, rng=rng)
        self.b_proj = Linear(c, h, bias=False, rng=rng)
        self.g_a_proj = Linear(c, k, bias=False, rng=rng)
        self.g_b_proj = Linear(k, h * k, bias=False, rng=rng)
        self.o_norm = RMSNorm(k, norm_eps)
        self.o_proj = Linear(h * k, c, bias=False, rng=rng)

    @property
    def conv_dim(self) -> int:
        """The short convolution's channels, 3HK: [q, k, v]."""
        return 3 * self.num_heads * self.head_dim

    def forward(
        self,
        x: np.ndarray,
        *,
        key_padding_mask: np.ndarray | None = None,
        cache: LinearStateCache | PagedLinearStateCache | None = None,
    ) -> np.ndarray:
        """The layer over x's tokens, continuing the cache's sequence when one is given.

        Args:
            x: (B, T, C).
            key_padding_mask: bool (B, M), True = padding: M = T, or with a cache
                ``cache.length + T`` (the last T columns are x's tokens); padded tokens' inputs
                are zeroed, as transformers' ``apply_mask_to_padding_states`` does (a left-padded
                sequence's state then stays 0 until its first real token).
            cache: a ``LinearStateCache`` or ``PagedLinearStateCache`` of this layer's B, H,
                K and convolution (3HK channels, width W): its states are read as the
                convolution's and the core's initial ones, and this call's final ones written
                back (its length grows by T).

        Returns:
            (B, T, C).
        """
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.dtype)
        batch, tokens, _ = x.shape
        h, k = self.num_heads, self.head_dim
        conv0, s0, start = None, None, 0
        if cache is not None:
            if not isinstance(cache, (LinearStateCache, PagedLinearStateCache)):
                raise TypeError(
                    "cache must be a LinearStateCache or a PagedLinearStateCache, got "
                    f"{type(cache).__name__}"
                )
            cache.check(batch, h, k, k, self.conv_dim, self.conv_kernel_size)
            start = cache.length
            conv0, s0 = cache.read()
            s0 = s0.astype(x.dtype, copy=False)
        keep = padding_keep(
            key_padding_mask, batch, start + tokens, tokens, x.dtype, cache is not None
        )
        if keep is not None:
            x = x * keep  # padded tokens write nothing, read nothing
        heads = (batch, tokens, h, k)
        mixed = np.concatenate([self.q_proj(x), self.k_proj(x), self.v_proj(x)], axis=-1)
        mixed, conv1 = self.conv1d(mixed, conv_state=conv0)  # (B, T, 3HK), causal, SiLU
        q, kk, v = (part.reshape(heads) for part in np.split(mixed, 3, axis=-1))  # (B, T, H, K)
        q, q_norm = l2norm_forward(q)
        kk, k_norm = l2norm_forward(kk)
        g = self.forget_gate(x)  # (B, T, H, K), the log gate per key channel
        beta = _sigmoid(self.b_proj(x))  # (B, T, H)
        core = kda_forward(
            q, kk, v, g, beta, initial_state=s0, output_final_state=cache is not None,
            form=self.form, chunk_size=self.chunk_size,
        )  # fmt: skip
        if cache is not None:
            cache.write(conv1, core.final_state, tokens)
        normed = self.o_norm(core.out)  # (B, T, H, K), per head
        gate_pre = self.g_b_proj(self.g_a_proj(x)).reshape(heads)  # C -> K -> H*K
        y, gate = output_gate_forward(normed, gate_pre, "sigmoid")  # per element
        out = self.o_proj(y.reshape(batch, tokens, h * k))  # (B, T, H*K) -> (B, T, C)
        ctx = None
        if core.ctx is not None:
            ctx = _KimiDeltaCtx(keep, q_norm, k_norm, beta, core.ctx, gate)
        self._save_ctx(ctx, out)
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Gradient of x; adds the gradients of every parameter.

        dY = o_proj^T(dout) per head;  dnormed, dZg = output_gate_backward(dY) (sigmoid);
        dx_gate = g_a_proj^T(g_b_proj^T(dZg));  dO = o_norm^T(dnormed);
        dq, dk, dv, dg, dbeta = kda_backward(dO);  dx_beta = b_proj^T(dbeta beta (1 - beta));
        dx_g = forget_gate^T(dg);  dq, dk through the L2 norm: (d - y sum(d * y)) / n;
        d[q, k, v] = conv1d^T([dq, dk, dv]);  dx = q_proj^T + k_proj^T + v_proj^T + dx_beta +
        dx_g + dx_gate, times keep (0 on padding). Derivation: docs/derivations/kimi-delta-layer.md.

        Args:
            dout: (B, T, C) gradient of the last forward's output.

        Returns:
            dx (B, T, C).
        """
        dout, ctx = self._pop_ctx(dout)
        if ctx is None:
            raise RuntimeError("KimiDeltaAttention.backward needs a forward run outside no_grad()")
        batch, tokens, _ = dout.shape
        heads = (batch, tokens, self.num_heads, self.head_dim)
        dy = self.o_proj.backward(dout).reshape(heads)  # forward: out = o_proj(merge(y))
        dnormed, dgate_pre = output_gate_backward(dy, ctx.gate)  # forward: y = n * sigmoid(zg)
        flat = dout.shape[:2] + (-1,)  # (B, T, H, K) -> (B, T, H*K)
        dx_gate = self.g_a_proj.backward(self.g_b_proj.backward(dgate_pre.reshape(flat)))
        do = self.o_norm.backward(dnormed)  # forward: normed = rmsnorm(o)
        grads = kda_backward(do, ctx.core)  # forward: o = kda(q, k, v, g, beta)
        dbeta_pre = grads.dbeta * ctx.beta * (1 - ctx.beta)  # forward: beta = sigmoid(b_proj(x))
        dx_beta = self.b_proj.backward(dbeta_pre)
        dx_g = self.forget_gate.backward(grads.dg)  # forward: g = forget_gate(x)
        dq = l2norm_backward(grads.dq, ctx.q_norm)  # forward: q = q / sqrt(|q|^2 + eps)
        dk = l2norm_backward(grads.dk, ctx.k_norm)
        dmixed = np.concatenate([dq.reshape(flat), dk.reshape(flat), grads.dv.reshape(flat)], -1)
        dmixed = self.conv1d.backward(dmixed)  # forward: mixed = silu(conv(mixed))
        dq_in, dk_in, dv_in = np.split(dmixed, 3, axis=-1)  # forward: mixed = [q, k, v](x)
        dx = self.q_proj.backward(dq_in) + self.k_proj.backward(dk_in) + self.v_proj.backward(dv_in)
        dx = dx + dx_beta + dx_g + dx_gate  # x feeds all six projections
        return dx if ctx.keep is None else dx * ctx.keep  # forward: x = x * keep
