"""The score pipeline of attention in torch, written once for the "math" and "manual" backends.

The twin of ``numpy_attention.scores``: every option of an attention call is checked once, by
``rules.prepare`` (before any work, with the NumPy core's messages), and each rule of the
pipeline is written once here: the "math" backend differentiates it by autograd, the "manual"
backend runs it without a graph and walks it back by hand, and the "flex" backend calls the same
position rules from FlexAttention's ``score_mod`` and ``mask_mod``.

1. ``S = Q K^T * scale``. With GQA, query head h reads kv head ``h // group``, group =
   H // H_kv: q is viewed as (..., H_kv, group, N, D) against k (..., H_kv, 1, M, D), so K and V
   are never repeated (``qk``, ``pv`` and their gradients).
2. ``softcap > 0``: ``S = softcap * tanh(S / softcap)``.
3. ALiBi: ``S -= slope_h * |p_i - j|``, with p_i = i + offset query i's position on the key axis
   (offset 0 for ``align="top-left"``, M - N for ``"bottom-right"``).
4. A float ``attn_mask`` is added.
5. Visibility: every hidden score is *replaced* by -inf (never added to, so a NaN or inf at a
   hidden key cannot leak into any row): the band ``p_i - left <= j <= p_i + right`` of causal
   (right = 0) and ``window``, chunks (``(j - s) // C == (p_i - s) // C``), a bool
   ``attn_mask``, ``key_padding_mask``, and the -inf entries of a float ``attn_mask``.
6. The softmax of each row with the sink's logit in its denominator and the natural-log
   log-sum-exp of the row: a row with nothing to attend to gets probabilities 0 and lse -inf
   (with a sink: lse = the sink logit); a NaN in a visible score makes its row NaN.
7. Dropout, then ``O = P' V`` (in ``functional``).

Shape legend: B batch, H query heads, H_kv key/value heads, N query length, M key length, D head
width, Dv value head width; "..." any leading axes of q, the last of them the heads axis H.

Derivation: docs/derivations/attention.md (the pipeline), softmax.md, softcap.md, alibi.md,
windows.md, gqa.md, sinks.md, lse.md. Tests: tests/torch_attention/test_scores.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from . import masks
from .rules import ScoreRules


class AttentionOutput(NamedTuple):
    """``attention(..., return_lse=True)``: the output and the log-sum-exp of each row.

    out: (..., H, N, Dv) in the inputs' dtype. lse: (..., H, N), natural log, the sink's term
    included, in the compute dtype (float32 for half inputs): -inf for a row with nothing to
    attend to, the sink logit with sinks.
    """

    out: torch.Tensor
    lse: torch.Tensor


# -- GQA: query heads grouped by the kv head they read (steps 1 and 7, and their gradients) ---


def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    """(..., H, L, W) -> (..., H_kv, group, L, W): query head h = (h // group, h % group)."""
    return x if group == 1 else x.unflatten(-3, (-1, group))


def _kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """(..., H_kv, M, W) -> (..., H_kv, 1, M, W), broadcasting over each group."""
    return x if group == 1 else x.unsqueeze(-3)


def _ungrouped(x: torch.Tensor, group: int) -> torch.Tensor:
    """(..., H_kv, group, L, W) -> (..., H, L, W)."""
    return x if group == 1 else x.flatten(-4, -3)


def _group_sum(x: torch.Tensor, group: int) -> torch.Tensor:
    """(..., H_kv, group, L, W) -> (..., H_kv, L, W): a kv head's gradient sums its group's."""
    return x if group == 1 else x.sum(dim=-3)


def qk(q: torch.Tensor, k: torch.Tensor, group: int) -> torch.Tensor:
    """Q K^T: q (..., H, N, D), k (..., H_kv, M, D) -> (..., H, N, M)."""
    return _ungrouped(_grouped(q, group) @ _kv(k, group).transpose(-2, -1), group)


def pv(probs: torch.Tensor, v: torch.Tensor, group: int) -> torch.Tensor:
    """P V: probs (..., H, N, M), v (..., H_kv, M, Dv) -> (..., H, N, Dv)."""
    return _ungrouped(_grouped(probs, group) @ _kv(v, group), group)


def pv_backward(
    dout: torch.Tensor, probs: torch.Tensor, v: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """O = P V  ->  dP = dO V^T (..., H, N, M);  dV = P^T dO summed over each group."""
    dprobs = _ungrouped(_grouped(dout, group) @ _kv(v, group).transpose(-2, -1), group)
    dv = _group_sum(_grouped(probs, group).transpose(-2, -1) @ _grouped(dout, group), group)
    return dprobs, dv


def qk_backward(
    dscores: torch.Tensor, q: torch.Tensor, k: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """S = Q K^T  ->  dQ = dS K (..., H, N, D);  dK = dS^T Q summed over each group."""
    dq = _ungrouped(_grouped(dscores, group) @ _kv(k, group), group)
    dk = _group_sum(_grouped(dscores, group).transpose(-2, -1) @ _grouped(q, group), group)
    return dq, dk


# -- the rules on positions (one place, read by every backend) --------------------------------


def band(
    rules: ScoreRules, rows: torch.Tensor, cols: torch.Tensor, start: Any = None
) -> torch.Tensor | None:
    """Causal, window and chunks: True where ``p_i - left <= j <= p_i + right`` and, with
    chunks of C counted from s, ``(j - s) // C == (p_i - s) // C``, for query ``rows`` and key
    ``cols`` (index tensors that broadcast); None when nothing is hidden. ``start`` is s where
    the caller indexes ``rules.chunk_start`` itself (FlexAttention's ``mask_mod``); by default
    the full-rank ``rules.chunk_start`` (or 0)."""
    ahead = cols - (rows + rules.offset)  # j - p_i
    visible = None
    if rules.right is not None:
        visible = ahead <= rules.right
    if rules.left is not None:
        behind = ahead >= -rules.left
        visible = behind if visible is None else visible & behind
    if rules.chunk is not None:
        if start is None:
            start = 0 if rules.chunk_start is None else rules.chunk_start
        key_chunk = torch.div(cols - start, rules.chunk, rounding_mode="floor")
        query_chunk = torch.div(rows + rules.offset - start, rules.chunk, rounding_mode="floor")
        same = key_chunk == query_chunk
        visible = same if visible is None else visible & same
    return visible


def visible(rules: ScoreRules, device: torch.device) -> torch.Tensor | None:
    """Bool "may attend" of every rule (the tensor masks and the band), broadcasting to
    (..., N, M); None if every score is visible."""
    rows = torch.arange(rules.n, device=device)[:, None]  # (N, 1)
    cols = torch.arange(rules.m, device=device)[None, :]  # (1, M)
    return masks.combine(rules.allowed, band(rules, rows, cols))


def distance(rules: ScoreRules, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """ALiBi's |p_i - j| for query ``rows`` and key ``cols``, in the compute dtype."""
    return (rows + rules.offset - cols).abs().to(rules.compute)


def cap(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    """Step 2, the softcap: softcap * tanh(S / softcap); S itself when softcap is 0."""
    return scores if not softcap else softcap * torch.tanh(scores / softcap)


# -- the pipeline -----------------------------------------------------------------------------


def scores_forward(
    q: torch.Tensor, k: torch.Tensor, rules: ScoreRules
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Steps 1-5: the scores S (..., H, N, M) of q (..., H, N, D) and k (..., H_kv, M, D), in
    the compute dtype, and ``tanh(S1 / softcap)`` for the softcap's backward (None without).

    Differentiable by autograd (the "math" backend).
    """
    scores = qk(q, k, rules.group) * rules.scale  # S1, (..., H, N, M)
    capped = None
    if rules.softcap:
        capped = torch.tanh(scores / rules.softcap)
        scores = rules.softcap * capped
    rows = torch.arange(rules.n, device=q.device)[:, None]  # (N, 1)
    cols = torch.arange(rules.m, device=q.device)[None, :]  # (1, M)
    if rules.slopes is not None:
        scores = scores - rules.slopes * distance(rules, rows, cols)
    if rules.bias is not None:
        scores = scores + rules.bias
    visible = masks.combine(rules.allowed, band(rules, rows, cols))
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores, capped


def softmax_forward(
    scores: torch.Tensor, sinks: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 6: P = exp(S - lse) over the last axis, lse = log(sum_j exp(S_j) + exp(sink)).

    The shift is the row max (the sink included), or 0 for a row that is all -inf (also when
    M = 0): shifting by -inf would give -inf - (-inf) = NaN. Such a row gets P = 0 and lse =
    -inf (with a sink: the sink logit, its whole weight on the sink), and autograd gives it
    gradient 0 (the shift needs none: softmax is shift-invariant). A NaN in a row, or a +inf
    (exp(inf - inf) = NaN), makes the whole row NaN.

    Args:
        scores: (..., M).
        sinks: a sink logit broadcasting to (..., 1), or None.

    Returns:
        probs (..., M) and lse (...,).
    """
    shift = _row_max(scores.detach())  # (..., 1)
    if sinks is not None:
        shift = torch.maximum(shift, sinks.detach())
    shift = shift.masked_fill(shift == float("-inf"), 0.0)
    exps = (scores - shift).exp()
    total = exps.sum(dim=-1, keepdim=True)  # (..., 1)
    if sinks is not None:
        total = total + (sinks - shift).exp()  # the sink's term: a logit with no value
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
