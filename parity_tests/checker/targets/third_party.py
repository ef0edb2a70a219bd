"""Real third-party attention kernels behind a spec's signature: FlexAttention (eager and
compiled) and Hugging Face's attention functions, each through the smallest adapter that lets the
checker call it. Every adapter is a module-level function, so that it pickles into the child
process of ``isolate=True`` (``checker.running.isolation``).

Hugging Face's functions take ``(module, query, key, value, attention_mask, ...)`` with q, k, v
(B, H, N, D) and return ``(out (B, N, H, Dv), weights)``; the adapters give them a bare module
holding what they read (``num_key_value_groups``, ``is_causal``, ``training``), build the mask the
way the function expects it, and transpose the output back to (B, H, N, Dv):

- ``hf_sdpa``: ``transformers.integrations.sdpa_attention.sdpa_attention_forward``; SDPA's mask
  is passed as given (bool True = may attend, or float).
- ``hf_llama_eager``: Llama's ``eager_attention_forward``; the mask is additive, as Hugging
  Face's masking utilities build it for eager attention: 0 where visible, ``finfo(dtype).min``
  where hidden (causal included: eager has no causal flag).
- ``hf_gpt2_eager``: GPT-2's ``eager_attention_forward``, with the additive mask written as SDPA
  means a float mask: -inf where hidden. GPT-2 has no GQA.
- ``hf_flex``: ``transformers.integrations.flex_attention.flex_attention_forward`` as shipped
  (it compiles FlexAttention on its first call), with the additive ``finfo.min`` mask; inference
  only. ``hf_flex_eager``: the same function with its compile step replaced by eager
  FlexAttention, everything else Hugging Face's code.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width.

Tests: tests/checker/targets/test_builtin.py
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any
from unittest import mock

import torch
from torch import nn

from ..golden.attention_baseline import visible


def flex_available() -> bool:
    """Whether this torch has FlexAttention."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def transformers_available() -> bool:
    """Whether transformers (with its attention integrations) is installed."""
    try:
        import transformers.integrations.sdpa_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled_flex() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def compiled_flex_attention(query, key, value, **kwargs):
    """``torch.compile(flex_attention)``, compiled once per process (and per shape by torch)."""
    return _compiled_flex()(query, key, value, **kwargs)


class _Module(nn.Module):
    """What Hugging Face's attention functions read from the calling layer."""

    def __init__(self, groups: int, is_causal: bool, training: bool) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = is_causal
        self.train(training)


def _module(query, key, is_causal: bool, dropout_p: float) -> _Module:
    return _Module(query.shape[1] // key.shape[1], is_causal, dropout_p > 0.0)


def _additive(query, key, attn_mask, is_causal: bool, hidden: float) -> torch.Tensor | None:
    """SDPA's mask (and is_causal, top-left) as an additive float mask in q's dtype: 0 where
    visible (a float mask's finite values kept), ``hidden`` where not."""
    n, m = query.shape[-2], key.shape[-2]
    allowed = visible(n, m, causal=is_causal, device=query.device)
    bias = None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask if allowed is None else attn_mask & allowed
    elif attn_mask is not None:
        finite = ~torch.isneginf(attn_mask)
        allowed = finite if allowed is None else finite & allowed
        bias = torch.where(finite, attn_mask, 0.0).to(query.dtype)
    if allowed is None:
        return None
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    mask = torch.where(allowed, zero, torch.full_like(zero, hidden))  # in q's dtype: finfo.min fits
    mask = mask if bias is None else mask + bias
    mask = mask if mask.ndim == 4 else mask[None, None]  # (N, M) -> (1, 1, N, M)
    return mask.expand(query.shape[0], *mask.shape[1:])  # a batch axis of B, as the models give


def _scale(query, scale):
    return query.shape[-1] ** -0.5 if scale is None else scale


def hf_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False):  # fmt: skip
    """Hugging Face's ``sdpa_attention_forward`` behind SDPA's signature."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, _ = sdpa_attention_forward(
        _module(query, key, is_causal, dropout_p),
        query,
        key,
        value,
        attn_mask,
        dropout=dropout_p,
        scaling=scale,
        is_causal=is_causal,
    )
    return out.transpose(1, 2)  # (B, N, H, Dv) -> (B, H, N, Dv)


def hf_llama_eager(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):  # fmt: skip
    """Llama's ``eager_attention_forward`` with Hugging Face's own ``finfo.min`` mask."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    hidden = torch.finfo(query.dtype).min
    return _eager(eager_attention_forward, hidden, query, key, value, attn_mask, dropout_p,
                  is_causal, scale)  # fmt: skip


def hf_gpt2_eager(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """GPT-2's ``eager_attention_forward`` with an additive -inf mask."""
    from transformers.models.gpt2.modeling_gpt2 import eager_attention_forward

    return _eager(eager_attention_forward, -math.inf, query, key, value, attn_mask, dropout_p,
                  is_causal, scale)  # fmt: skip


def _eager(forward, hidden, query, key, value, attn_mask, dropout_p, is_causal, scale):
    """A model's ``eager_attention_forward`` called as the model calls it: SDPA's mask and
    is_causal as an additive mask with ``hidden`` where hidden, the default scale 1/sqrt(D)."""
    mask = _additive(query, key, attn_mask, is_causal, hidden)
    module = _module(query, key, is_causal, dropout_p)
    out, _ = forward(module, query, key, value, mask, scaling=_scale(query, scale),
                     dropout=dropout_p)  # fmt: skip
    return out.transpose(1, 2)  # (B, N, H, Dv) -> (B, H, N, Dv)


def hf_flex(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False):  # fmt: skip
    """Hugging Face's ``flex_attention_forward`` as shipped (compiled), inference only."""
    from transformers.integrations.flex_attention import flex_attention_forward

    mask = _additive(query, key, attn_mask, is_causal, torch.finfo(query.dtype).min)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = flex_attention_forward(
            _module(query, key, is_causal, dropout_p),
            query,
            key,
            value,
            mask,
            scaling=scale,
            dropout=dropout_p,
        )
    return out.transpose(1, 2)  # (B, N, H, Dv) -> (B, H, N, Dv)


def hf_flex_eager(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False):  # fmt: skip
    """``hf_flex`` with the compile step replaced by eager FlexAttention."""
    from torch.nn.attention.flex_attention import flex_attention
    from transformers.integrations import flex_attention as hf_module

    def eager(query, key, value, training=False, **kwargs):
        return flex_attention(query, key, value, **kwargs)

    with mock.patch.object(hf_module, "compile_friendly_flex_attention", eager):
        return hf_flex(query, key, value, attn_mask, dropout_p, is_causal, scale)
