"""docs/pitfalls.md names, for every pitfall, the case and tensor that flag it: the ones
``PITFALLS`` holds (a battery built by code renames its cases when it changes, and the table
went stale once; this keeps it true)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from parity_tests.checker.pitfalls import PITFALLS

TABLE = Path(__file__).resolve().parents[2] / "docs" / "pitfalls.md"


def _rows() -> dict[str, str]:
    """The last cell of each pitfall's row, by the pitfall's name."""
    rows = {}
    for line in TABLE.read_text().splitlines():
        match = re.match(r"\| `(\w+)`.*\|([^|]*)\|\s*$", line)
        if match and match.group(1) in PITFALLS:
            rows[match.group(1)] = match.group(2).strip()
    return rows


@pytest.mark.parametrize("name", sorted(PITFALLS))
def test_the_table_names_the_case_and_tensor_that_flag_each_pitfall(name):
    cell = _rows().get(name)

    assert cell is not None, f"docs/pitfalls.md has no row for {name}"
    case, rest = cell.split(",", 1)
    assert (case, rest.split()[0]) == (PITFALLS[name].case, PITFALLS[name].tensor)
