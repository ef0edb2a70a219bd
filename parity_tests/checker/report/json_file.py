"""The ``--json`` report on disk, written as the run goes, so that a run stopped before its end
(Ctrl-C, a SIGTERM from a timeout, a kill) keeps what it measured.

The file is always one whole JSON report of the schema (render.py, docs/kernel-verification.md,
"The JSON report"), rewritten as (case, dtype) groups finish: written to a temporary file beside
it and renamed over it, so that a reader, or a run killed mid-write, never meets half a file.
Its ``state`` says how far the run got: "running" (written while the run went on: a file left
so was stopped without a chance to say so, SIGKILL), "interrupted" (stopped by SIGINT or
SIGTERM, or by an exception of the checker itself once the file was written: every group
finished is in it), "finished". The check in progress is in it with the
groups it finished, ``"finished": false``, no verdict, and a summary that begins
"unfinished: ...".

A rewrite costs time with the size of the report, so it waits at least ``every`` seconds
after the last one (or the start; default 1), and ten times as long as the last one took: a
run keeps more than 90% of its time for its kernels, and a run killed outright loses at most
the last few seconds of groups (one stopped by a signal loses none: it writes the file before
it exits).

Tests: tests/checker/report/test_json_file.py, tests/parity/test_cli.py (a run killed)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .render import jsonable, packages

STATES = ("running", "interrupted", "finished")


class JsonFile:
    """The report ``result`` (the JSON schema's top level, filled in by the run as it goes) at
    ``path``. A path that exists and is not a regular file (``/dev/stdout``, a pipe) is written
    once, at the end or at the interruption."""

    def __init__(
        self,
        path: str,
        result: dict[str, Any],
        *,
        every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path, self.result, self.every, self.clock = path, result, every, clock
        self.rewritten = not os.path.exists(path) or os.path.isfile(path)
        self.current: tuple[str, Callable[[], dict]] | None = None
        self.last, self.cost, self.written = clock(), 0.0, False
        self.imported: frozenset[str] = frozenset()  # the top-level modules ``found`` is of
        self.found: dict[str, str] = {}

    def running(self, key: str, entry: Callable[[], dict] | None) -> None:
        """The run went on: ``entry`` renders the check in progress (None: none is), which
        goes after the finished checks of ``result[key]``; the file is rewritten when due."""
        self.current = None if entry is None else (key, entry)
        wait = max(self.every, 10.0 * self.cost)
        if self.rewritten and self.clock() - self.last >= wait:
            self.write("running")

    def write(self, state: str) -> None:
        """Write the report as it stands now, its ``state`` one of ``STATES``."""
        started = self.clock()
        snapshot = {**self.result, "state": state}
        snapshot["environment"] = {**self.result["environment"], "packages": self._packages()}
        if self.current is not None and state != "finished":
            key, entry = self.current
            snapshot[key] = [*(self.result[key] or []), entry()]
        text = json.dumps(jsonable(snapshot), indent=1, allow_nan=False)
        if self.rewritten:
            _replace(self.path, text)
        else:
            with open(self.path, "w", encoding="utf-8") as stream:
                stream.write(text)
        self.last, self.written = self.clock(), True
        self.cost = self.last - started

    def _packages(self) -> dict[str, str]:
        """``render.packages()``, looked up again only when a module was imported since."""
        imported = frozenset(name.partition(".")[0] for name in list(sys.modules))
        if imported != self.imported:
            self.imported, self.found = imported, packages()
        return self.found


def unfinished(entry: dict, total: int) -> dict:
    """The entry (``render.check_entry``) of a check still running, of ``total`` groups to run:
    no verdict, and a summary that says how many it ran."""
    done = sum(group["status"] != "not-run" for group in entry["groups"])
    summary = f"unfinished: {done} of {total} groups run; so far {entry['summary']}"
    return {**entry, "finished": False, "verdict": None, "summary": summary}


def _replace(path: str, text: str) -> None:
    """``text`` at ``path`` all at once: a temporary file beside it renamed over it."""
    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:  # Ctrl-C or SIGTERM mid-write too: no temporary file left behind
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
