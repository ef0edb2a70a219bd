"""parity_tests/bench/decode.py without timing anything: the report and the targets on hand-made
rows, and the bookkeeping of ``decode_rows`` (which call each memory figure measures, the sizes of
the cache and the weights) on a layer small enough to run in milliseconds.

The rows are made of dyadic numbers so that every ratio is exact and a target exactly met is met.
"""

from __future__ import annotations

import numpy as np
import pytest

from parity_tests.bench import decode as bench_decode
from parity_tests.bench.decode import CACHE, PAGE_SIZES, PREFILL, decode_lines, targets

MIB = 2**20


def _rows(
    numpy_decode: float = 3.0, numpy_prefill: float = 1.0, paged: tuple = (3.0, 3.75)
) -> dict:
    return {
        **{f"numpy paged {page} decode": t for page, t in zip(PAGE_SIZES, paged, strict=True)},
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
    assert lines[-4:-1] == [
        "| contiguous | 3 s | 1.00x | 0.5 s | - | - |",
        "| pages of 16 | 3 s | 1.00x | 0.5 s | 1 s | 2.00x |",
        "| pages of 256 | 3.75 s | 1.25x | 0.5 s | 1 s | 2.00x |",
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
    lines = targets(_rows(numpy_decode, numpy_prefill, (numpy_decode,) * 2))

    assert lines[:2] == [
        f"| NumPy decode step <= {bench_decode.DECODE_TARGET}x the torch twin (Llama-8B layer, "
        f"cache {CACHE}) | {decode[0]} | {decode[1]} |",
        f"| NumPy prefill of {PREFILL} <= {bench_decode.PREFILL_TARGET}x the torch twin | "
        f"{prefill[0]} | {prefill[1]} |",
    ]


def test_the_paged_targets_are_met_at_their_bound_and_judged_alone():
    lines = targets(_rows(paged=(3.6, 3.75)))  # 1.2x and 1.25x of the contiguous 3.0

    assert lines[2:] == [
        f"| NumPy decode step over pages of {page} <= {bench_decode.PAGED_TARGET}x the "
        f"contiguous cache's (cache {CACHE}) | {ratio} | {met} |"
        for page, ratio, met in zip(PAGE_SIZES, ("1.20x", "1.25x"), ("yes", "no"), strict=True)
    ]


@pytest.fixture
def tiny(monkeypatch):
    """The benchmark's layer and lengths shrunk to a few tokens of width 16."""
    layer = {"hidden_size": 16, "num_heads": 4, "num_kv_heads": 2, "head_dim": 4}
    monkeypatch.setattr(bench_decode, "LAYER", layer)
    monkeypatch.setattr(bench_decode, "CACHE", 12)
    monkeypatch.setattr(bench_decode, "DECODE_STEPS", 3)
    monkeypatch.setattr(bench_decode, "PREFILL", 5)
    monkeypatch.setattr(bench_decode, "PAGE_SIZES", (2, 4))
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
    times += [rows[f"numpy paged {page} decode"] for page in (2, 4)]
    times += [rows[f"attention pages {page} {order}"] for page in (2, 4)
              for order in ("in order", "shuffled")]  # fmt: skip
    assert np.isfinite(times + [rows["attention contiguous"]]).all()  # each measured at least once
