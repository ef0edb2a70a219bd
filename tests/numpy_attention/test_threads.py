"""The tiled path's thread pool (numpy_attention.threads): every task runs once, errors surface,
and the process's BLAS thread count is what it was before, however many calls ran at once."""

from __future__ import annotations

import os
import threading

import pytest

from numpy_attention import threads, tiled

BLAS = threads._blas_threads()
POOL = pytest.mark.skipif(
    BLAS is None or (os.cpu_count() or 1) < 2,
    reason="no pool here: NumPy's BLAS offers no per-thread control, or one core",
)


def test_every_task_runs_once():
    seen, lock = [], threading.Lock()

    def work(task):
        with lock:
            seen.append(task)

    threads.run(list(range(100)), work)

    assert sorted(seen) == list(range(100))


def test_serial_fallback_runs_in_order_in_the_calling_thread(monkeypatch):
    monkeypatch.setattr(threads, "_blas_threads", lambda: None)
    seen = []

    threads.run(list(range(20)), lambda task: seen.append((task, threading.get_ident())))

    assert [task for task, _ in seen] == list(range(20))
    assert {ident for _, ident in seen} == {threading.get_ident()}


def test_the_first_error_is_raised_and_stops_new_tasks():
    started = []

    def work(task):
        started.append(task)
        if task == 3:
            raise ArithmeticError("tile 3")

    with pytest.raises(ArithmeticError, match="tile 3"):
        threads.run(list(range(1000)), work)

    assert len(started) < 1000


@POOL
def test_the_callers_blas_threads_are_left_as_they_were(rng):
    """Pool threads limit their BLAS to one thread; the caller's count must survive that."""
    q, k, v = (rng.standard_normal((2, 3, 64, 8)) for _ in range(3))
    original = BLAS.get()
    BLAS.set_local(2)  # a known count above 1, whatever earlier tests left
    try:
        tiled.tiled_attention_forward(q, k, v, block_q=16)  # 4 query blocks: tiles on the pool
        after = BLAS.get()
    finally:
        BLAS.set_local(original)

    assert after == 2


@POOL
@pytest.mark.parametrize("trial", range(10))
def test_concurrent_calls_leave_the_blas_threads_as_they_were(rng, trial):
    """Four threads run the tiled path at once; after the last one, the process's BLAS count
    is the one from before the first. (This OpenBLAS applies a pool thread's "local" count to
    the whole process: each call restoring what it saw on entry left it at 1, the count
    another call had set, in about half of these trials.)"""
    q, k, v = (rng.standard_normal((1, 2, 256, 8)) for _ in range(3))
    original = BLAS.get()
    BLAS.set_local(2)
    barrier = threading.Barrier(4)
    errors = []

    def call():
        try:
            barrier.wait()
            tiled.tiled_attention_forward(q, k, v, block_q=16, block_k=16, causal=True)
        except Exception as error:  # surfaced below
            errors.append(error)

    workers = [threading.Thread(target=call) for _ in range(4)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        after = BLAS.get()
    finally:
        BLAS.set_local(original)

    assert not errors
    assert after == 2
