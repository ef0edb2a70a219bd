"""The progress display of long runs: on a terminal one line rewritten in place, elsewhere plain
lines (a part's start, its count at most every so often, its end), each count with the time
spent and the time left at the pace so far."""

from __future__ import annotations

import io

import pytest

from parity_tests.progress import Progress, duration


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_part_and_a_count_at_most_every_so_often():
    stream, clock = io.StringIO(), _Clock()
    progress = Progress(stream, every=30.0, clock=clock)

    progress.start("k on cpu (fuzz battery)")
    for done in range(1, 5):  # a group every 20 s
        clock.now += 20.0
        progress.update(f"k case{done} float32")
        progress.advance(done, 4)

    assert stream.getvalue().splitlines() == [
        "[   0.0s] k on cpu (fuzz battery)",
        "[  40.0s] k on cpu (fuzz battery): 2 of 4 groups, 40s spent, about 40s left",
        "[  80.0s] k on cpu (fuzz battery): 4 of 4 groups, 1m20s spent",
    ]


def test_a_terminal_gets_one_line_rewritten_and_cleared_at_the_end(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the line is cut to the terminal's width
    stream, clock = _Terminal(), _Clock()
    progress = Progress(stream, clock=clock)

    progress.start("k on cpu (default battery)")
    clock.now = 10.0
    progress.update("k plain float32 (2 of 5)")
    progress.advance(1, 5)
    progress.done()

    screens = stream.getvalue().split("\r\033[K")
    assert "\n" not in stream.getvalue()
    assert screens[-2] == (
        "[  10.0s] k on cpu (default battery): 1 of 5 groups, 10s spent, about 40s left"
        " | k plain float32 (2 of 5)"
    )
    assert screens[-1] == ""  # cleared


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0s"), (42, "42s"), (65, "1m05s"), (3600 + 125, "1h02m"), (-3, "0s")],
)
def test_a_duration_reads_as_people_say_it(seconds, text):
    assert duration(seconds) == text
