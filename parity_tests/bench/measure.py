"""How the benchmarks of ``python -m parity_tests.bench`` measure, and how they state a
measurement: the best time of several runs, NumPy's peak traced memory, NumPy's own matmul rate
on this machine, and the units of the report.

Times are the best of ``repeats`` runs (wall clock) after one warm-up. NumPy's peak memory is the
tracemalloc peak of one more run (NumPy reports its array allocations to tracemalloc); torch's
allocations are not visible to tracemalloc and are not measured.

Tests: tests/bench/test_measure.py.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable

import numpy as np


def best_time(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up: caches, thread pools, lazy imports
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def seconds_of(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def traced_peak(run: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def matmul_rate(repeats: int) -> float:
    """NumPy's float32 matmul throughput in GFLOP/s, (2048 x 2048) @ (2048 x 2048), all cores."""
    a, b = (
        np.random.default_rng(i).standard_normal((2048, 2048), dtype=np.float32) for i in (0, 1)
    )
    return 2 * 2048**3 / best_time(lambda: a @ b, repeats) / 1e9


def seconds(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def mib(size: float) -> str:
    return f"{size / 2**20:,.0f} MiB"
