"""The project's Triton kernel against torch's fused kernels on a GPU: ``python -m
parity_tests.bench_triton`` (never a timed test; it needs CUDA and the extra ``triton``).

At (B, H, N, D) = (4, 16, 4096, 128) in bfloat16, causal, and causal with a window of 1024 keys
(the query included: ``window=(1023, 0)``), forward and forward+backward of

- ``torch_attention.triton`` (``functional.attention(..., backend="triton")``, autotuned);
- SDPA's flash backend (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``), which has no window: its
  window row is empty rather than a dense mask on another backend;
- FlexAttention compiled (``torch.compile(flex_attention)`` with a block mask).

Each is timed by ``triton.testing.do_bench`` (median ms, warm-up first, so the autotuner and
the compiler are done). Throughput is visible scores times the FLOPs of each score (4 D forward,
10 D forward+backward: the two products of the forward and five of the backward, FlashAttention's
convention); the ratios are triton's throughput over each other kernel's (> 1: triton faster).
The target: forward+backward at least ``TARGET`` of SDPA's throughput, causal. Without CUDA
or without Triton (or under its interpreter) it prints one line and exits 2.

Shape legend: B batch, H heads, N query and key length, D head width.

Tests: tests/parity/test_bench_triton.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

SHAPE = (4, 16, 4096, 128)  # (B, H, N, D)
WINDOW = 1024  # keys, the query included
TARGET = 0.7  # triton's fwd+bwd throughput over SDPA flash's, causal
CASES = {"causal": None, f"window {WINDOW}": (WINDOW - 1, 0)}
KERNELS = ("triton", "sdpa-flash", "flex-compiled")
PASSES = ("fwd", "fwd+bwd")


class Row(NamedTuple):
    case: str
    kind: str  # "fwd" or "fwd+bwd"
    ms: dict[str, float | None]  # per kernel; None where it cannot run the case


def visible_scores(n: int, window: tuple[int, int] | None) -> int:
    """Scores a causal (N, N) head computes: N(N+1)/2, or fewer with a window (left, 0)."""
    if window is None:
        return n * (n + 1) // 2
    keys = window[0] + 1
    return sum(min(i + 1, keys) for i in range(n))


def tflops(ms: float, kind: str, window: tuple[int, int] | None) -> float:
    """TFLOP/s of one call at SHAPE: 4 D FLOPs per visible score forward, 10 D forward+backward
    (2 FLOPs per multiply-add; Q K^T and P V forward, five products backward)."""
    b, h, n, d = SHAPE
    per_score = 4 * d if kind == "fwd" else 10 * d
    return b * h * visible_scores(n, window) * per_score / (ms * 1e-3) / 1e12


def report_lines(rows: list[Row], device_name: str) -> list[str]:
    """The table: ms and TFLOP/s per kernel, triton's throughput ratio over each other kernel,
    and the target's verdict."""
    lines = [
        f"Triton kernel vs SDPA flash and compiled FlexAttention on {device_name}: "
        f"(B, H, N, D) = {SHAPE} bfloat16",
        f"{'case':<12} {'pass':<8}"
        + "".join(f" {name + ' ms (TFLOP/s)':>28}" for name in KERNELS)
        + "".join(f" {'triton/' + name:>20}" for name in KERNELS[1:]),
    ]
    verdict = "not measured"
    for row in rows:
        window = CASES[row.case]
        cells = "".join(f" {_cell(row.ms[name], row.kind, window):>28}" for name in KERNELS)
        ratios = "".join(f" {_ratio(row.ms['triton'], row.ms[name]):>20}" for name in KERNELS[1:])
        lines.append(f"{row.case:<12} {row.kind:<8}{cells}{ratios}")
        if row.case == "causal" and row.kind == "fwd+bwd":
            ratio = _speedup(row.ms["triton"], row.ms["sdpa-flash"])
            if ratio is not None:
                verdict = f"{ratio:.2f}x: {'met' if ratio >= TARGET else 'NOT met'}"
    lines.append(f"target: triton fwd+bwd >= {TARGET}x SDPA flash's throughput, causal: {verdict}")
    return lines


def _cell(ms: float | None, kind: str, window: tuple[int, int] | None) -> str:
    return "-" if ms is None else f"{ms:.3f} ({tflops(ms, kind, window):.0f})"


def _speedup(triton_ms: float | None, other_ms: float | None) -> float | None:
    return None if triton_ms is None or other_ms is None else other_ms / triton_ms


def _ratio(triton_ms: float | None, other_ms: float | None) -> str:
    ratio = _speedup(triton_ms, other_ms)
    return "-" if ratio is None else f"{ratio:.2f}x"


def _calls(window: tuple[int, int] | None) -> dict[str, Callable[..., torch.Tensor] | None]:
    """Each kernel as ``call(q, k, v) -> out`` on (B, H, N, D), None where it cannot run."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from torch_attention.functional import attention

    b, h, n, _ = SHAPE
    left = None if window is None else window[0]

    def triton_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v, causal=True, window=window, backend="triton")

    def sdpa_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def mask_mod(batch: Any, head: Any, row: Any, col: Any) -> Any:
        visible = col <= row
        return visible if left is None else visible & (col >= row - left)

    block_mask = create_block_mask(mask_mod, None, None, n, n, device="cuda")
    compiled = torch.compile(flex_attention)

    def flex_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return compiled(q, k, v, block_mask=block_mask)

    return {
        "triton": triton_call,
        "sdpa-flash": sdpa_call if window is None else None,
        "flex-compiled": flex_call,
    }


def measure() -> list[Row]:
    """Every case, pass and kernel, timed on the current CUDA device."""
    from triton.testing import do_bench

    torch.manual_seed(0)
    q, k, v, dout = (
        torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(4)
    )
    dout = dout.detach()
    rows = []
    for case, window in CASES.items():
        calls = _calls(window)
        for kind in PASSES:
            times: dict[str, float | None] = {}
            for name, call in calls.items():
                if call is None:
                    times[name] = None
                    continue
                times[name] = float(do_bench(_timed(call, kind, q, k, v, dout),
                                             grad_to_none=[q, k, v]))  # fmt: skip
            rows.append(Row(case, kind, times))
    return rows


def _timed(call: Callable[..., torch.Tensor], kind: str, q: Any, k: Any, v: Any, dout: Any) -> Any:
    if kind == "fwd":

        def forward() -> None:
            with torch.no_grad():
                call(q, k, v)

        return forward

    def forward_backward() -> None:
        call(q, k, v).backward(dout)

    return forward_backward


def unavailable() -> str | None:
    """Why the benchmark cannot run here, in one line; None when it can."""
    if not torch.cuda.is_available():
        return "bench_triton needs a CUDA GPU (torch.cuda.is_available() is False); nothing timed"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "bench_triton times the compiled kernel: unset TRITON_INTERPRET (the interpreter)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "bench_triton needs the optional extra 'triton' (pip install -e '.[triton]')"
    return None


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m parity_tests.bench_triton",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    ).parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    for line in report_lines(measure(), torch.cuda.get_device_name()):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
