"""Decoding over a KV cache, contiguous or in pages, in torch: the twin of
``numpy_attention.decode.paged`` (flash-attn's ``flash_attn_with_kvcache``, exactly, as
``kvcache_attention``), on any device. Its argument checks are ``checks.py`` (which calls the
pure-Python checker both twins share, ``numpy_attention.decode.arguments``); the pages it reads,
``pages.py``; a layer's page pool, ``PagedKVCache``, ``cache.py``.

The same semantics, checks and messages as the NumPy twin (docs/decoding.md): for sequence b with
L_b = cache_seqlens[b] + s_new keys, the new k, v (keys rotated at cache_seqlens[b] + i) are
written in place at [cache_seqlens[b], L_b) of its cache row or of its pages in table order;
queries (rotated at cache_seqlens[b] + i when causal or windowed, else at cache_seqlens[b]) sit
at p_i = L_b - s_q + i; keys before cache_leftpad[b] are hidden. Every score rule is
``functional.attention``'s with ``align="bottom-right"``, on the keys [lo, L_b) each sequence can
see. This is the kernel checker's built-in correct target of the "flash_kvcache" spec (behind
flash-attn's exact signature in ``parity_tests.checker.targets.decode``); it gathers each
sequence's pages with one ``index_select``, for clarity rather than speed.

Dtypes: float16 and bfloat16 are rotated and attended in float32 (``functional.attention``'s
"math" rule) and returned in their dtype; lse float32. Lengths, tables and indices may live on
any device: they are read on the host (one sync per call), where the checks run.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size, L_b the keys of sequence b.

Derivation: docs/decoding.md.
Tests: tests/torch_attention/decode/test_paged.py (against the NumPy twin in float64, on every
dtype by the kernel checker's policy), tests/checker/running/test_decode.py (the checker's
verdict).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..functional import attention
from ..rope import rotate_pairs
from ..rules import compute_dtype
from .checks import DecodeCall, check_call
from .pages import read_tokens, write_tokens

__all__ = ["KVCacheOutput", "kvcache_attention"]


class KVCacheOutput(NamedTuple):
    """What ``kvcache_attention`` returns: out (B, s_q, H, Dv) in q's dtype, lse (B, H, s_q)
    (float32 for half inputs, natural log, -inf for a query with nothing to see) or None."""

    out: torch.Tensor
    lse: torch.Tensor | None


def kvcache_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: Any,
    cache_batch_idx: Any = None,
    cache_leftpad: Any = None,
    block_table: Any = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    return_lse: bool = False,
) -> KVCacheOutput:
    """flash-attn's ``flash_attn_with_kvcache``: append k, v to the cache in place, then attend;
    ``numpy_attention.decode.paged.kvcache_attention_forward``'s twin (the same arguments, shapes
    and errors; tables and lengths as integer tensors, arrays or ints). Runs under
    ``torch.no_grad()``: a decode kernel has no backward.

    Returns:
        ``KVCacheOutput(out, lse)``: out (B, s_q, H, Dv) in q's dtype, lse (B, H, s_q) or None.
    """
    call = check_call(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, return_lse,
    )  # fmt: skip
    with torch.no_grad():
        q, k = _rotated(call, q, k)
        if k is not None and v is not None:
            for b in range(q.shape[0]):
                positions = list(range(call.seqlens[b], call.seqlens[b] + call.s_new))
                write_tokens(k_cache, call.pages[b], positions, k[b])
                write_tokens(v_cache, call.pages[b], positions, v[b])
        outs, lses = [], []
        for b in range(q.shape[0]):
            hi = call.seqlens[b] + call.s_new
            keys = read_tokens(k_cache, call.pages[b], call.lo[b], hi)  # (M, H_kv, D)
            values = read_tokens(v_cache, call.pages[b], call.lo[b], hi)  # (M, H_kv, Dv)
            slopes = call.slopes
            if slopes is not None and slopes.ndim == 2:
                slopes = slopes[b]
            result = attention(
                q[b].transpose(0, 1)[None],  # (s_q, H, D) -> (1, H, s_q, D)
                keys.transpose(0, 1)[None],  # (M, H_kv, D) -> (1, H_kv, M, D)
                values.transpose(0, 1)[None],
                alibi_slopes=slopes,
                return_lse=True,
                **call.options,
            )
            outs.append(result.out[0].transpose(0, 1))  # (H, s_q, Dv) -> (s_q, H, Dv)
            lses.append(result.lse[0])  # (H, s_q)
    if outs:
        out, lse = torch.stack(outs), torch.stack(lses)
    else:
        out = q.new_zeros(q.shape[:3] + v_cache.shape[-1:])
        lse = q.new_zeros((0, q.shape[2], q.shape[1]), dtype=compute_dtype(q.dtype))
    return KVCacheOutput(out, lse if return_lse else None)


def _rotated(
    call: DecodeCall, q: torch.Tensor, k: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q and the new keys with their first rotary_dim coordinates rotated (in float32 for half
    inputs, then rounded to the inputs' dtype); unchanged without rotary."""
    if call.rotary is None or k is None:
        return q, k
    cos, sin = call.rotary
    width = 2 * cos.shape[-1]
    seqlens = torch.tensor(call.seqlens, device=q.device)[:, None]  # (B, 1)
    steps_q = torch.arange(q.shape[1], device=q.device)
    rotated = []
    for x, steps in ((q, steps_q if call.q_moves else 0 * steps_q), (k, None)):
        steps = torch.arange(x.shape[1], device=x.device) if steps is None else steps
        positions = seqlens + steps[None, :]  # (B, s)
        tables = cos[positions][:, :, None], sin[positions][:, :, None]  # (B, s, 1, rot / 2)
        part = x[..., :width].to(cos.dtype)
        turned = rotate_pairs(part, *tables, interleaved=call.interleaved)
        rotated.append(torch.cat([turned.to(x.dtype), x[..., width:]], dim=-1))
    return rotated[0], rotated[1]
