"""Decoding on the CPU with the NumPy layer, for ``python -m parity_tests.bench`` (part ``decode``;
never a timed test).

A Llama-8B-shaped attention layer (hidden 4096, 32 query heads, 8 kv heads, head width 128,
float32, random weights) in NumPy (``numpy_attention.grouped.GroupedQueryAttention``) and its
torch twin (``torch_attention.grouped``, backend "auto") holding the same weights:

- one decode step: a token attending over a cache of about 4096 (the mean of ``DECODE_STEPS``
  consecutive steps from cache length 4096 - DECODE_STEPS on, the cache refilled before each
  round);
- a prefill of 2048 tokens into an empty cache;
- batched, B of ``BATCHES`` sequences of about 4096 tokens each: the NumPy decode step over a
  ``PagedKVCache`` of pages of 16 and of 256 tokens against the contiguous ``KVCache``'s step
  (the issue's bound: 1.2x at every B), the caches filled as a server fills them (a prefill,
  then the rest a page at a time, the pages each sequence's decode steps would ask for, the
  sequences alternating), and how many runs (maximal stretches of consecutive pool pages) each
  sequence's pages form then: 1 is read in place, more is gathered at every step;
- the attention alone (``numpy_attention.decode.kvcache_attention_forward``, one query over the
  4096 cached keys, no append), contiguous, over pages in pool order, and over shuffled pages
  (a fragmented pool, whose pages it gathers: the cost of a copy of the keys and values).

Memory: the cache's own size, and NumPy's tracemalloc peak of one decode step and of the prefill
(what the call allocates beyond the weights and the cache); torch's allocations are not visible
to tracemalloc.

Tests: tests/bench/test_decode.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from numpy_attention import no_grad
from numpy_attention.decode.cache import KVCache, PagedKVCache
from numpy_attention.decode.paged import kvcache_attention_forward
from numpy_attention.grouped import GroupedQueryAttention
from torch_attention import from_numpy
from torch_attention.decode.cache import KVCache as TorchKVCache
from torch_attention.grouped import GroupedQueryAttention as TorchGroupedQueryAttention

LAYER = {"hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128}
CACHE = 4096  # tokens in the cache at a decode step
DECODE_STEPS = 8  # consecutive steps timed per round
PREFILL = 2048
DECODE_TARGET = 1.5  # NumPy / torch, the bounds
PREFILL_TARGET = 1.2
PAGE_SIZES = (16, 256)  # tokens per page of the paged cache
BATCHES = (1, 8, 32)  # sequences decoding together over pages
PAGED_TARGET = 1.2  # the paged decode step / the contiguous cache's, at every B


def _layers() -> tuple[GroupedQueryAttention, TorchGroupedQueryAttention]:
    numpy_layer = GroupedQueryAttention(**LAYER, rng=0).eval()
    torch_layer = TorchGroupedQueryAttention(**LAYER).eval()
    from_numpy(torch_layer, numpy_layer)
    return numpy_layer, torch_layer


def _round(
    layer: Callable[..., object], cache: object, fill: tuple, x: object, steps: int
) -> float:
    """Refill the cache to CACHE - steps tokens (untimed), then time ``steps`` decode steps."""
    cache.reset()  # type: ignore[attr-defined]
    cache.append(*fill)  # type: ignore[attr-defined]
    start = time.perf_counter()
    for _ in range(steps):
        layer(x, cache=cache)
    return (time.perf_counter() - start) / steps


def decode_rows(repeats: int, peak: Callable[[Callable[[], object]], int]) -> dict:
    """Seconds per decode step and per prefill, NumPy and torch, and NumPy's memory (``peak``:
    the bytes a call allocates at most, the benchmark's ``traced_peak``)."""
    numpy_layer, torch_layer = _layers()
    rng = np.random.default_rng(0)
    kv = LAYER["num_kv_heads"], LAYER["head_dim"]
    fill_np = tuple(
        rng.standard_normal((1, kv[0], CACHE - DECODE_STEPS, kv[1]), dtype=np.float32)
        for _ in range(2)
    )
    fill_torch = tuple(torch.from_numpy(t) for t in fill_np)
    token = rng.standard_normal((1, 1, LAYER["hidden_size"]), dtype=np.float32)
    prompt = rng.standard_normal((1, PREFILL, LAYER["hidden_size"]), dtype=np.float32)
    np_cache = KVCache(1, *kv[:1], CACHE + 1, kv[1], np.float32)
    torch_cache = TorchKVCache(1, kv[0], CACHE + 1, kv[1], torch.float32)

    times = {"numpy decode": np.inf, "torch decode": np.inf}
    times.update({"numpy prefill": np.inf, "torch prefill": np.inf})
    with no_grad(), torch.no_grad():
        for _ in range(repeats + 1):  # the first round warms up
            times["numpy decode"] = min(
                times["numpy decode"],
                _round(numpy_layer, np_cache, fill_np, token, DECODE_STEPS),
            )
            times["torch decode"] = min(
                times["torch decode"],
                _round(torch_layer, torch_cache, fill_torch, torch.from_numpy(token), DECODE_STEPS),
            )
            for name, layer, cache, x in (
                ("numpy prefill", numpy_layer, np_cache, prompt),
                ("torch prefill", torch_layer, torch_cache, torch.from_numpy(prompt)),
            ):
                cache.reset()
                start = time.perf_counter()
                layer(x, cache=cache)
                times[name] = min(times[name], time.perf_counter() - start)

        np_cache.reset()
        np_cache.append(*fill_np)
        times["numpy decode peak"] = peak(lambda: numpy_layer(token, cache=np_cache))
        np_cache.reset()
        times["numpy prefill peak"] = peak(lambda: numpy_layer(prompt, cache=np_cache))
    times["cache bytes"] = np_cache.k.nbytes + np_cache.v.nbytes
    times["weight bytes"] = sum(p.nbytes for p in numpy_layer.named_parameters().values())
    times.update(batch_rows(numpy_layer, repeats, rng))
    times.update(attention_rows(repeats, rng))
    return times


def batch_rows(layer: GroupedQueryAttention, repeats: int, rng: np.random.Generator) -> dict:
    """Seconds per NumPy decode step of B sequences (each B of BATCHES) over the contiguous
    cache and over pages of each of PAGE_SIZES (rounds interleaved), and the most runs of pool
    pages a sequence's pages form after the last round."""
    kv_heads, width = LAYER["num_kv_heads"], LAYER["head_dim"]
    filled = CACHE - DECODE_STEPS
    # one sequence's keys and values, repeated for every sequence: the same numbers of every
    # product, without B copies of the random draw
    one = [rng.standard_normal((1, kv_heads, filled, width), dtype=np.float32) for _ in range(2)]
    rows: dict = {}
    with no_grad():
        for batch in BATCHES:
            fill = tuple(np.broadcast_to(t, (batch,) + t.shape[1:]) for t in one)
            token = rng.standard_normal((batch, 1, LAYER["hidden_size"]), dtype=np.float32)
            caches: dict = {"contiguous": KVCache(batch, kv_heads, CACHE + 1, width, np.float32)}
            for page in PAGE_SIZES:  # just the pages B sequences of CACHE + 1 tokens need
                blocks = batch * -(-(CACHE + 1) // page)
                caches[page] = PagedKVCache(blocks, page, kv_heads, width, dtype=np.float32)
            best = dict.fromkeys(caches, np.inf)
            for _ in range(repeats + 1):  # the first round warms up; the caches alternate
                for name, cache in caches.items():
                    _serve(cache, fill, None if name == "contiguous" else name)
                    start = time.perf_counter()
                    for _ in range(DECODE_STEPS):
                        layer(token, cache=cache)
                    best[name] = min(best[name], (time.perf_counter() - start) / DECODE_STEPS)
            rows[f"contiguous decode B{batch}"] = best["contiguous"]
            for page in PAGE_SIZES:
                rows[f"paged {page} decode B{batch}"] = best[page]
                rows[f"paged {page} runs B{batch}"] = max(
                    runs(table) for table in caches[page].block_table
                )
            del caches, fill
    return rows


def _serve(cache: KVCache | PagedKVCache, fill: tuple, page: int | None) -> None:
    """Refill the cache with ``fill`` (B, H_kv, CACHE - DECODE_STEPS, D) as a server does: a
    prefill of PREFILL tokens, then the rest ``page`` tokens at a time (the page that ``page``
    decode steps of every sequence would ask for, the sequences in turn); at once when
    ``page`` is None (a contiguous cache has no pages to ask for)."""
    cache.reset()
    filled = fill[0].shape[2]
    stops = [filled] if page is None else [*range(min(PREFILL, filled), filled, page), filled]
    start = 0
    for stop in stops:
        if stop > start:
            cache.append(fill[0][:, :, start:stop], fill[1][:, :, start:stop])
        start = stop


def runs(table: np.ndarray) -> int:
    """How many runs (maximal stretches of consecutive pool pages) a sequence's pages form, in
    table order: 1 is one view of the pool."""
    return int(np.count_nonzero(np.diff(table) != 1)) + 1 if len(table) else 0


def attention_rows(repeats: int, rng: np.random.Generator) -> dict:
    """Seconds per ``kvcache_attention_forward`` call, one query over CACHE cached keys (no
    append), from a contiguous cache and, per page size, from pages in pool order and shuffled."""
    heads, (kv_heads, width) = LAYER["num_heads"], (LAYER["num_kv_heads"], LAYER["head_dim"])
    q = rng.standard_normal((1, 1, heads, width), dtype=np.float32)
    keys, values = (
        rng.standard_normal((1, CACHE, kv_heads, width), dtype=np.float32) for _ in range(2)
    )
    calls = {"attention contiguous": (keys, values, None)}
    for page in PAGE_SIZES:
        pages = (keys.reshape(-1, page, kv_heads, width), values.reshape(-1, page, kv_heads, width))
        order = np.arange(len(pages[0]), dtype=np.int32)
        shuffled = rng.permutation(order).astype(np.int32)
        calls[f"attention pages {page} in order"] = (*pages, order[None])
        # the same tokens, their pages moved in the pool: sequence position t stays in page
        # table[t // page], so the keys attended are identical
        moved = tuple(np.empty_like(pool) for pool in pages)
        for pool, source in zip(moved, pages, strict=True):
            pool[shuffled] = source
        calls[f"attention pages {page} shuffled"] = (*moved, shuffled[None])
    times = dict.fromkeys(calls, np.inf)
    lengths = np.array([CACHE], dtype=np.int32)
    for _ in range(repeats + 1):
        for name, (k_cache, v_cache, table) in calls.items():
            start = time.perf_counter()
            for _ in range(DECODE_STEPS):
                kvcache_attention_forward(
                    q, k_cache, v_cache, cache_seqlens=lengths, block_table=table, causal=True
                )
            times[name] = min(times[name], (time.perf_counter() - start) / DECODE_STEPS)
    return times


def decode_lines(rows: dict, seconds: Callable[[float], str], mib: Callable[[float], str]) -> list:
    decode = rows["numpy decode"] / rows["torch decode"]
    prefill = rows["numpy prefill"] / rows["torch prefill"]
    lines = [
        "### Decoding on the CPU: a Llama-8B-shaped attention layer, float32",
        "",
        f"hidden 4096, 32 heads, 8 kv heads, head 128; NumPy `GroupedQueryAttention` against its "
        f"torch twin (backend auto), the same weights ({mib(rows['weight bytes'])}).",
        "",
        "| step | NumPy | torch | NumPy / torch | NumPy peak traced memory of the call |",
        "|---|---|---|---|---|",
        f"| one decode step, cache ~{CACHE} | {seconds(rows['numpy decode'])} | "
        f"{seconds(rows['torch decode'])} | {decode:.2f}x | {mib(rows['numpy decode peak'])} |",
        f"| prefill of {PREFILL} tokens | {seconds(rows['numpy prefill'])} | "
        f"{seconds(rows['torch prefill'])} | {prefill:.2f}x | {mib(rows['numpy prefill peak'])} |",
        "",
        f"The cache (keys and values of {CACHE + 1} tokens, one layer) holds "
        f"{mib(rows['cache bytes'])}.",
        "",
        f"Paged, batched: the NumPy decode step of B sequences of ~{CACHE} tokens each over a "
        "`PagedKVCache` filled as a server fills it (a prefill of "
        f"{PREFILL} tokens, then a page at a time, the sequences in turn), against a "
        "contiguous `KVCache` of the same lengths; runs: the most stretches of consecutive "
        "pool pages a sequence's pages form (1: read in place, more: gathered at every step).",
        "",
        "| B | cache | layer decode step | paged / contiguous | runs per sequence |",
        "|---|---|---|---|---|",
    ]
    for batch in BATCHES:
        contiguous = rows[f"contiguous decode B{batch}"]
        lines.append(f"| {batch} | contiguous | {seconds(contiguous)} | 1.00x | - |")
        for page in PAGE_SIZES:
            step = rows[f"paged {page} decode B{batch}"]
            lines.append(
                f"| {batch} | pages of {page} | {seconds(step)} | {step / contiguous:.2f}x | "
                f"{rows[f'paged {page} runs B{batch}']} |"
            )
    lines += [
        "",
        f"The attention alone (`kvcache_attention_forward`, one query over {CACHE} cached keys, "
        "B = 1): contiguous, pages in pool order, shuffled pages (a fragmented pool: gathered, "
        "a copy of the keys and values per call).",
        "",
        "| cache | pages in order | shuffled pages | shuffled / contiguous |",
        "|---|---|---|---|",
        f"| contiguous | {seconds(rows['attention contiguous'])} | - | - |",
    ]
    for page in PAGE_SIZES:
        shuffled = rows[f"attention pages {page} shuffled"]
        lines.append(
            f"| pages of {page} | {seconds(rows[f'attention pages {page} in order'])} | "
            f"{seconds(shuffled)} | {shuffled / rows['attention contiguous']:.2f}x |"
        )
    return lines + [""]


def targets(rows: dict | None) -> list[str]:
    if not rows:
        return []
    decode = rows["numpy decode"] / rows["torch decode"]
    prefill = rows["numpy prefill"] / rows["torch prefill"]
    lines = [
        f"| NumPy decode step <= {DECODE_TARGET}x the torch twin (Llama-8B layer, cache "
        f"{CACHE}) | {decode:.2f}x | {'yes' if decode <= DECODE_TARGET else 'no'} |",
        f"| NumPy prefill of {PREFILL} <= {PREFILL_TARGET}x the torch twin | {prefill:.2f}x | "
        f"{'yes' if prefill <= PREFILL_TARGET else 'no'} |",
    ]
    pages = " and ".join(str(page) for page in PAGE_SIZES)
    for batch in BATCHES:
        worst = max(
            rows[f"paged {page} decode B{batch}"] / rows[f"contiguous decode B{batch}"]
            for page in PAGE_SIZES
        )
        lines.append(
            f"| NumPy decode step of B = {batch} over pages ({pages}, the worse) <= "
            f"{PAGED_TARGET}x the contiguous cache's (cache {CACHE}) | {worst:.2f}x | "
            f"{'yes' if worst <= PAGED_TARGET else 'no'} |"
        )
    return lines
