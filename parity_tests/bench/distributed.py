"""Benchmark of ring attention (``torch_attention.distributed``) on gloo CPU processes.

    python -m parity_tests.bench.distributed --help
    python -m parity_tests.bench.distributed                       # the measurement of the docs
    python -m parity_tests.bench.distributed --shape 1,4,4096,64 --worlds 1,2,4

For each world size W of ``--worlds`` and each sequence length of ``--lengths`` (default: N/4,
N/2 and N of ``--shape``), W processes are started (torch.multiprocessing, gloo on 127.0.0.1)
and run ``ring_attention`` forward and backward, float32, on one whole sequence split by the
layout. Each rank gets ``cores // W`` intra-op threads, so that every W uses the same cores.
Reported per W and N, as the worst rank:

- time: forward and backward, the best of ``--repeats`` (wall clock, all ranks started
  together by a barrier);
- bytes sent: counted at ``torch.distributed.batch_isend_irecv`` (the only point-to-point call
  of the ring) in one forward and one backward, against the theory: a forward sends K and V
  W - 1 times, (W - 1) / W of the whole K and V, i.e. 2 (W - 1) / W of K with Dv = D; a
  backward sends them W - 1 times and the partial dK, dV W times;
- peak memory: the peak resident set of the rank during one forward and backward minus its
  resident set before (Linux: VmHWM of /proc/self/status, reset through /proc/self/clear_refs;
  elsewhere the process's lifetime peak, ``resource.getrusage``), after a warm-up at a small
  size so that code loaded on first use is not counted.

Two single-process references at the length N of ``--shape``: torch's fused SDPA (time and
peak) and, at ``--dense-n`` only, the plain dense math attention (explicit (B, H, N, N) scores,
autograd), whose peak grows as N^2: its need at N is extrapolated from it, not run.

The report goes to stdout; nothing is written. docs/context-parallel.md records one run.

Tests: tests/bench/test_distributed.py (never timed); the ring it measures is tested in
tests/torch_attention/test_distributed.py.
"""

from __future__ import annotations

if __name__ == "__main__":  # one line and exit 2, not a traceback, where torch is missing
    from parity_tests.cli import exit_without_torch

    exit_without_torch("python -m parity_tests.bench.distributed")

import argparse
import math
import os
import platform
import re
import resource
import socket
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from torch_attention.distributed import ring_attention, shard_sequence
from torch_attention.ring_checks import LAYOUTS

SHAPE = (1, 4, 16384, 64)  # (B, H, N, D): dense math would hold 4 GiB per (B, H, N, N) array
DENSE_N = 4096  # the plain dense attention is measured here and extrapolated to N
WARMUP_N = 256
GROUP_TIMEOUT = timedelta(minutes=20)
MIB = 2**20


# -- memory -------------------------------------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            found = re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def reset_peak() -> int:
    """Reset the peak resident set where Linux allows it; the resident set now, in bytes."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass
    now = _status_kib("VmRSS")
    return 1024 * (now if now is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def peak() -> int:
    """The peak resident set since ``reset_peak`` (Linux) or since the process began, bytes."""
    high = _status_kib("VmHWM")
    return 1024 * (high if high is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


# -- one rank -----------------------------------------------------------------------------------


def _inputs(shape: tuple[int, int, int, int], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for _ in range(4)]  # q, k, v, dout


def _count_sends(sent: dict[str, int]) -> None:
    """Count the bytes this process hands to ``batch_isend_irecv`` to send (this process only)."""
    original = dist.batch_isend_irecv

    def counting(ops: list[dist.P2POp]) -> list[Any]:
        sent["bytes"] += sum(
            op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend
        )
        return original(ops)

    dist.batch_isend_irecv = counting  # type: ignore[assignment]


def _ring_once(
    whole: list[torch.Tensor], rank: int, world: int, args: argparse.Namespace, sent: dict
) -> tuple[float, float, int, int]:
    """One forward and backward on this rank's shards: their times and the bytes sent."""
    q, k, v, dout = (shard_sequence(t, rank, world, layout=args.layout) for t in whole)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dist.barrier()
    start_bytes, start = sent["bytes"], time.perf_counter()
    out = ring_attention(q, k, v, causal=args.causal, layout=args.layout)
    middle_bytes, middle = sent["bytes"], time.perf_counter()
    out.backward(dout)
    end = time.perf_counter()
    return middle - start, end - middle, middle_bytes - start_bytes, sent["bytes"] - start_bytes


def _rank(rank: int, world: int, port: int, length: int, args: argparse.Namespace, queue) -> None:
    torch.set_num_threads(max(1, args.cores // world))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=GROUP_TIMEOUT,
    )  # fmt: skip
    sent = {"bytes": 0}
    _count_sends(sent)
    batch, heads, _, width = args.shape
    warmup = _inputs((batch, heads, WARMUP_N * world, width))
    _ring_once(warmup, rank, world, args, sent)  # code loaded on first use is not counted
    whole = _inputs((batch, heads, length, width))
    before = reset_peak()
    runs = [_ring_once(whole, rank, world, args, sent)]
    memory = peak() - before
    runs += [_ring_once(whole, rank, world, args, sent) for _ in range(args.repeats - 1)]
    queue.put(
        {
            "rank": rank,
            "forward": min(run[0] for run in runs),
            "backward": min(run[1] for run in runs),
            "sent_forward": runs[0][2],
            "sent_total": runs[0][3],
            "peak": memory,
        }
    )
    dist.destroy_process_group()


def run_world(world: int, length: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One ring of ``world`` processes at sequence length ``length``; every rank's figures."""
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(
        _rank, args=(world, port, length, args, queue), nprocs=world, start_method="spawn"
    )
    return sorted((queue.get() for _ in range(world)), key=lambda row: row["rank"])


# -- single-process references -----------------------------------------------------------------


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, N, N)
    if causal:
        n = q.shape[-2]
        hidden = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _reference(kind: str, length: int, args: argparse.Namespace, queue) -> None:
    torch.set_num_threads(args.cores)
    batch, heads, _, width = args.shape

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if kind == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        return _dense(q, k, v, args.causal)

    def once(shape: tuple[int, int, int, int]) -> tuple[float, float]:
        q, k, v, dout = _inputs(shape)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        start = time.perf_counter()
        out = attend(q, k, v)
        middle = time.perf_counter()
        out.backward(dout)
        return middle - start, time.perf_counter() - middle

    once((batch, heads, WARMUP_N, width))
    before = reset_peak()
    times = [once((batch, heads, length, width))]
    memory = peak() - before
    times += [once((batch, heads, length, width)) for _ in range(args.repeats - 1)]
    queue.put(
        {
            "forward": min(t[0] for t in times),
            "backward": min(t[1] for t in times),
            "peak": memory,
        }
    )


def run_reference(kind: str, length: int, args: argparse.Namespace) -> dict[str, Any]:
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    process = context.Process(target=_reference, args=(kind, length, args, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


# -- the report ---------------------------------------------------------------------------------


def theory(world: int, shape: tuple[int, int, int, int], length: int) -> tuple[int, int]:
    """Bytes one rank sends in a forward and in a forward + backward, float32, Dv = D."""
    batch, heads, _, width = shape
    kv_shard = 2 * batch * heads * (length // world) * width * 4  # its K and V
    forward = (world - 1) * kv_shard
    return forward, forward + (world - 1) * kv_shard + (world if world > 1 else 0) * kv_shard


def report(args: argparse.Namespace) -> None:
    batch, heads, length, width = args.shape
    print(
        f"ring attention, float32, causal={args.causal}, layout={args.layout}, "
        f"(B, H, N, D) = {args.shape}; {platform.processor() or platform.machine()}, "
        f"{args.cores} cores, torch {torch.__version__}; best of {args.repeats}"
    )
    k_bytes = batch * heads * length * width * 4
    print(f"K of the whole sequence at N = {length}: {k_bytes / MIB:.1f} MiB\n")
    header = (
        f"{'W':>2} {'N':>6} {'fwd s':>7} {'bwd s':>7} {'sent fwd MiB':>13} {'theory':>8} "
        f"{'sent fwd+bwd MiB':>17} {'theory':>8} {'peak/rank MiB':>14}"
    )
    print(header)
    for n in args.lengths:
        for world in args.worlds:
            rows = run_world(world, n, args)
            fwd_theory, total_theory = theory(world, args.shape, n)
            print(
                f"{world:>2} {n:>6} {max(r['forward'] for r in rows):>7.2f} "
                f"{max(r['backward'] for r in rows):>7.2f} "
                f"{max(r['sent_forward'] for r in rows) / MIB:>13.2f} {fwd_theory / MIB:>8.2f} "
                f"{max(r['sent_total'] for r in rows) / MIB:>17.2f} {total_theory / MIB:>8.2f} "
                f"{max(r['peak'] for r in rows) / MIB:>14.1f}",
                flush=True,
            )
    print("\nsingle process, whole sequence:")
    sdpa = run_reference("sdpa", length, args)
    print(
        f"  torch SDPA (fused, {args.cores} threads) N = {length}: "
        f"forward {sdpa['forward']:.2f} s, backward {sdpa['backward']:.2f} s, "
        f"peak {sdpa['peak'] / MIB:.1f} MiB"
    )
    if args.dense_n:
        dense = run_reference("dense", args.dense_n, args)
        need = dense["peak"] * (length / args.dense_n) ** 2
        print(
            f"  dense math (explicit scores, autograd) N = {args.dense_n}: forward "
            f"{dense['forward']:.2f} s, backward {dense['backward']:.2f} s, peak "
            f"{dense['peak'] / MIB:.1f} MiB; at N = {length} (x{(length / args.dense_n) ** 2:g}): "
            f"~{need / 2**30:.1f} GiB"
        )


# -- command line -------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"integers of at least 1, got {text!r}")
    return values


def _positive(text: str) -> int:
    values = _ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"one integer, got {text!r}")
    return values[0]


def _shape(text: str) -> tuple[int, int, int, int]:
    values = _ints(text)
    if len(values) != 4:
        raise argparse.ArgumentTypeError(f"a shape is B,H,N,D (four integers), got {text!r}")
    return (values[0], values[1], values[2], values[3])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m parity_tests.bench.distributed",
        description="Ring attention on gloo CPU processes: time, bytes sent, peak memory.",
    )
    parser.add_argument("--shape", type=_shape, default=SHAPE, help="B,H,N,D (default %(default)s)")
    parser.add_argument("--worlds", type=_ints, default=[1, 2], help="world sizes (default 1,2)")
    parser.add_argument(
        "--lengths", type=_ints, default=None, help="sequence lengths (default N/4,N/2,N)"
    )
    parser.add_argument("--layout", choices=LAYOUTS, default="zigzag")
    parser.add_argument("--no-causal", dest="causal", action="store_false", help="full attention")
    parser.add_argument("--repeats", type=_positive, default=1, help="timed runs, best of (1)")
    parser.add_argument(
        "--dense-n",
        type=int,
        default=DENSE_N,
        help=f"N of the dense single-process reference, 0 to skip (default {DENSE_N})",
    )
    parser.add_argument(
        "--cores",
        type=_positive,
        default=os.cpu_count() or 1,
        help="intra-op threads shared by the ranks (default: this machine's cores)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.lengths = args.lengths or [args.shape[2] // 4, args.shape[2] // 2, args.shape[2]]
    for world in args.worlds:
        parts = world * (2 if args.layout == "zigzag" else 1)
        if any(n % parts for n in args.lengths):
            parser.error(f"lengths {args.lengths} must split into {parts} chunks for W = {world}")
    report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
