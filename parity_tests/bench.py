"""Benchmark of the NumPy attention against torch on this machine's CPU (never a timed test).

    python -m parity_tests.bench --help
    python -m parity_tests.bench                     # the whole benchmark, report on stdout
    python -m parity_tests.bench --only gpt2         # one part of it
    python -m parity_tests.bench --only shapes --shape 1,12,512,64 --repeats 1
    python -m parity_tests.bench --write-docs        # the whole benchmark, recorded in docs/

The parts (``--only``): ``shapes``, causal float32 attention at each shape of ``SHAPES`` (or of
``--shape``): NumPy dense and tiled forward (inference, under ``no_grad()``) and
forward+backward, torch's fused SDPA and torch eager math in the same run, the ratios, the
achieved GFLOP/s against NumPy's own matmul rate measured in the same run, and NumPy's peak
traced memory; ``crossover``, the dense/tiled crossover that sets ``impl="auto"``; ``blocks``,
the tiled path's block sizes; ``profile``, the tiled path's products alone against the whole;
``gpt2``, the GPT-2 layer (x (10, 512, 768), 12 heads) forward in NumPy against the torch mirror
on SDPA; ``options`` and ``window``, the cost of today's options on the tiled path
(``parity_tests/bench_options.py``); ``decode``, a Llama-8B-shaped layer's decode step and
prefill, NumPy against the torch twin (``parity_tests/bench_decode.py``); ``latent``, a
DeepSeek-V2-Lite-shaped MLA layer's decode step, absorbed and expanded, NumPy against the torch
twin, and its cache bytes per token (``parity_tests/bench_latent.py``). The issues' targets
are reported where the parts they need
ran.

The report goes to stdout. Only ``--write-docs`` (with the whole benchmark) rewrites the
generated block of docs/benchmarks.md and, when matplotlib is installed (the ``plot`` extra),
docs/benchmarks.png.

Times are the best of ``--repeats`` runs (wall clock). NumPy's peak memory is the tracemalloc
peak of one more run (NumPy reports its array allocations to tracemalloc); torch's allocations
are not visible to tracemalloc and are not measured.

Tests: tests/parity/test_bench.py.
"""

from __future__ import annotations

if __name__ == "__main__":  # one line and exit 2, not a traceback, where torch is missing
    from parity_tests.cli import exit_without_torch

    exit_without_torch("python -m parity_tests.bench")

import argparse
import math
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from numpy_attention import functional, no_grad, threads, tiled
from numpy_attention.functional import merge_heads_forward
from numpy_attention.fused import CausalSelfAttention, split_projection_forward
from torch_attention.fused import CausalSelfAttention as TorchCausalSelfAttention

from . import bench_decode, bench_latent, bench_options

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
CROSSOVER_N = [256, 384, 512, 640, 768]  # (1, 12, N, 64): dense vs tiled, for impl="auto"
CROSSOVER_ROUNDS = 15  # dense and tiled alternate, so that load on a shared machine hits both
PROFILE = (1, 12, 2048, 64)  # block-size sweep, profile and the first two targets
BLOCK_SWEEP = [(128, 128), (256, 256), (512, 512), (128, 512), (512, 128)]  # (block_q, block_k)
LONG = (1, 4, 16384, 64)  # the memory target
SDPA_TARGET_SHAPES = [(1, 12, 2048, 64), (1, 8, 4096, 64)]  # forward and fwd+bwd against SDPA
GPT2 = {"batch": 10, "tokens": 512, "width": 768, "heads": 12}
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def best_time(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up: caches, thread pools, lazy imports
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def traced_peak(run: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def causal_flops(b: int, h: int, n: int, d: int) -> tuple[float, float]:
    """Model FLOPs of (forward, forward+backward) over the visible entries j <= i only: two
    products forward (Q K^T, P V), five backward (2.5x forward, FlashAttention's convention)."""
    forward = 4.0 * b * h * d * n * (n + 1) / 2
    return forward, 3.5 * forward


def matmul_rate(repeats: int) -> float:
    """NumPy's float32 matmul throughput in GFLOP/s, (2048 x 2048) @ (2048 x 2048), all cores."""
    a, b = (
        np.random.default_rng(i).standard_normal((2048, 2048), dtype=np.float32) for i in (0, 1)
    )
    return 2 * 2048**3 / best_time(lambda: a @ b, repeats) / 1e9


# -- one shape ---------------------------------------------------------------------------------


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


# -- crossover, profile, GPT-2 layer -----------------------------------------------------------


def crossover() -> list[tuple[int, float, float, float, float]]:
    """(N, dense and tiled fwd+bwd causal, the same not causal) at (1, 12, N, 64): the best of
    CROSSOVER_ROUNDS rounds that each run dense then tiled (times of a few ms are noisy)."""
    rows = []
    for n in CROSSOVER_N:
        rng = np.random.default_rng(n)
        q, k, v, dout = (rng.standard_normal((1, 12, n, 64), dtype=np.float32) for _ in range(4))
        times = []
        for causal in (True, False):
            dense = numpy_runs(q, k, v, dout, "dense", causal)[1]
            tiles = numpy_runs(q, k, v, dout, "tiled", causal)[1]
            rounds = [(seconds_of(dense), seconds_of(tiles)) for _ in range(CROSSOVER_ROUNDS)]
            times += [min(dense for dense, _ in rounds), min(tiles for _, tiles in rounds)]
        rows.append((n, *times))
    return rows


def seconds_of(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def block_sweep(repeats: int) -> list[tuple[int, int, float]]:
    """(block_q, block_k, tiled fwd+bwd) at PROFILE, causal float32."""
    rng = np.random.default_rng(3)
    q, k, v, dout = (rng.standard_normal(PROFILE, dtype=np.float32) for _ in range(4))
    rows = []
    for block_q, block_k in BLOCK_SWEEP:

        def forward_backward(block_q: int = block_q, block_k: int = block_k) -> None:
            ctx = tiled.tiled_attention_forward(
                q, k, v, causal=True, block_q=block_q, block_k=block_k
            ).ctx
            tiled.tiled_attention_backward(dout, ctx)

        rows.append((block_q, block_k, best_time(forward_backward, repeats)))
    return rows


def tile_products_floor(
    shape: tuple[int, int, int, int], repeats: int, measured: dict | None = None
) -> dict[str, float]:
    """The time the tiled path's matrix products alone take, on the same pool: per visible tile
    two (g, 256, 64) x (g, 64, 256) products for the forward and five more for the backward;
    beside them the whole tiled forward and forward+backward and torch SDPA's (from
    ``measured``, the shapes part's row, when it ran). What the whole takes beyond the products
    is elementwise work and Python overhead, which a fused kernel such as SDPA's avoids."""
    b, h, n, d = shape
    block = tiled.BLOCK_Q
    chunk = min(b * h, tiled.TILE_ENTRIES // block**2)
    rng = np.random.default_rng(1)
    left = rng.standard_normal((chunk, block, d), dtype=np.float32)
    right = rng.standard_normal((chunk, d, block), dtype=np.float32)
    blocks = n // block
    tiles = blocks * (blocks + 1) // 2 * math.ceil(b * h / chunk)

    def products(count: int) -> Callable[[], None]:
        def per_tile(_: object) -> None:
            for _ in range(count):
                left @ right

        return lambda: threads.run([(None,)] * tiles, per_tile)

    result = {
        "forward products": best_time(products(2), repeats),
        "products": best_time(products(7), repeats),
        "tiles": tiles,
    }
    if measured is None:
        q, k, v, dout = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
        forward, forward_backward = numpy_runs(q, k, v, dout, "tiled")
        fused = torch_runs(q, k, v, dout, sdpa)
        measured = {
            "tiled fwd": best_time(forward, repeats),
            "tiled fwd+bwd": best_time(forward_backward, repeats),
            "sdpa fwd": best_time(fused[0], repeats),
            "sdpa fwd+bwd": best_time(fused[1], repeats),
        }
    keys = ("tiled fwd", "tiled fwd+bwd", "sdpa fwd", "sdpa fwd+bwd")
    return result | {key: measured[key] for key in keys}


def gpt2_layer(repeats: int) -> dict[str, float]:
    """CausalSelfAttention(768, 12) forward in eval mode: NumPy (impl="auto") vs torch (SDPA),
    whole and stage by stage (projections, attention, head merge), each side timed in a group."""
    cfg = GPT2
    b, n, c, h = cfg["batch"], cfg["tokens"], cfg["width"], cfg["heads"]
    layer = CausalSelfAttention(c, h, 1024, rng=0).eval()
    mirror = TorchCausalSelfAttention(c, h, 1024, backend="sdpa").eval()
    mirror.load_state_dict({name: torch.from_numpy(t) for name, t in layer.state_dict().items()})
    x = np.random.default_rng(2).standard_normal((b, n, c), dtype=np.float32)
    tx = torch.from_numpy(x)

    def numpy_forward() -> np.ndarray:
        with no_grad():
            return layer(x)

    def torch_forward() -> torch.Tensor:
        with torch.no_grad():
            return mirror(tx)

    expected = torch_forward().numpy()
    error = np.max(np.abs(numpy_forward() - expected)) / np.max(np.abs(expected))
    result = {
        "numpy": best_time(numpy_forward, repeats),
        "numpy peak": traced_peak(numpy_forward),
        "rel error": float(error),
    }
    with no_grad():
        qkv = layer.Wqkv(x)  # (B, N, C) -> (B, N, 3C)
        (q, k, v), _ = split_projection_forward(qkv, 3, h)  # 3 x (B, H, N, D), views
        heads = functional.attention_forward(q, k, v, causal=True).out
        merged = merge_heads_forward(heads)[0]  # (B, H, N, D) -> (B, N, C)

        result |= {
            "numpy Wqkv": best_time(lambda: layer.Wqkv(x), repeats),
            "numpy attention": best_time(
                lambda: functional.attention_forward(q, k, v, causal=True), repeats
            ),
            "numpy merge": best_time(lambda: merge_heads_forward(heads), repeats),
            "numpy Wo": best_time(lambda: layer.Wo(merged), repeats),
        }
    result["torch"] = best_time(torch_forward, repeats)
    with torch.no_grad():
        tqkv = mirror.Wqkv(tx)
        tq, tk, tv = tqkv.view(b, n, 3, h, c // h).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
        theads = sdpa(tq, tk, tv)
        tmerged = theads.transpose(1, 2).reshape(b, n, c)
        result |= {
            "torch Wqkv": best_time(lambda: mirror.Wqkv(tx), repeats),
            "torch attention": best_time(lambda: sdpa(tq, tk, tv), repeats),
            "torch merge": best_time(lambda: theads.transpose(1, 2).reshape(b, n, c), repeats),
            "torch Wo": best_time(lambda: mirror.Wo(tmerged), repeats),
        }
    return result


# -- report ------------------------------------------------------------------------------------


def seconds(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def mib(size: float) -> str:
    return f"{size / 2**20:,.0f} MiB"


def targets(
    rows: dict,
    layer: dict | None,
    options: dict | None = None,
    window: dict | None = None,
    decode: dict | None = None,
    latent: dict | None = None,
) -> list[str]:
    """The issues' targets, as ratios from this run: those whose measurements ran."""
    checks = []
    main = rows.get(PROFILE, {})
    for shape in SDPA_TARGET_SHAPES:  # step 7: the plain path pushed to torch's fused kernel
        if shape in rows:
            checks += [
                (
                    f"NumPy tiled forward (inference) <= 1.0x torch SDPA at {shape}",
                    rows[shape]["tiled fwd"] / rows[shape]["sdpa fwd"],
                    1.0,
                    "{:.2f}x",
                ),
                (
                    f"NumPy tiled fwd+bwd <= 0.9x torch SDPA at {shape}",
                    rows[shape]["tiled fwd+bwd"] / rows[shape]["sdpa fwd+bwd"],
                    0.9,
                    "{:.2f}x",
                ),
            ]
    if "eager fwd+bwd" in main:
        checks += [
            (
                f"NumPy fwd+bwd <= 2.0x torch SDPA at {PROFILE}",
                main["tiled fwd+bwd"] / main["sdpa fwd+bwd"],
                2.0,
                "{:.2f}x",
            ),
            (
                f"NumPy fwd+bwd <= 0.5x torch eager math at {PROFILE}",
                main["tiled fwd+bwd"] / main["eager fwd+bwd"],
                0.5,
                "{:.2f}x",
            ),
        ]
    if LONG in rows:
        checks.append(
            (
                f"{LONG} causal fwd+bwd peak traced memory < 1.5 GiB",
                rows[LONG]["tiled peak fwd+bwd"] / 2**20,
                1.5 * 1024,
                "{:,.0f} MiB",  # MiB, as the tables below state it
            )
        )
    if layer is not None:
        checks.append(
            (
                "GPT-2 layer forward <= 1.5x the torch SDPA module",
                layer["numpy"] / layer["torch"],
                1.5,
                "{:.2f}x",
            )
        )
    lines = (
        [
            f"| {name} | {fmt.format(value)} | {'yes' if value <= limit else 'no'} |"
            for name, value, limit, fmt in checks
        ]
        + bench_options.targets(options, window)
        + bench_decode.targets(decode)
        + bench_latent.targets(latent)
    )
    if not lines:
        return []
    return ["### Targets", "", "| target | this run | met |", "|---|---|---|", *lines, ""]


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


def crossover_table(cross: list) -> list[str]:
    lines = [
        '### Dense vs tiled, forward+backward at (1, 12, N, 64): the impl="auto" crossover',
        "",
        "| N | causal: dense | tiled | tiled / dense | not causal: dense | tiled | tiled / dense |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {n} | {seconds(cd)} | {seconds(ct)} | {ct / cd:.2f} "
        f"| {seconds(nd)} | {seconds(nt)} | {nt / nd:.2f} |"
        for n, cd, ct, nd, nt in cross
    ]
    return [*lines, ""]


def block_table(sweep: list) -> list[str]:
    lines = [
        f"### Block sizes, tiled forward+backward at {PROFILE}",
        "",
        "| block_q | block_k | time |",
        "|---|---|---|",
    ]
    lines += [f"| {bq} | {bk} | {seconds(t)} |" for bq, bk, t in sweep]
    return [*lines, ""]


def profile_lines(floor: dict) -> list[str]:
    lines = [f"### Where the tiled time goes, at {PROFILE}", ""]
    for kind, key, products, count, target in (
        ("forward", "fwd", floor["forward products"], 2, 1.0),
        ("forward+backward", "fwd+bwd", floor["products"], 7, 0.9),
    ):
        whole, fused = floor[f"tiled {key}"], floor[f"sdpa {key}"]
        lines.append(
            f"- {kind}: the products alone, {count} per tile for {floor['tiles']} tiles (same "
            f"pool, same shapes), {seconds(products)}: {100 * products / whole:.0f}% of the whole "
            f"tiled {kind} ({seconds(whole)}) and {products / fused:.2f}x torch SDPA's whole "
            f"{kind} ({seconds(fused)}). The rest, {seconds(whole - products)}, is elementwise "
            f"work (exp, max, masks) and Python overhead; at {target}x SDPA it would have to fit "
            f"in {seconds(max(0.0, target * fused - products))}."
        )
    return [*lines, ""]


def layer_lines(layer: dict) -> list[str]:
    lines = [
        f"### GPT-2 attention layer forward, x ({GPT2['batch']}, {GPT2['tokens']}, "
        f"{GPT2['width']}), {GPT2['heads']} heads, eval, no_grad",
        "",
        f'- NumPy `fused.CausalSelfAttention` (impl="auto"): {seconds(layer["numpy"])}, '
        f"peak {mib(layer['numpy peak'])}",
        f'- torch `torch_attention.fused.CausalSelfAttention` (backend="sdpa"): '
        f"{seconds(layer['torch'])}",
        f"- ratio NumPy / torch: {layer['numpy'] / layer['torch']:.2f}x; outputs agree to "
        f"{layer['rel error']:.1e} (relative)",
        "",
        "| stage | NumPy | torch | NumPy / torch |",
        "|---|---|---|---|",
    ]
    for stage, label in [
        ("Wqkv", "Wqkv projection (B, N, C) -> (B, N, 3C)"),
        ("attention", "attention (B, H, N, D), causal"),
        ("merge", "merge heads"),
        ("Wo", "Wo projection"),
    ]:
        numpy_time, torch_time = layer[f"numpy {stage}"], layer[f"torch {stage}"]
        ratio = f"{numpy_time / torch_time:.2f}x" if torch_time >= 1e-4 else "- (torch: a view)"
        lines.append(f"| {label} | {seconds(numpy_time)} | {seconds(torch_time)} | {ratio} |")
    return [*lines, ""]


def report(
    rate: float,
    repeats: int,
    rows: dict | None = None,
    sweep: list | None = None,
    cross: list | None = None,
    floor: dict | None = None,
    layer: dict | None = None,
    options: dict | None = None,
    window: dict | None = None,
    decode: dict | None = None,
    latent: dict | None = None,
) -> str:
    """The Markdown report of the parts that ran (None: the part did not run)."""
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores; "
        f"NumPy {np.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads). "
        f"NumPy float32 matmul (2048^3) in this run: {rate:.0f} GFLOP/s. "
        f"Times: the best of {repeats} runs after one warm-up (one run from N = 16384 on).",
        "",
        *targets(rows or {}, layer, options, window, decode, latent),
    ]
    if rows:
        lines += shape_tables(rows, rate)
    if cross is not None:
        lines += crossover_table(cross)
    if sweep is not None:
        lines += block_table(sweep)
    if floor is not None:
        lines += profile_lines(floor)
    if layer is not None:
        lines += layer_lines(layer)
    if options is not None:
        lines += bench_options.option_lines(options, seconds)
    if window is not None:
        lines += bench_options.window_lines(window, seconds)
    if decode is not None:
        lines += bench_decode.decode_lines(decode, seconds, mib)
    if latent is not None:
        lines += bench_latent.latent_lines(latent, seconds, mib)
    return "\n".join(lines).rstrip("\n")


def write_doc(text: str) -> None:
    """Replace the generated block of docs/benchmarks.md, keeping the prose around it."""
    block = f"{BEGIN}\n{text}\n{END}"
    doc = DOC.read_text() if DOC.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    head, rest = doc.split(BEGIN, 1)
    DOC.write_text(head + block + rest.split(END, 1)[1])


def plot(rows: dict) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = ["dense", "tiled", "sdpa", "eager"]
    labels = {
        "dense": "NumPy dense",
        "tiled": "NumPy tiled",
        "sdpa": "torch SDPA",
        "eager": "torch eager",
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, kind in zip(axes, ["fwd", "fwd+bwd"], strict=True):
        x = np.arange(len(rows))
        for i, name in enumerate(names):
            times = [row.get(f"{name} {kind}", np.nan) for row in rows.values()]
            ax.bar(x + (i - 1.5) * 0.2, times, 0.2, label=labels[name])
        ax.set_xticks(x, [f"{s[0]},{s[1]},{s[2]},{s[3]}" for s in rows], rotation=15)
        ax.set_xlabel("(B, H, N, D)")
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.set_title(f"causal float32 attention, {kind}")
        ax.legend()
    fig.tight_layout()
    path = DOC.with_suffix(".png")
    fig.savefig(path, dpi=110)
    return path


PARTS = (
    "shapes",
    "crossover",
    "blocks",
    "profile",
    "gpt2",
    "options",
    "window",
    "decode",
    "latent",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m parity_tests.bench",
        description="Time the NumPy attention (dense and tiled) against torch on this CPU. "
        "The report goes to stdout; nothing is written unless --write-docs is given. "
        "The whole benchmark takes several minutes.",
    )
    parser.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        metavar="N",
        help="time each run as the best of N after one warm-up (default 3; shapes with "
        "N >= 16384 run once)",
    )
    parser.add_argument(
        "--only",
        choices=PARTS,
        action="append",
        metavar="PART",
        help=f"run only this part (repeatable): {', '.join(PARTS)}",
    )
    parser.add_argument(
        "--shape",
        type=_shape,
        action="append",
        metavar="B,H,N,D",
        help="time this shape in the shapes part instead of the default ones (repeatable)",
    )
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="also rewrite the generated block of docs/benchmarks.md and docs/benchmarks.png; "
        "only with the whole benchmark (no --only, no --shape)",
    )
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _shape(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"a shape is B,H,N,D (four integers), got {text!r}")
    b, h, n, d = (_positive_int(part) for part in parts)
    return b, h, n, d


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts, print the report; with ``--write-docs``, record it in docs/."""
    cli = build_parser()
    options = cli.parse_args(argv)
    if options.write_docs and (options.only or options.shape):
        cli.error("--write-docs records the whole benchmark: drop --only and --shape")
    parts = [part for part in PARTS if part in (options.only or PARTS)]
    if options.shape and "shapes" not in parts:
        cli.error("--shape sets the shapes of the shapes part, which --only leaves out")
    repeats = options.repeats

    rate = matmul_rate(repeats)
    rows = None
    if "shapes" in parts:
        rows = {shape: bench_shape(shape, repeats) for shape in options.shape or SHAPES}
    cross = crossover() if "crossover" in parts else None
    sweep = block_sweep(repeats) if "blocks" in parts else None
    floor = None
    if "profile" in parts:
        floor = tile_products_floor(PROFILE, repeats, (rows or {}).get(PROFILE))
    layer = gpt2_layer(repeats) if "gpt2" in parts else None
    options_rows = bench_options.option_rows(best_time, repeats) if "options" in parts else None
    window = bench_options.window_rows(best_time) if "window" in parts else None
    decode = bench_decode.decode_rows(repeats, traced_peak) if "decode" in parts else None
    latent = bench_latent.latent_rows(repeats, traced_peak) if "latent" in parts else None
    text = report(
        rate, repeats, rows, sweep, cross, floor, layer, options_rows, window, decode, latent
    )
    print(text)
    if options.write_docs:
        write_doc(text)
        path = plot(rows or {})
        plotted = f" and {path}" if path else " (no plot: matplotlib not installed)"
        print(f"\nwrote {DOC}{plotted}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
