"""Decoding on the CPU with the NumPy layer, for ``python -m parity_tests.bench`` (part ``decode``;
never a timed test).

A Llama-8B-shaped attention layer (hidden 4096, 32 query heads, 8 kv heads, head width 128,
float32, random weights) in NumPy (``numpy_attention.grouped.GroupedQueryAttention``) and its
torch twin (``torch_attention.grouped``, backend "auto") holding the same weights:

- one decode step: a token attending over a cache of about 4096 (the mean of ``DECODE_STEPS``
  consecutive steps from cache length 4096 - DECODE_STEPS on, the cache refilled before each
  round);
- a prefill of 2048 tokens into an empty cache;
- the same decode step over a ``PagedKVCache`` of pages of 16 and of 256 tokens (the pages the
  cache gives one sequence are consecutive in its pool, and are read in place), against the
  contiguous ``KVCache``'s step (the issue's bound: 1.2x);
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
PAGED_TARGET = 1.2  # the paged decode step / the contiguous cache's


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
    paged = {
        page: PagedKVCache(-(-(CACHE + 1) // page), page, kv[0], kv[1], dtype=np.float32)
        for page in PAGE_SIZES
    }

    times = {"numpy decode": np.inf, "torch decode": np.inf}
    times.update({"numpy prefill": np.inf, "torch prefill": np.inf})
    times.update({f"numpy paged {page} decode": np.inf for page in PAGE_SIZES})
    with no_grad(), torch.no_grad():
        for _ in range(repeats + 1):  # the first round warms up
            times["numpy decode"] = min(
                times["numpy decode"],
                _round(numpy_layer, np_cache, fill_np, token, DECODE_STEPS),
            )
            for page, cache in paged.items():  # interleaved with the contiguous rounds
                name = f"numpy paged {page} decode"
                times[name] = min(
                    times[name], _round(numpy_layer, cache, fill_np, token, DECODE_STEPS)
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
    times.update(attention_rows(repeats, rng))
    return times


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
        "Paged: the same NumPy decode step over a `PagedKVCache` (its pages for one sequence "
        "consecutive in the pool, read in place), against the contiguous `KVCache`'s step; "
        f"and the attention alone (`kvcache_attention_forward`, one query over {CACHE} cached "
        "keys): contiguous, pages in pool order, shuffled pages (gathered: a copy of the keys "
        "and values per call).",
        "",
        "| cache | layer decode step | / contiguous | attention alone, pages in order | "
        "shuffled pages | / contiguous |",
        "|---|---|---|---|---|---|",
        f"| contiguous | {seconds(rows['numpy decode'])} | 1.00x | "
        f"{seconds(rows['attention contiguous'])} | - | - |",
    ]
    for page in PAGE_SIZES:
        step = rows[f"numpy paged {page} decode"]
        shuffled = rows[f"attention pages {page} shuffled"]
        lines.append(
            f"| pages of {page} | {seconds(step)} | {step / rows['numpy decode']:.2f}x | "
            f"{seconds(rows[f'attention pages {page} in order'])} | {seconds(shuffled)} | "
            f"{shuffled / rows['attention contiguous']:.2f}x |"
        )
    return lines + [""]


def targets(rows: dict | None) -> list[str]:
    if not rows:
        return []
    decode = rows["numpy decode"] / rows["torch decode"]
    prefill = rows["numpy prefill"] / rows["torch prefill"]
    return [
        f"| NumPy decode step <= {DECODE_TARGET}x the torch twin (Llama-8B layer, cache "
        f"{CACHE}) | {decode:.2f}x | {'yes' if decode <= DECODE_TARGET else 'no'} |",
        f"| NumPy prefill of {PREFILL} <= {PREFILL_TARGET}x the torch twin | {prefill:.2f}x | "
        f"{'yes' if prefill <= PREFILL_TARGET else 'no'} |",
    ] + [
        f"| NumPy decode step over pages of {page} <= {PAGED_TARGET}x the contiguous cache's "
        f"(cache {CACHE}) | {ratio:.2f}x | {'yes' if ratio <= PAGED_TARGET else 'no'} |"
        for page in PAGE_SIZES
        for ratio in [rows[f"numpy paged {page} decode"] / rows["numpy decode"]]
    ]
