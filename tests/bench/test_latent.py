"""parity_tests/bench/latent.py without timing anything: the report and the targets on hand-made
rows, and the bookkeeping of ``latent_rows`` (which call each memory figure measures, the cache
bytes per token from the caches' own arrays, the weights) on a layer small enough to run in
milliseconds.

The rows are made of dyadic numbers so that every ratio is exact and a target exactly met is met.
"""

from __future__ import annotations

import numpy as np
import pytest

from parity_tests.bench import latent as bench_latent
from parity_tests.bench.latent import CACHE, TORCH_TARGET, latent_lines, targets

MIB = 2**20


def _rows(numpy_absorbed: float = 3.0, torch_math: float = 4.0) -> dict:
    return {
        "numpy absorbed": numpy_absorbed,
        "numpy expanded": 8.0,
        "numpy absorbed paged": 4.0,
        "torch absorbed": 2.0,
        "torch expanded": 16.0,
        "torch math absorbed": torch_math,
        "numpy absorbed peak": 1 * MIB,
        "numpy expanded peak": 64 * MIB,
        "latent bytes/token": 2304,
        "expanded bytes/token": 20480,
        "gqa bytes/token": 8192,
        "weight bytes": 56 * MIB,
    }


def _seconds(t: float) -> str:
    return f"{t:g} s"


def _mib(size: float) -> str:
    return f"{size / MIB:g} MiB"


def test_latent_lines_put_each_figure_in_its_row():
    lines = latent_lines(_rows(), _seconds, _mib)

    assert "the same weights (56 MiB)" in lines[2] and f"~{CACHE} tokens" in lines[2]
    assert lines[6:8] == [
        "| absorbed | 3 s | 2 s | 4 s | 1.50x | 1 MiB |",  # against torch's faster: 2 s
        "| expanded | 8 s | 16 s | - | 4.00x | 64 MiB |",
    ]
    assert lines[9] == (
        "Over pages (`PagedLatentCache`, pages of 64, one sequence whose pages are consecutive, "
        "read in place), the NumPy absorbed step: 4 s, 1.33x the contiguous cache's."
    )
    assert "(c and k_pe, 512 + 64 numbers) 2,304 B" in lines[11]
    assert "expanded 20,480 B (8.9x)" in lines[11] and "8,192 B (3.6x)" in lines[11]


@pytest.mark.parametrize("rows", [None, {}], ids=["not run", "empty"])
def test_targets_of_nothing_measured_are_none(rows):
    assert targets(rows) == []


@pytest.mark.parametrize(
    ("numpy_absorbed", "torch_math", "vs_torch", "vs_expanded"),
    [
        (3.0, 4.0, ("1.50x", "yes"), ("0.38x", "yes")),  # exactly at the bound, auto faster
        (3.0, 1.0, ("3.00x", "no"), ("0.38x", "yes")),  # math faster: judged against it
        (8.0, 8.0, ("4.00x", "no"), ("1.00x", "no")),  # as slow as expanded is not faster
    ],
)
def test_each_target_is_judged_alone_against_torchs_faster_backend(
    numpy_absorbed, torch_math, vs_torch, vs_expanded
):
    lines = targets(_rows(numpy_absorbed, torch_math))

    assert lines == [
        f"| NumPy absorbed MLA decode step <= {TORCH_TARGET}x the torch twin's on its faster "
        f"backend (V2-Lite layer, cache {CACHE}) | {vs_torch[0]} | {vs_torch[1]} |",
        f"| NumPy absorbed MLA decode step faster than expanded | {vs_expanded[0]} | "
        f"{vs_expanded[1]} |",
    ]


@pytest.fixture
def tiny(monkeypatch):
    """The benchmark's layer and lengths shrunk to a few tokens of width 16."""
    layer = {
        "hidden_size": 16,
        "num_heads": 2,
        "kv_lora_rank": 6,
        "qk_nope_head_dim": 4,
        "qk_rope_head_dim": 2,
        "v_head_dim": 3,
    }
    monkeypatch.setattr(bench_latent, "LAYER", layer)
    monkeypatch.setattr(bench_latent, "CACHE", 12)
    monkeypatch.setattr(bench_latent, "DECODE_STEPS", 3)
    monkeypatch.setattr(bench_latent, "PAGE_SIZE", 4)
    return layer


def test_latent_rows_measure_each_run_and_size_the_caches_and_weights(tiny, monkeypatch):
    # The stand-in for traced_peak runs the call and reports how often it read the absorbed
    # form's up-projections: once for the absorbed step, never for the expanded one.
    # The paged row's steps attend over a PagedLatentCache of 3 pages of 4.
    expanded, paged = [], []
    layer_class, paged_class = bench_latent.MultiHeadLatentAttention, bench_latent.PagedLatentCache
    monkeypatch.setattr(
        layer_class, "_up_projections", _spy(layer_class._up_projections, expanded, "absorbed")
    )
    attend = paged_class.attend
    monkeypatch.setattr(
        paged_class,
        "attend",
        lambda cache, *a, **o: paged.append(cache.block_table.shape) or attend(cache, *a, **o),
    )

    rows = bench_latent.latent_rows(1, lambda call: (expanded.clear(), call(), len(expanded))[2])

    c, h, rank, p, rope, dv = tiny.values()
    assert rows["numpy absorbed peak"] == 1 and rows["numpy expanded peak"] == 0
    assert rows["latent bytes/token"] == (rank + rope) * 4  # float32
    assert rows["expanded bytes/token"] == h * (p + rope + dv) * 4
    assert rows["gqa bytes/token"] == 2 * 8 * 128 * 4  # decode.py's Llama-8B layer
    assert rows["weight bytes"] == (c * h * (p + rope) + c * (rank + rope)
                                    + rank * h * (p + dv) + h * dv * c + rank) * 4  # fmt: skip
    times = [rows[row] for row, *_ in bench_latent.RUNS]
    assert np.isfinite(times).all()  # every one was measured at least once
    assert paged == [(1, 3)] * 2 * 3  # 2 rounds (warm-up, 1 repeat) of 3 steps


def _spy(method, calls, tag):
    """``method`` that also records ``tag`` in ``calls`` each time it runs."""

    def spied(self):
        calls.append(tag)
        return method(self)

    return spied
