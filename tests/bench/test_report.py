"""parity_tests/bench/report.py: the targets judged on the parts that ran, and ``--write-docs``'s
rewrite of the generated block only."""

from __future__ import annotations

from parity_tests.bench import attention, report

from .conftest import RECORDED


def test_the_report_judges_the_targets_of_the_parts_that_ran():
    long_row = {f"{path} {run}": 1.0 for path in ("tiled", "sdpa") for run in ("fwd", "fwd+bwd")}
    long_row |= {"tiled peak fwd": 2**20, "tiled peak fwd+bwd": 104 * 2**20}
    text = report.report(100.0, 1, rows={attention.LONG: long_row})
    targets = [line for line in text.splitlines() if line.startswith("| (1, 4, 16384, 64) causal")]
    assert targets == [
        "| (1, 4, 16384, 64) causal fwd+bwd peak traced memory < 1.5 GiB | 104 MiB | yes |"
    ]
    assert "SDPA at" not in text and "GPT-2" not in text  # their measurements did not run


def test_write_doc_replaces_the_generated_block_only(doc):
    report.write_doc("new run")
    assert doc.read_text() == RECORDED.replace("recorded run", "new run")
