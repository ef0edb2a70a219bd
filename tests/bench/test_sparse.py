"""parity_tests/bench/sparse.py without timing anything: the report and the target on hand-made
rows, the indices' pattern, that the sparse and dense runs compute the same attention when every
query names all its keys, and the bookkeeping of ``sparse_rows`` (which sizes the dense run
skips) on sizes small enough to run in milliseconds.

The rows are made of dyadic numbers so that every ratio is exact and a target exactly met is met.
"""

from __future__ import annotations

import numpy as np
import pytest

from parity_tests.bench import sparse as bench_sparse
from parity_tests.bench.sparse import LINEAR_TARGET, sparse_lines, targets

TOPK = bench_sparse.TOPK


VALID = {2048: 2048 * TOPK // 2, 4096: 4096 * TOPK // 4 * 3, 8192: 8192 * TOPK // 8 * 7}


def _rows(largest: float = 4.0 * 1.5, dense_last: float | None = None) -> dict:
    """Sparse seconds at S = 2048, 4096, 8192: 1 s, 2 s (flat per S * topk), then ``largest``;
    valid entries: 1/2, 3/4 and 7/8 of the slots, as the benchmark's causal lists."""
    return {
        "sparse": {2048: 1.0, 4096: 2.0, 8192: largest},
        "valid": dict(VALID),
        "dense": {2048: 0.5, 4096: 4.0, 8192: dense_last},
    }


def _seconds(t: float) -> str:
    return f"{t:g} s"


def test_sparse_lines_put_each_figure_in_its_row():
    lines = sparse_lines(_rows(4.0), _seconds)

    per_entry = 1e9 / (2048 * TOPK)  # ns: 1 s over 2048 queries of topk entries
    assert lines[6:9] == [
        f"| 2048 | 1 s | {per_entry:.1f} ns | {VALID[2048]} (0.500) | {2 * per_entry:.1f} ns "
        "| 0.5 s | 2.00x |",
        f"| 4096 | 2 s | {per_entry:.1f} ns | {VALID[4096]} (0.750) | {per_entry / 0.75:.1f} ns "
        "| 4 s | 0.50x |",
        f"| 8192 | 4 s | {per_entry:.1f} ns | {VALID[8192]} (0.875) | {per_entry / 0.875:.1f} ns "
        "| not run | - |",
    ]
    assert lines[10] == (  # per valid entry: 2, 4/3 and 8/7 times per S * topk
        "Spread over S (largest / smallest): per S * topk 1.00x, per valid entry 1.75x (the "
        "gathers and scores run over every slot, the scatter-add over the valid entries)."
    )
    assert lines[12] == (
        f"Dense not run at S = 8192: expected over {bench_sparse.DENSE_BUDGET:.0f} s from the "
        "previous size times (S / S_prev)^2."
    )


def test_sparse_lines_name_no_skipped_size_when_dense_ran_everywhere():
    lines = sparse_lines(_rows(4.0, dense_last=16.0), _seconds)

    assert lines[8].endswith("| 16 s | 0.25x |")
    assert not any(line.startswith("Dense not run") for line in lines)


@pytest.mark.parametrize("rows", [None, {}], ids=["not run", "empty"])
def test_targets_of_nothing_measured_are_none(rows):
    assert targets(rows) == []


@pytest.mark.parametrize(
    ("largest", "spread", "met"),
    [
        (4.0, "1.00x", "yes"),  # flat
        (4.0 * LINEAR_TARGET, f"{LINEAR_TARGET:.2f}x", "yes"),  # exactly at the bound
        (8.0, "2.00x", "no"),  # the largest S twice as slow per entry
    ],
)
def test_the_target_is_the_spread_of_the_time_per_entry(largest, spread, met):
    lines = targets(_rows(largest))

    ns = 1e9 / (2048 * TOPK)
    assert lines == [
        f"| NumPy sparse fwd+bwd time per S * topk flat over S = 2048, 4096, 8192 (largest / "
        f"smallest <= {LINEAR_TARGET}x; {ns:.1f}, {ns:.1f}, {ns * largest / 4:.1f} ns) | "
        f"{spread} | {met} |"
    ]


def test_causal_indices_name_recent_and_earlier_keys_causally():
    s, topk = 40, 8
    indices = bench_sparse.causal_indices(s, topk, np.random.default_rng(0))

    assert indices.shape == (s, 1, topk)
    for t in range(s):
        row = indices[t, 0]
        named = row[row >= 0]
        assert len(named) == min(t + 1, topk) and (row[len(named) :] == -1).all()
        assert named.max() == t and len(set(named.tolist())) == len(named)  # causal, no repeats
        if t >= topk:  # the last topk / 2 keys, then topk / 2 earlier ones
            assert named[topk // 2 :].tolist() == list(range(t + 1 - topk // 2, t + 1))
            assert (named[: topk // 2] < t + 1 - topk // 2).all()
    later = indices[topk:, 0, : topk // 2]
    assert len(np.unique(later)) > topk // 2  # the earlier picks differ between queries


@pytest.fixture
def tiny(monkeypatch):
    """The benchmark's sizes shrunk to a few tokens of width 12."""
    monkeypatch.setattr(bench_sparse, "SIZES", (8, 16, 32))
    monkeypatch.setattr(bench_sparse, "TOPK", 8)
    monkeypatch.setattr(bench_sparse, "HEADS", 4)
    monkeypatch.setattr(bench_sparse, "WIDTH", 12)
    monkeypatch.setattr(bench_sparse, "D_V", 8)


def test_sparse_and_dense_runs_compute_the_same_attention(tiny):
    # With topk >= S every query names all its keys: the sparse call is the dense causal one,
    # and V = k[..., :D_V] sends the values' gradient into dk's first columns.
    s = 8
    rng = np.random.default_rng(0)
    q, k, dout = (t.astype(np.float64) for t in bench_sparse._inputs(s, rng))
    indices = bench_sparse.causal_indices(s, 8, rng)

    out, (dq, dk, dv, _) = bench_sparse.sparse_run(q, k, dout, indices)()
    dense_out, (dense_dq, dense_dk, dense_dv, _) = bench_sparse.dense_run(q, k, dout)()

    assert dv is None
    head_major = (1, 0, 2)
    np.testing.assert_allclose(out, dense_out[0].transpose(head_major), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dq, dense_dq[0].transpose(head_major), rtol=1e-12, atol=1e-12)
    dense_dk = dense_dk[0].transpose(head_major).copy()
    dense_dk[..., :8] += dense_dv[0].transpose(head_major)
    np.testing.assert_allclose(dk, dense_dk, rtol=1e-12, atol=1e-12)


def test_sparse_rows_time_each_size_and_skip_dense_past_its_budget(tiny, monkeypatch):
    # Each "timing" runs the call and returns S / 8 seconds for sparse, (S / 8)^2 for dense;
    # with a budget of 10 s the dense run at 32 (expected 4 * 4 = 16 s) is skipped.
    calls = []

    def fake_time(run, s, repeats):
        out, grads = run()
        sparse = grads.dv is None
        calls.append(("sparse" if sparse else "dense", s, out.shape, repeats))
        return s / 8 if sparse else (s / 8) ** 2

    monkeypatch.setattr(bench_sparse, "_time", fake_time)
    monkeypatch.setattr(bench_sparse, "DENSE_BUDGET", 10.0)

    rows = bench_sparse.sparse_rows(3)

    assert rows == {
        "sparse": {8: 1.0, 16: 2.0, 32: 4.0},
        "valid": {8: 36, 16: 36 + 8 * 8, 32: 36 + 24 * 8},  # 1 + ... + 8, then topk a query
        "dense": {8: 1.0, 16: 4.0, 32: None},
    }
    assert calls == [
        ("sparse", 8, (8, 4, 8), 3),
        ("dense", 8, (1, 4, 8, 8), 3),
        ("sparse", 16, (16, 4, 8), 3),
        ("dense", 16, (1, 4, 16, 8), 3),
        ("sparse", 32, (32, 4, 8), 3),
    ]


def test_time_runs_once_from_once_from_on(monkeypatch):
    runs = []
    monkeypatch.setattr(bench_sparse, "ONCE_FROM", 16)

    bench_sparse._time(lambda: runs.append("big"), 16, 3)
    bench_sparse._time(lambda: runs.append("small"), 8, 3)

    assert runs == ["big"] + ["small"] * 4  # one warm-up, then the best of 3
