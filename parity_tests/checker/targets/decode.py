"""Correct decode kernels behind the real libraries' signatures: the built-in targets of the
"flash_kvcache" and "flash_mla" specs (``checker.specs._decode``).

- ``flash_attn_with_kvcache``: flash-attn's signature, computed by
  ``torch_attention.decode.kvcache_attention`` (``num_splits`` is a scheduling hint: accepted and
  unused, as a kernel that never splits may).
- ``flash_mla_with_kvcache``: FlashMLA's signature over the same twin: the one latent head of
  the pages as K, its first ``head_dim_v`` coordinates as V (a view, as FlashMLA reads them),
  ``cache_seqlens`` counting the queries' own tokens (no append); the metadata is unused.
- ``hf_paged_eager`` and ``hf_paged_sdpa``: transformers' paged attention
  (``eager_paged_attention_forward``, and ``sdpa_attention_forward`` given a
  ``PagedAttentionCache``) behind flash-attn's signature. The adapter only translates layouts:
  the k and v pages are laid into a ``PagedAttentionCache`` of one layer (page p is its block p
  plus the blocks of its two reserved sectors), the block table becomes its allocator's table,
  its own ``get_read_indices``/``get_write_indices`` and ``build_attention_mask`` give the
  indices and the mask, its own ``cache.update`` writes the new tokens, and the pages are copied
  back afterwards, so the checker sees the pages as flash-attn's kernel leaves them. What
  transformers does not take raises ``KernelUnsupported`` (a skip, with the reason): no rotary
  (models rotate before attention), no leftpad or batch index, no window, softcap or ALiBi on
  this path, no lse, new tokens equal to the queries, causal (or one query, where causal is
  the same). docs/decoding.md records what it showed.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/targets/test_decode.py
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from torch_attention.decode.paged import kvcache_attention

from ..report.rows import KernelUnsupported

# The options of flash_attn_with_kvcache that transformers' paged attention takes.
HF_PAGED_FEATURES = frozenset({"causal", "gqa", "paged", "append", "splits"})


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):  # fmt: skip
    """flash-attn's ``flash_attn_with_kvcache`` computed by ``torch_attention``."""
    result = kvcache_attention(
        q, k_cache, v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, block_table=block_table, softmax_scale=softmax_scale,
        causal=causal, window_size=window_size, softcap=softcap,
        rotary_interleaved=rotary_interleaved, alibi_slopes=alibi_slopes,
        return_lse=return_softmax_lse,
    )  # fmt: skip
    return (result.out, result.lse) if return_softmax_lse else result.out


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits, softmax_scale=None,
                           causal=False):  # fmt: skip
    """FlashMLA's ``flash_mla_with_kvcache`` computed by ``torch_attention``: (out, lse)."""
    result = kvcache_attention(
        q, k_cache, k_cache[..., :head_dim_v], cache_seqlens=cache_seqlens,
        block_table=block_table, softmax_scale=softmax_scale, causal=causal, return_lse=True,
    )  # fmt: skip
    return result.out, result.lse


# -- transformers' paged attention --------------------------------------------------------------


def hf_paged_eager(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                   cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                   block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                   softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                   return_softmax_lse=False):  # fmt: skip
    """transformers' ``eager_paged_attention_forward`` behind flash-attn's signature."""
    from transformers.integrations.eager_paged import eager_paged_attention_forward

    return _hf_paged(eager_paged_attention_forward, locals())


def hf_paged_sdpa(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                  cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                  block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                  softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                  return_softmax_lse=False):  # fmt: skip
    """transformers' ``sdpa_attention_forward`` with a ``PagedAttentionCache``, behind
    flash-attn's signature."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return _hf_paged(sdpa_attention_forward, locals())


def hf_paged_cases() -> tuple[str, ...]:
    """The cases of the flash_kvcache battery built for ``HF_PAGED_FEATURES`` that
    transformers' paged attention takes (``_hf_unsupported``, read from the case): the new
    tokens are the queries, and the queries are causal (or one). A battery's other cases would
    be skipped, and skips would outnumber the judged cases."""
    from ..specs import get

    battery = get("flash_kvcache").battery("default", HF_PAGED_FEATURES)
    return tuple(
        case.name
        for case in battery
        if case.needs <= HF_PAGED_FEATURES
        and case.s_new == case.s_q
        and (case.causal or case.s_q == 1)
    )


def _hf_unsupported(args: dict[str, Any]) -> str | None:
    """What transformers' paged attention cannot take, or None."""
    q, k = args["q"], args["k"]
    if args["rotary_cos"] is not None:
        return "rotary: transformers rotates q and k in the model, before attention"
    if args["cache_leftpad"] is not None or args["cache_batch_idx"] is not None:
        return "cache_leftpad / cache_batch_idx: continuous batching packs sequences instead"
    if args["window_size"] != (-1, -1) or args["softcap"] or args["alibi_slopes"] is not None:
        return "window, softcap and ALiBi: not on the paged attention path of transformers"
    if args["return_softmax_lse"]:
        return "lse: transformers' attention functions return none"
    if k is None or k.shape[1] != q.shape[1]:
        return "new tokens other than the queries: continuous batching appends what it attends"
    if not args["causal"] and q.shape[1] > 1:
        return "bidirectional queries: continuous batching's mask is causal"
    return None


def _hf_paged(function: Any, args: dict[str, Any]) -> torch.Tensor:
    """Lay the pages into a ``PagedAttentionCache``, call ``function`` as transformers'
    continuous batching does, and copy the pages back."""
    reason = _hf_unsupported(args)
    if reason is not None:
        raise KernelUnsupported(reason)
    q, k, v, k_cache, v_cache = (args[n] for n in ("q", "k", "v", "k_cache", "v_cache"))
    from transformers.generation.continuous_batching.utils import build_attention_mask

    batch, s_q, heads, width = q.shape
    table = args["block_table"]
    if table is None:  # a contiguous cache: one page of its whole capacity per sequence
        table = torch.arange(batch, dtype=torch.int32)[:, None]
    cache = _paged_cache(k_cache.shape[0], k_cache.shape[1], heads, k_cache.shape[2], width,
                         q.dtype, str(q.device))  # fmt: skip
    allocator = cache.layer_to_allocator[0]
    offset = 2 * allocator.blocks_per_sector  # the two reserved sectors hold the first blocks
    pages = allocator.cache_tensor.view(-1, 2, *k_cache.shape[1:])  # (blocks, K|V, P, H_kv, D)
    pages.zero_()
    pages[offset : offset + k_cache.shape[0], 0] = k_cache
    pages[offset : offset + v_cache.shape[0], 1] = v_cache
    seqlens = [int(n) for n in args["cache_seqlens"]]
    read, write, cu_k = [], [], [0]
    allocator.block_table.clear()
    for b, past in enumerate(seqlens):
        allocator.block_table[f"seq{b}"] = [int(p) + offset for p in table[b]]
        read += allocator.get_read_indices(f"seq{b}", past, s_q)
        write += allocator.get_write_indices(f"seq{b}", past, s_q)
        cu_k.append(cu_k[-1] + past + s_q)
    cu_q = [s_q * b for b in range(batch + 1)]
    # Hidden everywhere first, as continuous batching resets its mask; then its blocks per sequence
    lowest = torch.finfo(q.dtype).min
    mask = torch.full((1, 1, cu_q[-1], cu_k[-1]), lowest, dtype=q.dtype, device=q.device)
    build_attention_mask(mask, cu_q, cu_k)
    index = functools.partial(torch.tensor, dtype=torch.int64, device=q.device)
    module = _Module(heads // k_cache.shape[2])

    def packed(t: torch.Tensor) -> torch.Tensor:  # (B, s, heads, W) -> (1, heads, B * s, W)
        return t.reshape(-1, *t.shape[2:]).transpose(0, 1)[None]

    out, _ = function(
        module, packed(q), packed(k), packed(v), mask, scaling=_scale(args["softmax_scale"], width),
        cache=cache, cu_seq_lens_k={"full_attention": index(cu_k)},
        max_length_k={"full_attention": max(cu_k[i + 1] - cu_k[i] for i in range(batch))},
        read_index=[index(read)], write_index=[index(write)],
    )  # fmt: skip
    k_cache.copy_(pages[offset : offset + k_cache.shape[0], 0])
    v_cache.copy_(pages[offset : offset + v_cache.shape[0], 1])
    return out.reshape(batch, s_q, heads, -1)  # (1, B * s_q, H, Dv) -> (B, s_q, H, Dv)


class _Module(torch.nn.Module):
    """What transformers' attention functions read of the attention module: its layer index and
    how many query heads share a kv head."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.layer_idx = 0
        self.num_key_value_groups = groups
        self.is_causal = True


def _scale(scale: float | None, width: int) -> float:
    return width**-0.5 if scale is None else scale


@functools.lru_cache(maxsize=8)
def _paged_cache(
    blocks: int, page: int, heads: int, kv_heads: int, width: int, dtype: torch.dtype, device: str
) -> Any:
    """A ``PagedAttentionCache`` of one full-attention layer with at least ``blocks`` blocks of
    ``page`` tokens (a tiny Llama config: only its attention shape matters), made once per
    shape."""
    from transformers import LlamaConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.generation.continuous_batching.distributed import DistributedHelper

    # RoPE's validation refuses an odd head width (it rotates pairs), though the cache holds
    # any: build with an even stand-in, then give the cache its true width.
    config = LlamaConfig(hidden_size=heads * width, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=width + width % 2,
                         num_hidden_layers=1, vocab_size=8)  # fmt: skip
    config.head_dim = width
    batching = ContinuousBatchingConfig(page_size=page, num_blocks=blocks,
                                        max_batch_tokens=page, max_memory_percent=1.0)  # fmt: skip
    # Sizing memory on CPU, it logs an ERROR that psutil is missing; the sizes are given here.
    quiet = logging.getLogger("ContinuousBatchingLogger")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        return PagedAttentionCache(config, batching, device, DistributedHelper(None, None), dtype)
    finally:
        quiet.setLevel(level)
