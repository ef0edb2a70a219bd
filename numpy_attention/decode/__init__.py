"""Decoding over a KV cache: flash-attn's ``flash_attn_with_kvcache`` as the reference of the
decode kernels, and the caches a layer decodes over.

- ``paged.py``: ``kvcache_attention_forward``, the decode call over a contiguous cache or pages;
- ``checks.py``: its arguments checked on arrays; ``arguments.py``: the refusals of the decode
  contract in pure Python, the one checker the torch twin calls too;
- ``pages.py``: where a token lives in a pool of pages, and which pages each sequence holds;
- ``cache.py``: a layer's KV cache, contiguous (``KVCache``) or in pages (``PagedKVCache``).

Derivation: docs/decoding.md.
Tests: tests/numpy_attention/decode/ (one test file per module, test_X.py for X.py).
"""

from .cache import KVCache, PagedKVCache
from .paged import KVCacheOutput, kvcache_attention_forward

__all__ = ["KVCache", "KVCacheOutput", "PagedKVCache", "kvcache_attention_forward"]
