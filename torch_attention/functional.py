"""The stateless core in torch: softmax, scaled dot-product attention, head split/merge.

The twin of ``numpy_attention.functional``. ``attention`` has the semantics of
``numpy_attention.functional.attention_forward``, edge rules included (DESIGN.md "Edge rules"),
and runs on one of four backends:

- ``"sdpa"``: ``F.scaled_dot_product_attention``, the fast path; our masks are translated into
  its single ``attn_mask`` / ``is_causal`` (``masks.to_sdpa``). It cannot take an explicit
  dropout keep-mask. Inputs holding NaN or inf go to the plain path (SDPA's kernels do not keep
  the edge rules for them).
- ``"math"``: the score pipeline of ``scores.py`` in plain torch ops, differentiated by autograd.
- ``"manual"``: ``ManualAttention``, a ``torch.autograd.Function`` running the same pipeline,
  whose backward is the hand-derived one of ``numpy_attention.functional.attention_backward``.
- ``"auto"``: ``"sdpa"``, unless an explicit ``dropout_mask`` forces ``"math"``.

Whatever the backend, a query row with nothing to attend to gets output 0 and gradient 0.
docs/torch-backends.md says what each backend does and how the masks are translated.

Shape legend: B batch, H heads, N query length, M key/value length, D head width (queries and
keys), Dv value head width. "..." is any number of leading batch axes.

Dtypes: q, k and v share one float dtype, which the output has. ``"math"`` and ``"manual"``
compute float16 and bfloat16 in float32 (like NumPy's float16 rule); ``"sdpa"`` follows torch.

Derivation: docs/derivations/attention.md, docs/derivations/softmax.md.
Tests: tests/torch_attention/test_functional.py.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import masks, scores, validation
from .scores import ScoreRules

BACKENDS = ("auto", "sdpa", "math", "manual")


def check_backend(backend: Any) -> str:
    """``backend`` if it names one of ``BACKENDS``; ``ValueError`` otherwise."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return str(backend)


# -- softmax ----------------------------------------------------------------------------------


def softmax(scores_: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis; entries equal to -inf are masked out.

    A row whose entries are all -inf (nothing to attend to) gives probabilities 0, not NaN, and
    autograd gives it gradient 0; a NaN in a row makes the whole row NaN.

    Args:
        scores_: (..., M) float tensor.

    Returns:
        probs (..., M).
    """
    return scores.softmax_forward(validation.float_tensor("scores", scores_))[0]


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

    S = Q K^T * scale (+ float attn_mask); S = -inf where hidden; P = softmax(S);
    P' = P * keep / (1 - dropout_p) in dropout; O = P' V.

    Args:
        q: (..., N, D) queries.
        k: (..., M, D) keys; same leading axes and dtype as q.
        v: (..., M, Dv) values; same leading axes and dtype as q.
        causal: top-left aligned causal mask, query i sees keys j <= i (as SDPA's is_causal);
            a Python or NumPy bool.
        key_padding_mask: bool (B, M), True = padding, never attended. Needs a batched q.
        attn_mask: bool (True = may attend) or float (added to the scores; -inf hides),
            broadcasting to (..., N, M).
        scale: multiplies q k^T, a finite real number; defaults to 1 / sqrt(D).
        dropout_p: inverted dropout on the attention weights, in [0, 1).
        dropout_mask: bool keep-mask (True = kept) broadcasting to (..., N, M); needs
            dropout_p > 0 and a backend other than ``"sdpa"``. Without it, dropout draws from
            torch's global generator (inside SDPA for ``"sdpa"``).
        backend: ``"auto"``, ``"sdpa"``, ``"math"`` or ``"manual"`` (module docstring).

    Returns:
        out (..., N, Dv) in the inputs' dtype. A query row with nothing to attend to gets 0;
        M = 0 gives zeros, N = 0 an empty output.

    Masks given as array-likes are converted to tensors on q's device.
    """
    backend = check_backend(backend)
    q, k, v, rules = scores.prepare(
        q,
        k,
        v,
        causal=causal,
        key_padding_mask=key_padding_mask,
        attn_mask=attn_mask,
        scale=scale,
        dropout_p=dropout_p,
        dropout_mask=dropout_mask,
    )
    if backend == "auto":
        backend = "sdpa" if rules.keep is None else "math"
    if backend == "sdpa":
        if rules.keep is not None:
            raise ValueError(
                "backend='sdpa' cannot take an explicit dropout_mask; use 'math' or 'manual'"
            )
        if _all_finite(q, k, v, rules.bias):
            return _sdpa(q, k, v, rules)
        backend = "math"  # SDPA's kernels turn a NaN row into 0: the plain path keeps the rules
    keep = rules.keep if rules.keep is not None else _draw_keep(q, rules)
    if backend == "math":
        return _plain_forward(q, k, v, rules.bias, rules, keep)[0]
    out, _ = ManualAttention.apply(q, k, v, rules.bias, rules, keep)
    return out


def _draw_keep(q: torch.Tensor, rules: ScoreRules) -> torch.Tensor | None:
    """A keep-mask drawn from torch's generator, ``rand(..., N, M) >= p``; None without dropout."""
    if rules.dropout_p == 0.0:
        return None
    return torch.rand(tuple(q.shape[:-1]) + (rules.m,), device=q.device) >= rules.dropout_p


def _plain_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    rules: ScoreRules,
    keep: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The straight-line pipeline in torch ops: out (..., N, Dv) in q's dtype, probs (..., N, M).

    The ``"math"`` backend runs it under autograd; ``ManualAttention.forward`` runs it too and
    keeps ``probs`` for its hand-derived backward.
    """
    dtype, compute = q.dtype, rules.compute
    q, k, v = (t.to(compute) for t in (q, k, v))
    s = scores.scores_forward(q, k, rules._replace(bias=bias))  # (..., N, M)
    probs, _ = scores.softmax_forward(s)
    weights = probs if keep is None else probs * keep / (1.0 - rules.dropout_p)
    out = weights @ v  # (..., N, M) @ (..., M, Dv) -> (..., N, Dv)
    return out.to(dtype), probs


class ManualAttention(torch.autograd.Function):
    """Attention with the hand-derived backward of ``numpy_attention.functional``.

    ``apply(q, k, v, bias, rules, keep) -> (out, probs)``, with the call prepared by
    ``scores.prepare``: ``bias`` the float mask (it gets a gradient when it requires one),
    ``rules`` the rest of the call, ``keep`` the dropout keep-mask or None. ``probs`` is returned
    for the backward only and has no gradient.
    """

    @staticmethod
    def forward(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
        rules: ScoreRules,
        keep: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _plain_forward(q, k, v, bias, rules, keep)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
        q, k, v, bias, rules, keep = inputs
        _, probs = output
        ctx.mark_non_differentiable(probs)
        ctx.save_for_backward(q, k, v, probs, keep)
        ctx.rules = rules
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
        Hidden entries have P = 0, so dS = 0 there and a fully masked row gets zero gradient.
        Derivation: docs/derivations/attention.md.
        """
        q_in, k_in, v_in, probs, keep = ctx.saved_tensors
        rules: ScoreRules = ctx.rules
        q, k, v, dout = (t.to(probs.dtype) for t in (q_in, k_in, v_in, dout))
        rescale = 1.0 / (1.0 - rules.dropout_p)

        weights = probs if keep is None else probs * keep * rescale
        dv = weights.transpose(-2, -1) @ dout  # (..., M, N) @ (..., N, Dv) -> (..., M, Dv)
        dweights = dout @ v.transpose(-2, -1)  # (..., N, Dv) @ (..., Dv, M) -> (..., N, M)
        dprobs = dweights if keep is None else dweights * keep * rescale
        row_dot = (dprobs * probs).sum(dim=-1, keepdim=True)  # rowsum(dP * P), (..., N, 1)
        dscores = probs * (dprobs - row_dot)
        dq = (dscores @ k) * rules.scale  # (..., N, M) @ (..., M, D) -> (..., N, D)
        dk = (dscores.transpose(-2, -1) @ q) * rules.scale  # (..., M, N) @ (..., N, D)
        dbias = dscores.sum_to_size(ctx.bias_shape) if ctx.needs_input_grad[3] else None
        return dq.to(q_in.dtype), dk.to(k_in.dtype), dv.to(v_in.dtype), dbias, None, None


# -- the sdpa backend -------------------------------------------------------------------------


def _all_finite(*tensors: torch.Tensor | None) -> bool:
    """Whether every given tensor is free of NaN and inf (one host sync on an accelerator)."""
    return all(bool(torch.isfinite(t).all()) for t in tensors if t is not None)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rules: ScoreRules) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with our masks, and 0 on rows with nothing to attend to.

    Causal alone uses SDPA's own ``is_causal`` (top-left, as ours, and never a fully masked
    row); any other mask becomes one SDPA ``attn_mask`` with the causal mask folded in. Called
    with finite inputs only (non-finite ones take the plain path, which multiplies the values of
    hidden keys by exact zeros as the reference does, where a fused kernel may skip them).
    """
    is_causal = rules.causal and rules.allowed is None and rules.bias is None
    sdpa_mask, row_valid = None, None
    if not is_causal:
        bias = None if rules.bias is None else rules.bias.to(q.dtype)
        sdpa_mask, row_valid = masks.to_sdpa(rules.visible(q.device), bias)
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=sdpa_mask,
        dropout_p=rules.dropout_p,
        is_causal=is_causal,
        scale=rules.scale,
    )
    return out if row_valid is None else out.masked_fill(~row_valid, 0.0)


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
