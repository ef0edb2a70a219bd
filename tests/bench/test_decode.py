"""parity_tests/bench/decode.py without timing anything: the report and the targets on hand-made
rows, and the bookkeeping of ``decode_rows`` (which call each memory figure measures, the sizes of
the cache and the weights) on a layer small enough to run in milliseconds.

The rows are made of dyadic numbers so that every ratio is exact and a target exactly met is met.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.decode.cache import PagedKVCache
from parity_tests.bench import decode as bench_decode
from parity_tests.bench.decode import (
    BATCHES,
    CACHE,
    PAGE_SIZES,
    PREFILL,
    decode_lines,
    runs,
    targets,
)

MIB = 2**20


def _rows(numpy_decode: float = 3.0, numpy_prefill: float = 1.0, paged: dict | None = None) -> dict:
    """Hand-made rows; ``paged``: the paged steps (pages of 16, of 256) by B, against contiguous
    steps of 3 s."""
    paged = paged or dict.fromkeys(BATCHES, (3.0, 3.75))
    return {
        **{f"contiguous decode B{batch}": 3.0 for batch in BATCHES},
        **{
            f"paged {page} decode B{batch}": t
            for batch in BATCHES
            for page, t in zip(PAGE_SIZES, paged[batch], strict=True)
        },
        **{f"paged {page} runs B{batch}": batch for batch in BATCHES for page in PAGE_SIZES},
        "attention contiguous": 0.5,
        **{f"attention pages {page} in order": 0.5 for page in PAGE_SIZES},
        **{f"attention pages {page} shuffled": 1.0 for page in PAGE_SIZES},
        "numpy decode": numpy_decode,
        "torch decode": 2.0,
        "numpy prefill": numpy_prefill,
        "torch prefill": 1.0,
        "numpy decode peak": 3 * MIB,
        "numpy prefill peak": 100 * MIB,
        "cache bytes": 64 * MIB,
        "weight bytes": 160 * MIB,
    }


def _seconds(t: float) -> str:
    return f"{t:g} s"


def _mib(size: float) -> str:
    return f"{size / MIB:g} MiB"


def test_decode_lines_put_each_figure_in_its_row():
    lines = decode_lines(_rows(), _seconds, _mib)

    assert "the same weights (160 MiB)" in lines[2]
    assert lines[6:8] == [
        f"| one decode step, cache ~{CACHE} | 3 s | 2 s | 1.50x | 3 MiB |",
        f"| prefill of {PREFILL} tokens | 1 s | 1 s | 1.00x | 100 MiB |",
    ]
    assert lines[9] == f"The cache (keys and values of {CACHE + 1} tokens, one layer) holds 64 MiB."
    batched = lines.index(
        "| B | cache | layer decode step | paged / contiguous | runs per sequence |"
    )
    assert lines[batched + 2 : batched + 2 + 3 * len(BATCHES)] == [
        row
        for batch in BATCHES
        for row in (
            f"| {batch} | contiguous | 3 s | 1.00x | - |",
            f"| {batch} | pages of 16 | 3 s | 1.00x | {batch} |",
            f"| {batch} | pages of 256 | 3.75 s | 1.25x | {batch} |",
        )
    ]
    assert lines[-4:-1] == [
        "| contiguous | 0.5 s | - | - |",
        "| pages of 16 | 0.5 s | 1 s | 2.00x |",
        "| pages of 256 | 0.5 s | 1 s | 2.00x |",
    ]


@pytest.mark.parametrize("rows", [None, {}], ids=["not run", "empty"])
def test_targets_of_nothing_measured_are_none(rows):
    assert targets(rows) == []


@pytest.mark.parametrize(
    ("numpy_decode", "numpy_prefill", "decode", "prefill"),
    [
        (3.0, 1.2, ("1.50x", "yes"), ("1.20x", "yes")),  # both exactly at their bound
        (3.125, 1.2, ("1.56x", "no"), ("1.20x", "yes")),
        (3.0, 1.25, ("1.50x", "yes"), ("1.25x", "no")),
    ],
)
def test_each_target_is_met_at_its_bound_and_judged_alone(
    numpy_decode, numpy_prefill, decode, prefill
):
    lines = targets(_rows(numpy_decode, numpy_prefill))

    assert lines[:2] == [
        f"| NumPy decode step <= {bench_decode.DECODE_TARGET}x the torch twin (Llama-8B layer, "
        f"cache {CACHE}) | {decode[0]} | {decode[1]} |",
        f"| NumPy prefill of {PREFILL} <= {bench_decode.PREFILL_TARGET}x the torch twin | "
        f"{prefill[0]} | {prefill[1]} |",
    ]


def test_the_paged_targets_judge_each_batch_by_its_worse_page_size_at_their_bound():
    paged = dict(zip(BATCHES, [(3.6, 3.0), (3.0, 3.75), (3.0, 3.0)], strict=True))
    lines = targets(_rows(paged=paged))  # of the contiguous 3.0: 1.2x, 1.25x, 1.0x

    assert lines[2:] == [
        f"| NumPy decode step of B = {batch} over pages (16 and 256, the worse) <= "
        f"{bench_decode.PAGED_TARGET}x the contiguous cache's (cache {CACHE}) | {ratio} | {met} |"
        for batch, ratio, met in zip(
            BATCHES, ("1.20x", "1.25x", "1.00x"), ("yes", "no", "yes"), strict=True
        )
    ]


@pytest.mark.parametrize(
    ("table", "expected"), [([], 0), ([4], 1), ([0, 1, 2], 1), ([0, 1, 6, 9, 10], 3), ([3, 2], 2)]
)
def test_runs_counts_the_stretches_of_consecutive_pages(table, expected):
    assert runs(np.array(table, dtype=np.int32)) == expected


@pytest.mark.parametrize(("page", "appended"), [(2, [5, 2, 2]), (4, [5, 4]), (None, [9])])
def test_serve_fills_a_prefill_then_a_page_at_a_time(rng, monkeypatch, page, appended):
    """After the prefill, each append is one page of every sequence: the pages ``page`` decode
    steps would ask for, the sequences in turn; the cache holds the fill."""
    monkeypatch.setattr(bench_decode, "PREFILL", 5)
    cache = PagedKVCache(16, 2, 1, 4, dtype=np.float64)
    fill = rng.standard_normal((2, 2, 1, 9, 4))
    lengths = []
    append = cache.append
    monkeypatch.setattr(cache, "append", lambda k, v: lengths.append(k.shape[2]) or append(k, v))

    bench_decode._serve(cache, tuple(fill), page)

    assert lengths == appended and cache.length == 9
    keys, values = cache.gather()
    np.testing.assert_array_equal(keys, fill[0])
    np.testing.assert_array_equal(values, fill[1])


@pytest.fixture
def tiny(monkeypatch):
    """The benchmark's layer and lengths shrunk to a few tokens of width 16."""
    layer = {"hidden_size": 16, "num_heads": 4, "num_kv_heads": 2, "head_dim": 4}
    monkeypatch.setattr(bench_decode, "LAYER", layer)
    monkeypatch.setattr(bench_decode, "CACHE", 12)
    monkeypatch.setattr(bench_decode, "DECODE_STEPS", 3)
    monkeypatch.setattr(bench_decode, "PREFILL", 5)
    monkeypatch.setattr(bench_decode, "PAGE_SIZES", (2, 4))
    monkeypatch.setattr(bench_decode, "BATCHES", (1, 3))
    return layer


def test_decode_rows_measure_the_step_and_the_prefill_and_size_the_cache(tiny):
    # The stand-in for traced_peak runs the call and reports how many tokens it attended from.
    rows = bench_decode.decode_rows(1, lambda call: call().shape[1])

    c, h, h_kv, d = tiny.values()
    assert rows["numpy decode peak"] == 1  # one token
    assert rows["numpy prefill peak"] == 5  # the whole prompt
    assert rows["cache bytes"] == 2 * h_kv * (12 + 1) * d * 4  # K and V, float32
    assert rows["weight bytes"] == (c * h * d + 2 * c * h_kv * d + h * d * c) * 4  # q, k, v, o
    times = [rows[f"{lib} {step}"] for lib in ("numpy", "torch") for step in ("decode", "prefill")]
    times += [rows[f"contiguous decode B{batch}"] for batch in (1, 3)]
    times += [rows[f"paged {page} decode B{batch}"] for page in (2, 4) for batch in (1, 3)]
    times += [rows[f"attention pages {page} {order}"] for page in (2, 4)
              for order in ("in order", "shuffled")]  # fmt: skip
    assert np.isfinite(times + [rows["attention contiguous"]]).all()  # each measured at least once
    # 12 tokens in pages of 2 and 4, three sequences taking pages in turn: still one run each
    assert [rows[f"paged {page} runs B{batch}"] for page in (2, 4) for batch in (1, 3)] == [1] * 4
