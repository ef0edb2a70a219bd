"""``isolate=True``: every call in a child process, so that a kernel that crashes the interpreter
or hangs gets an "error" verdict naming the signal or the time limit, and the run goes on."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch.nn.functional as F

from parity_tests import check_kernel


def crashes(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """A kernel that kills its process with SIGSEGV on causal cases (as compiled code can)."""
    if is_causal:
        os.kill(os.getpid(), signal.SIGSEGV)
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                          scale=scale)  # fmt: skip


def hangs(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    time.sleep(600)


def test_a_crash_is_an_error_naming_the_signal_and_the_run_goes_on():
    report = check_kernel(crashes, dtypes=["float32"], cases=["plain", "causal-n<m", "scale-1/d"],
                          isolate=True)  # fmt: skip

    assert report.groups == {
        ("plain", "float32"): "pass",
        ("causal-n<m", "float32"): "fail",
        ("scale-1/d", "float32"): "pass",
    }
    (row,) = [row for row in report.rows if row.case == "causal-n<m"]
    assert row.verdict == "error" and "killed by signal SIGSEGV" in row.detail
    assert not report.passed


def test_a_hang_is_an_error_naming_the_time_limit():
    started = time.monotonic()

    report = check_kernel(hangs, dtypes=["float32"], cases=["plain"], isolate=3.0)

    (row,) = report.rows
    assert row.verdict == "error" and "time limit of 3 s" in row.detail
    assert time.monotonic() - started < 120  # the child's start, then 3 s, never 600


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


@pytest.mark.parametrize("isolate", [0.0, -1.0, "yes"])
def test_a_time_limit_must_be_positive(isolate):
    with pytest.raises(ValueError, match="isolate must be"):
        check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], isolate=isolate)
