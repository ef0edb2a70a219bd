"""Decoding over a KV cache: flash-attn's ``flash_attn_with_kvcache`` as the reference of the
decode kernels, and the caches a layer decodes over.

- ``paged.py``: ``kvcache_attention_forward``, the decode call over a contiguous cache or pages;
- ``checks.py``: its arguments checked on arrays; ``arguments.py``: the refusals of the decode
  contract in pure Python, the one checker the torch twin calls too;
- ``pages.py``: where a token lives in a pool of pages, and which pages each sequence holds;
- ``cache.py``: a layer's KV cache, contiguous (``KVCache``) or in pages (``PagedKVCache``);
- ``prefill.py``: ``paged_prefill_forward``, ragged queries of many sequences over pages (chunked
  prefill, mixed with decodes), and ``cascade_prefill_forward``, the same split at a shared prefix;
- ``serving.py``: FlashInfer's CSR page tables and base-2 merge, vLLM's metadata and slot
  mapping, over ``prefill.py``; ``serving_arguments.py``: their refusals in pure Python, shared
  with the torch twin.

Derivation: docs/decoding.md.
Tests: tests/numpy_attention/decode/ (one test file per module, test_X.py for X.py).
"""

from .cache import KVCache, PagedKVCache
from .paged import KVCacheOutput, kvcache_attention_forward
from .prefill import PrefillOutput, cascade_prefill_forward, paged_prefill_forward
from .serving import (
    csr_block_table,
    flashinfer_paged_forward,
    merge_state,
    merge_states,
    vllm_paged_forward,
)

__all__ = [
    "KVCache",
    "KVCacheOutput",
    "PagedKVCache",
    "PrefillOutput",
    "cascade_prefill_forward",
    "csr_block_table",
    "flashinfer_paged_forward",
    "kvcache_attention_forward",
    "merge_state",
    "merge_states",
    "paged_prefill_forward",
    "vllm_paged_forward",
]
