"""Broken kernels with the "vllm_paged" spec's signature, one mistake each: ``plain_vllm`` is vLLM's
write-then-attend over the plain computation of ``golden.serving_baseline.plain_paged``,
correct but for its mistake.

Shape legend: T query tokens, H_kv key/value heads, D head width, P page size.

Tests: tests/checker/pitfalls/test_init.py, tests/checker/specs/test_serving.py
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..golden.serving_baseline import plain_vllm
from . import Pitfall

SPEC = "vllm_paged"


def _pitfall(name: str, mistake: str, doc: str) -> Callable[..., torch.Tensor]:
    """The spec's signature over ``_vllm`` with ``mistake``, named ``name``."""

    def kernel(query, key, value, kv_cache, attn_metadata, *, sliding_window=None,
               logits_soft_cap=None, sinks=None):  # fmt: skip
        return plain_vllm(query, key, value, kv_cache, attn_metadata, sliding_window,
                     logits_soft_cap, sinks, mistake)  # fmt: skip

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc
    return kernel


vllm_attends_before_write = _pitfall(
    "vllm_attends_before_write", "write_after",
    "Attends before writing the new tokens: the queries read the slots' old numbers.")
vllm_skips_cache_write = _pitfall(
    "vllm_skips_cache_write", "no_write",
    "Never writes the new tokens into the cache (attends its old numbers).")
vllm_table_stride = _pitfall(
    "vllm_table_stride", "table_stride",
    "The block table's rows read with the stride of the most pages a sequence needs, not the "
    "table's width: every sequence but the first reads other pages (FlashInfer #4270).")
vllm_causal_top_left = _pitfall(
    "vllm_causal_top_left", "top_left",
    "Causal aligned top-left per sequence: wrong for chunks and decode steps.")
vllm_prefix_top_left = _pitfall(
    "vllm_prefix_top_left", "prefix_top_left",
    "The cascade's shared prefix attended causally top-left (query i sees its first i + 1 keys) "
    "where every query sees all of it.")
vllm_far_logits_masked = _pitfall(
    "vllm_far_logits_masked", "far_masked",
    "Finite scores below -3000 read as masked (FlashInfer #4450).")
vllm_sink_dropped = _pitfall(
    "vllm_sink_dropped", "no_sink", "The sinks left out of the denominator.")


_MIXED = "vllm-mixed-p16-h4-4-d64"
PITFALLS = {
    "vllm_attends_before_write": Pitfall(vllm_attends_before_write, _MIXED, "out", SPEC),
    "vllm_skips_cache_write": Pitfall(vllm_skips_cache_write, _MIXED, "kv_cache", SPEC),
    "vllm_table_stride": Pitfall(vllm_table_stride, _MIXED, "out", SPEC),
    "vllm_causal_top_left": Pitfall(
        vllm_causal_top_left, "vllm-mixed-p144-h8-2-d64-causal-window-softcap-sinks", "out", SPEC),
    "vllm_prefix_top_left": Pitfall(
        vllm_prefix_top_left, "vllm-mixed-p128-h4-4-d64-sinks-shifted-cascade", "out", SPEC),
    "vllm_far_logits_masked": Pitfall(vllm_far_logits_masked, "vllm-mixed-p64-h4-4-d64-shifted",
                                      "out", SPEC),
    "vllm_sink_dropped": Pitfall(
        vllm_sink_dropped, "vllm-mixed-p144-h8-2-d64-causal-window-softcap-sinks", "out", SPEC),
}
