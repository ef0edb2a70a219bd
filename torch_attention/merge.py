"""Merging two partial attentions over disjoint key sets into the attention over their union.

The torch twin of ``numpy_attention.merge``, differentiable by autograd. Attention over keys
A u B, row by row, is a weighted mean of the attentions over A and over B, with weights from
their log-sum-exps (the math of split-KV decoding and of ring attention,
``torch_attention.distributed``):

    lse = log(exp(lse_a) + exp(lse_b));  w_a = exp(lse_a - lse);  w_b = exp(lse_b - lse)
    out = w_a * out_a + w_b * out_b

A part with nothing to attend to (lse -inf, out 0) gets weight 0; two of them merge into a dead
row (out 0, lse -inf) whose gradients are 0, never NaN. The result's lse feeds the next merge,
so merges nest, and autograd carries the lse gradient through every level.

Shape legend: "..." leading axes (B, H), N query length, Dv value head width.

Derivation: docs/derivations/merge.md. Tests: tests/torch_attention/test_merge.py.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import validation


class MergeOutput(NamedTuple):
    """out (..., N, Dv) in the outputs' dtype, lse (..., N) in the lse dtype."""

    out: torch.Tensor
    lse: torch.Tensor


def merge_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> MergeOutput:
    """The attention over the union of two disjoint key sets, from the attentions over each.

    lse = logaddexp(lse_a, lse_b);  w_a = exp(lse_a - lse), w_b = exp(lse_b - lse) (0 where
    lse = -inf);  out = w_a * out_a + w_b * out_b. Autograd gives the backward of
    docs/derivations/merge.md: dout_a = w_a * dout, dlse_a = w_a * (dlse + rowsum(dout *
    (out_a - out))), likewise b.

    Args:
        out_a: (..., N, Dv), attention over key set A.
        lse_a: (..., N), its log-sum-exp (natural log; -inf for a row with nothing to see).
        out_b: (..., N, Dv), attention over key set B, same shape and dtype as out_a.
        lse_b: (..., N), its log-sum-exp, same dtype as lse_a.

    Returns:
        ``MergeOutput(out, lse)``: out in the outputs' dtype (computed in float32 at least, so
        float16 and bfloat16 are rounded once), lse in the lse dtype.
    """
    out_a, out_b = validation.float_tensor("out_a", out_a), validation.float_tensor("out_b", out_b)
    lse_a, lse_b = validation.float_tensor("lse_a", lse_a), validation.float_tensor("lse_b", lse_b)
    dtype = validation.same_dtype(out_a=out_a, out_b=out_b)
    lse_dtype = validation.same_dtype(lse_a=lse_a, lse_b=lse_b)
    if out_a.ndim < 1 or out_a.shape != out_b.shape:
        raise ValueError(
            f"out_a and out_b must share one shape, got {tuple(out_a.shape)} and "
            f"{tuple(out_b.shape)}"
        )
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        if lse.shape != out_a.shape[:-1]:
            raise ValueError(
                f"{name} must be (..., N) = {tuple(out_a.shape[:-1])} for outputs "
                f"{tuple(out_a.shape)}, got {tuple(lse.shape)}"
            )
    compute = torch.promote_types(torch.promote_types(torch.float32, dtype), lse_dtype)
    out_a, out_b, lse_a, lse_b = (t.to(compute) for t in (out_a, out_b, lse_a, lse_b))

    # A row dead on both sides would compute -inf - (-inf) = NaN in the weights, and autograd
    # would carry that NaN into the gradients even where the weight is then replaced by 0; its
    # lse are set to 0 first (a finite stand-in whose gradient masked_fill drops).
    dead = torch.isneginf(lse_a) & torch.isneginf(lse_b)  # (..., N)
    lse_a, lse_b = lse_a.masked_fill(dead, 0.0), lse_b.masked_fill(dead, 0.0)
    lse = torch.logaddexp(lse_a, lse_b)  # (..., N); -inf only on dead rows, set below
    weight_a = (lse_a - lse).exp().masked_fill(dead, 0.0)[..., None]  # (..., N, 1)
    weight_b = (lse_b - lse).exp().masked_fill(dead, 0.0)[..., None]
    out = weight_a * out_a + weight_b * out_b  # (..., N, Dv)
    lse = lse.masked_fill(dead, float("-inf"))
    return MergeOutput(out.to(dtype), lse.to(lse_dtype))
