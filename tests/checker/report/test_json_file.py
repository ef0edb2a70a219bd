"""The --json report written as the run goes: the check in progress with the groups it finished,
rewritten at most every so often, whole at every moment, and its state at the end or at an
interruption."""

from __future__ import annotations

import json
import os

import pytest
import torch.nn.functional as F

from parity_tests import check_kernel
from parity_tests.checker.report.json_file import JsonFile, unfinished
from parity_tests.checker.report.render import check_entry


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _result() -> dict:
    return {"schema_version": 5, "environment": {"python": "3"}, "verdict": None,
            "state": "running", "kernels": []}  # fmt: skip


def _entry(report) -> dict:
    return unfinished(check_entry(report, target="k", battery="quick", judged=True), 4)


@pytest.fixture(scope="module")
def report():
    return check_kernel(F.scaled_dot_product_attention, dtypes=["float32"],
                        cases=["plain", "causal-n<m"], forward_only=True)  # fmt: skip


def test_the_check_in_progress_is_written_with_its_groups_once_due(tmp_path, report):
    path, clock = tmp_path / "report.json", _Clock()
    file = JsonFile(str(path), _result(), every=1.0, clock=clock)

    file.running("kernels", lambda: _entry(report))
    assert not path.exists()  # not yet due
    clock.now = 1.0
    file.running("kernels", lambda: _entry(report))

    written = json.loads(path.read_text())
    (check,) = written["kernels"]
    assert written["state"] == "running" and written["environment"]["packages"]["torch"]
    assert len(check["groups"]) == 2 and check["finished"] is False and check["verdict"] is None
    assert check["summary"].startswith("unfinished: 2 of 4 groups run; so far pass: ")


def test_a_rewrite_waits_ten_times_as_long_as_the_last_one_took(tmp_path, report):
    path, clock = tmp_path / "report.json", _Clock()
    file = JsonFile(str(path), _result(), every=1.0, clock=clock)
    clock.now = 1.0

    def slow() -> dict:
        clock.now += 0.5  # a write that takes half a second
        return _entry(report)

    file.running("kernels", slow)
    written = path.stat().st_mtime_ns
    clock.now += 4.0  # past every, not past 10 x 0.5 s
    file.running("kernels", lambda: _entry(report))

    assert path.stat().st_mtime_ns == written and file.last == 1.5


def test_an_interruption_or_the_end_writes_at_once_and_says_so(tmp_path, report):
    path, result = tmp_path / "report.json", _result()
    file = JsonFile(str(path), result, every=1000.0)
    file.running("kernels", lambda: _entry(report))

    file.write("interrupted")
    interrupted = json.loads(path.read_text())
    result["kernels"].append(check_entry(report, target="k", battery="quick", judged=True))
    file.running("kernels", None)
    file.write("finished")
    finished = json.loads(path.read_text())

    assert interrupted["state"] == "interrupted" and len(interrupted["kernels"][0]["groups"]) == 2
    assert finished["state"] == "finished" and finished["kernels"][0]["finished"] is True
    assert os.listdir(tmp_path) == ["report.json"]  # no temporary file left behind


def test_a_path_that_is_not_a_regular_file_is_written_once_at_the_end(tmp_path, report):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the writer can open
    file = JsonFile(str(fifo), _result(), every=0.0)

    file.running("kernels", lambda: _entry(report))
    assert os.read(reader, 1 << 20) == b""  # not rewritten: a pipe cannot be replaced
    file.write("finished")

    assert json.loads(os.read(reader, 1 << 20))["state"] == "finished"
    os.close(reader)
