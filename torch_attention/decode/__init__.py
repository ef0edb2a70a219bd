"""Decoding over a KV cache in torch, the twin of ``numpy_attention.decode``: flash-attn's
``flash_attn_with_kvcache`` (``kvcache_attention``), the kernel checker's built-in correct decode
target, and the caches a layer decodes over.

- ``paged.py``: ``kvcache_attention``, the decode call over a contiguous cache or pages;
- ``checks.py``: its arguments checked on tensors, the rest by the pure-Python checker both
  twins share (``numpy_attention.decode.arguments``);
- ``pages.py``: where a token lives in a pool of pages, and which pages each sequence holds;
- ``cache.py``: a layer's KV cache, contiguous (``KVCache``) or in pages (``PagedKVCache``).

Derivation: docs/decoding.md.
Tests: tests/torch_attention/decode/ (one test file per module, test_X.py for X.py).
"""

from .cache import KVCache, PagedKVCache
from .paged import KVCacheOutput, kvcache_attention

__all__ = ["KVCache", "KVCacheOutput", "PagedKVCache", "kvcache_attention"]
