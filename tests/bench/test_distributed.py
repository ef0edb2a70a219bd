"""parity_tests/bench/distributed.py without timing anything: its command line, the bytes a rank
should send (docs/context-parallel.md, "Communication"), the counting of the bytes it does send,
and the reading of the peak resident set.

One tiny real ring (W = 2 gloo processes at (1, 2, 16, 4), about two seconds, nearly all of it
starting the processes) checks that what the benchmark counts is what the theory says; its
times are not looked at.
"""

from __future__ import annotations

import io
import sys
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from parity_tests.bench import distributed as bench_distributed
from parity_tests.bench.distributed import build_parser, main, peak, reset_peak, run_world, theory

MIB = 2**20
STATUS = "Name:\tpython\nVmPeak:\t  900000 kB\nVmHWM:\t    5678 kB\nVmRSS:\t    1234 kB\n"


def _must_not_run(*args, **kwargs):
    raise AssertionError("the benchmark started measuring")


@pytest.fixture
def unmeasured(monkeypatch):
    """Every measurement replaced by a failure; the arguments ``report`` was given, if any."""
    given = []
    monkeypatch.setattr(bench_distributed, "report", given.append)
    monkeypatch.setattr(bench_distributed, "run_world", _must_not_run)
    monkeypatch.setattr(bench_distributed, "run_reference", _must_not_run)
    return given


# -- command line -------------------------------------------------------------------------------


def test_help_measures_nothing_and_exits_0(unmeasured, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])

    assert done.value.code == 0
    assert "--worlds" in capsys.readouterr().out
    assert unmeasured == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--shape", "1,4,4096"],
        ["--shape", "1,4,0,64"],
        ["--worlds", "0"],
        ["--worlds", "two"],
        ["--repeats", "0"],
        ["--cores", "2,2"],
        ["--layout", "striped"],
        ["--lengths", "6"],  # zigzag at W = 2 cuts 4 chunks
        ["--worlds", "3", "--lengths", "9"],  # zigzag at W = 3 cuts 6 chunks
        ["--bogus"],
    ],
    ids=" ".join,
)
def test_bad_usage_is_exit_2_before_any_work(argv, unmeasured, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)

    assert done.value.code == 2
    assert "usage: python -m parity_tests.bench.distributed" in capsys.readouterr().err
    assert unmeasured == []


@pytest.mark.parametrize(
    ("argv", "lengths"),
    [
        (["--shape", "1,2,64,8"], [16, 32, 64]),  # N/4, N/2, N
        (["--worlds", "3", "--lengths", "9", "--layout", "contiguous"], [9]),  # 3 chunks
    ],
    ids=["defaults", "contiguous"],
)
def test_good_usage_reaches_the_report_with_its_lengths(argv, lengths, unmeasured):
    assert main(argv) == 0

    (args,) = unmeasured
    assert args.lengths == lengths


# -- bytes sent ---------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_theory_is_the_ring_formula_of_the_docs(world):
    shape = (2, 3, 24, 8)  # (B, H, N, D): N splits for every W here
    k_bytes = 2 * 3 * 24 * 8 * 4  # |K|, float32

    forward, total = theory(world, shape, 24)

    assert forward == Fraction(2 * (world - 1), world) * k_bytes
    if world == 1:
        assert total == 0  # a ring of one rank sends nothing
    else:
        assert total - forward == Fraction(2 * (world - 1) + 2 * world, world) * k_bytes


def test_count_sends_counts_the_bytes_handed_to_send_only(monkeypatch):
    handed = []
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: handed.append(ops) or ["work"])
    sent = {"bytes": 0}
    ops = [
        SimpleNamespace(op=dist.isend, tensor=torch.zeros(3, 5)),  # 60 bytes
        SimpleNamespace(op=dist.irecv, tensor=torch.zeros(7, dtype=torch.float64)),
        SimpleNamespace(op=dist.isend, tensor=torch.zeros(2, dtype=torch.float16)),  # 4 bytes
    ]

    bench_distributed._count_sends(sent)
    works = dist.batch_isend_irecv(ops)

    assert sent == {"bytes": 64}
    assert works == ["work"] and handed == [ops]  # the real call still happens


def test_a_ring_of_two_sends_what_the_theory_says():
    args = build_parser().parse_args(["--shape", "1,2,16,4", "--cores", "1"])

    ranks = run_world(2, 16, args)

    forward, total = theory(2, args.shape, 16)
    assert [(r["rank"], r["sent_forward"], r["sent_total"]) for r in ranks] == [
        (0, forward, total),
        (1, forward, total),
    ]


# -- peak memory --------------------------------------------------------------------------------


class _Written(io.StringIO):
    """A file opened for writing whose text lands in ``log`` when it is closed."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def close(self) -> None:
        self.log.append(self.getvalue())
        super().close()


@pytest.fixture
def proc(monkeypatch):
    """/proc/self with STATUS as its status; what is written to clear_refs."""
    written: list[str] = []

    def fake_open(path, mode="r"):
        if path == "/proc/self/status" and mode == "r":
            return io.StringIO(STATUS)
        if path == "/proc/self/clear_refs" and mode == "w":
            return _Written(written)
        raise OSError(path)

    monkeypatch.setattr(bench_distributed, "open", fake_open, raising=False)
    return written


@pytest.mark.parametrize(
    ("field", "kib"), [("VmRSS", 1234), ("VmHWM", 5678), ("VmSwap", None), ("RSS", None)]
)
def test_a_status_field_is_read_in_kib(field, kib, proc):
    assert bench_distributed._status_kib(field) == kib


def test_reset_peak_clears_the_high_water_mark_and_returns_the_resident_set(proc):
    assert reset_peak() == 1234 * 1024
    assert proc == ["5"]


def test_peak_is_the_high_water_mark_not_the_virtual_peak(proc):
    assert peak() == 5678 * 1024


def test_without_proc_both_fall_back_to_the_lifetime_peak(monkeypatch):
    def no_proc(path, mode="r"):
        raise OSError(path)

    monkeypatch.setattr(bench_distributed, "open", no_proc, raising=False)
    usage = SimpleNamespace(ru_maxrss=4321)
    stub = SimpleNamespace(RUSAGE_SELF=0, getrusage=lambda who: usage)
    monkeypatch.setattr(bench_distributed, "resource", stub)

    assert (reset_peak(), peak()) == (4321 * 1024, 4321 * 1024)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_keeps_an_allocation_already_freed():
    before = reset_peak()
    block = b"\x01" * (64 * MIB)  # every page written
    del block  # the resident set falls back; its high-water mark does not

    grown = peak() - before

    assert grown >= 32 * MIB  # the resident set, read instead, would be about 0
