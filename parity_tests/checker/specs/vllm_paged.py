"""The "vllm_paged" spec: vLLM's paged attention backend as its model runner calls it,
``kernel(query, key, value, kv_cache, attn_metadata, *, sliding_window=None,
logits_soft_cap=None, sinks=None) -> output``: query (T, H, D) the batch's query tokens packed,
key and value (T, H_kv, D) their new keys and values, which the kernel writes into ``kv_cache``
(2, num_blocks, P, H_kv, D) at ``attn_metadata.slot_mapping`` before it attends (vLLM's
``reshape_and_cache``); then each sequence's queries attend its ``seq_lens[b]`` keys through its
row of ``block_table`` (int32, padded with 0: block 0 is the null block no sequence owns),
bottom-right causal; the scale 1 / sqrt(D) (``attn_metadata.scale``). ``attn_metadata`` is a
``VllmMetadata`` (the fields of vLLM's FlashAttentionMetadata the call reads: num_actual_tokens,
max_query_len, query_start_loc, max_seq_len, seq_lens, block_table, slot_mapping, causal,
use_cascade, common_prefix_len, scale). ``sliding_window`` is vLLM's: the keys a query sees,
itself included (window_left + 1). With ``use_cascade``, the first ``common_prefix_len`` keys
are the same pages in every row, which a kernel may attend once for all sequences and merge
(vLLM's cascade attention): the answer is the same.

Its factors: the batch, causal, GQA, window, softcap, sinks, cascade, pages of 16 (vLLM's
smallest for its flash backend), 64, 128, 144 and 256 tokens, and the values. Its features:
``causal``, ``gqa``, ``window``, ``softcap``, ``sinks`` and ``cascade``; no lse (vLLM's
backend returns the output only). Judged: the output and the cache after the call.

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..battery.serving import BATCHES, VALUES, PagedCase
from ._serving import PagedSpec, on

FEATURE_FACTORS = {name: name for name in ("causal", "gqa", "window", "softcap", "sinks",
                                           "cascade")}  # fmt: skip


@dataclass
class VllmMetadata:
    """The fields of vLLM's attention metadata a paged call reads."""

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor  # (B + 1,) int32
    max_seq_len: int
    seq_lens: torch.Tensor  # (B,) int32, keys per sequence, its new tokens included
    block_table: torch.Tensor  # (B, max blocks) int32, 0-padded
    slot_mapping: torch.Tensor  # (T,) int64: block * P + offset of each new token
    causal: bool = True
    use_cascade: bool = False
    common_prefix_len: int = 0
    scale: float = 1.0


class VllmPagedSpec(PagedSpec):
    name = "vllm_paged"
    signature = ("kernel(query, key, value, kv_cache, attn_metadata, *, sliding_window=None, "
                 "logits_soft_cap=None, sinks=None)")  # fmt: skip
    features = frozenset(FEATURE_FACTORS)
    factors = {
        "batch": BATCHES,
        **{name: ("off", "on") for name in FEATURE_FACTORS},
        "page": ("16", "64", "128", "144", "256"),
        "values": VALUES,
    }
    feature_factors = FEATURE_FACTORS
    judged_everywhere = frozenset()
    constrained = ("window", "cascade")

    def allowed(self, row: Mapping[str, str]) -> bool:
        """A window beside a shared prefix is not a cascade vLLM runs (it turns cascade off)."""
        return not (row.get("window") == "on" and row.get("cascade") == "on")

    def values_of(self, case: Any) -> dict[str, str]:
        return {**self.paged_values(case), "cascade": "on" if case.prefix else "off"}

    def case_of(self, row: Mapping[str, str], d: int) -> PagedCase:
        prefix = 2 * int(row["page"]) if on(row["cascade"]) else 0
        return self.paged_case(row, d, prefix=prefix)

    def call(self, kernel: Callable[..., Any], case: PagedCase, given: dict[str, torch.Tensor],
             want_lse: bool, options: Mapping[str, Any]) -> Any:  # fmt: skip
        given["kv_cache"] = torch.stack([given["k_pages"], given["v_pages"]])
        metadata = VllmMetadata(
            num_actual_tokens=case.tokens, max_query_len=max(case.q_lens),
            query_start_loc=given["query_start_loc"], max_seq_len=max(case.kv_lens),
            seq_lens=given["seq_lens"], block_table=given["block_table"],
            slot_mapping=given["slot_mapping"], causal=case.causal,
            use_cascade=bool(case.prefix), common_prefix_len=case.prefix,
            scale=1.0 / math.sqrt(case.d),
        )  # fmt: skip
        options_: dict[str, Any] = {}
        if case.window >= 0:
            options_["sliding_window"] = case.window + 1
        if case.softcap:
            options_["logits_soft_cap"] = case.softcap
        if case.sinks:
            options_["sinks"] = given["sinks"]
        return kernel(given["q"], given["key"], given["value"], given["kv_cache"], metadata,
                      **options_)  # fmt: skip

    def results(self, case: PagedCase, result: Any, given: dict[str, torch.Tensor],
                want_lse: bool) -> dict:  # fmt: skip
        cache = given["kv_cache"]
        return {"out": (result, (case.tokens, case.heads, case.dv)),
                "kv_cache": (cache, tuple(cache.shape))}  # fmt: skip

    def targets(self, device: Any, dtypes: tuple[str, ...]) -> list[Any]:
        from ..targets.builtin import Target
        from ..targets.serving import plain_vllm_attention, vllm_attention

        return [Target("vllm_attention", vllm_attention, dtypes, self.name),
                Target("plain_vllm_attention", plain_vllm_attention, dtypes, self.name)]


SPEC = VllmPagedSpec()
