"""The project's Triton kernel against torch's fused kernels on a GPU: ``python -m
parity_tests.bench.triton`` (never a timed test; it needs CUDA and the extra ``triton``).

At (B, H, N, D) = (4, 16, 4096, 128) in bfloat16, causal, and causal with a window of 1024 keys
(the query included: ``window=(1023, 0)``), forward and forward+backward of

- ``torch_attention.triton`` (``functional.attention(..., backend="triton")``, autotuned);
- SDPA's flash backend (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``), which has no window: its
  window row is empty rather than a dense mask on another backend;
- FlexAttention compiled (``torch.compile(flex_attention)`` with a block mask).

Each is timed by ``triton.testing.do_bench`` (median ms, warm-up first, so the autotuner and
the compiler are done). Throughput is visible scores times the FLOPs of each score (4 D forward,
14 D forward+backward: the two products of the forward and five of the backward, FlashAttention's
convention, whatever a kernel recomputes); the ratios are triton's throughput over each other
kernel's (> 1: triton faster).
The target: forward+backward at least ``TARGET`` of SDPA's throughput, causal. Without CUDA
or without Triton (or under its interpreter) it prints one line and exits 2.

``--compile-only [--arch 90]`` needs no GPU: it compiles the three kernels to machine code for
``sm_<arch>`` with the ptxas that Triton bundles (bfloat16, float16 and float32 at D = 128, the
first autotuning configuration, plain causal and every option at once) and prints each one's
shared memory, which proves what the interpreter cannot: that the kernels compile for a GPU.

Shape legend: B batch, H heads, N query and key length, D head width.

Tests: tests/bench/test_triton.py.
"""

from __future__ import annotations

if __name__ == "__main__":  # one line and exit 2, not a traceback, where torch is missing
    from parity_tests.cli import exit_without_torch

    exit_without_torch("python -m parity_tests.bench.triton")

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
    """TFLOP/s of one call at SHAPE: 4 D FLOPs per visible score forward, 14 D forward+backward
    (2 FLOPs per multiply-add; Q K^T and P V forward, five products backward)."""
    b, h, n, d = SHAPE
    per_score = 4 * d if kind == "fwd" else 14 * d
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


def compile_lines(arch: int) -> list[str]:
    """Compile every kernel for ``sm_<arch>`` without a GPU; one line per kernel, dtype and set
    of options, with its shared memory (a failure raises Triton's compilation error)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from torch_attention.triton import backward, forward, launch

    d = SHAPE[3]
    options = {
        "causal": {"HAS_RIGHT": True},
        "every option": {"VARLEN": True, "BOTTOM_RIGHT": True, "SOFTCAP": True, "ALIBI": True,
                         "HAS_LEFT": True, "HAS_RIGHT": True, "DROPOUT": True, "SINKS": True,
                         "SLOPE_GRAD": True},
    }  # fmt: skip
    kernels = {
        "forward": (forward.attention_forward_kernel, launch.FORWARD_CONFIGS[0]),
        "dk/dv": (backward.attention_backward_dkdv_kernel, launch.BACKWARD_CONFIGS[0]),
        "dq": (backward.attention_backward_dq_kernel, launch.BACKWARD_CONFIGS[0]),
    }
    lines = []
    for dtype in ("bf16", "fp16", "fp32"):
        for name, flags in options.items():
            for kernel_name, (kernel, (block_m, block_n, warps, stages)) in kernels.items():
                constexprs = {"BLOCK_D": d, "BLOCK_DV": d, "BLOCK_M": block_m, "BLOCK_N": block_n,
                              "DOT_PRECISION": "ieee" if dtype == "fp32" else None}  # fmt: skip
                source = ASTSource(kernel, *kernel_signature(kernel, dtype, flags, constexprs))
                compiled = triton.compile(
                    source,
                    target=GPUTarget("cuda", arch, 32),
                    options={"num_warps": warps, "num_stages": stages},
                )
                lines.append(
                    f"sm_{arch} {kernel_name:<8} {dtype:<5} {name:<13} compiled, "
                    f"{compiled.metadata.shared} bytes of shared memory"
                )
    return lines


def kernel_signature(
    kernel: Any, dtype: str, flags: dict[str, bool], constexprs: dict[str, Any]
) -> tuple[dict[str, str], dict[str, Any]]:
    """The argument types of ``kernel`` (pointers to ``dtype`` for q, k, v, out and their
    gradients, float32 for the statistics, int32 offsets, a pointer to the int64 seed) and its
    constexprs; an option that is off passes its tensors as None."""
    packed = flags.get("VARLEN", False)
    unused = set()
    if not packed:
        unused |= {"cu_seqlens_q", "cu_seqlens_k"}
    if not flags.get("ALIBI", False):
        unused |= {"slopes"}
    if not flags.get("SINKS", False):
        unused |= {"sinks"}
    if not flags.get("SLOPE_GRAD", False):
        unused |= {"dslope_rows"}
    if not flags.get("DROPOUT", False):
        unused |= {"seed"}
    signature, values = {}, {}
    for name in kernel.arg_names:
        if name.isupper() or name in unused:
            signature[name] = "constexpr"
            values[name] = constexprs.get(name, flags.get(name, False if name.isupper() else None))
        elif name in ("q", "k", "v", "out", "dout", "dq", "dk", "dv"):
            signature[name] = "*" + dtype
        elif name in ("lse", "delta", "sinks", "slopes", "dslope_rows"):
            signature[name] = "*fp32"
        elif name.startswith("cu_seqlens"):
            signature[name] = "*i32"
        elif name == "seed":
            signature[name] = "*i64"
        elif name in ("scale", "softcap", "dropout_p", "rescale"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return signature, values


def unavailable() -> str | None:
    """Why the benchmark cannot run here, in one line; None when it can."""
    if not torch.cuda.is_available():
        return "bench.triton needs a CUDA GPU (torch.cuda.is_available() is False); nothing timed"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "bench.triton times the compiled kernel: unset TRITON_INTERPRET (the interpreter)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "bench.triton needs the optional extra 'triton' (pip install -e '.[triton]')"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parity_tests.bench.triton",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="compile the kernels for a GPU target (no GPU needed) instead of timing them",
    )
    parser.add_argument("--arch", type=int, default=90, help="with --compile-only: sm_ARCH")
    args = parser.parse_args(argv)
    if args.compile_only:
        if os.environ.get("TRITON_INTERPRET") == "1":
            print("--compile-only compiles the kernels: unset TRITON_INTERPRET", file=sys.stderr)
            return 2
        for line in compile_lines(args.arch):
            print(line, flush=True)
        return 0
    reason = unavailable()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    for line in report_lines(measure(), torch.cuda.get_device_name()):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
