"""MiniMax's lightning attention layer: linear attention with a fixed decay per head, then an
RMSNorm over every head and a sigmoid output gate. Parameters are named like transformers'
``MiniMaxLightningAttention``, so its attention state dict loads without renaming.

Shape legend: B batch, T tokens of this call, C model width (``hidden_size``), H heads, D head
width (q, k and v alike), S the per-head state (D, D).

The chain, as transformers 5 computes it (``modeling_minimax.py``):

    z = qkv_proj(x)                                       (B, T, C) -> (B, T, 3*H*D)
    u = silu(z) * keep                                    keep: 0 on padded tokens, else 1
    q, k, v = split(u.reshape(B, T, H, 3*D), D)           (B, T, H, D) each
    S_t = exp(-slope_h) S_{t-1} + k_t v_t^T               per head, S_0 = 0 or the cache's
    o_t = S_t^T q_t                                       no scale: transformers applies none
    a = rmsnorm(merge(o)) * norm.weight                   over the whole H*D width, eps 1e-6
    y = a * sigmoid(output_gate(x))                       (B, T, H*D)
    out = out_proj(y)                                     (B, T, C)

The recurrence is simple gated linear attention (``linear_attention.simple_gla_forward``) with
the log gate g = -slope_h at every token and scale 1: transformers' blocks compute
``(Q K^T * exp(-slope (i - j))) V + (Q * exp(-slope i)) S`` within a block and carry
``S exp(-slope L) + (K * exp(-slope (L - j)))^T V`` to the next, which is the chunked form of
that recurrence; with a cache, every later call of transformers runs the recurrence token by
token. The slopes are ALiBi's: slope_h = 2^(-8 (h + 1) / H) * (1 - l / (layers - 1 + 1e-5)
+ 1e-5) for layer l of ``num_hidden_layers`` (``slope_rates``), computed in float64 here;
transformers computes its buffers at init in torch's default dtype, so a model built in float64
(``set_default_dtype``, or ``from_pretrained``/``from_config`` with ``dtype=torch.float64``)
holds these values, while one built in float32 and cast with ``.double()`` holds their float32
rounding, and its decay tables float32 exps (docs/hugging-face.md, "MiniMax's lightning
layers").

Padding: ``key_padding_mask`` (B, M), True = padding (M = T, or the cache's length plus T: the
package's convention, ``linear_cache.padding_keep``), zeroes q, k and v of the padded tokens
after the SiLU (transformers' ``apply_mask_to_padding_states``): a padded token writes nothing
and reads nothing (its output is 0), but the decay still runs over it, as in transformers.

The backward walks the chain in reverse through the parts' own backwards (Linear, RMSNorm, the
output gate, the core's ``simple_gla_backward``); the log gate is a constant (no gradient for
the slopes), the SiLU's derivative is s (1 + z (1 - s)), and x feeds qkv_proj and the gate, so
dx is the sum of both.

Decoding, a ``LinearStateCache`` or ``PagedLinearStateCache`` (``linear_cache.py``, no
convolution state) holds each head's (D, D) state: the layer reads it as the initial state, runs
the core with ``output_final_state=True`` and writes the final state back. A cached call can be
differentiated too (the state it read is a constant).

Derivation: docs/derivations/lightning-layer.md (the chain, why the decay is simple GLA, each
backward line), docs/derivations/linear-attention.md, docs/derivations/rmsnorm.md,
docs/derivations/output-gate.md, docs/derivations/linear.md.
Tests: tests/numpy_attention/test_lightning.py; against transformers in
tests/parity/test_hf_lightning.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import validation
from .gate import GateCtx, _sigmoid, output_gate_backward, output_gate_forward
from .layers import Linear
from .linear_attention import FORMS, LinearCtx, simple_gla_backward, simple_gla_forward
from .linear_cache import LinearStateCache, PagedLinearStateCache, padding_keep
from .module import Module
from .norms import RMSNorm

__all__ = ["LightningAttention", "slope_rates"]


def slope_rates(num_heads: int, layer_idx: int, num_hidden_layers: int) -> np.ndarray:
    """(H,) float64: transformers' ``get_slope_rate``, slope_h = base^(h + 1) * factor with
    base = 1 / 2^(8 / H) and factor = 1 - layer_idx / (num_hidden_layers - 1 + 1e-5) + 1e-5."""
    base = 1 / (2 ** (8 / num_heads))
    factor = 1 - layer_idx / (num_hidden_layers - 1 + 1e-5) + 1e-5
    return base ** np.arange(1, num_heads + 1, dtype=np.float64) * factor  # (H,)


class _LightningCtx(NamedTuple):
    pre: np.ndarray  # z = qkv_proj(x), the SiLU's input, (B, T, 3*H*D)
    sig: np.ndarray  # sigmoid(z), z's shape
    keep: np.ndarray | None  # (B, T, 1): 1 on real tokens, 0 on padding; None without a mask
    core: LinearCtx  # simple_gla_forward's
    gate: GateCtx  # output_gate_forward's


class LightningAttention(Module):
    """MiniMax's lightning attention (module docstring for the chain).

    Parameters, created in this order (transformers'): ``norm`` = RMSNorm(H*D, 1e-6),
    ``qkv_proj`` = Linear(C, 3*H*D), ``out_proj`` = Linear(H*D, C), ``output_gate`` =
    Linear(C, H*D), none with a bias. The slopes are no parameter or buffer: ``slope_rate``
    (H,) float64, from the constructor's arguments.

    Args:
        hidden_size: C.
        num_heads: H.
        head_dim: D; None is C // H.
        layer_idx: this layer's index in the model, which sets the slopes.
        num_hidden_layers: the model's number of layers, which sets the slopes.
        slope_rate: (H,) decays per token used as given (each > 0), in place of the model's
            rule; None computes them (``slope_rates``).
        norm_eps: the eps of ``norm`` (transformers keeps RMSNorm's default 1e-6 here, not the
            config's ``rms_norm_eps``).
        form: the core's ``"chunk"`` or ``"recurrent"`` form (equal up to rounding).
        chunk_size: the core's chunk length (transformers' ``block_size``).
        rng: generator or seed for the initial weights.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        layer_idx: int = 0,
        num_hidden_layers: int = 1,
        slope_rate: Any = None,
        norm_eps: float = 1e-6,
        form: str = "chunk",
        chunk_size: int = 64,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__()
        self.hidden_size = validation.positive_int("hidden_size", hidden_size)
        self.num_heads = validation.positive_int("num_heads", num_heads)
        if head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"head_dim None is hidden_size // num_heads, but hidden_size {hidden_size} "
                    f"is not divisible by num_heads {num_heads}: give head_dim"
                )
            head_dim = self.hidden_size // self.num_heads
        self.head_dim = validation.positive_int("head_dim", head_dim)
        self.layer_idx = validation.non_negative_int("layer_idx", layer_idx)
        self.num_hidden_layers = validation.positive_int("num_hidden_layers", num_hidden_layers)
        if self.layer_idx >= self.num_hidden_layers:
            raise ValueError(
                f"layer_idx {layer_idx} must be below num_hidden_layers {num_hidden_layers}"
            )
        self.slope_rate = _check_slopes(slope_rate, self.num_heads, layer_idx, num_hidden_layers)
        if form not in FORMS:
            raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
        self.form = str(form)
        self.chunk_size = validation.positive_int("chunk_size", chunk_size)
        self.rng = np.random.default_rng(rng)

        c, width = self.hidden_size, self.num_heads * self.head_dim
        self.norm = RMSNorm(width, norm_eps)
        self.qkv_proj = Linear(c, 3 * width, bias=False, rng=self.rng)
        self.out_proj = Linear(width, c, bias=False, rng=self.rng)
        self.output_gate = Linear(c, width, bias=False, rng=self.rng)

    def forward(
        self,
        x: np.ndarray,
        *,
        key_padding_mask: Any = None,
        cache: LinearStateCache | PagedLinearStateCache | None = None,
    ) -> np.ndarray:
        """Causal lightning attention over x's tokens, after the cache's state when given.

        Args:
            x: (B, T, C).
            key_padding_mask: bool (B, M), True = padding, M = T, or ``cache.length + T`` with a
                cache (the package's convention): this call's padded tokens' q, k and v are
                zeroed (module docstring).
            cache: a ``LinearStateCache`` or ``PagedLinearStateCache`` of this layer's B, H,
                D, D and no convolution: its state is the initial state, and the final state
                is written back (``cache.length`` += T).

        Returns:
            (B, T, C).
        """
        x = validation.layer_input("x", x, self.hidden_size, (3,), self.dtype)
        b, t, _ = x.shape
        s0, start = None, 0
        if cache is not None:
            if not isinstance(cache, (LinearStateCache, PagedLinearStateCache)):
                raise TypeError(
                    "cache must be a LinearStateCache or a PagedLinearStateCache, got "
                    f"{type(cache).__name__}"
                )
            cache.check(b, self.num_heads, self.head_dim, self.head_dim, None, None)
            _, s0 = cache.read()  # (B, H, D, D); no convolution state
            start = cache.length
        keep = padding_keep(key_padding_mask, b, start + t, t, x.dtype, cache is not None)

        pre = self.qkv_proj(x)  # (B, T, C) -> (B, T, 3*H*D)
        sig = _sigmoid(pre)
        qkv = pre * sig  # silu(z) = z sigmoid(z)
        if keep is not None:
            qkv = qkv * keep  # padded tokens: q = k = v = 0
        qkv = qkv.reshape(b, t, self.num_heads, 3 * self.head_dim)  # -> (B, T, H, 3*D)
        q, k, v = np.split(qkv, 3, axis=-1)  # (B, T, H, D) each
        g = np.broadcast_to(-self.slope_rate.astype(x.dtype), (b, t, self.num_heads))
        core = simple_gla_forward(
            q, k, v, g, scale=1.0, initial_state=s0, output_final_state=cache is not None,
            form=self.form, chunk_size=self.chunk_size,
        )  # fmt: skip
        merged = core.out.reshape(b, t, -1)  # (B, T, H, D) -> (B, T, H*D)
        normed = self.norm(merged)  # over the whole H*D width
        gated, gate = output_gate_forward(normed, self.output_gate(x), "sigmoid")
        out = self.out_proj(gated)  # (B, T, H*D) -> (B, T, C)
        if cache is not None:
            cache.write(None, core.final_state, t)
        if core.ctx is not None:
            self._save_ctx(_LightningCtx(pre, sig, keep, core.ctx, gate), out)
        else:
            self._save_ctx(None, out)  # under no_grad(): nothing is kept
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Gradient of x; adds the gradients of every parameter.

        dy = out_proj^T(dout); da = dy * sigmoid(p), dp = dy * a * s (1 - s) (p = output_gate(x));
        dxg = output_gate^T(dp); do = norm^T(da) split per head; dq, dk, dv = the core's
        backward (g a constant: its gradient dropped; a read cache state likewise);
        du = [dq | dk | dv] per head, times keep; dz = du * s (1 + z (1 - s)), s = sigmoid(z);
        dx = qkv_proj^T(dz) + dxg. Derivation: docs/derivations/lightning-layer.md.

        Args:
            dout: (B, T, C) gradient of the last forward's output.

        Returns:
            dx (B, T, C).
        """
        dout, ctx = self._pop_ctx(dout)
        b, t, _ = dout.shape
        dgated = self.out_proj.backward(dout)  # forward: out = out_proj(gated)
        dnormed, dpre_gate = output_gate_backward(dgated, ctx.gate)  # gated = a * sigmoid(p)
        dx_gate = self.output_gate.backward(dpre_gate)  # forward: p = output_gate(x)
        dmerged = self.norm.backward(dnormed)  # forward: normed = norm(merged)
        do = dmerged.reshape(b, t, self.num_heads, self.head_dim)  # -> (B, T, H, D)
        grads = simple_gla_backward(do, ctx.core)  # forward: o = the recurrence of q, k, v
        dqkv = np.concatenate([grads.dq, grads.dk, grads.dv], axis=-1)  # -> (B, T, H, 3*D)
        dqkv = dqkv.reshape(b, t, -1)  # -> (B, T, 3*H*D)
        if ctx.keep is not None:
            dqkv = dqkv * ctx.keep  # forward: qkv = qkv * keep
        s, z = ctx.sig, ctx.pre
        dz = dqkv * s * (1 + z * (1 - s))  # forward: qkv = z sigmoid(z)
        dx_qkv = self.qkv_proj.backward(dz)  # forward: z = qkv_proj(x)
        return dx_qkv + dx_gate  # x feeds the projection and the gate


def _check_slopes(slope_rate: Any, heads: int, layer_idx: int, layers: int) -> np.ndarray:
    """The (H,) slopes in float64: given (finite, > 0, that length), or the model's rule."""
    if slope_rate is None:
        return slope_rates(heads, layer_idx, layers)
    slopes = validation.float_array("slope_rate", slope_rate).astype(np.float64)
    if slopes.shape != (heads,) or not np.all(np.isfinite(slopes)) or np.any(slopes <= 0):
        raise ValueError(
            f"slope_rate must hold num_heads = {heads} finite decays > 0, shape ({heads},), got "
            f"shape {slopes.shape}"
        )
    return slopes
