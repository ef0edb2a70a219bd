"""Decoding over a KV cache in torch, the twin of ``numpy_attention.decode``: flash-attn's
``flash_attn_with_kvcache`` (``kvcache_attention``), the kernel checker's built-in correct decode
target, and the caches a layer decodes over.

- ``paged.py``: ``kvcache_attention``, the decode call over a contiguous cache or pages;
- ``checks.py``: its arguments checked on tensors, the rest by the pure-Python checker both
  twins share (``numpy_attention.decode.arguments``);
- ``pages.py``: where a token lives in a pool of pages, and which pages each sequence holds;
- ``cache.py``: a layer's KV cache, contiguous (``KVCache``) or in pages (``PagedKVCache``);
- ``prefill.py``: ``paged_prefill`` (ragged queries of many sequences over pages) and
  ``cascade_prefill`` (the same split at a shared prefix);
- ``serving.py``: FlashInfer's CSR page tables, base-2 merge and ``PagedPrefillWrapper``, vLLM's
  metadata and slot mapping; their refusals are ``numpy_attention.decode.serving_arguments``'s.

Derivation: docs/decoding.md.
Tests: tests/torch_attention/decode/ (one test file per module, test_X.py for X.py).
"""

from .cache import KVCache, PagedKVCache
from .paged import KVCacheOutput, kvcache_attention
from .prefill import PrefillOutput, cascade_prefill, paged_prefill
from .serving import (
    PagedPrefillWrapper,
    csr_block_table,
    flashinfer_paged,
    merge_state,
    merge_states,
    vllm_paged,
)

__all__ = [
    "KVCache",
    "KVCacheOutput",
    "PagedKVCache",
    "PagedPrefillWrapper",
    "PrefillOutput",
    "cascade_prefill",
    "csr_block_table",
    "flashinfer_paged",
    "kvcache_attention",
    "merge_state",
    "merge_states",
    "paged_prefill",
    "vllm_paged",
]
