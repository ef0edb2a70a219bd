"""Correct kernels behind the sparse specs' signatures: their built-in targets, and the adapter of
a real one.

- ``flash_mla_sparse_fwd``: FlashMLA's ``flash_mla_sparse_fwd(q, kv, indices, sm_scale,
  d_v=512, attn_sink=None, topk_length=None) -> (out, max_logits, lse)`` computed by
  ``torch_attention.sparse.sparse_attention``: V the first ``d_v`` numbers of the one latent
  head, the sink (float32, one per query head) scaling the output and no part of lse; lse and
  max_logits float32 (float64 for float64 inputs), a lonely query's lse +inf and max_logits
  -inf, as FlashMLA's tests/ref.py defines them.
- ``plain_flash_mla_sparse_fwd``: the same signature over the plain gather of
  ``golden.sparse_baseline`` instead of the twin, which is the bounds' baseline: a correct kernel
  whose rounding is its own (the "sparse" spec's twin of it is ``plain_sparse`` itself).
- ``fla_naive_dsa``: flash-linear-attention's pure-torch DSA reference behind the "sparse" spec's
  signature (what it showed: docs/kernel-verification.md, "Sparse kernels").

Shape legend: S_q query tokens, S_kv key tokens, H query heads, H_kv key heads, D head width,
Dv value width, topk entries per list.

Tests: tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

import math

import torch

from torch_attention.sparse import sparse_attention

from ..golden.sparse_baseline import max_logits, plain_flash_mla_sparse


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    """FlashMLA's sparse prefill computed by the torch twin (see the module docstring)."""
    stats = torch.float64 if q.dtype == torch.float64 else torch.float32
    sinks = None if attn_sink is None else attn_sink.to(q.dtype)
    if sinks is not None and q.dtype in (torch.float16, torch.bfloat16):
        # The twin takes sinks in q's dtype; FlashMLA's are float32: compute in float32 then.
        out = sparse_attention(
            q.float(),
            kv.float(),
            None,
            indices,
            softmax_scale=sm_scale,
            sinks=attn_sink.float(),
            topk_length=topk_length,
            d_v=d_v,
        )
        out = out.to(q.dtype)
    else:
        out = sparse_attention(
            q,
            kv,
            None,
            indices,
            softmax_scale=sm_scale,
            sinks=sinks,
            topk_length=topk_length,
            d_v=d_v,
        )
    alone = sparse_attention(
        q,
        kv,
        None,
        indices,
        softmax_scale=sm_scale,
        topk_length=topk_length,
        d_v=d_v,
        return_lse=True,
    )
    lse = alone.lse.to(stats)
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    return out, max_logits(q, kv, indices, sm_scale, topk_length).to(stats), lse


def plain_flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                               topk_length=None):  # fmt: skip
    """FlashMLA's sparse prefill over the plain gather (``golden.sparse_baseline``), not the
    twin the bounds scale: a correct kernel whose rounding is its own."""
    return plain_flash_mla_sparse(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)


def fla_naive_dsa(q, k, v, indices, *, softmax_scale=None, sinks=None, topk_length=None,
                  d_v=None, return_lse=False):  # fmt: skip
    """flash-linear-attention's ``fla.ops.dsa.naive.naive_dsa`` (pure torch) behind the twin's
    signature, the smallest adapter: fla's queries are the keys' own tokens (T = S_kv, causal),
    so the S_q queries sit at the last S_q positions (where the battery's lists place them) and
    the positions before them get a zero query naming key 0 (their rows are dropped); its one
    list per token serves every head, so each key head's group of query heads is one call with
    that head's list; V is ``k[..., :d_v]`` for the latent form (a view: dk gets both
    gradients). What it has no argument for raises ``KernelUnsupported``: sinks, topk_length,
    lse."""
    from fla.ops.dsa.naive import naive_dsa

    from ..report.rows import KernelUnsupported

    if sinks is not None or topk_length is not None or return_lse:
        raise KernelUnsupported("fla's naive_dsa takes no sinks, topk_length or lse")
    (s_q, heads, _), (s_kv, kv_heads) = q.shape, k.shape[:2]
    group, before = heads // kv_heads, s_kv - s_q
    values = k[..., :d_v] if v is None else v
    outs = []
    for h in range(kv_heads):
        lists = indices[:, h].long()
        queries = q[:, h * group : (h + 1) * group]
        queries = torch.cat([queries.new_zeros((before, *queries.shape[1:])), queries])
        named = torch.cat([lists.new_full((before, lists.shape[1]), -1), lists])
        named[:before, 0] = 0
        out = naive_dsa(queries[None], k[None, :, h : h + 1], values[None, :, h : h + 1], None,
                        None, indices=named[None], scale=softmax_scale)  # fmt: skip
        outs.append(out[0, before:])
    return torch.cat(outs, dim=1)
