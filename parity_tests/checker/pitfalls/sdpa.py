"""Broken kernels with the signature of ``F.scaled_dot_product_attention``, one classic mistake
each: those of the tutorials this project's layers are drawn from (docs/pitfalls.md), GQA's, and
a temperature a percent off that only the bias statistic sees in bfloat16. Each differs from the
checker's plain baseline (``golden.attention_baseline.plain_attention``, built from
``attention_scores`` and ``masked_softmax``) in one step only.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width.

Tests: tests/checker/pitfalls/test_sdpa.py
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..battery.attention.quick import pick
from ..golden.attention_baseline import attention_scores, expand_kv, masked_softmax, plain_attention
from ..specs.sdpa import SPEC
from . import Pitfall


def kv_from_query(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Keys and values built from the query projection (a tutorial's bug): key = value = query."""
    key, value = _kv(query, key, value, enable_gqa)
    return _plain(query, query, query, attn_mask, dropout_p, is_causal, scale)


def scale_by_d(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Default scale 1 / D instead of 1 / sqrt(D)."""
    key, value = _kv(query, key, value, enable_gqa)
    scale = 1.0 / query.shape[-1] if scale is None else scale
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale)


def scale_by_dv(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Default scale 1 / sqrt(Dv), read from the values' width, instead of 1 / sqrt(D): right
    whenever Dv == D, which is why the battery has Dv != D cases with the default scale."""
    key, value = _kv(query, key, value, enable_gqa)
    scale = 1.0 / math.sqrt(value.shape[-1]) if scale is None else scale
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale)


def ignores_scale(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """A given ``scale`` dropped: always 1 / sqrt(D)."""
    key, value = _kv(query, key, value, enable_gqa)
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, None)


def returns_float64(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Computed in float64 for accuracy, and the cast back to the inputs' dtype forgotten: the
    values are better than the baseline's, the dtype is wrong (the next layer gets float64)."""
    key, value = _kv(query, key, value, enable_gqa)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.double()
    query, key, value = query.double(), key.double(), value.double()
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale)


def clobbers_inputs(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Right answer, then the inputs reused as scratch space: q zeroed and k filled with NaN in
    place (through ``.data``, so that autograd's version check does not notice)."""
    given_query, given_key = query, key
    key, value = _kv(query, key, value, enable_gqa)
    out = _plain(query.clone(), key.clone(), value, attn_mask, dropout_p, is_causal, scale)
    given_query.data.zero_()
    given_key.data.fill_(math.nan)
    return out


def causal_off_by_one(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Causal mask from triu(ones, diagonal=0) instead of diagonal=1: query i no longer sees
    itself, and row 0 sees nothing."""
    key, value = _kv(query, key, value, enable_gqa)
    if is_causal:
        n, m = query.shape[-2], key.shape[-2]
        attn_mask = ~torch.ones(n, m, dtype=torch.bool, device=query.device).triu(diagonal=0)
    return _plain(query, key, value, attn_mask, dropout_p, False, scale)


def mask_inverted(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """A bool mask read as True = masked (nn.MultiheadAttention's convention) instead of SDPA's."""
    key, value = _kv(query, key, value, enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = ~attn_mask
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale)


def softmax_wrong_axis(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Softmax over the queries (dim=-2) instead of the keys."""
    key, value = _kv(query, key, value, enable_gqa)
    probs = torch.softmax(attention_scores(query, key, attn_mask, is_causal, scale), dim=-2)
    return _dropout(probs, dropout_p) @ value  # (B, H, N, M) @ (B, H, M, Dv) -> (B, H, N, Dv)


def dropout_not_rescaled(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Dropout keeps weights without the 1 / (1 - p) rescale, so the expected output shrinks."""
    key, value = _kv(query, key, value, enable_gqa)
    probs = masked_softmax(_scores(query, key, attn_mask, is_causal, scale)).to(query.dtype)
    if dropout_p:
        probs = probs * (torch.rand(probs.shape, device=probs.device) >= dropout_p)
    return probs @ value  # (B, H, N, M) @ (B, H, M, Dv) -> (B, H, N, Dv)


def assumes_equal_lengths(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Cross-attention that assumes the keys have the queries' length N (a tutorial's bug): it
    reads only the first N keys and values."""
    key, value = _kv(query, key, value, enable_gqa)
    n = query.shape[-2]
    if attn_mask is not None:
        attn_mask = attn_mask[..., :n]
    key, value = key[..., :n, :], value[..., :n, :]  # (B, H, M, D) -> (B, H, min(N, M), D)
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale)


def mask_before_scale(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """A float mask added before the scaling, so the bias is scaled too."""
    key, value = _kv(query, key, value, enable_gqa)
    if attn_mask is None or attn_mask.dtype == torch.bool:
        return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    wide = torch.promote_types(query.dtype, torch.float32)  # a mask added as kernels add it
    scores = ((query @ key.transpose(-2, -1)).to(wide) + attn_mask.to(wide)) * scale  # (B,H,N,M)
    return _dropout(masked_softmax(scores).to(query.dtype), dropout_p) @ value


def no_max_shift(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Softmax as exp(s) / sum(exp(s)) without subtracting the row max: overflows on large logits
    and gives 0 / 0 on fully masked rows."""
    key, value = _kv(query, key, value, enable_gqa)
    exps = attention_scores(query, key, attn_mask, is_causal, scale).exp()
    probs = exps / exps.sum(dim=-1, keepdim=True)
    return _dropout(probs, dropout_p) @ value  # (B, H, N, M) @ (B, H, M, Dv) -> (B, H, N, Dv)


def nan_on_dead_rows(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """A plain softmax with no care for fully masked rows: NaN there, as nn.MultiheadAttention
    with need_weights=True gives."""
    key, value = _kv(query, key, value, enable_gqa)
    probs = torch.softmax(attention_scores(query, key, attn_mask, is_causal, scale), dim=-1)
    return _dropout(probs, dropout_p) @ value  # (B, H, N, M) @ (B, H, M, Dv) -> (B, H, N, Dv)


class _NoRowsum(torch.autograd.Function):
    """O = P' V with P' given; a hand-written backward whose softmax gradient lacks a term."""

    @staticmethod
    def forward(ctx: Any, query, key, value, weights, scale):
        ctx.save_for_backward(query, key, value, weights)
        ctx.scale = scale
        return weights @ value  # (B, H, N, M) @ (B, H, M, Dv) -> (B, H, N, Dv)

    @staticmethod
    def backward(ctx: Any, dout):
        """dV = P^T dO; dP = dO V^T; dS = P * dP (wrong: the correct one is
        P * (dP - rowsum(dP * P))); dQ = dS K * scale; dK = dS^T Q * scale."""
        query, key, value, weights = ctx.saved_tensors
        dv = weights.transpose(-2, -1) @ dout  # (B, H, M, N) @ (B, H, N, Dv) -> (B, H, M, Dv)
        dscores = weights * (dout @ value.transpose(-2, -1))  # (B, H, N, M)
        dq = (dscores @ key) * ctx.scale  # (B, H, N, M) @ (B, H, M, D) -> (B, H, N, D)
        dk = (dscores.transpose(-2, -1) @ query) * ctx.scale  # (B, H, M, N) @ (B, H, N, D)
        return dq, dk, dv, None, None


def backward_without_rowsum(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """A hand-written backward whose softmax gradient misses the rowsum term."""
    key, value = _kv(query, key, value, enable_gqa)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    with torch.no_grad():
        probs = masked_softmax(_scores(query, key, attn_mask, is_causal, scale)).to(query.dtype)
    return _NoRowsum.apply(query, key, value, _dropout(probs, dropout_p), scale)


def temperature_1pct(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Scores 1% too hot (scale * 1.01, as a mis-rounded constant or a folded log2(e) would
    give): a small error everywhere, under the max bound of bfloat16 on most cases, which only
    the bias statistic sees there."""
    key, value = _kv(query, key, value, enable_gqa)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale * 1.01)


# -- corners of 2025-2026: rows shifted far below zero, broadcast keys ----------------------------

FAR_NEGATIVE = -1e4  # the row max below which far_negative_as_masked takes a row for dead


def far_negative_as_masked(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """A row whose largest score is finite but far below zero (at most ``FAR_NEGATIVE``) taken
    for a fully masked row and given zeros: the test a kernel makes when its masked scores are
    a finite sentinel rather than -inf (FlashInfer #4450, #4451). Softmax does not see a shift
    of a whole row: a float mask adding -1e5 to a row leaves its answer what it was."""
    key, value = _kv(query, key, value, enable_gqa)
    scores = attention_scores(query, key, attn_mask, is_causal, scale, mask_in_float32=True)
    dead = scores.amax(dim=-1, keepdim=True) <= FAR_NEGATIVE  # (B, H, N, 1)
    probs = masked_softmax(scores).masked_fill(dead, 0.0).to(query.dtype)
    return _dropout(probs, dropout_p) @ value  # (B, H, N, M) @ (B, H, M, Dv) -> (B, H, N, Dv)


def broadcast_kv_1mod32(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Keys and values given as stride-0 views (``expand`` over heads or batch) take a path that
    loads keys in blocks of 32 and, when M = 32 k + 1, loads the last block's one key from the
    start of the block before it: its score and value are those of key M - 33. Right on
    materialized keys and at every other M (PyTorch #191937: SDPA's efficient kernel on stride-0
    k and v at key lengths 1 mod 32, error 19.5)."""
    m = key.shape[-2]
    if m % 32 == 1 and m > 32 and _broadcast(key, value):
        key, value = (torch.cat([t[..., :-1, :], t[..., -33:-32, :]], dim=-2) for t in (key, value))
    key, value = _kv(query, key, value, enable_gqa)
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale)


def _broadcast(*tensors: torch.Tensor) -> bool:
    """Whether each tensor has a stride-0 axis of size > 1 among its leading axes."""
    return all(
        any(
            stride == 0 and size > 1
            for size, stride in zip(t.shape[:-2], t.stride()[:-2], strict=True)
        )
        for t in tensors
    )


# -- GQA (SDPA's signature with enable_gqa) -------------------------------------------------------


def gqa_head_modulo(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):  # fmt: skip
    """Query head h reads kv head h % H_kv (``repeat``) instead of h // (H / H_kv)
    (``repeat_interleave``): right only when H_kv = 1 or H_kv = H."""
    if enable_gqa:
        group = query.shape[-3] // key.shape[-3]
        key, value = key.repeat(1, group, 1, 1), value.repeat(1, group, 1, 1)
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale)


def gqa_no_group_sum(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, enable_gqa=False):  # fmt: skip
    """A right forward whose dK and dV take only the first query head of each group instead of
    the sum over the group (the others read a detached copy)."""
    if enable_gqa:
        group = query.shape[-3] // key.shape[-3]
        key, value = (_first_of_group_only(t, group) for t in (key, value))
    return _plain(query, key, value, attn_mask, dropout_p, is_causal, scale)


def _first_of_group_only(t: torch.Tensor, group: int) -> torch.Tensor:
    """(B, H_kv, M, W) -> (B, H, M, W), gradient flowing from the first head of a group only."""
    copies = [t if i == 0 else t.detach() for i in range(group)]
    return torch.stack(copies, dim=2).flatten(1, 2)  # (B, H_kv, g, M, W) -> (B, H, M, W)


def _plain(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``plain_attention`` adding a float mask in float32 (at least), as SDPA and every fused
    kernel do: a pitfall is its one mistake, not also float16's loss of a row shifted by
    -65,504 (eager attention's, finding 7 of docs/kernel-verification.md), which would flag it
    on the shifted cases for a reason not its own."""
    return plain_attention(*args, mask_in_float32=True, **kwargs)


def _scores(*args: Any) -> torch.Tensor:
    """``attention_scores`` with a float mask added in float32 (at least), as ``_plain``."""
    return attention_scores(*args, mask_in_float32=True)


def _kv(query, key, value, enable_gqa: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value with one head per query head: right GQA (h // (H / H_kv), autograd sums
    the group), for the pitfalls whose mistake is elsewhere."""
    if not enable_gqa:
        return key, value
    return expand_kv(key, query.shape[-3]), expand_kv(value, query.shape[-3])


def _dropout(probs: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """Correct inverted dropout from torch's generator, for the pitfalls whose bug is elsewhere."""
    if not dropout_p:
        return probs
    keep = torch.rand(probs.shape, device=probs.device) >= dropout_p
    return probs * keep * (1.0 / (1.0 - dropout_p))


def _on(teeth: str) -> str:
    """The case of the quick battery (and default) for ``quick.TEETH[teeth]``."""
    return pick(SPEC, teeth)


PITFALLS: dict[str, Pitfall] = {
    "kv_from_query": Pitfall(kv_from_query, _on("plain"), "out"),
    "scale_by_d": Pitfall(scale_by_d, _on("n<m"), "out"),
    "scale_by_dv": Pitfall(scale_by_dv, _on("dv != d"), "out"),
    "ignores_scale": Pitfall(ignores_scale, _on("scale"), "out"),
    # In float64 its result is right: a mistake only for the other dtypes.
    "returns_float64": Pitfall(
        returns_float64, _on("n<m"), "out", dtypes=("float32", "float16", "bfloat16")
    ),
    "clobbers_inputs": Pitfall(clobbers_inputs, _on("n<m"), "q"),
    "causal_off_by_one": Pitfall(causal_off_by_one, _on("causal n<m"), "out"),
    "mask_inverted": Pitfall(mask_inverted, _on("bool mask"), "out"),
    "softmax_wrong_axis": Pitfall(softmax_wrong_axis, _on("n<m"), "out"),
    "backward_without_rowsum": Pitfall(backward_without_rowsum, _on("n<m"), "dq"),
    "dropout_not_rescaled": Pitfall(dropout_not_rescaled, _on("dropout"), "out"),
    "assumes_equal_lengths": Pitfall(assumes_equal_lengths, _on("n<m"), "out"),
    "mask_before_scale": Pitfall(mask_before_scale, _on("float mask"), "out"),
    "no_max_shift": Pitfall(no_max_shift, _on("dead rows"), "out"),
    "nan_on_dead_rows": Pitfall(nan_on_dead_rows, _on("dead rows"), "out"),
    "temperature_1pct": Pitfall(temperature_1pct, _on("plain, long"), "dq"),
    "far_negative_as_masked": Pitfall(far_negative_as_masked, _on("shifted"), "out"),
    "broadcast_kv_1mod32": Pitfall(broadcast_kv_1mod32, _on("broadcast 1 mod 32"), "out"),
    "gqa_head_modulo": Pitfall(gqa_head_modulo, _on("gqa"), "out"),
    "gqa_no_group_sum": Pitfall(gqa_no_group_sum, _on("gqa"), "dk"),
}
