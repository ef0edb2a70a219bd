"""Correct kernels behind the linear-attention specs' signatures: the built-in targets, and the
adapters of real ones. "fla_gdn"'s:

- ``twin_chunk_gated_delta_rule``: flash-linear-attention's ``chunk_gated_delta_rule`` computed
  by ``torch_attention.linear_attention.gated_delta_rule`` in its chunked (WY/UT) form, a
  different computation from the recurrent baseline the bounds scale; the "fla_gdn" spec's
  built-in target.
- ``transformers_chunk_gated_delta_rule``: transformers' ``torch_chunk_gated_delta_rule``
  (models/qwen3_next), its torch body (``inspect.unwrap`` past the hub-kernel decorator, which
  would call fla's Triton kernel when fla is installed): it takes no ``scale`` (its **kwargs
  swallow it; it always scales by K^-0.5) and no ``cu_seqlens``, its initial state is
  (B, H, K, V) and it returns the final state in float32.
- ``fla_naive_chunk_gated_delta_rule`` and ``fla_naive_recurrent_gated_delta_rule``: fla's
  pure-torch references (``fla.ops.gated_delta_rule.naive``; the recurrent one takes beta
  before g), computing in float32 and returning o in float32, without ``cu_seqlens``.
- ``transformers_recurrent_gated_delta_rule``: transformers' ``torch_recurrent_gated_delta_rule``
  (models/qwen3_next), its torch body as the chunked one's: no ``scale``, no ``cu_seqlens``.
- ``fla_fused_recurrent_gated_delta_rule``: fla's Triton ``fused_recurrent_gated_delta_rule``
  (it takes two more gates, gk and gv, before beta: beta goes by keyword), forward only (its
  backward raises NotImplementedError by design); runs under Triton's interpreter on CPU.

"fla_kda"'s:

- ``twin_chunk_kda``: ``chunk_kda`` computed by ``torch_attention.linear_attention.kda`` in its
  chunked form; the built-in target.
- ``fla_naive_recurrent_kda`` and ``fla_naive_chunk_kda``: fla's pure-torch references
  (``fla.ops.kda.naive``), computing in float32 and returning o in v's dtype, without
  ``cu_seqlens``; the chunked one asserts T % 64 == 0, so the adapter pads T to the next
  multiple of 64 with tokens that change nothing (k = v = q = 0, g = 0, beta = 0) and cuts o
  back.
- ``transformers_chunk_kda`` and ``transformers_recurrent_kda``: transformers' Kimi Linear
  fallbacks ``chunk_kimi_delta_attention`` / ``recurrent_kimi_delta_attention``
  (models/kimi_linear), their torch bodies as above: no ``scale`` (always K^-0.5), no
  ``cu_seqlens``, computing in float32, the final state in float32.
- ``fla_fused_recurrent_kda``: fla's Triton ``fused_recurrent_kda``, forward only (its result
  has no autograd graph); runs under Triton's interpreter on CPU.

fla's chunked Triton kernels (``chunk_gated_delta_rule``, ``chunk_kda``) are the spec's
signatures as they are (``fla.ops.gated_delta_rule:chunk_gated_delta_rule``,
``fla.ops.kda:chunk_kda``) and need no adapter; on a CPU they do not run under Triton 3.9's
interpreter (docs/kernel-verification.md).

What the third-party ones showed: docs/kernel-verification.md, "Linear-attention kernels".

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import inspect

import torch

from torch_attention.linear_attention import gated_delta_rule, kda


def twin_chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                output_final_state=False, cu_seqlens=None,
                                use_qk_l2norm_in_kernel=False):  # fmt: skip
    """fla's signature over the torch twin's chunked form (q and k normalized first when
    ``use_qk_l2norm_in_kernel``, as fla's kernel does)."""
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    return tuple(gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                  form="chunk"))  # fmt: skip


def _l2norm(x):
    return x / (x.float().pow(2).sum(-1, keepdim=True) + 1e-6).sqrt().to(x.dtype)


def transformers_chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                        output_final_state=False,
                                        use_qk_l2norm_in_kernel=False):  # fmt: skip
    """transformers' ``torch_chunk_gated_delta_rule`` (its torch body) behind fla's signature,
    the smallest adapter: ``scale`` is passed on as a keyword, which the body ignores."""
    from transformers.models.qwen3_next import modeling_qwen3_next

    body = inspect.unwrap(modeling_qwen3_next.torch_chunk_gated_delta_rule)
    return body(q, k, v, g, beta, initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale)  # fmt: skip


def fla_naive_chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                     output_final_state=False):  # fmt: skip
    """fla's ``naive_chunk_gated_delta_rule`` behind fla's signature."""
    from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule

    return naive_chunk_gated_delta_rule(q, k, v, g, beta, scale=scale,
                                        initial_state=initial_state,
                                        output_final_state=output_final_state)  # fmt: skip


def fla_naive_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                         output_final_state=False):  # fmt: skip
    """fla's ``naive_recurrent_gated_delta_rule`` behind fla's signature (it takes beta before
    g)."""
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    return naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=scale,
                                            initial_state=initial_state,
                                            output_final_state=output_final_state)  # fmt: skip


def transformers_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                            output_final_state=False,
                                            use_qk_l2norm_in_kernel=False):  # fmt: skip
    """transformers' ``torch_recurrent_gated_delta_rule`` (its torch body) behind fla's
    signature; ``scale`` is passed on as a keyword, which the body ignores."""
    from transformers.models.qwen3_next import modeling_qwen3_next

    body = inspect.unwrap(modeling_qwen3_next.torch_recurrent_gated_delta_rule)
    return body(q, k, v, g, beta, initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale)  # fmt: skip


def fla_fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                         output_final_state=False, cu_seqlens=None,
                                         use_qk_l2norm_in_kernel=False):  # fmt: skip
    """fla's Triton ``fused_recurrent_gated_delta_rule`` behind ``chunk_gated_delta_rule``'s
    signature: beta by keyword (its third to fifth parameters are g, gk, gv)."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    return fused_recurrent_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta=beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )


def twin_chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, cu_seqlens=None):  # fmt: skip
    """fla's ``chunk_kda`` signature over the torch twin's chunked form."""
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    return tuple(kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                     form="chunk"))  # fmt: skip


def fla_naive_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None,
                            output_final_state=False):  # fmt: skip
    """fla's ``naive_recurrent_kda`` behind ``chunk_kda``'s signature."""
    from fla.ops.kda.naive import naive_recurrent_kda

    return naive_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state)  # fmt: skip


def fla_naive_chunk_kda(q, k, v, g, beta, scale=None, initial_state=None,
                        output_final_state=False):  # fmt: skip
    """fla's ``naive_chunk_kda`` behind ``chunk_kda``'s signature, T padded to a multiple of
    its chunk (64) with tokens that change nothing, o cut back to T."""
    from fla.ops.kda.naive import naive_chunk_kda

    tokens = q.shape[1]
    pad = -tokens % 64
    padded = [torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
              for x in (q, k, v, g, beta)]  # fmt: skip
    out, final = naive_chunk_kda(*padded, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state)  # fmt: skip
    return out[:, :tokens], final


def transformers_chunk_kda(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False):  # fmt: skip
    """transformers' ``chunk_kimi_delta_attention`` (its torch body) behind ``chunk_kda``'s
    signature; ``scale`` is passed on as a keyword, which the body ignores."""
    from transformers.models.kimi_linear import modeling_kimi_linear

    body = inspect.unwrap(modeling_kimi_linear.chunk_kimi_delta_attention)
    return body(q, k, v, g, beta, initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale)  # fmt: skip


def transformers_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None,
                               output_final_state=False,
                               use_qk_l2norm_in_kernel=False):  # fmt: skip
    """transformers' ``recurrent_kimi_delta_attention`` (its torch body) behind ``chunk_kda``'s
    signature; ``scale`` is passed on as a keyword, which the body ignores."""
    from transformers.models.kimi_linear import modeling_kimi_linear

    body = inspect.unwrap(modeling_kimi_linear.recurrent_kimi_delta_attention)
    return body(q, k, v, g, beta, initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale)  # fmt: skip


def fla_fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None,
                            output_final_state=False, use_qk_l2norm_in_kernel=False,
                            cu_seqlens=None):  # fmt: skip
    """fla's Triton ``fused_recurrent_kda`` behind ``chunk_kda``'s signature (its sixth and
    seventh parameters are A_log and dt_bias: the rest go by keyword)."""
    from fla.ops.kda import fused_recurrent_kda

    return fused_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state,
                               use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                               cu_seqlens=cu_seqlens)  # fmt: skip
