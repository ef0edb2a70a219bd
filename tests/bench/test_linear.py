"""parity_tests/bench/linear.py without timing anything: the report and the targets on hand-made
rows, that the two forms' runs compute the same gradients, and the bookkeeping of ``core_rows``
(which sizes the recurrent run skips) on sizes small enough to run in milliseconds.

The rows are made of dyadic numbers so that every ratio is exact and a target exactly met is met.
"""

from __future__ import annotations

import numpy as np
import pytest

from parity_tests.bench import linear as bench_linear
from parity_tests.bench.linear import DECODE_TARGET, LINEAR_TARGET, linear_lines, targets


def _rows(largest: float = 4.0, recurrent_last: float | None = None, decode=None) -> dict:
    """Chunk seconds at T = 2048, 4096, 8192: 1 s, 2 s (flat per token), then ``largest``."""
    rows = {
        "chunk": {2048: 1.0, 4096: 2.0, 8192: largest},
        "recurrent": {2048: 4.0, 4096: 16.0, 8192: recurrent_last},
    }
    if decode is not None:
        rows["decode"] = decode
    return rows


def _seconds(t: float) -> str:
    return f"{t:g} s"


def test_linear_lines_put_each_figure_in_its_row():
    lines = linear_lines(_rows(), _seconds)

    us = 1e6 / 2048
    assert lines[6:9] == [
        f"| 2048 | 1 s | {us:.1f} us | 4 s | 4.00x |",
        f"| 4096 | 2 s | {us:.1f} us | 16 s | 8.00x |",
        f"| 8192 | 4 s | {us:.1f} us | not run | - |",
    ]
    assert lines[10].startswith("Recurrent not run at T = 8192: expected over")


def test_decode_rows_get_their_table():
    lines = linear_lines(_rows(recurrent_last=32.0, decode={512: 0.5, 2048: 0.5}), _seconds)

    assert not any(line.startswith("Recurrent not run") for line in lines)
    assert lines[-4:-1] == ["|---|---|", "| 512 | 0.5 s |", "| 2048 | 0.5 s |"]


@pytest.mark.parametrize("rows", [None, {}], ids=["not run", "empty"])
def test_targets_of_nothing_measured_are_none(rows):
    assert targets(rows) == []


@pytest.mark.parametrize(
    ("largest", "spread", "met"),
    [
        (4.0, "1.00x", "yes"),  # flat
        (4.0 * LINEAR_TARGET, f"{LINEAR_TARGET:.2f}x", "yes"),  # exactly at the bound
        (8.0, "2.00x", "no"),  # the largest T twice as slow per token
    ],
)
def test_the_linear_target_is_the_spread_of_the_time_per_token(largest, spread, met):
    lines = targets(_rows(largest))

    assert lines[0].endswith(f"(largest / smallest <= {LINEAR_TARGET}x) | {spread} | {met} |")


@pytest.mark.parametrize(
    ("recurrent", "ratio", "met"),
    [(4.0, "4.00x", "yes"), (1.0, "1.00x", "no"), (0.5, "0.50x", "no")],
)
def test_the_speed_target_is_the_smallest_recurrent_over_chunk_ratio(recurrent, ratio, met):
    rows = _rows()
    rows["recurrent"] = {2048: recurrent, 4096: 16.0, 8192: None}

    lines = targets(rows)

    assert lines[1] == (
        "| NumPy gated delta rule, chunk form faster than recurrent at T = 2048, 4096 (smallest "
        f"recurrent / chunk > 1x) | {ratio} | {met} |"
    )


@pytest.mark.parametrize(
    ("steps", "flat", "met"),
    [((0.5, 0.5, 0.5), "1.00x", "yes"), ((0.5, 0.5, 0.5 * DECODE_TARGET), "1.50x", "yes"),
     ((0.25, 0.5, 1.0), "4.00x", "no")],
)  # fmt: skip
def test_the_decode_target_is_the_spread_of_the_step(steps, flat, met):
    lines = targets(_rows(decode=dict(zip((512, 2048, 8192), steps, strict=True))))

    assert lines[-1].endswith(f"| {flat} | {met} |") and "decode step flat" in lines[-1]


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(bench_linear, "SIZES", (8, 16, 32))
    monkeypatch.setattr(bench_linear, "HEADS", 2)
    monkeypatch.setattr(bench_linear, "WIDTH", 4)
    monkeypatch.setattr(bench_linear, "CHUNK", 4)


def test_the_two_forms_runs_compute_the_same_numbers(tiny):
    inputs = tuple(x.astype(np.float64) for x in bench_linear._inputs(12, np.random.default_rng(0)))

    chunk_out, chunk_grads = bench_linear.core_run(inputs, "chunk")()
    rec_out, rec_grads = bench_linear.core_run(inputs, "recurrent")()

    np.testing.assert_allclose(chunk_out, rec_out, rtol=1e-12, atol=1e-13)
    for mine, theirs in zip(chunk_grads[:5], rec_grads[:5], strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-11, atol=1e-12)


def test_core_rows_time_each_size_and_skip_recurrent_past_its_budget(tiny, monkeypatch):
    # Each "timing" runs the call and returns T / 8 seconds for chunk, T for recurrent; with a
    # budget of 20 s the recurrent run at 32 (expected 16 * 2 = 32 s) is skipped.
    calls = []

    def fake_time(run, t, repeats):
        out, _ = run()
        calls.append((t, out.shape))
        return t / 8 if len(calls) % 2 else float(t)

    monkeypatch.setattr(bench_linear, "_time", fake_time)
    monkeypatch.setattr(bench_linear, "RECURRENT_BUDGET", 20.0)

    rows = bench_linear.core_rows(1)

    assert rows == {"chunk": {8: 1.0, 16: 2.0, 32: 4.0}, "recurrent": {8: 8.0, 16: 16.0, 32: None}}
    assert [t for t, _ in calls] == [8, 8, 16, 16, 32]
    assert all(shape == (1, t, 2, 4) for t, shape in calls)
