"""The tiled path's settings, measured, for ``python -m parity_tests.bench`` (parts
``crossover``, ``blocks`` and ``profile``; never a timed test).

``crossover``: dense against tiled forward+backward at (1, 12, N, 64) for each N of
``CROSSOVER_N``, causal and not, the crossover that sets ``impl="auto"``; ``blocks``: the tiled
forward+backward at ``PROFILE`` for each (block_q, block_k) of ``BLOCK_SWEEP``; ``profile``: the
tiled path's matrix products alone against the whole tiled run and torch SDPA's, at ``PROFILE``,
and where the tiled forward's time beyond its products goes (``forward_breakdown``).

Tests: tests/bench/test_tuning.py.
"""

from __future__ import annotations

import math
import os
import queue
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from numpy_attention import scores, threads, tiled
from numpy_attention.rules import prepare

from .attention import numpy_runs, sdpa, torch_runs
from .measure import best_time, seconds, seconds_of

CROSSOVER_N = [256, 384, 512, 640, 768]  # (1, 12, N, 64): dense vs tiled, for impl="auto"
CROSSOVER_ROUNDS = 15  # dense and tiled alternate, so that load on a shared machine hits both
PROFILE = (1, 12, 2048, 64)  # block-size sweep, profile and the first two targets
BLOCK_SWEEP = [(128, 128), (256, 256), (512, 512), (128, 512), (512, 128)]  # (block_q, block_k)
FORWARD_TARGET = 1.4  # the tiled forward's time over its own products' (issue 31)


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
) -> dict:
    """The time the tiled path's matrix products alone take, on the same pool: per visible tile
    two (g, 256, 64) x (g, 64, 256) products for the forward and five more for the backward;
    beside them the whole tiled forward and forward+backward and torch SDPA's (from
    ``measured``, the shapes part's row, when it ran), and the forward's other steps timed
    alone (``forward_breakdown``, under "forward steps"). The forward's products, its whole and
    its steps are timed in alternation (the whole forward's time from there replaces the shapes
    part's), so that load on a shared machine hits them alike. What the whole takes beyond the
    products is elementwise work and Python overhead, which a fused kernel such as SDPA's
    avoids."""
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

    steps = forward_breakdown(shape, repeats, products(2))
    result = {
        "forward products": steps.pop("the products (2 per tile)"),
        "tiled fwd": steps.pop("the whole forward"),
        "products": best_time(products(7), repeats),
        "tiles": tiles,
        "forward steps": steps,
    }
    if measured is None:
        q, k, v, dout = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
        forward_backward = numpy_runs(q, k, v, dout, "tiled")[1]
        fused = torch_runs(q, k, v, dout, sdpa)
        measured = {
            "tiled fwd+bwd": best_time(forward_backward, repeats),
            "sdpa fwd": best_time(fused[0], repeats),
            "sdpa fwd+bwd": best_time(fused[1], repeats),
        }
    keys = ("tiled fwd+bwd", "sdpa fwd", "sdpa fwd+bwd")
    return result | {key: measured[key] for key in keys}


class Buffers(NamedTuple):
    """One worker's tile-sized arrays for ``forward_breakdown``."""

    scores: np.ndarray  # (g, bk, bq), what each step works on
    source: np.ndarray  # (g, bk, bq), S^T - shift of a real tile, what exp reads
    row_sum: np.ndarray  # (g, 1, bq)
    acc: np.ndarray  # (g, bq, Dv)
    partial: np.ndarray  # (g, bq, Dv), a block's P V


def forward_breakdown(
    shape: tuple[int, int, int, int], repeats: int, products: Callable[[], None]
) -> dict[str, float]:
    """The tiled forward's steps other than its products, each timed alone, causal float32 at
    ``shape``, in ``repeats`` rounds that run ``products``, the whole forward (under no_grad)
    and each step in turn, the best of each: the steps over the forward's own tiles (its
    default blocks, one pool task per query block as it hands them out) on the same pool,
    through its own helpers; the work before the tiles on the calling thread.

    What the whole forward takes beyond its products and these steps is Python per tile, the
    tiles' setup and finish (buffers, Q * scale of their rows, the division by the row sums,
    lse) and the pool's hand-offs.
    """
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    rules = prepare(q, k, v, causal=True)[-1]
    blocks = tiled._blocks(rules, tiled.BLOCK_Q, tiled.BLOCK_K)
    shift = scores.fixed_shift(rules)  # None where the forward runs the online max instead
    # One task per query block and part, handed out as the forward does: its tiles.
    tasks: list[list] = []
    for bi in reversed(range(tiled._num_blocks(rules.n, blocks.block_q))):
        rows = tiled._span(bi, blocks.block_q, rules.n)
        for part in tiled._parts(rules, blocks):
            steps = []
            for cols, pieces in tiled._key_tiles(rules, blocks, rows):
                steps.append((scores.Tile(part.flat, rows, cols, transposed=True), pieces))
            tasks.append(steps)
    # Each thread's buffers, tile-sized: scores of a real tile (S^T - shift) to take exp of.
    g = max(steps[0][0].groups.stop - steps[0][0].groups.start for steps in tasks if steps)
    bk, bq = blocks.block_k, blocks.block_q
    k_block = k.reshape(-1, rules.m, k.shape[-1])[:g, :bk]  # (g, bk, D)
    q_block = (q * rules.query_scale).reshape(-1, rules.n, q.shape[-1])[:g, :bq]  # (g, bq, D)
    source = k_block @ q_block.swapaxes(-1, -2) - (shift or 0)  # (g, bk, bq)
    # One set of buffers per worker, made before the clock starts: a task takes a free one.
    free: queue.SimpleQueue[Buffers] = queue.SimpleQueue()
    for _ in range(os.cpu_count() or 1):
        free.put(
            Buffers(
                source.copy(),
                source.copy(),
                np.zeros((g, 1, bq), np.float32),
                np.zeros((g, bq, v.shape[-1]), np.float32),
                np.ones((g, bq, v.shape[-1]), np.float32),
            )
        )

    def over_tiles(step: Callable[..., None]) -> Callable[[], None]:
        def task(steps: list) -> None:
            buf = free.get()
            for tile, pieces in steps:
                g_t = tile.groups.stop - tile.groups.start
                bk_t, bq_t = tile.cols.stop - tile.cols.start, tile.rows.stop - tile.rows.start
                step(buf, g_t, bk_t, bq_t, tile, pieces)
            free.put(buf)

        return lambda: threads.run(tasks, task)

    def pipeline(buf: Buffers, g_t: int, bk_t: int, bq_t: int, tile, pieces) -> None:
        scores_t = buf.scores[:g_t, :bk_t, :bq_t]
        scores.apply(rules, scores_t, tile, shift=shift)
        scores.flush_underflow(scores_t, scores.exp_floor(rules, tile))

    def exp(buf: Buffers, g_t: int, bk_t: int, bq_t: int, tile, pieces) -> None:
        scores_t, source_t = buf.scores[:g_t, :bk_t, :bq_t], buf.source[:g_t, :bk_t, :bq_t]
        tiled._exp_visible(source_t, pieces, scores_t)  # over the parts of a cut tile seen

    def row_sums(buf: Buffers, g_t: int, bk_t: int, bq_t: int, tile, pieces) -> None:
        ones = tiled._ones(bk_t, rules.compute)
        buf.row_sum[:g_t, :, :bq_t] += ones @ buf.scores[:g_t, :bk_t, :bq_t]

    def accumulate(buf: Buffers, g_t: int, bk_t: int, bq_t: int, tile, pieces) -> None:
        buf.acc[:g_t, :bq_t] += buf.partial[:g_t, :bq_t]

    def before_tiles() -> None:
        prepare(q, k, v, causal=True)

    runs = {
        "the products (2 per tile)": products,
        "the whole forward": numpy_runs(q, k, v, None, "tiled")[0],  # no dout: forward only
        "exp": over_tiles(exp),
        "shift and masks (scores.apply)": over_tiles(pipeline),
        "row sums (ones @ P)": over_tiles(row_sums),
        "acc += P V": over_tiles(accumulate),
        "before the tiles (checks, score bounds)": before_tiles,
    }
    # In this order the row sums read exp's weights; the pipeline shifts its scores again on
    # every run, and exp overwrites them on the next round.
    for run in runs.values():
        run()  # warm-up
    best = dict.fromkeys(runs, math.inf)
    for _ in range(repeats):
        for name, run in runs.items():
            best[name] = min(best[name], seconds_of(run))
    return best


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
    return [*lines, "", *forward_breakdown_lines(floor)]


def forward_breakdown_lines(floor: dict) -> list[str]:
    """The forward's time over its products' against the target, and where the rest goes."""
    whole, products = floor["tiled fwd"], floor["forward products"]
    steps = floor["forward steps"]
    rest = whole - products - sum(steps.values())
    lines = [
        f"The tiled forward takes {whole / products:.2f}x the time of its own products "
        f"(target: within {FORWARD_TARGET}x). Its other steps, each timed alone over the "
        "forward's own tiles on the same pool:",
        "",
        "| forward step | time | share of the whole forward | / the products |",
        "|---|---|---|---|",
    ]
    rows = [("the products (2 per tile)", products), *steps.items()]
    rows.append(("the rest: Python, tile setup and finish, pool hand-offs", rest))
    lines += [
        f"| {name} | {seconds(t)} | {100 * t / whole:.0f}% | {t / products:.2f} |"
        for name, t in rows
    ]
    return [*lines, ""]
