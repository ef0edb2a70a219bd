"""The tiled path's settings, measured, for ``python -m parity_tests.bench`` (parts
``crossover``, ``blocks`` and ``profile``; never a timed test).

``crossover``: dense against tiled forward+backward at (1, 12, N, 64) for each N of
``CROSSOVER_N``, causal and not, the crossover that sets ``impl="auto"``; ``blocks``: the tiled
forward+backward at ``PROFILE`` for each (block_q, block_k) of ``BLOCK_SWEEP``; ``profile``: the
tiled path's matrix products alone against the whole tiled run and torch SDPA's, at ``PROFILE``.

Tests: tests/bench/test_tuning.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from numpy_attention import threads, tiled

from .attention import numpy_runs, sdpa, torch_runs
from .measure import best_time, seconds, seconds_of

CROSSOVER_N = [256, 384, 512, 640, 768]  # (1, 12, N, 64): dense vs tiled, for impl="auto"
CROSSOVER_ROUNDS = 15  # dense and tiled alternate, so that load on a shared machine hits both
PROFILE = (1, 12, 2048, 64)  # block-size sweep, profile and the first two targets
BLOCK_SWEEP = [(128, 128), (256, 256), (512, 512), (128, 512), (512, 128)]  # (block_q, block_k)


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
