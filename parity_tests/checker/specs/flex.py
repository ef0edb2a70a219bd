"""The "flex" spec: FlexAttention's ``flex_attention(query, key, value, score_mod=None,
block_mask=None, scale=None, enable_gqa=False, return_lse=False)``, lse asked for as the
installed torch does (``return_aux`` in torch 2.13); (B, H, N, D); the alignment the checker's
mask says.

The checker builds ``score_mod`` (softcap, ALiBi, the finite part of a float mask) and
``block_mask`` (causal, the window, a bool mask, the -inf entries of a float mask) with the
installed torch's ``create_block_mask`` (``flex_mods``), and passes only the keywords that
differ from the signature's defaults. On CPU FlexAttention has no backward: a forward-only
check passes tensors that do not require grad.

Shape legend: B batch, H heads, N query length, M key/value length, D head width.

Tests: tests/checker/specs/test_attention.py, tests/checker/test_spec.py (every claim's coverage)
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..battery.attention.case import Case
from ._attention import AttentionSpec
from .sdpa import CORE


class FlexSpec(AttentionSpec):
    name = "flex"
    signature = (
        "flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, "
        "enable_gqa=False, return_lse=False)"
    )
    features = frozenset({"mask", "causal", "window", "softcap", "alibi", "gqa", "lse", "dv"})
    factor_names = (*CORE, "align", "mask", "window", "softcap", "alibi")
    align = None

    def invoke(self, kernel: Callable[..., Any], case: Case, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, given: dict[str, torch.Tensor], want_lse: bool, *,
               deterministic: bool = False) -> Any:  # fmt: skip
        kwargs = flex_mods(case, given.get("attn_mask"), given.get("alibi_slopes"), q.device)
        if case.scale is not None:
            kwargs["scale"] = case.scale
        if case.kv_heads != case.heads:
            kwargs["enable_gqa"] = True
        if want_lse:
            kwargs.update(_flex_lse_request())
        with warnings.catch_warnings():
            # Eager FlexAttention warns on every new shape that it runs unfused: known, and what
            # a forward-only check of it on CPU means.
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch")
            return kernel(q, k, v, **kwargs)


SPEC = FlexSpec()


@functools.cache
def _flex_module() -> Any:
    from torch.nn.attention import flex_attention

    return flex_attention


def _flex_lse_request() -> dict[str, Any]:
    """How the installed torch's ``flex_attention`` is asked for lse."""
    module = _flex_module()
    if "return_aux" in inspect.signature(module.flex_attention).parameters:
        return {"return_aux": module.AuxRequest(lse=True)}
    return {"return_lse": True}


def flex_mods(
    case: Case, attn_mask: torch.Tensor | None, slopes: torch.Tensor | None, device: torch.device
) -> dict[str, Any]:
    """``score_mod`` and ``block_mask`` expressing ``case`` for FlexAttention (only those needed).

    score_mod: softcap, then ALiBi ``- slope * |p_i - j|``, then the finite part of a float mask.
    block_mask (``create_block_mask``): causal and the window on p_i, a bool mask, and the -inf
    entries of a float mask (hidden, as the golden hides them).
    """
    b, h, n, m = case.batch, case.heads, case.n, case.m
    offset = m - n if case.align == "bottom-right" else 0
    bias = allowed = None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask.expand(b, h, n, m)
    elif attn_mask is not None:
        allowed = ~torch.isneginf(attn_mask).expand(b, h, n, m)
        bias = torch.where(allowed, attn_mask.expand(b, h, n, m), 0.0)
    rates = None
    if slopes is not None:  # float32 numbers, kept in float64: the bias is formed in float64
        # and rounded to float32 or the scores' dtype if wider (formed in float32, a float64
        # kernel's -slope * |p_i - j| carried 1e-8 of rounding: the float64 calibration)
        rates = (slopes.expand(b, h) if slopes.ndim == 1 else slopes).double()
    cap = case.softcap
    left, right = case.window if case.window is not None else (None, None)
    if case.causal:
        right = 0 if right is None else min(right, 0)
    result: dict[str, Any] = {}
    if cap or rates is not None or bias is not None:

        def score_mod(score: Any, bi: Any, hi: Any, row: Any, col: Any) -> Any:
            if cap:
                score = cap * torch.tanh(score / cap)
            if rates is not None:
                at_least_float32 = torch.promote_types(score.dtype, torch.float32)
                score = score - (rates[bi, hi] * (row + offset - col).abs()).to(at_least_float32)
            if bias is not None:
                score = score + bias[bi, hi, row, col]
            return score

        result["score_mod"] = score_mod
    if allowed is not None or left is not None or right is not None:

        def mask_mod(bi: Any, hi: Any, row: Any, col: Any) -> Any:
            seen = col >= 0  # all True, in the index's type
            if left is not None:
                seen = seen & (col >= row + offset - left)
            if right is not None:
                seen = seen & (col <= row + offset + right)
            if allowed is not None:
                seen = seen & allowed[bi, hi, row, col]
            return seen

        per_head = allowed is not None
        result["block_mask"] = _flex_module().create_block_mask(
            mask_mod, b if per_head else None, h if per_head else None, n, m, device=device
        )
    return result
