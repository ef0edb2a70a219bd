"""The score pipeline of attention in torch, written once for the "math" and "manual" backends.

The twin of ``numpy_attention.scores``: every option of an attention call is checked once here
(``prepare``, before any work), and the pipeline that turns q and k into probabilities is written
once, for the backend that differentiates it by autograd ("math") and for the one with the
hand-derived backward ("manual"):

1. ``S = Q K^T * scale``.
2. A float ``attn_mask`` is added.
3. Visibility: every hidden score is *replaced* by -inf (never added to, so a NaN or inf at a
   hidden key cannot leak into any row): causal (j <= i), a bool ``attn_mask``,
   ``key_padding_mask``, and the -inf entries of a float ``attn_mask``.
4. The softmax over each row, with its natural-log log-sum-exp: a row with nothing to attend to
   gets probabilities 0 and lse -inf; a NaN in a visible score makes its row NaN.
5. Dropout, then ``O = P' V`` (in ``functional``).

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value head
width; "..." any leading axes of q.

Derivation: docs/derivations/attention.md, docs/derivations/softmax.md.
Tests: tests/torch_attention/test_scores.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from . import masks, validation


class ScoreRules(NamedTuple):
    """Every option of one attention call, checked, in the form the backends read.

    ``allowed`` holds the tensor masks only (bool ``attn_mask``, padding, the -inf entries of a
    float mask); causal is a rule on positions, kept apart so that SDPA can use its own.
    """

    n: int
    m: int
    scale: float
    causal: bool
    bias: torch.Tensor | None  # float attn_mask in the compute dtype, 0 where it was -inf
    allowed: torch.Tensor | None  # bool "may attend", broadcasting to (..., N, M)
    dropout_p: float
    keep: torch.Tensor | None  # explicit dropout keep-mask, broadcasting to (..., N, M)
    compute: torch.dtype  # float32 for half inputs, else the inputs' dtype

    def visible(self, device: torch.device) -> torch.Tensor | None:
        """Bool "may attend" of every rule, broadcasting to (..., N, M); None if all visible."""
        causal = masks.causal_mask(self.n, self.m, device) if self.causal else None
        return masks.combine(self.allowed, causal)


class Inputs(NamedTuple):
    """q, k, v checked (in their own dtype), with the rules of the call."""

    q: torch.Tensor  # (..., N, D)
    k: torch.Tensor  # (..., M, D)
    v: torch.Tensor  # (..., M, Dv)
    rules: ScoreRules


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half types are computed in float32 (NumPy's float16 rule); others in their own dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def prepare(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: Any = False,
    key_padding_mask: Any = None,
    attn_mask: Any = None,
    scale: Any = None,
    dropout_p: Any = 0.0,
    dropout_mask: Any = None,
) -> Inputs:
    """Check q, k, v and every option (before any work) and build the rules of the call.

    Raises ``TypeError``/``ValueError`` naming the argument and the shapes involved, with the
    messages of ``numpy_attention.scores.prepare``.
    """
    q, k, v = (validation.float_tensor(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    compute = compute_dtype(validation.same_dtype(q=q, k=k, v=v))
    _check_shapes(q, k, v)
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    score_shape = tuple(q.shape[:-1]) + (m,)
    device = q.device

    causal = validation.flag("causal", causal)
    bias, allowed = None, []
    if attn_mask is not None:
        bool_mask, float_mask = masks.split_attn_mask(attn_mask, score_shape, compute, device)
        allowed.append(bool_mask)
        if float_mask is not None:
            hidden = float_mask == float("-inf")  # -inf in a float mask hides: replace, not add
            bias = float_mask.masked_fill(hidden, 0.0)
            allowed.append(~hidden)
    if key_padding_mask is not None:
        allowed.append(masks.key_padding_allowed(key_padding_mask, tuple(q.shape), m, device))

    p = validation.dropout_p(dropout_p)
    keep = None
    if dropout_mask is not None:
        keep = validation.keep_mask("dropout_mask", dropout_mask, p, score_shape, device)

    if d == 0:
        raise ValueError(
            f"q and k have head width D = 0 (q {tuple(q.shape)}): nothing to attend with"
        )
    scale_value = 1.0 / math.sqrt(d) if scale is None else validation.finite_real("scale", scale)
    rules = ScoreRules(
        n=n,
        m=m,
        scale=scale_value,
        causal=causal,
        bias=bias,
        allowed=masks.combine(*allowed),
        dropout_p=p,
        keep=keep,
        compute=compute,
    )
    return Inputs(q, k, v, rules)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """``ValueError`` naming the shapes unless q (..., N, D), k (..., M, D), v (..., M, Dv)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must have at least 2 axes (..., length, width), got {tuple(t.shape)}"
            )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the head width D, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"k and v must share their leading axes and the key length M, got k "
            f"{tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            f"q, k and v must share their leading axes, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )


# -- the pipeline -----------------------------------------------------------------------------


def scores_forward(q: torch.Tensor, k: torch.Tensor, rules: ScoreRules) -> torch.Tensor:
    """Steps 1-3: the scores S (..., N, M) of q (..., N, D) and k (..., M, D), compute dtype.

    Differentiable by autograd (the "math" backend); the "manual" backend runs it without a
    graph and walks it back by hand (``functional.ManualAttention``).
    """
    scores = (q @ k.transpose(-2, -1)) * rules.scale  # (..., N, D) @ (..., D, M) -> (..., N, M)
    if rules.bias is not None:
        scores = scores + rules.bias
    visible = rules.visible(q.device)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores


def softmax_forward(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 4: P = exp(S - lse) over the last axis, and lse = log(sum_j exp(S_j)).

    The shift is the row max, or 0 for a row that is all -inf (also when M = 0): shifting by
    -inf would give -inf - (-inf) = NaN. Such a row gets P = 0 and lse = -inf, and autograd gives
    it gradient 0 (the shift needs none: softmax is shift-invariant). A NaN in a row, or a +inf
    (exp(inf - inf) = NaN), makes the whole row NaN.

    Args:
        scores: (..., M).

    Returns:
        probs (..., M) and lse (...,).
    """
    shift = _row_max(scores.detach())  # (..., 1)
    shift = shift.masked_fill(shift == float("-inf"), 0.0)
    exps = (scores - shift).exp()
    total = exps.sum(dim=-1, keepdim=True)  # (..., 1)
    live = total != 0  # NaN != 0: a NaN row stays NaN
    safe = torch.where(live, total, torch.ones_like(total))
    probs = exps / safe
    lse = torch.where(live, shift + safe.log(), torch.full_like(total, float("-inf")))
    return probs, lse.squeeze(-1)


def _row_max(scores: torch.Tensor) -> torch.Tensor:
    """The max of each row, (..., 1), NaN where the row holds a NaN; -inf for M = 0."""
    if scores.shape[-1] == 0:
        return scores.new_full(scores.shape[:-1] + (1,), float("-inf"))
    return scores.amax(dim=-1, keepdim=True)
