"""The "flash" spec: flash-attn's ``flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None,
causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
return_attn_probs=False)``; (B, N, H, D); causal, windows and ALiBi bottom-right; with
``return_attn_probs=True`` the second item returned is lse (B, H, N).

The checker passes only the keywords that differ from the signature's defaults (a kernel
without, say, a softcap argument still runs the cases that need none); ``window_size`` uses -1
for an unbounded side, and under causal the right side is 0 (what flash-attn sets itself);
ALiBi slopes are float32, as the library requires; ``deterministic=True`` goes to a kernel that
claims the feature "deterministic" (its backward is then run twice and compared bit for bit).
flash-attn returns no dropout mask: its dropout is judged by draws
(``running.dropout.draw_outputs``, ``judge.policy.judge_draws``).

Shape legend: B batch, H heads, N query length, D head width.

Tests: tests/checker/specs/test_attention.py, tests/checker/test_spec.py (every claim's coverage)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..battery.attention.case import Case
from ._attention import AttentionSpec

CORE = ("lengths", "causal", "gqa", "dv", "scale", "inputs", "logits", "memory")
OPTIONS = ("window", "softcap", "alibi")


class FlashSpec(AttentionSpec):
    name = "flash"
    signature = (
        "flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, "
        "window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, "
        "return_attn_probs=False)"
    )
    features = frozenset({"causal", "window", "softcap", "alibi", "gqa", "lse", "dv", "dropout"})
    factor_names = (*CORE, *OPTIONS, "dropout")
    align = "bottom-right"
    dropout = "draws"
    quick_teeth = ("any", "causal n<m", "window", "alibi", "softcap", "softcap with alibi",
                   "alibi under gqa", "kv strides", "padded keys", "last key of a block",
                   "even square", "split causal", "dropout", "outliers",
                   "two row tiles")  # fmt: skip

    def heads_first(self, case: Case) -> bool:
        return False

    def layout(self, case: Case, t: torch.Tensor) -> torch.Tensor:
        return t if case.packed else t.transpose(1, 2)  # (B, H, L, W) -> (B, L, H, W)

    def unlayout(self, case: Case, t: torch.Tensor, heads: int) -> torch.Tensor:
        return t if case.packed else t.transpose(1, 2)  # (B, L, H, W) -> (B, H, L, W)

    def invoke(self, kernel: Callable[..., Any], case: Case, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, given: dict[str, torch.Tensor], want_lse: bool, *,
               deterministic: bool = False) -> Any:  # fmt: skip
        slopes = given.get("alibi_slopes")
        return kernel(q, k, v, **flash_keywords(case, slopes, want_lse, deterministic))

    def split_result(self, result: Any, want_lse: bool) -> tuple[Any, Any]:
        if not want_lse:
            return (result[0] if isinstance(result, (tuple, list)) else result), None
        return super().split_result(result, want_lse)


def flash_keywords(
    case: Case, slopes: torch.Tensor | None, want_lse: bool, deterministic: bool = False
) -> dict[str, Any]:
    """flash-attn's keywords that differ from their defaults. ``window_size`` uses -1 for an
    unbounded side; under causal the right side is 0 (what flash-attn sets itself);
    ``deterministic=True`` for a kernel that claims the feature (its backward, which otherwise
    adds dq's blocks atomically in any order, then promises the same bits every call)."""
    kwargs: dict[str, Any] = {}
    if case.dropout_p:
        kwargs["dropout_p"] = case.dropout_p
    if case.scale is not None:
        kwargs["softmax_scale"] = case.scale
    if case.causal:
        kwargs["causal"] = True
    if case.window is not None:
        left, right = case.window
        right = 0 if case.causal and right is None else right
        kwargs["window_size"] = (-1 if left is None else left, -1 if right is None else right)
    if case.softcap:
        kwargs["softcap"] = case.softcap
    if slopes is not None:
        kwargs["alibi_slopes"] = slopes
    if deterministic:
        kwargs["deterministic"] = True
    if want_lse:
        kwargs["return_attn_probs"] = True
    return kwargs


SPEC = FlashSpec()
