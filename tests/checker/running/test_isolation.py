"""``isolate=True``: every call in a child process, so that a kernel that crashes the interpreter
or hangs gets an "error" verdict naming the signal or the time limit, and the run goes on; what
the child writes goes into the error, not to the terminal, and a child that crashes, hangs or is
done leaves no named semaphore behind."""

from __future__ import annotations

import _multiprocessing
import multiprocessing
import os
import signal
import time

import pytest
import torch.nn.functional as F

from parity_tests import check_kernel

# Where the kernels below note the named semaphores they create (the child inherits it).
SEMAPHORES_FILE = "PARITY_TEST_SEMAPHORES"


def _hold_a_semaphore() -> None:
    """Create a named semaphore, as compiled code's progress bars do, registered with the
    resource tracker (a spawned child's default context is "spawn"), and note its name."""
    lock = multiprocessing.Lock()
    _hold_a_semaphore.held.append(lock)  # type: ignore[attr-defined]
    with open(os.environ[SEMAPHORES_FILE], "a", encoding="utf-8") as stream:
        stream.write(lock._semlock.name + "\n")


_hold_a_semaphore.held = []  # type: ignore[attr-defined]


def holds_then_crashes(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                       scale=None):  # fmt: skip
    """A kernel that holds a named semaphore per call and kills its process with SIGSEGV on
    causal cases (as compiled code can), after saying so on stdout and stderr."""
    _hold_a_semaphore()
    if is_causal:
        print("crashing now (stdout)", flush=True)
        os.write(2, b"free(): invalid size (stderr)\n")
        os.kill(os.getpid(), signal.SIGSEGV)
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                          scale=scale)  # fmt: skip


def hangs(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    _hold_a_semaphore()
    time.sleep(600)


@pytest.fixture
def semaphores(tmp_path, monkeypatch):
    """The names of the semaphores the kernels' processes created, read after the test's
    call."""
    path = tmp_path / "semaphores"
    path.touch()
    monkeypatch.setenv(SEMAPHORES_FILE, str(path))
    return lambda: path.read_text().split()


def _left_behind(names: list[str]) -> list[str]:
    """Those of the named semaphores that still exist (unlinked now, so that none outlives the
    test)."""
    found = []
    for name in names:
        try:
            _multiprocessing.sem_unlink(name)
        except FileNotFoundError:
            continue
        found.append(name)
    return found


def test_a_crash_is_an_error_naming_the_signal_and_the_run_goes_on(capfd, semaphores):
    """The first child passes plain, then crashes on causal-n<m, holding a semaphore it can no
    longer release; the second runs scale-1/d and is done. The crash is an error with what the
    child wrote, and neither child leaves its semaphore for the resource tracker to find at
    exit ("There appear to be 1 leaked semaphore objects")."""
    report = check_kernel(holds_then_crashes, dtypes=["float32"],
                          cases=["plain", "causal-n<m", "scale-1/d"], isolate=True)  # fmt: skip

    assert report.groups == {
        ("plain", "float32"): "pass",
        ("causal-n<m", "float32"): "error",
        ("scale-1/d", "float32"): "pass",
    }
    (row,) = [row for row in report.rows if row.case == "causal-n<m"]
    assert row.verdict == "error" and "killed by signal SIGSEGV" in row.detail
    assert not report.passed
    (error,) = report.errors
    assert error.kind == "crash" and error.where == [("causal-n<m", "float32")]
    assert "crashing now (stdout)" in error.traceback
    assert "free(): invalid size (stderr)" in error.traceback
    assert "crashing now" not in "".join(capfd.readouterr())  # not on the terminal
    # one a call: plain and scale-1/d are called twice (the second call compared with the
    # first), causal-n<m once (its first call crashed)
    assert len(semaphores()) == 5 and _left_behind(semaphores()) == []


def test_a_hang_is_an_error_naming_the_time_limit(semaphores):
    started = time.monotonic()

    report = check_kernel(hangs, dtypes=["float32"], cases=["plain"], isolate=True, timeout=3)

    (row,) = report.rows
    assert row.verdict == "error" and "time limit of 3 s" in row.detail
    assert time.monotonic() - started < 120  # the child's start, then 3 s, never 600
    assert report.errors[0].kind == "hang"
    assert len(semaphores()) == 1 and _left_behind(semaphores()) == []


def test_an_isolated_kernel_is_judged_as_in_process():
    isolated = check_kernel("torch.nn.functional:scaled_dot_product_attention", dtypes=["float32"],
                            cases=["plain", "dv>d"], isolate=True)  # fmt: skip
    direct = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"],
                          cases=["plain", "dv>d"])  # fmt: skip

    assert isolated.rows == direct.rows


def test_a_kernel_that_does_not_pickle_is_refused_before_any_work():
    def local(query, key, value, **kwargs):
        return F.scaled_dot_product_attention(query, key, value)

    with pytest.raises(TypeError, match="module-level function"):
        check_kernel(local, dtypes=["float32"], isolate=True)


@pytest.mark.parametrize(
    ("isolate", "timeout", "error"),
    [
        (0.0, None, "isolate must be"),
        (-1.0, None, "isolate must be"),
        ("yes", None, "isolate must be"),
        (True, -1, "timeout must be a time limit in seconds > 0"),
        (False, 5, "timeout limits an isolated call: it needs isolate=True"),
        (5, 5, "give the time limit once"),
    ],
)
def test_a_time_limit_must_be_positive_and_given_once(isolate, timeout, error):
    with pytest.raises(ValueError, match=error):
        check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], isolate=isolate,
                     timeout=timeout)  # fmt: skip
