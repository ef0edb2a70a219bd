"""Merging two partial attentions over disjoint key sets into the attention over their union.

Attention over keys A u B, row by row, is a weighted mean of the attention over A and over B,
with weights from their log-sum-exps (the math of split-KV decoding and of ring attention):

    lse = log(exp(lse_a) + exp(lse_b));  w_a = exp(lse_a - lse);  w_b = exp(lse_b - lse)
    out = w_a * out_a + w_b * out_b

A part with nothing to attend to (lse -inf, out 0) gets weight 0; two of them merge into a dead
row (out 0, lse -inf). Sinks are exactly a merge with a state of lse = the sink logit and out 0.
The result's lse feeds the next merge, so merges nest; their backward needs the gradient of lse,
and ``attention_backward(dout, ctx, dlse)`` takes it.

Shape legend: "..." leading axes (B, H), N query length, Dv value head width.

Derivation: docs/derivations/merge.md. Tests: tests/numpy_attention/test_merge.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import validation
from .grad_mode import is_grad_enabled


class MergeCtx(NamedTuple):
    out_a: np.ndarray  # (..., N, Dv), compute dtype
    out_b: np.ndarray
    out: np.ndarray  # the merged output, compute dtype
    weight_a: np.ndarray  # (..., N, 1): w_a = exp(lse_a - lse)
    weight_b: np.ndarray
    dtype: np.dtype  # the outputs' dtype
    lse_dtype: np.dtype


class MergeOutput(NamedTuple):
    """out (..., N, Dv) in the outputs' dtype, lse (..., N), ctx (None under ``no_grad()``)."""

    out: np.ndarray
    lse: np.ndarray
    ctx: MergeCtx | None


class MergeGrads(NamedTuple):
    dout_a: np.ndarray
    dlse_a: np.ndarray
    dout_b: np.ndarray
    dlse_b: np.ndarray


def merge_attention_forward(
    out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray, lse_b: np.ndarray
) -> MergeOutput:
    """The attention over the union of two disjoint key sets, from the attentions over each.

    lse = logaddexp(lse_a, lse_b);  w_a = exp(lse_a - lse), w_b = exp(lse_b - lse) (0 where
    lse = -inf);  out = w_a * out_a + w_b * out_b.

    Args:
        out_a: (..., N, Dv), attention over key set A.
        lse_a: (..., N), its log-sum-exp (natural log; -inf for a row with nothing to see).
        out_b: (..., N, Dv), attention over key set B, same shape and dtype as out_a.
        lse_b: (..., N), its log-sum-exp, same dtype as lse_a.

    Returns:
        ``MergeOutput(out, lse, ctx)``: out in the outputs' dtype (computed in float32 for
        float16), lse in the lse dtype.
    """
    out_a, out_b = validation.float_array("out_a", out_a), validation.float_array("out_b", out_b)
    lse_a, lse_b = validation.float_array("lse_a", lse_a), validation.float_array("lse_b", lse_b)
    dtype = validation.same_dtype(out_a=out_a, out_b=out_b)
    lse_dtype = validation.same_dtype(lse_a=lse_a, lse_b=lse_b)
    if out_a.ndim < 1 or out_a.shape != out_b.shape:
        raise ValueError(
            f"out_a and out_b must share one shape, got {out_a.shape} and {out_b.shape}"
        )
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        if lse.shape != out_a.shape[:-1]:
            raise ValueError(
                f"{name} must be (..., N) = {out_a.shape[:-1]} for outputs {out_a.shape}, "
                f"got {lse.shape}"
            )
    compute = np.result_type(np.float32, dtype, lse_dtype)
    out_a, out_b, lse_a, lse_b = (
        t.astype(compute, copy=False) for t in (out_a, out_b, lse_a, lse_b)
    )

    lse = np.logaddexp(lse_a, lse_b)  # (..., N); -inf only when both are
    dead = np.isneginf(lse)
    with np.errstate(invalid="ignore"):  # -inf - (-inf) on dead rows, replaced just below
        weight_a = np.where(dead, 0, np.exp(lse_a - lse))[..., None]  # (..., N, 1)
        weight_b = np.where(dead, 0, np.exp(lse_b - lse))[..., None]
    out = weight_a * out_a + weight_b * out_b  # (..., N, Dv)
    ctx = MergeCtx(out_a, out_b, out, weight_a, weight_b, dtype, lse_dtype)
    return MergeOutput(
        out.astype(dtype, copy=False),
        lse.astype(lse_dtype, copy=False),
        ctx if is_grad_enabled() else None,
    )


def merge_attention_backward(
    dout: np.ndarray, dlse: np.ndarray | None, ctx: MergeCtx
) -> MergeGrads:
    """Gradients of both parts, given the merged output's and lse's.

    dout_a = w_a * dout;  dlse_a = w_a * (dlse + rowsum(dout * (out_a - out)));  likewise b.
    (d w_a / d lse_a = w_a * w_b and out_a - out = w_b * (out_a - out_b): the weights' chain.)
    Derivation: docs/derivations/merge.md.

    Args:
        dout: (..., N, Dv) gradient of the merged output.
        dlse: (..., N) gradient of the merged lse, or None for 0.
        ctx: from ``merge_attention_forward``.

    Returns:
        ``MergeGrads(dout_a, dlse_a, dout_b, dlse_b)``, outputs' and lse's dtypes.
    """
    if not isinstance(ctx, MergeCtx):
        raise TypeError(
            "merge_attention_backward needs the ctx of a forward run outside no_grad(), "
            f"got {type(ctx).__name__}"
        )
    out_a, out_b, out, weight_a, weight_b, dtype, lse_dtype = ctx
    dout = validation.grad_output(dout, out.shape, out.dtype)
    upstream = np.zeros(out.shape[:-1], out.dtype) if dlse is None else dlse
    upstream = validation.grad_output(upstream, out.shape[:-1], out.dtype, name="dlse")[..., None]
    grads = []
    for weight, part in ((weight_a, out_a), (weight_b, out_b)):
        dpart = weight * dout  # forward: out = w_a * out_a + w_b * out_b
        dlse_part = weight * (upstream + (dout * (part - out)).sum(axis=-1, keepdims=True))
        grads += [dpart.astype(dtype, copy=False), dlse_part[..., 0].astype(lse_dtype, copy=False)]
    return MergeGrads(*grads)
