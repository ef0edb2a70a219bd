"""The stateless core in torch: masked softmax, scaled dot-product attention, head split/merge.

The twin of ``numpy_attention.functional``. ``attention`` has the semantics of
``numpy_attention.functional.attention_forward`` and runs on one of four backends:

- ``"sdpa"``: ``F.scaled_dot_product_attention``, the fast path; our masks are translated into
  its single ``attn_mask`` / ``is_causal`` (``masks.to_sdpa``). It cannot take an explicit
  dropout keep-mask.
- ``"math"``: the same formula written with plain torch ops, differentiated by autograd.
- ``"manual"``: ``ManualAttention``, a ``torch.autograd.Function`` whose backward is the
  hand-derived one of ``numpy_attention.functional.attention_backward``.
- ``"auto"``: ``"sdpa"``, unless an explicit ``dropout_mask`` forces ``"math"``.

Whatever the backend, a query row with nothing to attend to gets output 0 and gradient 0.
docs/torch-backends.md says what each backend does and how the masks are translated.

Shape legend: B batch, H heads, N query length, M key/value length, D head width (queries and
keys), Dv value head width. "..." is any number of leading batch axes.

Dtypes: q, k and v share one float dtype, which the output has. ``"math"`` and ``"manual"``
compute float16 and bfloat16 in float32 (like NumPy's float16 rule); ``"sdpa"`` follows torch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import masks, validation

BACKENDS = ("auto", "sdpa", "math", "manual")

# -- softmax ----------------------------------------------------------------------------------


def softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis; entries equal to -inf are masked out.

    A row whose entries are all -inf (nothing to attend to) gives probabilities 0, not NaN, and
    autograd gives it gradient 0.

    Args:
        scores: (..., M) float tensor.

    Returns:
        probs (..., M).
    """
    # Softmax is shift-invariant, so the shift needs no gradient.
    row_max = scores.detach().amax(dim=-1, keepdim=True)
    # A fully masked row has max -inf; shifting by 0 instead keeps exp(-inf) = 0 and avoids NaN.
    row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)
    exps = (scores - row_max).exp()
    total = exps.sum(dim=-1, keepdim=True)
    return exps / total.masked_fill(total == 0, 1.0)


# -- attention --------------------------------------------------------------------------------


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    dropout_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Scaled dot-product attention: ``softmax(q k^T * scale + masks) v``.

    S = Q K^T * scale (+ float attn_mask); S = -inf where masked; P = softmax(S);
    P' = P * keep / (1 - dropout_p) in dropout; O = P' V.

    Args:
        q: (..., N, D) queries.
        k: (..., M, D) keys; same leading axes and dtype as q.
        v: (..., M, Dv) values; same leading axes and dtype as q.
        causal: top-left aligned causal mask, query i sees keys j <= i (as SDPA's is_causal).
        key_padding_mask: bool (B, M), True = padding, never attended. Needs a batched q.
        attn_mask: bool (True = may attend) or float (added to the scores), broadcasting to
            (..., N, M).
        scale: multiplies q k^T; defaults to 1 / sqrt(D).
        dropout_p: inverted dropout on the attention weights, in [0, 1).
        dropout_mask: bool keep-mask (True = kept) broadcasting to (..., N, M); needs
            dropout_p > 0 and a backend other than ``"sdpa"``. Without it, dropout draws from
            torch's global generator (inside SDPA for ``"sdpa"``).
        backend: ``"auto"``, ``"sdpa"``, ``"math"`` or ``"manual"`` (module docstring).

    Returns:
        out (..., N, Dv) in the inputs' dtype. A query row with nothing to attend to gets 0.

    Masks given as array-likes are converted to tensors on q's device.
    """
    dtype = _check_qkv(q, k, v)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    compute = _compute_dtype(dtype)
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    score_shape = tuple(q.shape[:-1]) + (m,)

    allowed, bias = None, None
    if attn_mask is not None:
        allowed, bias = masks.split_attn_mask(attn_mask, score_shape, compute, q.device)
    padding = None
    if key_padding_mask is not None:
        padding = masks.key_padding_allowed(key_padding_mask, tuple(q.shape), m, q.device)
    p, keep = _check_dropout(dropout_p, dropout_mask, score_shape, q.device)
    scale = 1.0 / math.sqrt(d) if scale is None else validation.scale(scale)

    if backend == "auto":
        backend = "sdpa" if keep is None else "math"
    if backend == "sdpa":
        if keep is not None:
            raise ValueError(
                "backend='sdpa' cannot take an explicit dropout_mask; use 'math' or 'manual'"
            )
        return _sdpa(q, k, v, causal, masks.combine(allowed, padding), bias, p, scale)

    allowed = masks.combine(allowed, masks.causal_mask(n, m, q.device) if causal else None, padding)
    if keep is None and p > 0.0:
        keep = torch.rand(score_shape, device=q.device) >= p
    rescale = 1.0 / (1.0 - p)
    if backend == "math":
        out, _ = _forward(q, k, v, allowed, bias, keep, rescale, scale)
        return out
    out, _ = ManualAttention.apply(q, k, v, allowed, bias, keep, rescale, scale)
    return out


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    bias: torch.Tensor | None,
    keep: torch.Tensor | None,
    rescale: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The straight-line formula in torch ops: out (..., N, Dv) in q's dtype, probs (..., N, M).

    The ``"math"`` backend runs it under autograd; ``ManualAttention.forward`` runs it too and
    keeps ``probs`` for its hand-derived backward.
    """
    dtype, compute = q.dtype, _compute_dtype(q.dtype)
    q, k, v = (t.to(compute) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., N, D) @ (..., D, M) -> (..., N, M)
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = softmax(scores)
    weights = probs if keep is None else probs * keep * rescale
    out = weights @ v  # (..., N, M) @ (..., M, Dv) -> (..., N, Dv)
    return out.to(dtype), probs


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    allowed: torch.Tensor | None,
    bias: torch.Tensor | None,
    dropout_p: float,
    scale: float,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with our masks, and 0 on rows with nothing to attend to.

    Causal alone uses SDPA's own ``is_causal`` (top-left, as ours, and never a fully masked
    row); any other mask becomes one SDPA ``attn_mask`` with the causal mask folded in.
    """
    is_causal = causal and allowed is None and bias is None
    if causal and not is_causal:
        allowed = masks.combine(allowed, masks.causal_mask(q.shape[-2], k.shape[-2], q.device))
    sdpa_mask, row_valid = masks.to_sdpa(allowed, None if bias is None else bias.to(q.dtype))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=sdpa_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )
    return out if row_valid is None else out.masked_fill(~row_valid, 0.0)


class ManualAttention(torch.autograd.Function):
    """Attention with the hand-derived backward of ``numpy_attention.functional``.

    ``apply(q, k, v, allowed, bias, keep, rescale, scale) -> (out, probs)``, with the masks
    already prepared by ``attention``: ``allowed`` bool "may attend" or None, ``bias`` float added
    to the scores or None (it gets a gradient when it requires one), ``keep`` bool dropout
    keep-mask or None, ``rescale`` = 1 / (1 - dropout_p). ``probs`` is returned for the backward
    only and has no gradient.
    """

    @staticmethod
    def forward(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        allowed: torch.Tensor | None,
        bias: torch.Tensor | None,
        keep: torch.Tensor | None,
        rescale: float,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _forward(q, k, v, allowed, bias, keep, rescale, scale)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
        q, k, v, _, bias, keep, rescale, scale = inputs
        _, probs = output
        ctx.mark_non_differentiable(probs)
        ctx.save_for_backward(q, k, v, probs, keep)
        ctx.rescale, ctx.scale = rescale, scale
        ctx.bias_shape = None if bias is None else bias.shape

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, dout: torch.Tensor, dprobs_unused: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        """Gradients of q, k, v (and of the float bias when it requires one).

        P' = P * keep / (1 - p) (P' = P without dropout), then
        dV = P'^T dO;  dP' = dO V^T;  dP = dP' * keep / (1 - p);
        dS = P * (dP - rowsum(dP * P));  dQ = dS K * scale;  dK = dS^T Q * scale;
        dBias = dS summed over the axes the bias was broadcast along.
        Masked entries have P = 0, so dS = 0 there and a fully masked row gets zero gradient.
        Derivation: docs/derivations/attention.md.
        """
        q_in, k_in, v_in, probs, keep = ctx.saved_tensors
        q, k, v, dout = (t.to(probs.dtype) for t in (q_in, k_in, v_in, dout))
        rescale, scale = ctx.rescale, ctx.scale

        weights = probs if keep is None else probs * keep * rescale
        dv = weights.transpose(-2, -1) @ dout  # (..., M, N) @ (..., N, Dv) -> (..., M, Dv)
        dweights = dout @ v.transpose(-2, -1)  # (..., N, Dv) @ (..., Dv, M) -> (..., N, M)
        dprobs = dweights if keep is None else dweights * keep * rescale
        row_dot = (dprobs * probs).sum(dim=-1, keepdim=True)  # rowsum(dP * P), (..., N, 1)
        dscores = probs * (dprobs - row_dot)
        dq = (dscores @ k) * scale  # (..., N, M) @ (..., M, D) -> (..., N, D)
        dk = (dscores.transpose(-2, -1) @ q) * scale  # (..., M, N) @ (..., N, D) -> (..., M, D)
        dbias = dscores.sum_to_size(ctx.bias_shape) if ctx.needs_input_grad[4] else None
        return (
            dq.to(q_in.dtype),
            dk.to(k_in.dtype),
            dv.to(v_in.dtype),
            None,
            dbias,
            None,
            None,
            None,
        )


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half types are computed in float32 by the ``"math"`` and ``"manual"`` backends."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _check_qkv(q: Any, k: Any, v: Any) -> torch.dtype:
    q, k, v = (validation.float_tensor(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    dtype = validation.same_dtype(q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must have at least 2 axes (..., length, width), got {tuple(t.shape)}"
            )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"q, k and v must share their leading axes, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the head width D, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must share the key length M, got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    return dtype


def _check_dropout(
    dropout_p: Any, dropout_mask: Any, score_shape: tuple[int, ...], device: torch.device
) -> tuple[float, torch.Tensor | None]:
    """The checked probability and the explicit keep-mask (None when none was given)."""
    p = validation.dropout_p(dropout_p)
    if dropout_mask is None:
        return p, None
    dropout_mask = validation.bool_tensor("dropout_mask", dropout_mask, device)
    if p == 0.0:
        raise ValueError("dropout_mask was given with dropout_p == 0; set dropout_p > 0")
    validation.broadcasts_to("dropout_mask", dropout_mask, score_shape)
    return p, dropout_mask


# -- heads ------------------------------------------------------------------------------------


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(..., N, H*D) -> (..., H, N, D): head h takes columns h*D:(h+1)*D."""
    x = validation.float_tensor("x", x)
    if x.ndim < 2 or x.shape[-1] % num_heads != 0:
        raise ValueError(
            f"x of shape {tuple(x.shape)}: last axis must split into {num_heads} heads"
        )
    *lead, n, width = x.shape
    heads = x.reshape(*lead, n, num_heads, width // num_heads)  # (..., N, H, D)
    return heads.transpose(-3, -2)  # (..., H, N, D)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(..., H, N, D) -> (..., N, H*D), the inverse of ``split_heads``."""
    x = validation.float_tensor("x", x)
    if x.ndim < 3:
        raise ValueError(f"x must be (..., H, N, D), got shape {tuple(x.shape)}")
    *lead, num_heads, n, d = x.shape
    return x.transpose(-3, -2).reshape(*lead, n, num_heads * d)  # (..., N, H, D) -> (..., N, H*D)
