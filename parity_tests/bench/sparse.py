"""Sparse attention by indices against dense causal attention on the CPU, for
``python -m parity_tests.bench`` (part ``sparse``; never a timed test).

Issue 29: ``numpy_attention.sparse`` (DeepSeek-V3.2's DSA, FlashMLA's sparse layout) costs in
proportion to S_q * topk, not S_q * S_kv. In MLA mode, float32: H = 16 query heads of D = 576
over one latent head (H_kv = 1) that is key and value at once (v None, d_v = 512), topk = 2048,
S_q = S_kv = S for each S of ``SIZES``. Each query's indices are causal and overlap their
neighbours' as DSA's indexer picks them: the last topk / 2 keys up to the query itself and
topk / 2 others drawn at random, without repeats, from the earlier ones; a query with fewer than
topk keys before it names all of them, then -1. The gathers, scores and weights run over all
topk slots of every query (the invalid ones are gathered and masked too), the backward's
scatter-add over the valid entries only: at S = topk half of the slots are -1. So the report
gives the time per S * topk slots (the target: flat over S) and, as information, the number of
valid entries and the time per valid entry.

Dense: ``functional.attention_forward`` (its ``auto`` path: tiled at these sizes), causal,
(1, H, S, D) queries over (1, 1, S, D) keys with ``k[..., :d_v]`` as the values, GQA 16:1 by
``enable_gqa``: the same numbers the sparse call reads, every key visible to every later query.
Its cost grows as S^2, so it runs at an S only while its time extrapolated from the previous S
(times (S / S_prev)^2) stays within ``DENSE_BUDGET`` seconds; the others are not run.

Times are forward+backward (the forward outside ``no_grad()``, then the backward of a random
dout), the best of ``repeats`` after one warm-up below ``ONCE_FROM``, one run from there on.

Tests: tests/bench/test_sparse.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from numpy_attention import functional
from numpy_attention.sparse import sparse_attention_backward, sparse_attention_forward

from .measure import best_time

SIZES = (2048, 4096, 8192)  # S = S_q = S_kv
TOPK = 2048
HEADS = 16  # query heads over one latent kv head
WIDTH = 576  # D: kv_lora_rank 512 + qk_rope 64
D_V = 512  # the values: k[..., :D_V]
DENSE_BUDGET = 180.0  # seconds: the dense run at S is skipped when expected to take longer
ONCE_FROM = 4096  # from this S on, each run is timed once, without a warm-up
LINEAR_TARGET = 1.5  # the largest sparse time per S * topk / the smallest, over SIZES


def causal_indices(s: int, topk: int, rng: np.random.Generator) -> np.ndarray:
    """(s, 1, topk) int32: query t names keys <= t only; with more than topk of them, the last
    topk // 2 (t itself included) and topk - topk // 2 earlier ones at random, no key twice;
    otherwise keys 0..t, then -1."""
    recent = topk // 2
    indices = np.full((s, 1, topk), -1, np.int32)
    for t in range(s):
        if t < topk:
            indices[t, 0, : t + 1] = np.arange(t + 1)
            continue
        first = t + 1 - recent  # the recent window is first..t
        earlier = rng.choice(first, topk - recent, replace=False)
        indices[t, 0, : topk - recent] = np.sort(earlier)
        indices[t, 0, topk - recent :] = np.arange(first, t + 1)
    return indices


def _inputs(s: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Token-major q (s, H, D), k (s, 1, D) and dout (s, H, D_V), float32."""
    q = rng.standard_normal((s, HEADS, WIDTH), dtype=np.float32)
    k = rng.standard_normal((s, 1, WIDTH), dtype=np.float32)
    dout = rng.standard_normal((s, HEADS, D_V), dtype=np.float32)
    return q, k, dout


def sparse_run(q, k, dout, indices) -> Callable[[], object]:
    """One sparse forward+backward in MLA mode (v None, d_v = D_V); a run returns
    (out, grads)."""

    def run() -> tuple:
        forward = sparse_attention_forward(q, k, None, indices, d_v=D_V)
        return forward.out, sparse_attention_backward(dout, forward.ctx)

    return run


def dense_run(q, k, dout) -> Callable[[], object]:
    """The same numbers head-major, one causal dense forward+backward, GQA over one kv head; a
    run returns (out, grads), head-major."""
    hq = np.ascontiguousarray(q.transpose(1, 0, 2))[None]  # (1, H, s, D)
    hk = np.ascontiguousarray(k.transpose(1, 0, 2))[None]  # (1, 1, s, D)
    hv = np.ascontiguousarray(hk[..., :D_V])
    hdout = np.ascontiguousarray(dout.transpose(1, 0, 2))[None]

    def run() -> tuple:
        forward = functional.attention_forward(hq, hk, hv, causal=True, enable_gqa=True)
        return forward.out, functional.attention_backward(hdout, forward.ctx)

    return run


def _time(run: Callable[[], object], s: int, repeats: int) -> float:
    if s >= ONCE_FROM:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    return best_time(run, repeats)


def sparse_rows(repeats: int) -> dict:
    """{"sparse": {S: seconds}, "valid": {S: valid entries}, "dense": {S: seconds, or None
    where skipped}} over SIZES."""
    rows: dict = {"sparse": {}, "valid": {}, "dense": {}}
    previous: tuple[int, float] | None = None
    for s in SIZES:
        rng = np.random.default_rng(s)
        q, k, dout = _inputs(s, rng)
        indices = causal_indices(s, TOPK, rng)
        rows["valid"][s] = int(np.count_nonzero(indices >= 0))
        rows["sparse"][s] = _time(sparse_run(q, k, dout, indices), s, repeats)
        expected = None if previous is None else previous[1] * (s / previous[0]) ** 2
        if expected is not None and expected > DENSE_BUDGET:
            rows["dense"][s] = None
            continue
        rows["dense"][s] = _time(dense_run(q, k, dout), s, repeats)
        previous = (s, rows["dense"][s])
    return rows


def _per_entry(rows: dict) -> dict:
    """Sparse seconds per S * topk entry (one query's list), by S."""
    return {s: t / (s * TOPK) for s, t in rows["sparse"].items()}


def _per_valid(rows: dict) -> dict:
    """Sparse seconds per valid entry (one in [0, S)), by S."""
    return {s: t / rows["valid"][s] for s, t in rows["sparse"].items()}


def _spread(per: dict) -> float:
    """The largest time per entry over the smallest."""
    return max(per.values()) / min(per.values())


def sparse_lines(rows: dict, seconds: Callable[[float], str]) -> list[str]:
    per_entry, per_valid = _per_entry(rows), _per_valid(rows)
    lines = [
        "### Sparse attention by indices against dense causal attention on the CPU, float32",
        "",
        f"MLA mode: {HEADS} query heads of D = {WIDTH} over one latent head, values its first "
        f"{D_V} columns, topk = {TOPK}; each query names its last {TOPK // 2} keys and "
        f"{TOPK - TOPK // 2} earlier ones at random (-1 where fewer exist). Dense: causal, GQA "
        f"{HEADS}:1, the same q, k and values. Forward+backward.",
        "",
        "| S | sparse | per S * topk | valid entries | per valid entry | dense | sparse / dense |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, sparse in rows["sparse"].items():
        dense = rows["dense"].get(s)
        dense_text = "not run" if dense is None else seconds(dense)
        ratio = "-" if dense is None else f"{sparse / dense:.2f}x"
        lines.append(
            f"| {s} | {seconds(sparse)} | {per_entry[s] * 1e9:.1f} ns | {rows['valid'][s]} "
            f"({rows['valid'][s] / (s * TOPK):.3f}) | {per_valid[s] * 1e9:.1f} ns | {dense_text} "
            f"| {ratio} |"
        )
    lines += [
        "",
        f"Spread over S (largest / smallest): per S * topk {_spread(per_entry):.2f}x, per valid "
        f"entry {_spread(per_valid):.2f}x (the gathers and scores run over every slot, the "
        "scatter-add over the valid entries).",
    ]
    skipped = [s for s, t in rows["dense"].items() if t is None]
    if skipped:
        lines += [
            "",
            f"Dense not run at S = {', '.join(map(str, skipped))}: expected over "
            f"{DENSE_BUDGET:.0f} s from the previous size times (S / S_prev)^2.",
        ]
    return [*lines, ""]


def targets(rows: dict | None) -> list[str]:
    if not rows or not rows.get("sparse"):
        return []
    per_entry = _per_entry(rows)
    spread = _spread(per_entry)
    sizes = ", ".join(f"{t * 1e9:.1f}" for t in per_entry.values())
    return [
        f"| NumPy sparse fwd+bwd time per S * topk flat over S = "
        f"{', '.join(map(str, per_entry))} (largest / smallest <= {LINEAR_TARGET}x; "
        f"{sizes} ns) | {spread:.2f}x | {'yes' if spread <= LINEAR_TARGET else 'no'} |"
    ]
