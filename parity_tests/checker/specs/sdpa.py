"""The "sdpa" spec: ``F.scaled_dot_product_attention(query, key, value, attn_mask=None,
dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)``; (B, H, N, D); causal top-left.

The checker always passes ``attn_mask``, ``dropout_p``, ``is_causal`` and ``scale`` (None, 0.0,
False and None where the case has none: the arguments every SDPA-compatible kernel takes), and
``enable_gqa=True`` only to cases with fewer key/value heads. Its dropout is judged through the
keep-mask read back (``running.dropout.read_keep_mask``): the kernel must draw it from torch's
generator, as SDPA does.

Shape legend: B batch, H heads, N query length, D head width.

Tests: tests/checker/specs/test_attention.py, tests/checker/test_spec.py (every claim's coverage)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..battery.attention.case import Case
from ._attention import AttentionSpec

CORE = ("lengths", "causal", "gqa", "dv", "scale", "inputs", "logits", "memory")


class SdpaSpec(AttentionSpec):
    name = "sdpa"
    signature = (
        "F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, "
        "is_causal=False, scale=None, enable_gqa=False)"
    )
    features = frozenset({"mask", "causal", "dropout", "gqa", "dv"})
    factor_names = (*CORE, "mask", "dropout")
    align = "top-left"
    dropout = "readback"
    quick_teeth = ("plain", "plain, long", "n<m", "causal n<m", "bool mask", "float mask",
                   "dead rows", "scale", "dv != d", "dropout", "gqa", "shifted",
                   "broadcast 1 mod 32")  # fmt: skip

    def allowed(self, row: Mapping[str, str]) -> bool:
        if row.get("causal") == "on" and row.get("mask") not in (None, "none"):
            return False  # SDPA takes attn_mask or is_causal, not both
        return super().allowed(row)

    def cannot_express_options(self, case: Case) -> str | None:
        if case.mask != "none" and case.causal:
            return "SDPA takes attn_mask or is_causal, not both"
        if case.window is not None or case.softcap or case.alibi != "none":
            return "SDPA's signature has no window, softcap or ALiBi"
        return None

    def invoke(self, kernel: Callable[..., Any], case: Case, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, given: dict[str, torch.Tensor], want_lse: bool, *,
               deterministic: bool = False) -> Any:  # fmt: skip
        kwargs: dict[str, Any] = {
            "attn_mask": given.get("attn_mask"),
            "dropout_p": case.dropout_p,
            "is_causal": case.causal,
            "scale": case.scale,
        }
        if case.kv_heads != case.heads:
            kwargs["enable_gqa"] = True
        return kernel(q, k, v, **kwargs)


SPEC = SdpaSpec()
