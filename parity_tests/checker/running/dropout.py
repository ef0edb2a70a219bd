"""Dropout, judged through both kinds of signature: a keep-mask read back through SDPA's, and
draws judged statistically through flash-attn's, which returns no mask.

SDPA's signature (``read_keep_mask``): with q = k = 0 every visible weight of a row is equal,
and with V a block of Dv columns of the identity the output holds Dv columns of the weight
matrix after dropout: nonzero where kept. The probe calls keep every shape, keyword, mask
(its finite part zeroed, so that no weight underflows) and memory layout of the real call and
run under the same torch seed, one call per block of Dv keys, so a kernel that draws its mask
from torch's generator (as SDPA does) draws the same mask each time; the golden then applies
it, and the kept fraction of the visible entries is judged against 1 - p.

flash-attn's signature (``draw_outputs``): the output of ``DRAWS`` forward calls at p, each
under its own torch seed. ``judge.judge_draws`` holds them to what dropout does to the p = 0
output: each draw moves it by the variance dropout gives, and their mean comes back to it.

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T_q, T_k packed token counts.

Tests: tests/checker/running/test_dropout.py
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..battery.attention.case import Case
from ..golden import to64
from ..golden.attention import Inputs
from . import memory

if TYPE_CHECKING:
    from ..spec import Spec

Kernel = Callable[..., Any]

DRAWS = 16  # forward calls at p per case and dtype under flash-attn's signature


class ProbeError(Exception):
    """The kernel returned something that is not what its spec's library returns."""


def read_keep_mask(
    spec: Spec, kernel: Kernel, case: Case, inputs: Inputs, device: torch.device,
    seed: int,
) -> torch.Tensor:  # fmt: skip
    """The kernel's dropout keep-mask (B, H, N, M) for ``seed`` through a signature that takes
    (B, H, L, W) tensors and returns the output alone, SDPA's (see the module docstring);
    entries the case hides read as dropped."""
    b, h, h_kv, n, m = case.batch, case.heads, case.kv_heads, case.n, case.m
    dv, dtype = case.value_width, inputs.q.dtype
    q = torch.zeros(b, h, n, case.d, dtype=dtype, device=device)
    k = torch.zeros(b, h_kv, m, case.d, dtype=dtype, device=device)
    mask = inputs.attn_mask
    if mask is not None and mask.dtype != torch.bool:
        mask = torch.where(torch.isneginf(mask), mask, torch.zeros_like(mask))
    weights = torch.zeros(b, h, n, m, dtype=torch.float64, device=device)
    for start in range(0, m, dv):
        width = min(dv, m - start)
        v = torch.zeros(b, h_kv, m, dv, dtype=dtype, device=device)
        v[..., start : start + width, :width] = torch.eye(width, dtype=dtype, device=device)
        placed = memory.place(case.memory, q, k, v, heads_first=True)
        given = {} if mask is None else {"attn_mask": mask}
        out = _seeded(seed, device, functools.partial(spec.invoke, kernel, case,
                                                      *placed, given, False))  # fmt: skip
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (b, h, n, dv):
            what = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ProbeError(
                f"kernel returned {what} for the keep-mask probe, expected {(b, h, n, dv)}"
            )
        weights[..., start : start + width] = out.detach()[..., :width].double()
    return weights != 0


def visible(case: Case, inputs: Inputs) -> np.ndarray:
    """Bool (B, H, N, M): the entries the causal rule and the mask let a row see, where the
    keep-mask is judged."""
    seen = case.visible(case.n, case.m)  # (N, M)
    if inputs.attn_mask is not None:
        mask = to64(inputs.attn_mask)
        seen = seen & (mask if mask.dtype == bool else np.isfinite(mask))
    return np.broadcast_to(seen, (case.batch, case.heads, case.n, case.m))


def draw_outputs(
    kernel: Kernel,
    spec: Spec,
    case: Case,
    inputs: Inputs,
    given: dict[str, torch.Tensor],
    seed: int,
) -> np.ndarray:
    """``DRAWS`` outputs of the kernel at the case's dropout_p, forward only, each under its
    own torch seed, in the canonical layout: (DRAWS, B, H, N, Dv) or (DRAWS, T_q, H, Dv)."""
    device = inputs.q.device
    heads_first = spec.heads_first(case)
    qkv = [spec.layout(case, t) for t in (inputs.q, inputs.k, inputs.v)]
    expected = tuple(spec.layout(case, inputs.dout).shape)
    draws = []
    for draw in range(DRAWS):
        placed = memory.place(case.memory, *qkv, heads_first=heads_first)
        with torch.no_grad():
            call = functools.partial(spec.invoke, kernel, case, *placed, given, False)
            result = _seeded(draw_seed(seed, draw), device, call)
        out, _ = spec.split_result(result, want_lse=False)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
            what = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ProbeError(f"kernel returned out {what} at dropout_p, expected {expected}")
        draws.append(to64(spec.unlayout(case, out, case.heads)))
    return np.stack(draws)


def draw_seed(seed: int, draw: int) -> int:
    """torch's seed for draw ``draw`` of a run with ``seed``: distinct per draw and per seed."""
    return (seed * 1_000_003 + 7_919 * (draw + 1)) % 2**63


def _seeded(seed: int, device: torch.device, call: Callable[[], Any]) -> Any:
    """``call()`` with torch's generators seeded by ``seed``, the caller's state restored."""
    with torch.random.fork_rng(devices=rng_devices(device)):
        torch.manual_seed(seed)
        return call()


def rng_devices(device: torch.device) -> list[int]:
    """The CUDA devices whose generator state ``fork_rng`` saves and restores around a call."""
    if device.type != "cuda":
        return []
    return [torch.cuda.current_device() if device.index is None else device.index]
