"""parity_tests/bench/measure.py: the best of the timed runs after a warm-up, the traced peak of a
NumPy allocation, and the units of the report."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from parity_tests.bench import measure


def test_best_time_warms_up_then_keeps_the_fastest_run(monkeypatch):
    clock = iter([0.0, 5.0, 10.0, 12.0, 20.0, 24.0])  # runs of 5, 2 and 4 seconds
    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    calls = []

    best = measure.best_time(lambda: calls.append(1), repeats=3)

    assert best == 2.0 and len(calls) == 4  # the warm-up is not timed


def test_traced_peak_sees_a_numpy_allocation():
    peak = measure.traced_peak(lambda: np.ones(2**20, dtype=np.uint8))

    assert 2**20 <= peak < 2 * 2**20


def test_units():
    assert measure.seconds(0.0123) == "12.3 ms" and measure.seconds(2.5) == "2.50 s"
    assert measure.mib(3 * 2**20) == "3 MiB" and measure.mib(2048 * 2**20) == "2,048 MiB"
