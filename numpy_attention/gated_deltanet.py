"""Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5 (transformers'
``Qwen3NextGatedDeltaNet``, ``Qwen3_5GatedDeltaNet``): projections, a causal short convolution,
L2-normed queries and keys, the gated delta rule, a gated RMSNorm per value head, the output
projection. Parameters are named like Hugging Face's, so the module's state dict loads as is.

Shape legend: B batch, T tokens of this call, C model width (``hidden_size``), Hk key heads
(``linear_num_key_heads``), Hv value heads (a multiple of Hk, r = Hv / Hk), Dk key head width,
Dv value head width, Kd = Hk Dk, Vd = Hv Dv, F = 2 Kd + Vd the convolved width, W the
convolution's width.

The chain, as transformers 5 computes it:

    x = x * keep                                   padded tokens zeroed (key_padding_mask)
    fused:  [q | k | v | z] = in_proj_qkvz(x), [b | a] = in_proj_ba(x)   rows grouped per key
            head (below), regrouped to heads in order
    split:  [q | k | v] = in_proj_qkv(x), z = in_proj_z(x), b = in_proj_b(x), a = in_proj_a(x)
    [q | k | v] = silu(causal depthwise conv1d([q | k | v]))               (B, T, F)
    q, k = l2norm(q), l2norm(k) per head, y = x / sqrt(sum(x^2) + 1e-6)     (B, T, Hk, Dk)
    q, k repeated r times along the heads: key head h serves value heads h r .. h r + r - 1
    beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)           (B, T, Hv)
    o = gated_delta_rule(q, k, v, g, beta, scale = Dk^-0.5)               (B, T, Hv, Dv)
    y = rmsnorm(o) * silu(z)   per value head (Qwen3-Next's RMSNormGated: norm, then gate)
    out = out_proj(y)                                                     (B, T, C)

Qwen3-Next fuses the projections (``projections="fused"``): ``in_proj_qkvz`` (2 Kd + 2 Vd, C)
holds, for each key head in turn, that head's q (Dk rows), k (Dk), its r value heads' v (r Dv)
and z (r Dv); ``in_proj_ba`` (2 Hv, C) holds per key head its r b's then its r a's
(``fix_query_key_value_ordering``). The layer gathers those rows into [q heads; k heads; v heads;
z heads] and [b; a] with one fixed permutation and scatters the gradient back with it. Qwen3.5
(dense and MoE) has four projections in head order (``projections="split"``).

The convolution (``conv1d.weight`` (F, 1, W), no bias) is ``short_conv.ShortConv``; the norm's
weight is ``norm.weight`` (Dv,), one RMSNorm shared by every value head (``norms.RMSNorm``), its
gate ``gate.output_gate_forward(..., "silu")``; ``A_log`` and ``dt_bias`` are (Hv,).

Decoding, a ``LinearStateCache`` or ``PagedLinearStateCache`` (linear_cache.py) holds per
sequence the convolution's last W - 1 inputs (B, F, W - 1) and the recurrent state
(B, Hv, Dk, Dv): the layer reads both, runs the chain from them, and writes both back. A cached
call can be differentiated too (the states read are constants).

The backward walks the chain in reverse through the parts' backwards (Linear, ShortConv,
RMSNorm, the gate, the core's); the L2 norm's and the gates' lines are here:
dx = (dy - y sum(dy y)) / sqrt(sum(x^2) + eps); db = dbeta beta (1 - beta);
dA_log = sum(dg g); da = ddt_bias = -dg exp(A_log) sigmoid(a + dt_bias).

Derivation: docs/derivations/gated-deltanet-layer.md (the layer's chain, each backward line),
docs/derivations/linear-attention.md (the core).
Tests: tests/numpy_attention/test_gated_deltanet.py; against transformers in
tests/parity/test_hf_gated_deltanet.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import validation
from .gate import GateCtx, _sigmoid, output_gate_backward, output_gate_forward
from .layers import Linear
from .linear_attention import FORMS, LinearCtx, gated_delta_rule_backward, gated_delta_rule_forward
from .linear_cache import LinearStateCache, PagedLinearStateCache, padding_keep
from .module import Module
from .norms import L2NormCtx, RMSNorm, l2norm_backward, l2norm_forward
from .short_conv import ShortConv

__all__ = ["GatedDeltaNet", "PROJECTIONS"]

PROJECTIONS = ("fused", "split")


# -- the layer -----------------------------------------------------------------------------------


class _GatedDeltaNetCtx(NamedTuple):
    keep: np.ndarray | None  # (B, T, 1), 1 on real tokens, 0 on padding; None: no padding
    q_norm: L2NormCtx  # (B, T, Hk, Dk)
    k_norm: L2NormCtx
    beta: np.ndarray  # (B, T, Hv)
    g: np.ndarray  # (B, T, Hv)
    pre: np.ndarray  # a + dt_bias, (B, T, Hv)
    core: LinearCtx
    gate: GateCtx  # y = rmsnorm(o) * silu(z), (B, T, Vd)


class GatedDeltaNet(Module):
    """Qwen3-Next's and Qwen3.5's gated DeltaNet layer (module docstring for the chain).

    Parameters, created in this order: ``in_proj_qkvz`` = Linear(C, 2 Kd + 2 Vd) and
    ``in_proj_ba`` = Linear(C, 2 Hv) (``"fused"``), or ``in_proj_qkv`` = Linear(C, F),
    ``in_proj_z`` = Linear(C, Vd), ``in_proj_b`` and ``in_proj_a`` = Linear(C, Hv)
    (``"split"``), all without bias; ``conv1d`` = ShortConv (``conv1d.weight`` (F, 1, W));
    ``dt_bias`` (Hv,) at 1, ``A_log`` (Hv,) at log of uniform [1, 16]; ``norm`` = RMSNorm(Dv);
    ``out_proj`` = Linear(Vd, C, no bias). float32 until ``astype``.

    Args:
        hidden_size: C.
        num_k_heads: Hk, the query/key heads (``linear_num_key_heads``).
        num_v_heads: Hv, the value heads (``linear_num_value_heads``), a multiple of Hk.
        head_k_dim: Dk (``linear_key_head_dim``).
        head_v_dim: Dv (``linear_value_head_dim``).
        conv_kernel_size: W (``linear_conv_kernel_dim``), >= 2.
        projections: ``"fused"`` (Qwen3-Next's grouped ``in_proj_qkvz``, ``in_proj_ba``) or
            ``"split"`` (Qwen3.5's ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
            ``in_proj_a``).
        norm_eps: the gated RMSNorm's eps (``rms_norm_eps``).
        form: the core's form, ``"chunk"`` or ``"recurrent"`` (equal up to rounding).
        chunk_size: the core's chunk length.
        rng: generator or seed for the initial weights.
    """

    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        *,
        conv_kernel_size: int = 4,
        projections: str = "fused",
        norm_eps: float = 1e-6,
        form: str = "chunk",
        chunk_size: int = 64,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.num_k_heads = validation.positive_int("num_k_heads", num_k_heads)
        self.num_v_heads = validation.positive_int("num_v_heads", num_v_heads)
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"num_v_heads ({num_v_heads}) must be a multiple of num_k_heads ({num_k_heads}): "
                "each key head serves num_v_heads // num_k_heads value heads"
            )
        self.head_k_dim = validation.positive_int("head_k_dim", head_k_dim)
        self.head_v_dim = validation.positive_int("head_v_dim", head_v_dim)
        self.conv_kernel_size = validation.positive_int("conv_kernel_size", conv_kernel_size)
        if self.conv_kernel_size < 2:
            raise ValueError(f"conv_kernel_size must be >= 2, got {conv_kernel_size}")
        if projections not in PROJECTIONS:
            raise ValueError(f"projections must be one of {list(PROJECTIONS)}, got {projections!r}")
        self.projections = str(projections)
        norm_eps = validation.finite_real("norm_eps", norm_eps)
        if form not in FORMS:
            raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
        self.form = str(form)
        self.chunk_size = validation.positive_int("chunk_size", chunk_size)
        self.rng = np.random.default_rng(rng)

        c, hv = self.hidden_size, self.num_v_heads
        key_dim, value_dim = self.key_dim, self.value_dim
        if self.projections == "fused":
            self.in_proj_qkvz = Linear(c, 2 * key_dim + 2 * value_dim, bias=False, rng=self.rng)
            self.in_proj_ba = Linear(c, 2 * hv, bias=False, rng=self.rng)
        else:
            self.in_proj_qkv = Linear(c, self.conv_dim, bias=False, rng=self.rng)
            self.in_proj_z = Linear(c, value_dim, bias=False, rng=self.rng)
            self.in_proj_b = Linear(c, hv, bias=False, rng=self.rng)
            self.in_proj_a = Linear(c, hv, bias=False, rng=self.rng)
        self.conv1d = ShortConv(self.conv_dim, self.conv_kernel_size, rng=self.rng)
        self.register_parameter("dt_bias", np.ones(hv, dtype=np.float32))
        a_log = np.log(self.rng.uniform(1.0, 16.0, hv))  # the decay rates exp(A_log)
        self.register_parameter("A_log", a_log.astype(np.float32))
        self.norm = RMSNorm(self.head_v_dim, norm_eps)
        self.out_proj = Linear(value_dim, c, bias=False, rng=self.rng)
        qkvz_order, ba_order = fused_orders(
            self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        )
        self._qkvz_order, self._ba_order = qkvz_order, ba_order

    @property
    def key_dim(self) -> int:
        """Kd = Hk Dk."""
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        """Vd = Hv Dv."""
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """F = 2 Kd + Vd, the width the convolution sees ([q | k | v])."""
        return 2 * self.key_dim + self.value_dim

    def forward(
        self,
        x: np.ndarray,
        *,
        key_padding_mask: np.ndarray | None = None,
        cache: LinearStateCache | PagedLinearStateCache | None = None,
    ) -> np.ndarray:
        """The layer over x's tokens, from the cache's states when one is given.

        Args:
            x: (B, T, C).
            key_padding_mask: bool (B, M), True = padding: M = T, or with a cache
                ``cache.length + T`` (the last T columns are x's tokens); padded tokens' inputs
                are zeroed, as transformers' ``apply_mask_to_padding_states`` does.
            cache: a ``LinearStateCache`` or ``PagedLinearStateCache`` of B sequences, Hv heads,
                Dk, Dv, F and W: read before, written after (its length grows by T).

        Returns:
            (B, T, C).
        """
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.dtype, "GatedDeltaNet")
        batch, tokens, _ = x.shape
        conv_state = state = None
        start = 0
        if cache is not None:
            if not isinstance(cache, (LinearStateCache, PagedLinearStateCache)):
                raise TypeError(
                    "cache must be a LinearStateCache or a PagedLinearStateCache, got "
                    f"{type(cache).__name__}"
                )
            cache.check(
                batch, self.num_v_heads, self.head_k_dim, self.head_v_dim, self.conv_dim,
                self.conv_kernel_size,
            )  # fmt: skip
            start = cache.length
            conv_state, state = cache.read()
            conv_state = None if conv_state is None else conv_state.astype(x.dtype)
        keep = padding_keep(
            key_padding_mask, batch, start + tokens, tokens, x.dtype, cache is not None
        )
        out, ctx, new_conv, final_state = self._chain(x, keep, conv_state, state, cache is not None)
        if cache is not None:
            cache.write(new_conv, final_state, tokens)
        self._save_ctx(ctx, out)
        return out

    def _chain(
        self,
        x: np.ndarray,
        keep: np.ndarray | None,
        conv_state: np.ndarray | None,
        state: np.ndarray | None,
        cached: bool,
    ) -> tuple[np.ndarray, _GatedDeltaNetCtx | None, np.ndarray, np.ndarray | None]:
        """The forward chain (module docstring); inputs already checked."""
        b, t, _ = x.shape
        hk, hv, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        if keep is not None:
            x = x * keep  # padded tokens write nothing, read nothing
        if self.projections == "fused":
            qkvz = self.in_proj_qkvz(x)[..., self._qkvz_order]  # rows regrouped: [q; k; v; z]
            ba = self.in_proj_ba(x)[..., self._ba_order]  # [b; a]
            mixed, z = qkvz[..., : self.conv_dim], qkvz[..., self.conv_dim :]
            b_pre, a = ba[..., :hv], ba[..., hv:]
        else:
            mixed, z = self.in_proj_qkv(x), self.in_proj_z(x)  # (B, T, F), (B, T, Vd)
            b_pre, a = self.in_proj_b(x), self.in_proj_a(x)  # (B, T, Hv) each
        conv, new_conv = self.conv1d(mixed, conv_state=conv_state)  # silu(conv), (B, T, F)
        kd = self.key_dim
        q, q_norm = l2norm_forward(conv[..., :kd].reshape(b, t, hk, dk))  # (B, T, Hk, Dk)
        k, k_norm = l2norm_forward(conv[..., kd : 2 * kd].reshape(b, t, hk, dk))
        v = conv[..., 2 * kd :].reshape(b, t, hv, dv)  # (B, T, Hv, Dv)
        r = hv // hk
        q, k = np.repeat(q, r, axis=2), np.repeat(k, r, axis=2)  # -> (B, T, Hv, Dk)
        beta = _sigmoid(b_pre)  # (B, T, Hv)
        pre = a + self.dt_bias
        g = -np.exp(self.A_log) * np.logaddexp(0, pre)  # log gate, < 0: -exp(A_log) softplus
        core = gated_delta_rule_forward(
            q, k, v, g, beta, scale=dk**-0.5, initial_state=state, output_final_state=cached,
            form=self.form, chunk_size=self.chunk_size,
        )  # fmt: skip
        normed = self.norm(core.out)  # (B, T, Hv, Dv), one weight for every head
        y, gate = output_gate_forward(normed.reshape(b, t, -1), z, "silu")  # (B, T, Vd)
        out = self.out_proj(y)  # -> (B, T, C)
        ctx = None
        if core.ctx is not None:
            ctx = _GatedDeltaNetCtx(keep, q_norm, k_norm, beta, g, pre, core.ctx, gate)
        return out, ctx, new_conv, core.final_state

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Gradient of x; adds the gradients of every parameter.

        dy = out_proj^T(dout); dnormed, dz = gate backward (silu); do = norm backward;
        dq, dk, dv, dg, dbeta = the core's backward; dq, dk summed over the r value heads each
        key head serves, then through the L2 norm; db = dbeta beta (1 - beta);
        dA_log = sum(dg g); da = ddt_bias = -dg exp(A_log) sigmoid(a + dt_bias);
        d[q|k|v] through the convolution; the projections' backwards (fused: the rows'
        permutation undone); dx = sum of them, times keep. Derivation:
        docs/derivations/gated-deltanet-layer.md.

        Args:
            dout: (B, T, C) gradient of the last forward's output.

        Returns:
            dx (B, T, C).
        """
        dout, ctx = self._pop_ctx(dout)
        b, t, _ = dout.shape
        hk, hv, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        dy = self.out_proj.backward(dout)  # (B, T, C) -> (B, T, Vd)
        dnormed, dz = output_gate_backward(dy, ctx.gate)  # forward: y = normed * silu(z)
        do = self.norm.backward(dnormed.reshape(b, t, hv, dv))  # forward: normed = norm(o)
        grads = gated_delta_rule_backward(do, ctx.core)  # the initial state is a constant
        db = grads.dbeta * ctx.beta * (1 - ctx.beta)  # forward: beta = sigmoid(b)
        # forward: g = -exp(A_log) softplus(a + dt_bias)
        self._accumulate("A_log", np.sum(grads.dg * ctx.g, axis=(0, 1)))
        da = -grads.dg * np.exp(self.A_log) * _sigmoid(ctx.pre)  # softplus' = sigmoid
        self._accumulate("dt_bias", np.sum(da, axis=(0, 1)))
        r = hv // hk  # forward: q, k repeated r times along the heads
        dq = grads.dq.reshape(b, t, hk, r, dk).sum(axis=3)  # (B, T, Hv, Dk) -> (B, T, Hk, Dk)
        dkey = grads.dk.reshape(b, t, hk, r, dk).sum(axis=3)
        dq, dkey = l2norm_backward(dq, ctx.q_norm), l2norm_backward(dkey, ctx.k_norm)
        dconv = np.concatenate(
            [dq.reshape(b, t, -1), dkey.reshape(b, t, -1), grads.dv.reshape(b, t, -1)], axis=-1
        )  # (B, T, F)
        dmixed = self.conv1d.backward(dconv)  # forward: conv = silu(conv1d(mixed))
        if self.projections == "fused":  # forward: the rows gathered by the orders
            dqkvz = np.empty(dmixed.shape[:2] + (self._qkvz_order.size,), dmixed.dtype)
            dqkvz[..., self._qkvz_order] = np.concatenate([dmixed, dz], axis=-1)
            dba = np.empty(db.shape[:2] + (2 * hv,), db.dtype)
            dba[..., self._ba_order] = np.concatenate([db, da], axis=-1)
            dx = self.in_proj_qkvz.backward(dqkvz) + self.in_proj_ba.backward(dba)
        else:  # x feeds all four projections
            dx = (
                self.in_proj_qkv.backward(dmixed)
                + self.in_proj_z.backward(dz)
                + self.in_proj_b.backward(db)
                + self.in_proj_a.backward(da)
            )
        return dx if ctx.keep is None else dx * ctx.keep  # forward: x = x * keep


def fused_orders(
    num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """The rows of Qwen3-Next's ``in_proj_qkvz`` and ``in_proj_ba`` in head order.

    ``in_proj_qkvz`` holds per key head [q (Dk) | k (Dk) | v (r Dv) | z (r Dv)], ``in_proj_ba``
    per key head [b (r) | a (r)] (``fix_query_key_value_ordering``). Returns the indices that
    gather them into [q heads | k heads | v heads | z heads] (2 Kd + 2 Vd,) and [b | a] (2 Hv,)."""
    r = num_v_heads // num_k_heads
    group = 2 * head_k_dim + 2 * r * head_v_dim  # one key head's rows
    parts = np.cumsum([0, head_k_dim, head_k_dim, r * head_v_dim, r * head_v_dim])
    qkvz = [
        np.concatenate([h * group + np.arange(parts[i], parts[i + 1]) for h in range(num_k_heads)])
        for i in range(4)
    ]
    ba = [
        np.concatenate([h * 2 * r + i * r + np.arange(r) for h in range(num_k_heads)])
        for i in range(2)
    ]
    return np.concatenate(qkvz), np.concatenate(ba)
