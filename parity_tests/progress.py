"""Where a long run is, on stderr: the part running (a target's check, a seed of the
calibration), what it runs now, how many of its steps are done of how many, the time spent and
the time left at the pace so far.

On a terminal it is one line, rewritten in place:

    [ 312.4s] mykernel on cpu (fuzz battery): 24 of 120 groups, 5m12s spent, about 20m48s left | ...

Elsewhere (a log file, a pipe, a CI job) plain lines: one when a part starts, one with the count
at most every ``every`` seconds while it runs, and one when its last step is done, so that a log
of a long run shows it moving.

Tests: tests/parity/test_progress.py
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any


class Progress:
    """The progress display of ``python -m parity_tests`` (``start`` a part, ``update`` what it
    runs, ``advance`` its count, ``done`` at the end), writing to ``stream``."""

    def __init__(
        self,
        stream: Any,
        *,
        every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream, self.tty, self.every, self.clock = stream, stream.isatty(), every, clock
        self.started = self.part_started = self.printed = clock()
        self.part, self.running = "", ""
        self.count: tuple[int, int, str] | None = None

    def start(self, message: str) -> None:
        """A new part begins: ``message`` names it."""
        self.part, self.running, self.count = message, "", None
        self.part_started = self.clock()
        if self.tty:
            self._show()
        else:
            self._print()

    def update(self, message: str) -> None:
        """What the part runs now (shown on a terminal only)."""
        self.running = message
        if self.tty:
            self._show()

    def advance(self, done: int, total: int, unit: str = "groups") -> None:
        """``done`` of the part's ``total`` steps are done."""
        self.count = (done, total, unit)
        if self.tty:
            self._show()
        elif done == total or self.clock() - self.printed >= self.every:
            self._print()

    def done(self) -> None:
        """The end of the output: the terminal's line is cleared."""
        if self.tty:
            print("\r\033[K", end="", file=self.stream, flush=True)

    def line(self) -> str:
        """The part, its count with the time spent and the time left, and what runs now."""
        text = f"[{self.clock() - self.started:6.1f}s] {self.part}"
        if self.count is not None:
            done, total, unit = self.count
            spent = self.clock() - self.part_started
            text += f": {done} of {total} {unit}, {duration(spent)} spent"
            if 0 < done < total:
                text += f", about {duration(spent / done * (total - done))} left"
        return text + (f" | {self.running}" if self.running and self.tty else "")

    def _show(self) -> None:
        width = shutil.get_terminal_size((120, 24)).columns - 1
        print(f"\r\033[K{self.line()[:width]}", end="", file=self.stream, flush=True)

    def _print(self) -> None:
        self.printed = self.clock()
        print(self.line(), file=self.stream, flush=True)


def duration(seconds: float) -> str:
    """``seconds`` as people read a duration: 42s, 12m05s, 1h02m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
