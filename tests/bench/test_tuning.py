"""parity_tests/bench/tuning.py, the ``profile`` part, through ``python -m parity_tests.bench`` at
a small shape: the tiled path's products alone, set against the whole and against SDPA."""

from __future__ import annotations

from parity_tests.bench import cli, measure, tuning

from .conftest import RECORDED


def test_the_profile_sets_the_products_alone_against_sdpa(doc, monkeypatch, capsys):
    monkeypatch.setattr(measure, "matmul_rate", lambda repeats: 100.0)
    monkeypatch.setattr(tuning, "PROFILE", (1, 2, 512, 16))
    assert cli.main(["--only", "profile", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    forward, both = (line for line in lines if "the products alone" in line)
    assert forward.startswith("- forward: the products alone, 2 per tile for 3 tiles")
    assert both.startswith("- forward+backward: the products alone, 7 per tile for 3 tiles")
    assert "x torch SDPA's whole forward (" in forward and "at 1.0x SDPA" in forward
    assert "at 0.9x SDPA" in both
    assert doc.read_text() == RECORDED
