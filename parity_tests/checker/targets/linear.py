"""Correct kernels behind the linear-attention specs' signatures: the built-in target, and the
adapters of real ones.

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

What the third-party ones showed: docs/kernel-verification.md, "Linear-attention kernels".

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import inspect

from torch_attention.linear_attention import gated_delta_rule


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
