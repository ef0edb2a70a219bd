"""``python -m parity_tests.bench``: its command line, and that only ``--write-docs`` writes.

Nothing here times anything that matters: bad usage and ``--help`` end before any measurement.
"""

from __future__ import annotations

import pytest

from parity_tests.bench import cli, measure

from .conftest import RECORDED, must_not_run


def test_help_measures_nothing_and_writes_nothing(doc, monkeypatch, capsys):
    monkeypatch.setattr(measure, "matmul_rate", must_not_run)
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    assert "--write-docs" in capsys.readouterr().out
    assert doc.read_text() == RECORDED
    assert not doc.with_suffix(".png").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--write-docs", "--only", "gpt2"],
        ["--write-docs", "--shape", "1,2,64,16"],
        ["--only", "gpt2", "--shape", "1,2,64,16"],
        ["--repeats", "0"],
        ["--shape", "1,2,64"],
        ["--only", "everything"],
    ],
    ids=str,
)
def test_bad_usage_is_exit_2_before_any_work(argv, doc, monkeypatch, capsys):
    monkeypatch.setattr(measure, "matmul_rate", must_not_run)
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    assert "usage: python -m parity_tests.bench" in capsys.readouterr().err
    assert doc.read_text() == RECORDED
