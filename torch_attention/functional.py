"""The stateless core in torch: softmax, scaled dot-product attention, head split/merge.

The twin of ``numpy_attention.functional``. ``attention`` has the semantics of
``numpy_attention.functional.attention_forward`` with today's options (GQA, causal alignment,
windows, softcap, ALiBi, sinks, lse) and its edge rules (docs/design.md), and runs on one of six
backends:

- ``"math"``: the score pipeline of ``scores.py`` in plain torch ops, differentiated by autograd.
- ``"manual"``: ``ManualAttention``, a ``torch.autograd.Function`` running the same pipeline,
  whose backward is written by hand (the math of ``numpy_attention.functional``'s backward).
- ``"sdpa"``: ``F.scaled_dot_product_attention`` where the options fit (``backends.py``).
- ``"flex"``: FlexAttention's ``score_mod`` and ``block_mask`` (``backends.py``); forward-only
  on CPU.
- ``"triton"``: the project's own FlashAttention-2 kernel (``torch_attention.triton``, the
  optional extra ``triton``), on a GPU, or on CPU under Triton's interpreter; no masks.
- ``"auto"``: the fastest backend that supports the call on its device (``backends.choose``).

A backend that cannot compute an option exactly refuses it with a ``ValueError`` naming the
option; it never computes something else. docs/torch-backends.md says what each backend does,
supports and refuses.

Shape legend: B batch, H query heads, H_kv key/value heads, N query length, M key/value length,
D head width (queries and keys), Dv value head width; "..." any leading axes of q, the last of
them the heads axis H.

Dtypes: q, k and v share one float dtype, which the output has. ``"math"`` and ``"manual"``
compute float16 and bfloat16 in float32 (like NumPy's float16 rule) and return lse in float32;
``"sdpa"`` and ``"flex"`` follow torch; ``"triton"`` multiplies in the inputs' dtype with float32
accumulators (flash-attn's rounding) and returns lse in float32.

Derivation: docs/derivations/attention.md and the pages it links (softmax.md, softcap.md,
alibi.md, windows.md, gqa.md, sinks.md, lse.md). Tests: tests/torch_attention/test_functional.py
(edge rules, the original options, half precision by the kernel checker's policy),
test_functional_options.py (today's options, option by option, on every backend) and
tests/torch_attention/triton/ (the "triton" backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict, overload

import torch
from torch.autograd.function import once_differentiable

from . import backends, scores, validation
from .rules import ScoreRules, prepare
from .scores import AttentionOutput

if TYPE_CHECKING:
    from typing_extensions import Unpack

BACKENDS = ("auto", "sdpa", "flex", "math", "manual", "triton")

__all__ = [
    "BACKENDS",
    "AttentionOutput",
    "ManualAttention",
    "attention",
    "check_backend",
    "merge_heads",
    "softmax",
    "split_heads",
]


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


class Options(TypedDict, total=False):
    """The keyword options of ``attention`` other than ``return_lse``, for its overloads: with
    ``return_lse=False`` it returns a tensor, with ``True`` an ``AttentionOutput``."""

    causal: bool
    window: tuple[int | None, int | None] | None
    align: str
    key_padding_mask: torch.Tensor | None
    attn_mask: torch.Tensor | None
    scale: float | None
    softcap: float
    alibi_slopes: torch.Tensor | None
    sinks: torch.Tensor | None
    enable_gqa: bool
    dropout_p: float
    dropout_mask: torch.Tensor | None
    backend: str
    chunk_size: int | None
    chunk_start: Any


@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    return_lse: Literal[False] = False,
    **options: Unpack[Options],
) -> torch.Tensor: ...


@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    return_lse: Literal[True],
    **options: Unpack[Options],
) -> AttentionOutput: ...


@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    return_lse: bool,
    **options: Unpack[Options],
) -> torch.Tensor | AttentionOutput: ...


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    align: str = "top-left",
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
    dropout_mask: torch.Tensor | None = None,
    backend: str = "auto",
    return_lse: bool = False,
    chunk_size: int | None = None,
    chunk_start: Any = None,
) -> torch.Tensor | AttentionOutput:
    """Scaled dot-product attention with today's options, in the order of the score pipeline.

    S = Q K^T * scale; S = softcap * tanh(S / softcap); S -= slope_h * |p_i - j|; S += float
    attn_mask; S = -inf where hidden; P = softmax(S) with the sink in each row's denominator;
    P' = P * keep / (1 - dropout_p); O = P' V.

    Args:
        q: (..., H, N, D) queries (any leading axes; the last is the heads axis).
        k: (..., H_kv, M, D) keys; H_kv = H unless ``enable_gqa``; q's dtype.
        v: (..., H_kv, M, Dv) values; q's dtype.
        causal: query i sees keys j <= p_i (p_i = i, or i + M - N with ``align="bottom-right"``);
            a Python or NumPy bool.
        window: (left, right): query i sees keys p_i - left <= j <= p_i + right; either side
            may be None (unbounded). Intersects with ``causal``.
        align: "top-left" (SDPA's is_causal) or "bottom-right" (flash-attn's; a KV-cache decode
            step): where query i sits on the key axis, for causal, windows and ALiBi.
        key_padding_mask: bool (B, M), True = padding, never attended. Needs a batched q.
        attn_mask: bool (True = may attend) or float (added to the scores; -inf hides),
            broadcasting to (..., H, N, M).
        scale: multiplies q k^T, a finite real number; defaults to 1 / sqrt(D).
        softcap: > 0 caps the scores with ``softcap * tanh(S / softcap)`` (Gemma 2); 0 = off.
        alibi_slopes: (H,) or (B, H) float tensor: ALiBi, ``S -= slope_h * |p_i - j|``.
        sinks: (H,) tensor in q's dtype, one logit per query head that joins every row's
            softmax with no value (gpt-oss's attention sinks), used as given.
        enable_gqa: k and v may have H_kv heads with H % H_kv == 0; query head h reads kv head
            h // (H // H_kv).
        dropout_p: inverted dropout on the attention weights, in [0, 1).
        dropout_mask: bool keep-mask (True = kept) broadcasting to (..., H, N, M); needs
            dropout_p > 0. Without it, dropout draws from torch's global generator
            (``rand(..., H, N, M) >= p``; inside SDPA for ``"sdpa"``).
        backend: ``"auto"``, ``"sdpa"``, ``"flex"``, ``"math"``, ``"manual"`` or ``"triton"``
            (module docstring).
        return_lse: also return lse, the log-sum-exp of each row of scores (the sink's term
            included), as flash-attention does; differentiable.
        chunk_size: C, chunked attention (Llama 4): query i sees key j only when both lie in
            the same chunk of C keys, (j - s) // C == (p_i - s) // C; intersects with causal,
            windows and masks. None: no chunks. Every backend but "triton" takes it.
        chunk_start: s, the key where the first chunk starts: an int, or (B,) ints along q's
            first axis (each sequence's left padding); None: 0. Needs ``chunk_size``.

    Returns:
        out (..., H, N, Dv) in the inputs' dtype, or with ``return_lse=True`` the NamedTuple
        ``AttentionOutput(out, lse)``, lse (..., H, N) in the compute dtype (float32 for half
        inputs). A row with nothing to attend to gets output 0 and lse -inf (with sinks: the
        sink logit); M = 0 gives zeros, N = 0 an empty output.

    Masks given as array-likes are converted to tensors on q's device.
    """
    backend = check_backend(backend)
    return_lse = validation.flag("return_lse", return_lse)
    q, k, v, rules = prepare(
        q,
        k,
        v,
        causal=causal,
        window=window,
        align=align,
        key_padding_mask=key_padding_mask,
        attn_mask=attn_mask,
        scale=scale,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        enable_gqa=enable_gqa,
        dropout_p=dropout_p,
        dropout_mask=dropout_mask,
        chunk_size=chunk_size,
        chunk_start=chunk_start,
    )
    needs_grad = _needs_grad(q, k, v, rules)
    call = backends.Call(
        rules, return_lse, q.dtype, q.device, needs_grad, (q.shape[-1], v.shape[-1])
    )
    backend = backends.choose(call) if backend == "auto" else backends.check(backend, call)
    lse: torch.Tensor | None = None
    if backend == "sdpa" and backends.all_finite(q, k, v, rules.bias, rules.slopes):
        out = backends.sdpa(q, k, v, rules)
    elif backend == "flex":
        out, lse = backends.flex(q, k, v, rules)
    elif backend == "triton":
        from .triton import launch  # the optional extra, imported on first use

        out, lse = launch.attention(q, k, v, rules)
    else:  # math, manual, and sdpa's non-finite calls: SDPA's kernels break the edge rules
        keep = rules.keep if rules.keep is not None else _draw_keep(q, rules)
        if backend == "manual":
            out, lse = ManualAttention.apply(
                q, k, v, rules.bias, rules.slopes, rules.sinks, rules, keep
            )
        else:
            out, lse = _plain_forward(q, k, v, rules, keep)
    if not return_lse:
        return out
    if lse is None:
        raise RuntimeError(f"backend {backend!r} gave no lse although it accepted the call")
    return AttentionOutput(out, lse)


def _needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rules: ScoreRules) -> bool:
    """Whether autograd will want a backward through this call."""
    tensors = (q, k, v, rules.bias, rules.slopes, rules.sinks)
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _draw_keep(q: torch.Tensor, rules: ScoreRules) -> torch.Tensor | None:
    """A keep-mask drawn from torch's generator, ``rand(..., H, N, M) >= p``; None without
    dropout."""
    if rules.dropout_p == 0.0:
        return None
    return torch.rand(tuple(q.shape[:-1]) + (rules.m,), device=q.device) >= rules.dropout_p


# -- the math backend: the pipeline under autograd --------------------------------------------


def _plain_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rules: ScoreRules, keep: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out (..., H, N, Dv) in q's dtype and lse (..., H, N) in the compute dtype, by autograd."""
    out, lse, _, _ = _pipeline(q, k, v, rules, keep)
    return out, lse


def _pipeline(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rules: ScoreRules, keep: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The straight-line pipeline in torch ops: out, lse, probs (..., H, N, M) before dropout,
    and the softcap's tanh (or None). ``"math"`` runs it under autograd; ``ManualAttention``
    runs it without a graph and keeps probs and tanh for its backward."""
    dtype, compute = q.dtype, rules.compute
    q, k, v = (t.to(compute) for t in (q, k, v))
    s, capped = scores.scores_forward(q, k, rules)  # (..., H, N, M)
    probs, lse = scores.softmax_forward(s, rules.sinks)
    weights = probs if keep is None else probs * keep / (1.0 - rules.dropout_p)
    out = scores.pv(weights, v, rules.group)  # (..., H, N, M) @ (..., H_kv, M, Dv)
    return out.to(dtype), lse, probs, capped


# -- the manual backend: the hand-derived backward --------------------------------------------


class ManualAttention(torch.autograd.Function):
    """Attention whose backward is derived by hand, the math of the NumPy core's backward.

    ``apply(q, k, v, bias, slopes, sinks, rules, keep) -> (out, lse)``, with the call prepared
    by ``rules.prepare``: ``bias`` the float mask, ``slopes`` ALiBi's slopes and ``sinks`` the
    sink logits as ``rules`` holds them (each gets a gradient when it requires one), ``rules``
    the rest of the call, ``keep`` the dropout keep-mask or None.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
        slopes: torch.Tensor | None,
        sinks: torch.Tensor | None,
        rules: ScoreRules,
        keep: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rules = rules._replace(bias=bias, slopes=slopes, sinks=sinks)
        out, lse, probs, capped = _pipeline(q, k, v, rules, keep)
        ctx.save_for_backward(q, k, v, probs, lse, capped, keep, bias, slopes, sinks)
        ctx.rules = rules
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: torch.Tensor, dlse: torch.Tensor | None) -> tuple[Any, ...]:
        """Gradients of q, k, v, the float mask, the ALiBi slopes and the sinks.

        Forward: S1 = Q K^T * scale; S2 = c * tanh(S1 / c); S = S2 - slope * |p_i - j| + A,
        -inf where hidden; P = exp(S - lse), lse = log(sum_j exp(S_j) + exp(s)); P' = P * keep
        / (1 - p); O = P' V. Walking it back:
        dV = P'^T dO (summed over each GQA group);  dP' = dO V^T;  dP = dP' * keep / (1 - p);
        dS = P * (dP - rowsum(dP * P)) + dlse * P;
        dsink = sum over rows of P_sink * (dlse - rowsum(dP * P)), P_sink = exp(s - lse);
        dA = dS (summed to A's shape);  dslope = -sum(dS * |p_i - j|);
        dS1 = dS * (1 - tanh^2(S1 / c));  dQ = dS1 K * scale;  dK = dS1^T Q * scale (summed
        over each GQA group). Hidden entries have P = 0, so dS = 0 there, and a row with
        nothing to attend to gets gradient 0 (with a sink, its lse is the sink logit: dlse
        flows to the sink alone). Derivation: docs/derivations/attention.md, softcap.md,
        alibi.md, windows.md, gqa.md, sinks.md, lse.md.
        """
        q_in, k_in, v_in, probs, lse, capped, keep, bias, slopes, sinks = ctx.saved_tensors
        rules: ScoreRules = ctx.rules
        compute, group = rules.compute, rules.group
        q, k, v, dout = (t.to(compute) for t in (q_in, k_in, v_in, dout))
        rescale = 1.0 / (1.0 - rules.dropout_p)

        weights = probs if keep is None else probs * keep * rescale
        dweights, dv = scores.pv_backward(dout, weights, v, group)  # forward: O = P' V
        dprobs = dweights if keep is None else dweights * keep * rescale
        row_dot = (dprobs * probs).sum(dim=-1, keepdim=True)  # rowsum(dP * P), (..., H, N, 1)
        dscores = probs * (dprobs - row_dot)
        dlse_rows = None if dlse is None else dlse.to(compute)[..., None]  # (..., H, N, 1)
        if dlse_rows is not None:
            dscores = dscores + dlse_rows * probs  # forward: lse = log(sum_j exp(S_j) + ...)
        dsinks = None
        if ctx.needs_input_grad[5]:
            sink_probs = torch.exp(sinks - lse[..., None])  # P_sink, (..., H, N, 1)
            upstream = -row_dot if dlse_rows is None else dlse_rows - row_dot
            dsinks = (sink_probs * upstream).sum_to_size(sinks.shape)
        dbias = dscores.sum_to_size(bias.shape) if ctx.needs_input_grad[3] else None
        dslopes = None
        if ctx.needs_input_grad[4]:
            rows = torch.arange(rules.n, device=q.device)[:, None]
            cols = torch.arange(rules.m, device=q.device)[None, :]
            dslopes = -(dscores * scores.distance(rules, rows, cols)).sum_to_size(slopes.shape)
        if capped is not None:
            dscores = dscores * (1 - capped * capped)  # forward: S2 = c * tanh(S1 / c)
        dq, dk = scores.qk_backward(dscores, q, k, group)  # forward: S1 = Q K^T * scale
        return (
            (dq * rules.scale).to(q_in.dtype),
            (dk * rules.scale).to(k_in.dtype),
            dv.to(v_in.dtype),
            dbias,
            dslopes,
            dsinks,
            None,
            None,
        )


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
