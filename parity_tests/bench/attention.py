"""The attention alone, for ``python -m parity_tests.bench`` (part ``shapes``; never a timed
test): causal float32 attention at each shape of ``SHAPES`` (or of ``--shape``), NumPy dense and
tiled forward (inference, under ``no_grad()``) and forward+backward, torch's fused SDPA and torch
eager math in the same run, the ratios, the achieved GFLOP/s against NumPy's own matmul rate
measured in the same run, and NumPy's peak traced memory.

Paths that hold (B, H, N, N) arrays (NumPy dense, torch eager) skip the shapes whose scores would
not fit (``DENSE_MAX_SCORES``).

Tests: tests/bench/test_attention.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from numpy_attention import functional, no_grad

from .measure import best_time, mib, seconds, traced_peak

# (B, H, N, D), causal, float32; the last one is the long sequence.
SHAPES = [
    (1, 12, 512, 64),
    (10, 12, 512, 64),
    (1, 12, 2048, 64),
    (1, 8, 4096, 64),
    (1, 4, 16384, 64),
]
# Paths that hold (B, H, N, N) arrays (NumPy dense, torch eager) skip shapes above this many
# score entries: (1, 4, 16384, 16384) float32 is 4 GiB per array.
DENSE_MAX_SCORES = 8 * 4096 * 4096
LONG = (1, 4, 16384, 64)  # the memory target
SDPA_TARGET_SHAPES = [(1, 12, 2048, 64), (1, 8, 4096, 64)]  # forward and fwd+bwd against SDPA


def causal_flops(b: int, h: int, n: int, d: int) -> tuple[float, float]:
    """Model FLOPs of (forward, forward+backward) over the visible entries j <= i only: two
    products forward (Q K^T, P V), five backward (2.5x forward, FlashAttention's convention)."""
    forward = 4.0 * b * h * d * n * (n + 1) / 2
    return forward, 3.5 * forward


def numpy_runs(
    q, k, v, dout, impl: str, causal: bool = True
) -> tuple[Callable[[], object], Callable[[], object]]:
    def forward() -> None:
        with no_grad():
            functional.attention_forward(q, k, v, causal=causal, impl=impl)

    def forward_backward() -> None:
        ctx = functional.attention_forward(q, k, v, causal=causal, impl=impl).ctx
        functional.attention_backward(dout, ctx)

    return forward, forward_backward


def torch_runs(q, k, v, dout, kernel) -> tuple[Callable[[], object], Callable[[], object]]:
    tq, tk, tv = (torch.from_numpy(t).requires_grad_() for t in (q, k, v))
    tdout = torch.from_numpy(dout)

    def forward() -> None:
        with torch.no_grad():
            kernel(tq, tk, tv)

    def forward_backward() -> None:
        kernel(tq, tk, tv).backward(tdout)

    return forward, forward_backward


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def eager_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    n, m = q.shape[-2], k.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, N, M)
    hidden = torch.ones(n, m, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ v


def bench_shape(shape: tuple[int, int, int, int], repeats: int) -> dict[str, float]:
    b, h, n, d = shape
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    dense_fits = b * h * n * n <= DENSE_MAX_SCORES
    runs = {
        "tiled": numpy_runs(q, k, v, dout, "tiled"),
        "sdpa": torch_runs(q, k, v, dout, sdpa),
    }
    if dense_fits:
        runs["dense"] = numpy_runs(q, k, v, dout, "dense")
        runs["eager"] = torch_runs(q, k, v, dout, eager_math)
    repeats = repeats if n < 16384 else 1
    row: dict[str, float] = {}
    for name, (forward, forward_backward) in runs.items():
        row[f"{name} fwd"] = best_time(forward, repeats)
        row[f"{name} fwd+bwd"] = best_time(forward_backward, repeats)
        if name in ("tiled", "dense"):
            row[f"{name} peak fwd"] = traced_peak(forward)
            row[f"{name} peak fwd+bwd"] = traced_peak(forward_backward)
    return row


def shape_tables(rows: dict, rate: float) -> list[str]:
    lines = [
        "### Causal attention, float32, forward+backward",
        "",
        "| (B, H, N, D) | NumPy dense | NumPy tiled | torch SDPA | torch eager | tiled / SDPA "
        "| tiled / eager | tiled GFLOP/s (% of matmul) | peak dense | peak tiled |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, row in rows.items():
        flops = causal_flops(*shape)[1]
        tiles = row["tiled fwd+bwd"]
        dense = "dense fwd+bwd" in row
        vs_eager = f"{tiles / row['eager fwd+bwd']:.2f}x" if dense else "-"
        lines.append(
            f"| {shape} | {seconds(row['dense fwd+bwd']) if dense else 'skipped'} "
            f"| {seconds(tiles)} | {seconds(row['sdpa fwd+bwd'])} "
            f"| {seconds(row['eager fwd+bwd']) if dense else 'skipped'} "
            f"| {tiles / row['sdpa fwd+bwd']:.2f}x "
            f"| {vs_eager} "
            f"| {flops / tiles / 1e9:.0f} ({100 * flops / tiles / 1e9 / rate:.0f}%) "
            f"| {mib(row['dense peak fwd+bwd']) if dense else '-'} "
            f"| {mib(row['tiled peak fwd+bwd'])} |"
        )
    lines += [
        "",
        "### Causal attention, float32, forward (inference, no_grad)",
        "",
        "| (B, H, N, D) | NumPy dense | NumPy tiled | torch SDPA | torch eager | tiled / SDPA "
        "| tiled GFLOP/s (% of matmul) | peak dense | peak tiled |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, row in rows.items():
        flops = causal_flops(*shape)[0]
        tiles = row["tiled fwd"]
        dense = "dense fwd" in row
        lines.append(
            f"| {shape} | {seconds(row['dense fwd']) if dense else 'skipped'} | {seconds(tiles)} "
            f"| {seconds(row['sdpa fwd'])} | {seconds(row['eager fwd']) if dense else 'skipped'} "
            f"| {tiles / row['sdpa fwd']:.2f}x "
            f"| {flops / tiles / 1e9:.0f} ({100 * flops / tiles / 1e9 / rate:.0f}%) "
            f"| {mib(row['dense peak fwd']) if dense else '-'} | {mib(row['tiled peak fwd'])} |"
        )
    return [*lines, ""]
