"""The report of ``python -m parity_tests.bench``: the issues' targets judged on the parts that
ran, each part's tables, in Markdown; with ``--write-docs``, the generated block of
docs/benchmarks.md and, when matplotlib is installed (the ``plot`` extra), docs/benchmarks.png.

Tests: tests/bench/test_report.py.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np
import torch

from . import attention, gpt2, tuning
from . import decode as decode_bench
from . import latent as latent_bench
from . import linear as linear_bench
from . import options as options_bench
from . import sparse as sparse_bench
from .measure import mib, seconds

DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def targets(
    rows: dict,
    layer: dict | None,
    options: dict | None = None,
    window: dict | None = None,
    decode: dict | None = None,
    latent: dict | None = None,
    sparse: dict | None = None,
    linear: dict | None = None,
) -> list[str]:
    """The issues' targets, as ratios from this run: those whose measurements ran."""
    checks = []
    main = rows.get(tuning.PROFILE, {})
    # step 7: the plain path pushed to torch's fused kernel
    for shape in attention.SDPA_TARGET_SHAPES:
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
                f"NumPy fwd+bwd <= 2.0x torch SDPA at {tuning.PROFILE}",
                main["tiled fwd+bwd"] / main["sdpa fwd+bwd"],
                2.0,
                "{:.2f}x",
            ),
            (
                f"NumPy fwd+bwd <= 0.5x torch eager math at {tuning.PROFILE}",
                main["tiled fwd+bwd"] / main["eager fwd+bwd"],
                0.5,
                "{:.2f}x",
            ),
        ]
    if attention.LONG in rows:
        checks.append(
            (
                f"{attention.LONG} causal fwd+bwd peak traced memory < 1.5 GiB",
                rows[attention.LONG]["tiled peak fwd+bwd"] / 2**20,
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
        + options_bench.targets(options, window)
        + decode_bench.targets(decode)
        + latent_bench.targets(latent)
        + sparse_bench.targets(sparse)
        + linear_bench.targets(linear)
    )
    if not lines:
        return []
    return ["### Targets", "", "| target | this run | met |", "|---|---|---|", *lines, ""]


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
    sparse: dict | None = None,
    linear: dict | None = None,
) -> str:
    """The Markdown report of the parts that ran (None: the part did not run)."""
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores; "
        f"NumPy {np.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads). "
        f"NumPy float32 matmul (2048^3) in this run: {rate:.0f} GFLOP/s. "
        f"Times: the best of {repeats} runs after one warm-up (one run from N = 16384 on).",
        "",
        *targets(rows or {}, layer, options, window, decode, latent, sparse, linear),
    ]
    if rows:
        lines += attention.shape_tables(rows, rate)
    if cross is not None:
        lines += tuning.crossover_table(cross)
    if sweep is not None:
        lines += tuning.block_table(sweep)
    if floor is not None:
        lines += tuning.profile_lines(floor)
    if layer is not None:
        lines += gpt2.layer_lines(layer)
    if options is not None:
        lines += options_bench.option_lines(options, seconds)
    if window is not None:
        lines += options_bench.window_lines(window, seconds)
    if decode is not None:
        lines += decode_bench.decode_lines(decode, seconds, mib)
    if latent is not None:
        lines += latent_bench.latent_lines(latent, seconds, mib)
    if sparse is not None:
        lines += sparse_bench.sparse_lines(sparse, seconds)
    if linear is not None:
        lines += linear_bench.linear_lines(linear, seconds)
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
