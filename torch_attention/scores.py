"""The score pipeline of attention in torch, written once for the "math" and "manual" backends.

The twin of ``numpy_attention.scores``: every option of an attention call is checked once here
(``prepare``, before any work, with the NumPy core's messages), and each rule of the pipeline is
written once: the "math" backend differentiates it by autograd, the "manual" backend runs it
without a graph and walks it back by hand, and the "flex" backend calls the same position rules
from FlexAttention's ``score_mod`` and ``mask_mod``.

1. ``S = Q K^T * scale``. With GQA, query head h reads kv head ``h // group``, group =
   H // H_kv: q is viewed as (..., H_kv, group, N, D) against k (..., H_kv, 1, M, D), so K and V
   are never repeated (``qk``, ``pv`` and their gradients).
2. ``softcap > 0``: ``S = softcap * tanh(S / softcap)``.
3. ALiBi: ``S -= slope_h * |p_i - j|``, with p_i = i + offset query i's position on the key axis
   (offset 0 for ``align="top-left"``, M - N for ``"bottom-right"``).
4. A float ``attn_mask`` is added.
5. Visibility: every hidden score is *replaced* by -inf (never added to, so a NaN or inf at a
   hidden key cannot leak into any row): the band ``p_i - left <= j <= p_i + right`` of causal
   (right = 0) and ``window``, a bool ``attn_mask``, ``key_padding_mask``, and the -inf entries
   of a float ``attn_mask``.
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

import math
from typing import Any, NamedTuple

import torch

from . import masks, validation

ALIGNS = ("top-left", "bottom-right")


class AttentionOutput(NamedTuple):
    """``attention(..., return_lse=True)``: the output and the log-sum-exp of each row.

    out: (..., H, N, Dv) in the inputs' dtype. lse: (..., H, N), natural log, the sink's term
    included, in the compute dtype (float32 for half inputs): -inf for a row with nothing to
    attend to, the sink logit with sinks.
    """

    out: torch.Tensor
    lse: torch.Tensor


class ScoreRules(NamedTuple):
    """Every option of one attention call, checked, in the form the backends read.

    ``allowed`` holds the tensor masks only; causal and windows are a band of positions
    (``left``, ``right``, ``offset``), kept apart so that SDPA can use its own causal mask and
    FlexAttention its ``mask_mod``. Tensors broadcast against the scores (..., H, N, M).
    """

    n: int
    m: int
    group: int  # query heads per kv head (1 without GQA)
    scale: float
    softcap: float  # 0.0: off
    slopes: torch.Tensor | None  # ALiBi, (H, 1, 1) or (B, 1, ..., H, 1, 1), compute dtype
    bias: torch.Tensor | None  # float attn_mask, compute dtype, 0 where it was -inf
    allowed: torch.Tensor | None  # bool "may attend": bool attn_mask, padding, float -inf
    left: int | None  # the band of visible keys: p_i - left <= j <= p_i + right,
    right: int | None  # None = unbounded on that side; causal makes right <= 0
    offset: int  # p_i = i + offset
    sinks: torch.Tensor | None  # (H, 1, 1), compute dtype
    dropout_p: float
    keep: torch.Tensor | None  # explicit dropout keep-mask, broadcasting to (..., H, N, M)
    compute: torch.dtype  # float32 for half inputs, else the inputs' dtype

    def visible(self, device: torch.device) -> torch.Tensor | None:
        """Bool "may attend" of every rule, broadcasting to (..., N, M); None if all visible."""
        rows = torch.arange(self.n, device=device)[:, None]  # (N, 1)
        cols = torch.arange(self.m, device=device)[None, :]  # (1, M)
        return masks.combine(self.allowed, band(self, rows, cols))


class Inputs(NamedTuple):
    """q, k, v checked (in their own dtype), with the rules of the call."""

    q: torch.Tensor  # (..., H, N, D)
    k: torch.Tensor  # (..., H_kv, M, D)
    v: torch.Tensor  # (..., H_kv, M, Dv)
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
    window: Any = None,
    align: Any = "top-left",
    key_padding_mask: Any = None,
    attn_mask: Any = None,
    scale: Any = None,
    softcap: Any = 0.0,
    alibi_slopes: Any = None,
    sinks: Any = None,
    enable_gqa: Any = False,
    dropout_p: Any = 0.0,
    dropout_mask: Any = None,
) -> Inputs:
    """Check q, k, v and every option (before any work) and build the rules of the call.

    Raises ``TypeError``/``ValueError`` naming the argument and the shapes involved, with the
    messages of ``numpy_attention.scores.prepare``.
    """
    q, k, v = (validation.float_tensor(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    dtype = validation.same_dtype(q=q, k=k, v=v)
    compute = compute_dtype(dtype)
    group = _check_shapes(q, k, v, validation.flag("enable_gqa", enable_gqa))
    lead, n, m, d = tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1]
    score_shape = lead + (n, m)
    device = q.device

    causal = validation.flag("causal", causal)
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {ALIGNS}, got {align!r}")
    left, right = validation.window(window)
    if causal:
        right = 0 if right is None else min(right, 0)

    bias, allowed, padded_rows = None, [], None
    if attn_mask is not None:
        bool_mask, float_mask = masks.split_attn_mask(attn_mask, score_shape, compute, device)
        allowed.append(bool_mask)
        if float_mask is not None:
            hidden = float_mask == float("-inf")  # -inf in a float mask hides: replace, not add
            bias = float_mask.masked_fill(hidden, 0.0)
            allowed.append(~hidden)
    if key_padding_mask is not None:
        padding = masks.key_padding_allowed(key_padding_mask, tuple(q.shape), m, device)
        allowed.append(padding)
        padded_rows = ~padding[..., 0, :, None]  # (B, 1, .., 1, M) -> (B, 1, .., M, 1)

    p = validation.dropout_p(dropout_p)
    keep = None
    if dropout_mask is not None:
        keep = validation.keep_mask("dropout_mask", dropout_mask, p, score_shape, device)

    if d == 0:
        raise ValueError(
            f"q and k have head width D = 0 (q {tuple(q.shape)}): nothing to attend with"
        )
    scale_value = 1.0 / math.sqrt(d) if scale is None else validation.finite_real("scale", scale)
    cap = validation.finite_real("softcap", softcap)
    if cap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = off), got {softcap}")
    sinks = _check_sinks(sinks, lead, dtype, compute, device)
    slopes = _check_slopes(alibi_slopes, lead, compute, device)
    if padded_rows is not None:  # every check passed: the first work
        k, v = _unread(k, padded_rows), _unread(v, padded_rows)
    rules = ScoreRules(
        n=n,
        m=m,
        group=group,
        scale=scale_value,
        softcap=cap,
        slopes=slopes,
        bias=bias,
        allowed=masks.combine(*allowed),
        left=left,
        right=right,
        offset=m - n if align == "bottom-right" else 0,
        sinks=sinks,
        dropout_p=p,
        keep=keep,
        compute=compute,
    )
    return Inputs(q, k, v, rules)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> int:
    """The number of query heads per kv head; ``ValueError`` naming the shapes otherwise."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must have at least 2 axes (..., length, width), got {tuple(t.shape)}"
            )
    qs, ks, vs = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    if qs[-1] != ks[-1]:
        raise ValueError(f"q and k must share the head width D, got q {qs} and k {ks}")
    if ks[:-1] != vs[:-1]:
        raise ValueError(
            f"k and v must share their leading axes and the key length M, got k {ks} and v {vs}"
        )
    if qs[:-2] == ks[:-2]:
        return 1
    if not enable_gqa:
        raise ValueError(
            f"q, k and v must share their leading axes, got q {qs}, k {ks}, v {vs}; k and v "
            f"with fewer heads (GQA/MQA) need enable_gqa=True"
        )
    if q.ndim < 3 or q.ndim != k.ndim or qs[:-3] != ks[:-3]:
        raise ValueError(
            f"with enable_gqa, q (..., H, N, D) and k, v (..., H_kv, M, D) differ only in the "
            f"heads axis -3, got q {qs} and k {ks}"
        )
    heads, kv_heads = qs[-3], ks[-3]
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(
            f"the query heads H = {heads} must be a multiple of the kv heads H_kv = {kv_heads} "
            f"(q {qs}, k {ks})"
        )
    return heads // kv_heads


def _check_slopes(
    slopes: Any, lead: tuple[int, ...], compute: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """ALiBi slopes (H,) or (B, H), shaped to broadcast on the scores: (H, 1, 1), or
    (B, 1, ..., 1, H, 1, 1) against q's leading axes (B, ..., H)."""
    if slopes is None:
        return None
    slopes = validation.float_tensor("alibi_slopes", slopes)
    shape = tuple(slopes.shape)
    if len(lead) < 1 or slopes.ndim not in (1, 2) or shape[-1] != lead[-1]:
        raise ValueError(
            f"alibi_slopes must be (H,) or (B, H) with H = the heads axis of q (..., H, N, D); "
            f"got alibi_slopes {shape} for q leading axes {lead}"
        )
    if slopes.ndim == 2 and (len(lead) < 2 or shape[0] != lead[0]):
        raise ValueError(
            f"alibi_slopes (B, H) = {shape} needs q (B, ..., H, N, D) with that B; "
            f"got q leading axes {lead}"
        )
    if not bool(torch.isfinite(slopes).all()):
        raise ValueError(f"alibi_slopes must be finite (None for no ALiBi), got {slopes}")
    if slopes.ndim == 2:
        slopes = slopes.reshape(shape[:1] + (1,) * (len(lead) - 2) + shape[1:])
    return slopes.to(device=device, dtype=compute)[..., None, None]


def _check_sinks(
    sinks: Any, lead: tuple[int, ...], dtype: torch.dtype, compute: torch.dtype, device: Any
) -> torch.Tensor | None:
    """Sink logits (H,), one per query head, shaped (H, 1, 1) to broadcast on the scores."""
    if sinks is None:
        return None
    sinks = validation.float_tensor("sinks", sinks)
    if len(lead) < 1 or tuple(sinks.shape) != lead[-1:]:
        raise ValueError(
            f"sinks must be (H,), one logit per query head of q (..., H, N, D); got sinks "
            f"{tuple(sinks.shape)} for q leading axes {lead}"
        )
    if sinks.dtype != dtype:
        raise TypeError(f"sinks must have the dtype of q, k and v ({dtype}), got {sinks.dtype}")
    if not bool(torch.isfinite(sinks).all()):
        raise ValueError(f"sinks must be finite logits (None for no sinks), got {sinks}")
    return sinks.to(device=device, dtype=compute)[:, None, None]


def _unread(t: torch.Tensor, padded: torch.Tensor) -> torch.Tensor:
    """``t`` (k or v, (..., M, W)) with its padded rows set to 0: never read.

    Padding is hidden from every query, so its scores are replaced, but the products P V (and
    dS K in the backward) would still multiply its rows by exact zeros, and IEEE makes
    0 x NaN = NaN: garbage in padding (an unwritten cache slot) would reach every row. Zeroing
    the rows changes nothing else (their weights and gradients are 0); it is done whatever the
    rows hold, a copy of k and v instead of a host sync to look for garbage first.
    """
    return t.masked_fill(padded, 0.0)


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


def band(rules: ScoreRules, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor | None:
    """Causal and window: True where ``p_i - left <= j <= p_i + right`` for query ``rows`` and
    key ``cols`` (index tensors that broadcast); None when both sides are unbounded."""
    ahead = cols - (rows + rules.offset)  # j - p_i
    visible = None
    if rules.right is not None:
        visible = ahead <= rules.right
    if rules.left is not None:
        behind = ahead >= -rules.left
        visible = behind if visible is None else visible & behind
    return visible


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
