"""parity_tests/bench/attention.py, the ``shapes`` part, through ``python -m parity_tests.bench``:
the one run is a tiny shape, to prove that the part runs on its own and that its report goes to
stdout, not into the tracked docs."""

from __future__ import annotations

from parity_tests.bench import cli, measure

from .conftest import RECORDED


def test_a_part_prints_its_report_and_leaves_the_docs_alone(doc, monkeypatch, capsys):
    monkeypatch.setattr(measure, "matmul_rate", lambda repeats: 100.0)  # s of 2048^3 products
    assert cli.main(["--only", "shapes", "--shape", "1,2,64,16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| (1, 2, 64, 16) |" in out
    assert "GPT-2" not in out and "### Targets" not in out  # parts that did not run
    assert doc.read_text() == RECORDED
    assert not doc.with_suffix(".png").exists()
