"""torch's own kernels behind the SDPA spec's signature, as the built-in targets run them
(``targets.builtin``): SDPA forced to one backend (``forced_sdpa``; a case the backend refuses
raises ``KernelUnsupported`` with torch's reason), ``torch_attention.functional.attention`` with
one backend (``torch_attention_kernel``), ``nn.MultiheadAttention`` through identity projections
(``mha_kernel``), and which features each takes on the device (``claimable``: found by trying a
small problem).

Shape legend: B batch, H heads, N query length, M key/value length, D head width.

Tests: tests/checker/targets/test_builtin.py
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_attention.functional import attention

from .. import specs
from ..pipeline import Kernel
from ..report.rows import KernelUnsupported

SDPA_BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}

# What SDPA says when the forced backend cannot take a problem on this device, dtype or shape.
SDPA_REFUSALS = ("No available kernel", "No viable backend")
# What torch_attention.functional.attention says when a forced backend cannot compute a call.
TORCH_ATTENTION_REFUSAL = "cannot compute this call"


def forced_sdpa(backend: SDPBackend) -> Kernel:
    """SDPA restricted to one backend; a case the backend refuses raises ``KernelUnsupported``."""

    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
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
            except RuntimeError as exc:
                if not any(refusal in str(exc) for refusal in SDPA_REFUSALS):
                    raise
                reasons = [_strip_location(str(w.message)) for w in caught]
                raise KernelUnsupported("; ".join(r for r in reasons if r) or str(exc)) from exc

    kernel.__name__ = f"sdpa[{backend.name.lower()}]"
    return kernel


def _strip_location(message: str) -> str:
    message = re.sub(r"\s*\(Triggered internally at .*\)\s*$", "", message, flags=re.S).strip()
    return "" if message.endswith("not used because:") else message


@functools.lru_cache(maxsize=32)
def backend_runs(backend: SDPBackend, device: str | torch.device, dtype: str) -> bool:
    """Whether SDPA forced to ``backend`` runs a small problem on ``device`` in ``dtype``."""
    return _runs(forced_sdpa(backend), device, dtype)


@functools.lru_cache(maxsize=32)
def torch_attention_runs(
    backend: str, device: str | torch.device, dtype: str, backward: bool
) -> bool:
    """Whether ``torch_attention``'s ``backend`` runs a small problem on ``device`` in ``dtype``,
    with its backward or forward only (FlexAttention has no backward on CPU, say)."""
    return _runs(torch_attention_kernel(backend), device, dtype, backward)


@functools.lru_cache(maxsize=32)
def sdpa_backend_features(
    backend: SDPBackend, device: str | torch.device, dtypes: tuple[str, ...]
) -> frozenset[str] | None:
    return claimable(forced_sdpa(backend), device, dtypes)


@functools.lru_cache(maxsize=32)
def torch_attention_features(
    backend: str, device: str | torch.device, dtypes: tuple[str, ...], backward: bool
) -> frozenset[str] | None:
    return claimable(torch_attention_kernel(backend), device, dtypes, backward=backward)


def claimable(
    kernel: Kernel,
    device: str | torch.device,
    dtypes: tuple[str, ...],
    features: frozenset[str] | None = None,
    backward: bool = True,
) -> frozenset[str] | None:
    """The SDPA-signature features of ``features`` (None: all of the spec's) that ``kernel``
    takes on a small problem in the first dtype of ``dtypes`` (the backends' refusals do not
    depend on it), rather than raising ``KernelUnsupported`` (the CPU flash kernel refuses
    dropout and Dv != D, say); None when that is all of the spec's. The battery is then built
    for those features, so that a narrow kernel is judged on every pair of what it does rather
    than skipping most cases."""
    wanted = specs.SPEC_FEATURES["sdpa"] if features is None else features
    claimed = frozenset(f for f in wanted if _takes(kernel, device, dtypes[0], f, backward))
    return None if claimed == specs.SPEC_FEATURES["sdpa"] else claimed


def _takes(kernel: Kernel, device: str | torch.device, dtype: str, feature: str,
           backward: bool) -> bool:  # fmt: skip
    """Whether ``kernel`` takes a (1, 4, 8, 16) problem that needs ``feature``."""
    make = functools.partial(torch.randn, device=device, dtype=getattr(torch, dtype))
    q, k, v = make(1, 4, 8, 16), make(1, 4, 8, 16), make(1, 4, 8, 16)
    kwargs: dict[str, Any] = {}
    if feature == "dropout":
        kwargs["dropout_p"] = 0.5
    elif feature == "dv":
        v = make(1, 4, 8, 32)
    elif feature == "mask":
        kwargs["attn_mask"] = torch.ones(8, 8, dtype=torch.bool, device=device).tril()
    elif feature == "causal":
        kwargs["is_causal"] = True
    elif feature == "gqa":
        k, v = make(1, 2, 8, 16), make(1, 2, 8, 16)
        kwargs["enable_gqa"] = True
    for t in (q, k, v):
        t.requires_grad_(backward)
    try:
        out = kernel(q, k, v, **kwargs)
        if backward:
            out.sum().backward()
    except KernelUnsupported:
        return False
    return True


def _runs(kernel: Kernel, device: str | torch.device, dtype: str, backward: bool = True) -> bool:
    """Whether ``kernel`` takes a plain (1, 1, 8, 64) problem forward (and backward), rather than
    raising ``KernelUnsupported``."""
    q = torch.randn(1, 1, 8, 64, device=device, dtype=getattr(torch, dtype))
    try:
        if backward:
            q.requires_grad_(True)
            kernel(q, q, q).sum().backward()
        else:
            kernel(q, q, q)
    except KernelUnsupported:
        return False
    return True


def torch_attention_kernel(backend: str) -> Kernel:
    """``torch_attention.functional.attention`` with ``backend``, behind the SDPA signature. A
    call the backend says it cannot compute raises ``KernelUnsupported`` with its reason."""

    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):  # fmt: skip
        try:
            return attention(
                query,
                key,
                value,
                causal=is_causal,
                attn_mask=attn_mask,
                scale=scale,
                enable_gqa=enable_gqa,
                dropout_p=dropout_p,
                backend=backend,
            )
        except ValueError as exc:
            if TORCH_ATTENTION_REFUSAL not in str(exc):
                raise
            raise KernelUnsupported(str(exc)) from exc

    kernel.__name__ = f"torch_attention[{backend}]"
    return kernel


def mha_kernel(need_weights: bool) -> Kernel:
    """``nn.MultiheadAttention`` behind the SDPA signature.

    Heads are merged into the model width H*D and the projections set to the identity (exact in
    every dtype), so the module's own attention is what gets checked. A given ``scale`` is folded
    into the queries, since the module always scales by 1 / sqrt(D). SDPA's bool mask (True = may
    attend) is inverted into the module's (True = masked); the causal mask is passed explicitly.
    """

    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        b, h, n, d = query.shape
        m, dv = key.shape[-2], value.shape[-1]
        if dv != d:
            raise KernelUnsupported("nn.MultiheadAttention needs Dv == D")
        module = _identity_mha(h * d, h, dropout_p, query.device, query.dtype)
        if scale is not None:
            query = query * (scale * math.sqrt(d))
        merged = [t.transpose(1, 2).reshape(b, -1, h * d) for t in (query, key, value)]
        out, _ = module(
            *merged,
            attn_mask=_mha_mask(attn_mask, is_causal, b, h, n, m, query.device),
            need_weights=need_weights,
        )
        return out.reshape(b, n, h, d).transpose(1, 2)  # (B, N, H*D) -> (B, H, N, D)

    kernel.__name__ = f"mha[need_weights={need_weights}]"
    return kernel


def _identity_mha(
    width: int, heads: int, dropout_p: float, device: torch.device, dtype: torch.dtype
) -> nn.MultiheadAttention:
    module = nn.MultiheadAttention(
        width, heads, dropout=dropout_p, bias=False, batch_first=True, device=device, dtype=dtype
    )
    eye = torch.eye(width, device=device, dtype=dtype)
    with torch.no_grad():
        module.in_proj_weight.copy_(eye.repeat(3, 1))  # [W_q; W_k; W_v] = [I; I; I], (3C, C)
        module.out_proj.weight.copy_(eye)
    return module.requires_grad_(False)


def _mha_mask(attn_mask, is_causal, b, h, n, m, device) -> torch.Tensor | None:
    """SDPA's mask as the module's: bool True = masked, or float added; (N, M) or (B*H, N, M)."""
    if is_causal:
        return ~torch.ones(n, m, dtype=torch.bool, device=device).tril()
    if attn_mask is None:
        return None
    mask = attn_mask.expand(b, h, n, m).reshape(b * h, n, m)  # (..., N, M) -> (B*H, N, M)
    return ~mask if mask.dtype == torch.bool else mask
