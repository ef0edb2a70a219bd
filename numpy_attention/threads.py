"""The thread pool of the tiled path, and control of the BLAS library's own threads.

Tiles are independent pieces of work that NumPy runs with the GIL released (matmul and ufuncs),
so a pool of ``os.cpu_count()`` threads runs them in parallel. OpenBLAS's own threads would then
oversubscribe the cores, so each pool thread limits its BLAS to one thread
(``openblas_set_num_threads_local``); where NumPy's BLAS offers no such control, tiles run in the
calling thread and BLAS parallelizes each product itself. None of this is math: the results do
not depend on how many threads run or in which order they finish (the tiled path orders every
reduction itself).

Tests: tests/numpy_attention/test_threads.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np


def run(tasks: list[Any], work: Callable[[Any], None]) -> None:
    """Run independent tiles on os.cpu_count() threads, each with a 1-thread BLAS.

    Each thread pulls the next tile from a shared iterator, in the order of ``tasks`` (a future
    per tile would cost a thread wake-up per tile, which measured up to ~0.1 ms on a loaded
    2-core machine). The first error stops the others from starting new tiles and is raised.
    Where there is no per-thread BLAS control, the tiles run in the calling thread, in order.
    """
    blas = _blas_threads()
    workers = min(os.cpu_count() or 1, len(tasks)) if blas is not None else 1
    if blas is None or workers <= 1:
        for task in tasks:
            work(task)
        return
    pending, lock, failed = iter(tasks), threading.Lock(), threading.Event()

    def drain() -> None:
        while not failed.is_set():
            with lock:
                task = next(pending, None)
            if task is None:
                return
            try:
                work(task)
            except BaseException:
                failed.set()
                raise

    with _restoring(blas):
        with ThreadPoolExecutor(workers, initializer=blas.set_local, initargs=(1,)) as pool:
            for done in [pool.submit(drain) for _ in range(workers)]:
                done.result()


class _Callers:
    """How many calls of ``run`` are inside a pool now, and the BLAS thread count before the
    first of them: some OpenBLAS builds apply the "local" count to every thread, so each pool
    sets the process's count to 1, and only the last call to leave may restore it. (Each call
    restoring what it saw on entry left the process at one thread after concurrent calls.)"""

    lock = threading.Lock()
    active = 0
    before = 0


@contextlib.contextmanager
def _restoring(blas: _BlasThreads) -> Iterator[None]:
    with _Callers.lock:
        if _Callers.active == 0:
            _Callers.before = blas.get()
        _Callers.active += 1
    try:
        yield
    finally:
        with _Callers.lock:
            _Callers.active -= 1
            if _Callers.active == 0:
                blas.set_local(_Callers.before)


class _BlasThreads(NamedTuple):
    get: Callable[[], int]  # the calling thread's BLAS thread count
    set_local: Callable[[int], int]  # set it for the calling thread (in some builds: for all)


@functools.lru_cache(maxsize=1)
def _blas_threads() -> _BlasThreads | None:
    """OpenBLAS's thread-count getter and ``openblas_set_num_threads_local``, from the OpenBLAS
    that NumPy loaded; None where there is none (MKL, Accelerate, OpenBLAS before 0.3.27)."""
    getters = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_")
    for path in _loaded_openblas():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        set_local = getattr(library, "openblas_set_num_threads_local", None)
        get = next((getattr(library, name) for name in getters if hasattr(library, name)), None)
        if set_local is not None and get is not None:
            set_local.argtypes, set_local.restype = [ctypes.c_int], ctypes.c_int
            get.argtypes, get.restype = [], ctypes.c_int
            return _BlasThreads(get, set_local)
    return None


def _loaded_openblas() -> list[str]:
    """Paths of OpenBLAS libraries mapped into this process (Linux), or shipped in NumPy's wheel."""
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split(maxsplit=5)[-1].strip() for line in maps if "openblas" in line]
    except OSError:
        pass
    package = os.path.dirname(np.__file__)
    for pattern in ("../numpy.libs/*openblas*", ".dylibs/*openblas*"):
        paths += sorted(glob.glob(os.path.join(package, pattern)))
    return list(dict.fromkeys(os.path.realpath(path) for path in paths))
