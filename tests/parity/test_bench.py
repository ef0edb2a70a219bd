"""``python -m parity_tests.bench``: its command line, and that only ``--write-docs`` writes.

Nothing here times anything that matters: the one run is a tiny shape, to prove that a part of
the benchmark runs on its own and that its report goes to stdout, not into the tracked docs.
"""

from __future__ import annotations

import pytest

from parity_tests import bench

RECORDED = "prose\n<!-- bench:begin -->\nrecorded run\n<!-- bench:end -->\nmore prose\n"


@pytest.fixture
def doc(tmp_path, monkeypatch):
    """docs/benchmarks.md replaced by a scratch copy (and its .png beside it)."""
    path = tmp_path / "benchmarks.md"
    path.write_text(RECORDED)
    monkeypatch.setattr(bench, "DOC", path)
    return path


def test_help_measures_nothing_and_writes_nothing(doc, monkeypatch, capsys):
    monkeypatch.setattr(bench, "matmul_rate", _must_not_run)
    with pytest.raises(SystemExit) as done:
        bench.main(["--help"])
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
    monkeypatch.setattr(bench, "matmul_rate", _must_not_run)
    with pytest.raises(SystemExit) as done:
        bench.main(argv)
    assert done.value.code == 2
    assert "usage: python -m parity_tests.bench" in capsys.readouterr().err
    assert doc.read_text() == RECORDED


def test_a_part_prints_its_report_and_leaves_the_docs_alone(doc, monkeypatch, capsys):
    monkeypatch.setattr(bench, "matmul_rate", lambda repeats: 100.0)  # seconds of 2048^3 products
    assert bench.main(["--only", "shapes", "--shape", "1,2,64,16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| (1, 2, 64, 16) |" in out
    assert "GPT-2" not in out and "### Targets" not in out  # parts that did not run
    assert doc.read_text() == RECORDED
    assert not doc.with_suffix(".png").exists()


def test_the_report_judges_the_targets_of_the_parts_that_ran():
    long_row = {f"{path} {run}": 1.0 for path in ("tiled", "sdpa") for run in ("fwd", "fwd+bwd")}
    long_row |= {"tiled peak fwd": 2**20, "tiled peak fwd+bwd": 104 * 2**20}
    text = bench.report(100.0, 1, rows={bench.LONG: long_row})
    targets = [line for line in text.splitlines() if line.startswith("| (1, 4, 16384, 64) causal")]
    assert targets == [
        "| (1, 4, 16384, 64) causal fwd+bwd peak traced memory < 1.5 GiB | 104 MiB | yes |"
    ]
    assert "SDPA at" not in text and "GPT-2" not in text  # their measurements did not run


def test_write_doc_replaces_the_generated_block_only(doc):
    bench.write_doc("new run")
    assert doc.read_text() == RECORDED.replace("recorded run", "new run")


def _must_not_run(*args, **kwargs):
    raise AssertionError("the benchmark started measuring")


def test_the_profile_sets_the_products_alone_against_sdpa(doc, monkeypatch, capsys):
    monkeypatch.setattr(bench, "matmul_rate", lambda repeats: 100.0)
    monkeypatch.setattr(bench, "PROFILE", (1, 2, 512, 16))
    assert bench.main(["--only", "profile", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    forward, both = (line for line in lines if "the products alone" in line)
    assert forward.startswith("- forward: the products alone, 2 per tile for 3 tiles")
    assert both.startswith("- forward+backward: the products alone, 7 per tile for 3 tiles")
    assert "x torch SDPA's whole forward (" in forward and "at 1.0x SDPA" in forward
    assert "at 0.9x SDPA" in both
    assert doc.read_text() == RECORDED
