"""Cases by name: every battery names each case by what it holds, so one name is one case.

Tests: tests/checker/battery/test_catalog.py
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def unique_by_name(cases: Iterable[Any]) -> tuple[Any, ...]:
    """``cases`` in order, each name once (a repeated name must be the same case)."""
    found: dict[str, Any] = {}
    for case in cases:
        if found.setdefault(case.name, case) != case:
            raise ValueError(f"two different cases are named {case.name!r}")
    return tuple(found.values())
