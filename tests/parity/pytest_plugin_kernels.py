"""Kernels with SDPA's signature that tests/parity/test_pytest_plugin.py judges through the pytest
plugin (``--check-kernel tests.parity.pytest_plugin_kernels:NAME``): one with a wrong scale,
whose every judged group fails, and one that opts out of causal cases and raises on masks.
"""

from __future__ import annotations

import math

import torch.nn.functional as F

from parity_tests import KernelUnsupported

SCALE_ERROR = 1.1  # what wrong_scale multiplies the softmax scale by; not a kernel


def wrong_scale(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """SDPA with its scale 10% too large: every tensor of every case is wrong."""
    scale = SCALE_ERROR * (1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)
    return F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
    )


def no_causal_no_mask(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """SDPA that opts out of causal cases (``KernelUnsupported``: a "skip" verdict) and raises a
    RuntimeError on a mask (an "error" verdict)."""
    if is_causal:
        raise KernelUnsupported("causal attention is not implemented here")
    if attn_mask is not None:
        raise RuntimeError("masks are not implemented here\nsecond line of the message")
    return F.scaled_dot_product_attention(
        query, key, value, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa
    )
