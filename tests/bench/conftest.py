"""The benchmark's tests: docs/benchmarks.md replaced by a scratch copy, and a stand-in for any
measurement that must not start."""

from __future__ import annotations

import pytest

from parity_tests.bench import report

RECORDED = "prose\n<!-- bench:begin -->\nrecorded run\n<!-- bench:end -->\nmore prose\n"


@pytest.fixture
def doc(tmp_path, monkeypatch):
    """docs/benchmarks.md replaced by a scratch copy (and its .png beside it)."""
    path = tmp_path / "benchmarks.md"
    path.write_text(RECORDED)
    monkeypatch.setattr(report, "DOC", path)
    return path


def must_not_run(*args, **kwargs):
    raise AssertionError("the benchmark started measuring")
