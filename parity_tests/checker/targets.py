"""The kernels the CLI checks by default, each with the SDPA signature, and their known failures.

Targets: ``F.scaled_dot_product_attention`` with the default dispatch and with each backend that
``torch.nn.attention.sdpa_kernel`` can force on the device; ``torch_attention.functional.attention``
with each backend that runs forward and backward there; ``nn.MultiheadAttention`` through an
adapter (identity projections), with ``need_weights=True`` and ``False``. A backend that cannot
take a small plain problem forward and backward on the device is left out (found by trying one).

A forced backend that refuses a case (the CPU flash kernel has no dropout, say) raises
``KernelUnsupported`` with torch's (or torch_attention's) own reason, and the case is skipped for
that target. Known
failures are listed in ``EXPECTED_FAILURES`` with the reason, and reported as XFAIL, never hidden;
an expected failure that passes is reported as XPASS and fails the run, so the list stays honest.
docs/kernel-verification.md records what each target does.

Shape legend: B batch, H heads, N query length, M key/value length, D head width, Dv value width.

Tests: tests/checker/test_targets.py
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_attention.functional import BACKENDS, attention

from .kernels import Kernel
from .report import KernelUnsupported

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


@dataclass(frozen=True)
class Target:
    """A named kernel to check, and the dtypes it runs in on the device it was built for."""

    name: str
    kernel: Kernel
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class ExpectedFailure:
    """A documented failure: target ``target`` fails case ``case`` (in every dtype and on every
    device unless restricted), for ``reason``."""

    target: str
    case: str
    reason: str
    dtypes: tuple[str, ...] | None = None
    devices: tuple[str, ...] | None = None

    def matches(self, target: str, case: str, dtype: str, device: str) -> bool:
        return (
            self.target == target
            and self.case == case
            and (self.dtypes is None or dtype in self.dtypes)
            and (self.devices is None or torch.device(device).type in self.devices)
        )


MHA_NAN_ROWS = (
    "nn.MultiheadAttention with need_weights=True computes softmax itself: a query row with "
    "nothing to attend to gives NaN in the output and in every gradient (SDPA gives 0)"
)

EXPECTED_FAILURES: tuple[ExpectedFailure, ...] = (
    ExpectedFailure("mha[need_weights=True]", "dead-rows-bool", MHA_NAN_ROWS),
    ExpectedFailure("mha[need_weights=True]", "dead-rows-float", MHA_NAN_ROWS),
)


def expected_failure(target: str, case: str, dtype: str, device: str) -> ExpectedFailure | None:
    """The entry of ``EXPECTED_FAILURES`` for this run, or None."""
    for entry in EXPECTED_FAILURES:
        if entry.matches(target, case, dtype, device):
            return entry
    return None


def builtin_targets(device: str | torch.device, dtypes: tuple[str, ...]) -> list[Target]:
    """Every built-in target that runs on ``device`` in at least one of ``dtypes``."""
    targets = [Target("sdpa", F.scaled_dot_product_attention, dtypes)]
    for name, backend in SDPA_BACKENDS.items():
        available = tuple(d for d in dtypes if _backend_runs(backend, device, d))
        if available:
            targets.append(Target(f"sdpa[{name}]", forced_sdpa(backend), available))
    for name in BACKENDS:
        available = tuple(d for d in dtypes if _torch_attention_runs(name, device, d))
        if available:
            targets.append(
                Target(f"torch_attention[{name}]", torch_attention_kernel(name), available)
            )
    for need_weights in (True, False):
        targets.append(
            Target(f"mha[need_weights={need_weights}]", mha_kernel(need_weights), dtypes)
        )
    return targets


def forced_sdpa(backend: SDPBackend) -> Kernel:
    """SDPA restricted to one backend; a case the backend refuses raises ``KernelUnsupported``."""

    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
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
def _backend_runs(backend: SDPBackend, device: str | torch.device, dtype: str) -> bool:
    """Whether SDPA forced to ``backend`` runs a small problem on ``device`` in ``dtype``."""
    return _runs(forced_sdpa(backend), device, dtype)


@functools.lru_cache(maxsize=32)
def _torch_attention_runs(backend: str, device: str | torch.device, dtype: str) -> bool:
    """Whether ``torch_attention``'s ``backend`` runs a small problem on ``device`` in ``dtype``
    (FlexAttention has no backward on CPU, say)."""
    return _runs(torch_attention_kernel(backend), device, dtype)


def _runs(kernel: Kernel, device: str | torch.device, dtype: str) -> bool:
    """Whether ``kernel`` takes a plain (1, 1, 8, 64) problem forward and backward, rather than
    raising ``KernelUnsupported``."""
    q = torch.randn(1, 1, 8, 64, device=device, dtype=getattr(torch, dtype), requires_grad=True)
    try:
        kernel(q, q, q).sum().backward()
    except KernelUnsupported:
        return False
    return True


def torch_attention_kernel(backend: str) -> Kernel:
    """``torch_attention.functional.attention`` with ``backend``, behind the SDPA signature. A
    call the backend says it cannot compute raises ``KernelUnsupported`` with its reason."""

    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        try:
            return attention(
                query,
                key,
                value,
                causal=is_causal,
                attn_mask=attn_mask,
                scale=scale,
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
