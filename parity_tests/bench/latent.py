"""Decoding with multi-head latent attention on the CPU, for ``python -m parity_tests.bench``
(part ``latent``; never a timed test).

A DeepSeek-V2-Lite-shaped MLA layer (hidden 2048, 16 heads, kv_lora_rank 512, qk_nope_head_dim
128, qk_rope_head_dim 64, v_head_dim 128, no query LoRA, float32, random weights) in NumPy
(``numpy_attention.latent``) and its torch twin holding the same weights; one decode step, a
token attending over a latent cache of about 4096 (the mean of ``DECODE_STEPS`` consecutive steps
from cache length 4096 - DECODE_STEPS on, the cache refilled before each round), computed
absorbed and expanded on each side. The twin runs on backend "auto" (SDPA here) and, absorbed,
also on "math": torch's CPU SDPA with ``enable_gqa`` over one long shared key head was measured
far slower than its own math path, so the target is judged against the faster of the two. The
NumPy absorbed step also runs over pages (``PagedLatentCache``, pages of ``PAGE_SIZE``,
FlashMLA's): one sequence, whose pages the pool gives consecutively, so they are read in place.

Memory: NumPy's tracemalloc peak of one step of each form (what the call allocates beyond the
weights and the cache), and the bytes a token takes in the cache, one layer: the latent's
L + R numbers against the keys and values a KVCache would hold, for this layer's heads expanded
(H (P + R) + H Dv) and for the Llama-8B-shaped GQA layer of ``decode.py`` (2 H_kv D).

Tests: tests/bench/test_latent.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from numpy_attention import no_grad
from numpy_attention.decode.cache import KVCache
from numpy_attention.latent import MultiHeadLatentAttention
from numpy_attention.latent_cache import LatentCache, PagedLatentCache
from torch_attention import from_numpy
from torch_attention.latent import MultiHeadLatentAttention as TorchMultiHeadLatentAttention
from torch_attention.latent_cache import LatentCache as TorchLatentCache

from .decode import LAYER as GQA_LAYER

LAYER = {
    "hidden_size": 2048,
    "num_heads": 16,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
CACHE = 4096  # tokens in the cache at a decode step
DECODE_STEPS = 8  # consecutive steps timed per round
TORCH_TARGET = 1.5  # absorbed NumPy step / the torch twin's absorbed step, the bound
PAGE_SIZE = 64  # the paged cache's page, FlashMLA's
# (row, side, torch backend, absorb): the steps timed, in this order; "numpy paged" over a
# PagedLatentCache, right after the contiguous step it is compared with.
RUNS = [
    ("numpy absorbed", "numpy", None, True),
    ("numpy absorbed paged", "numpy paged", None, True),
    ("numpy expanded", "numpy", None, False),
    ("torch absorbed", "torch", "auto", True),
    ("torch expanded", "torch", "auto", False),
    ("torch math absorbed", "torch", "math", True),
]


def _layers() -> tuple[MultiHeadLatentAttention, dict[str, TorchMultiHeadLatentAttention]]:
    """The NumPy layer and its torch twins by backend, all holding the same weights."""
    numpy_layer = MultiHeadLatentAttention(**LAYER, rng=0).eval()
    twins = {}
    for backend in ("auto", "math"):
        twins[backend] = TorchMultiHeadLatentAttention(**LAYER, backend=backend).eval()
        from_numpy(twins[backend], numpy_layer)
    return numpy_layer, twins


def _round(layer: Callable[..., Any], cache: Any, fill: tuple, x: Any, absorb: bool) -> float:
    """Refill the cache to CACHE - DECODE_STEPS tokens (untimed), then time the steps."""
    cache.reset()
    cache.append(*fill)
    start = time.perf_counter()
    for _ in range(DECODE_STEPS):
        layer(x, cache=cache, absorb=absorb)
    return (time.perf_counter() - start) / DECODE_STEPS


def latent_rows(repeats: int, peak: Callable[[Callable[[], object]], int]) -> dict:
    """Seconds per decode step of each of ``RUNS``, NumPy's memory of each form (``peak``: the
    bytes a call allocates at most, the benchmark's ``traced_peak``), and the cache bytes per
    token of the latent against GQA's."""
    numpy_layer, twins = _layers()
    rng = np.random.default_rng(0)
    rank, rope = LAYER["kv_lora_rank"], LAYER["qk_rope_head_dim"]
    filled = CACHE - DECODE_STEPS
    fill_np = (
        rng.standard_normal((1, filled, rank), dtype=np.float32),
        rng.standard_normal((1, filled, rope), dtype=np.float32),
    )
    fill_torch = tuple(torch.from_numpy(t) for t in fill_np)
    token = rng.standard_normal((1, 1, LAYER["hidden_size"]), dtype=np.float32)
    np_cache = LatentCache(1, CACHE, rank, rope, np.float32)
    pages = -(-CACHE // PAGE_SIZE)
    np_paged = PagedLatentCache(pages, PAGE_SIZE, rank, rope, np.float32)
    torch_cache = TorchLatentCache(1, CACHE, rank, rope, torch.float32)

    rows: dict = {row: np.inf for row, *_ in RUNS}
    with no_grad(), torch.no_grad():
        for _ in range(repeats + 1):  # the first round warms up
            for row, side, backend, absorb in RUNS:
                if side.startswith("numpy"):
                    cache = np_paged if side == "numpy paged" else np_cache
                    step = _round(numpy_layer, cache, fill_np, token, absorb)
                else:
                    x = torch.from_numpy(token)
                    step = _round(twins[str(backend)], torch_cache, fill_torch, x, absorb)
                rows[row] = min(rows[row], step)
        for form, absorb in (("absorbed", True), ("expanded", False)):
            np_cache.reset()
            np_cache.append(*fill_np)
            rows[f"numpy {form} peak"] = peak(
                lambda absorb=absorb: numpy_layer(token, cache=np_cache, absorb=absorb)
            )
    rows |= cache_bytes_per_token()
    rows["weight bytes"] = sum(p.nbytes for p in numpy_layer.named_parameters().values())
    return rows


def cache_bytes_per_token() -> dict:
    """Bytes one token takes in one layer's float32 cache, from the caches' own arrays."""
    rank, rope = LAYER["kv_lora_rank"], LAYER["qk_rope_head_dim"]
    heads, head = LAYER["num_heads"], LAYER["qk_nope_head_dim"] + rope
    latent = LatentCache(1, 1, rank, rope, np.float32)
    expanded = (  # this layer's keys (P + R wide) and values (Dv wide), per head
        KVCache(1, heads, 1, head, np.float32).k.nbytes
        + KVCache(1, heads, 1, LAYER["v_head_dim"], np.float32).v.nbytes
    )
    gqa = KVCache(1, GQA_LAYER["num_kv_heads"], 1, GQA_LAYER["head_dim"], np.float32)
    return {
        "latent bytes/token": latent.latent.nbytes,
        "expanded bytes/token": expanded,
        "gqa bytes/token": gqa.k.nbytes + gqa.v.nbytes,
    }


def _torch_best(rows: dict) -> float:
    """The torch twin's absorbed step on its faster backend."""
    return min(rows["torch absorbed"], rows["torch math absorbed"])


def latent_lines(rows: dict, seconds: Callable[[float], str], mib: Callable[[float], str]) -> list:
    best = _torch_best(rows)
    latent, paged = rows["latent bytes/token"], rows["numpy absorbed paged"]
    return [
        "### Decoding with latent attention on the CPU: a DeepSeek-V2-Lite-shaped layer, float32",
        "",
        "hidden 2048, 16 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, no query "
        "LoRA; NumPy `MultiHeadLatentAttention` against its torch twin, the same weights "
        f"({mib(rows['weight bytes'])}); one decode step over a latent cache of ~{CACHE} tokens.",
        "",
        "| form | NumPy | torch (auto) | torch (math) | NumPy / torch's faster absorbed "
        "| NumPy peak traced memory of the call |",
        "|---|---|---|---|---|---|",
        f"| absorbed | {seconds(rows['numpy absorbed'])} | {seconds(rows['torch absorbed'])} "
        f"| {seconds(rows['torch math absorbed'])} | {rows['numpy absorbed'] / best:.2f}x "
        f"| {mib(rows['numpy absorbed peak'])} |",
        f"| expanded | {seconds(rows['numpy expanded'])} | {seconds(rows['torch expanded'])} "
        f"| - | {rows['numpy expanded'] / best:.2f}x | {mib(rows['numpy expanded peak'])} |",
        "",
        f"Over pages (`PagedLatentCache`, pages of {PAGE_SIZE}, one sequence whose pages are "
        f"consecutive, read in place), the NumPy absorbed step: {seconds(paged)}, "
        f"{paged / rows['numpy absorbed']:.2f}x the contiguous cache's.",
        "",
        "Cache bytes per token, one layer, float32: the latent (c and k_pe, "
        f"{LAYER['kv_lora_rank']} + {LAYER['qk_rope_head_dim']} numbers) {latent:,} B; this "
        f"layer's keys and values expanded {rows['expanded bytes/token']:,} B "
        f"({rows['expanded bytes/token'] / latent:.1f}x); the Llama-8B-shaped GQA layer's "
        f"(8 kv heads of 128) {rows['gqa bytes/token']:,} B "
        f"({rows['gqa bytes/token'] / latent:.1f}x).",
        "",
    ]


def targets(rows: dict | None) -> list[str]:
    if not rows:
        return []
    vs_torch = rows["numpy absorbed"] / _torch_best(rows)
    vs_expanded = rows["numpy absorbed"] / rows["numpy expanded"]
    return [
        f"| NumPy absorbed MLA decode step <= {TORCH_TARGET}x the torch twin's on its faster "
        f"backend (V2-Lite layer, cache {CACHE}) | {vs_torch:.2f}x | "
        f"{'yes' if vs_torch <= TORCH_TARGET else 'no'} |",
        f"| NumPy absorbed MLA decode step faster than expanded | {vs_expanded:.2f}x | "
        f"{'yes' if vs_expanded < 1 else 'no'} |",
    ]
