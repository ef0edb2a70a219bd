"""Broken kernels with flash-attn's ``flash_attn_varlen_func`` signature: a key leaking across
a sequence boundary.

Shape legend: H heads, T packed token count.

Tests: tests/checker/pitfalls/test_init.py
"""

from __future__ import annotations

import torch

from ..battery.attention.quick import pick
from ..specs.flash_varlen import SPEC
from . import Pitfall
from .flash import _flash


def varlen_leak(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                alibi_slopes=None, deterministic=False, return_attn_probs=False):  # fmt: skip
    """Every sequence but the first also sees the last key of the sequence before it (an offset
    read as ``cu_seqlens_k[s] - 1``): one key leaks across each boundary."""
    outs, lses = [], []
    bounds = list(zip(cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), strict=True))
    for s, ((q0, k0), (q1, k1)) in enumerate(zip(bounds, bounds[1:], strict=False)):
        k0 = max(k0 - 1, 0) if s else k0
        slopes = alibi_slopes
        if alibi_slopes is not None and alibi_slopes.ndim == 2:
            slopes = alibi_slopes[s : s + 1]
        parts = (t[None] for t in (q[q0:q1], k[k0:k1], v[k0:k1]))  # (L, H, W) -> (1, L, H, W)
        out, lse, _ = _flash(
            *parts, softmax_scale, causal, window_size, softcap, slopes, True, dropout_p=dropout_p
        )
        outs.append(out[0])
        lses.append(lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, dim=1)
    return (out, lse, None) if return_attn_probs else out


PITFALLS: dict[str, Pitfall] = {
    "varlen_leak": Pitfall(varlen_leak, pick(SPEC, "packed"), "out", "flash_varlen"),
}
