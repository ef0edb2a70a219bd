"""Correct kernels behind the serving specs' signatures, over the torch twin
(``torch_attention.decode.serving``): the built-in targets of "flashinfer_paged",
"vllm_paged" and "flashinfer_merge", and the shape of a user's adapter.

- ``flashinfer_wrapper(kv_layout)``: the twin's ``PagedPrefillWrapper`` for that layout, with
  FlashInfer's ``plan``/``run``. A user's CUDA FlashInfer is judged through the same factory:
  ``lambda layout: flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, layout)``, the
  CSR arrays moved to the device FlashInfer wants them on (docs/kernel-verification.md).
- ``vllm_attention``: the "vllm_paged" signature over the twin's ``vllm_paged`` (the metadata's
  fields read by name; ``sliding_window`` vLLM's count of keys, window_left + 1).
- ``merge``: FlashInfer's ``merge_state`` (four arguments) and ``merge_states`` (two), the
  twin's.
- ``plain_flashinfer_wrapper``, ``plain_vllm_attention``, ``plain_merge``: the same signatures
  over the plain computations of ``golden.serving_baseline`` instead of the twin, which is the
  bounds' baseline: correct kernels whose rounding is their own (the calibration's test of the
  bounds).

Shape legend: T query tokens, H query heads, H_kv key/value heads, D head width, S states.

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

from typing import Any

import torch

from torch_attention.decode import serving

from ..golden.serving_baseline import PlainWrapper, plain_merge_call, plain_vllm


def flashinfer_wrapper(kv_layout: str) -> Any:
    """The twin's FlashInfer wrapper for ``kv_layout``."""
    return serving.PagedPrefillWrapper(None, kv_layout)


def vllm_attention(query, key, value, kv_cache, attn_metadata, *, sliding_window=None,
                   logits_soft_cap=None, sinks=None) -> torch.Tensor:  # fmt: skip
    """vLLM's paged backend computed by the twin: writes key, value at the metadata's slots,
    then attends."""
    m = attn_metadata
    return serving.vllm_paged(
        query, key, value, kv_cache, query_start_loc=m.query_start_loc, seq_lens=m.seq_lens,
        block_table=m.block_table, slot_mapping=m.slot_mapping, softmax_scale=m.scale,
        causal=m.causal, window_left=-1 if sliding_window is None else sliding_window - 1,
        softcap=logits_soft_cap or 0.0, sinks=sinks,
        common_prefix_len=m.common_prefix_len if m.use_cascade else 0,
    )  # fmt: skip


def merge(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``merge_state(v_a, s_a, v_b, s_b)`` or ``merge_states(v, s)``, by the count of
    arguments."""
    if len(args) == 4:
        return serving.merge_state(*args)
    return serving.merge_states(*args)


def plain_flashinfer_wrapper(kv_layout: str) -> Any:
    """FlashInfer's plan/run over the plain computation (``golden.serving_baseline``), not the
    twin: a correct kernel whose rounding is its own."""
    return PlainWrapper(kv_layout)


def plain_vllm_attention(query, key, value, kv_cache, attn_metadata, *, sliding_window=None,
                         logits_soft_cap=None, sinks=None) -> torch.Tensor:  # fmt: skip
    """vLLM's call over the plain computation."""
    return plain_vllm(query, key, value, kv_cache, attn_metadata, sliding_window,
                      logits_soft_cap, sinks)  # fmt: skip


def plain_merge(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's merges over the plain merge."""
    return plain_merge_call(args)
