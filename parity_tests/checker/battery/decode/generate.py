"""The decode specs' batteries, generated: a covering array of the spec's options
(``battery.pairs``, the same builder as every spec's) given head widths and cache lengths chosen to
meet the spec's size requirements.

For a spec and the features a kernel claims (``default_battery``): the rows of
``pairs.covering_rows`` (every pair of option values one call can hold meets in some row, for the
features claimed: a kernel claiming ``paged`` gets pages of every size with every other option
it claims), each given, greedily, the head width and the four sequences' cache lengths that
meet the most requirements still unmet (``Spec.requirements``: every length of
``case.LENGTHS`` at every page size, an append crossing a page at every page size, every head
width); a requirement no row could take gets a row of its own (``Spec.row_for``). A kernel
claiming fewer features keeps the full battery's cases it can run (shared with every other
kernel of the spec) and gets rows for the pairs and sizes they leave, as the attention specs'
batteries do. Cases are named by what they hold (``Spec.case_of``), so one case built for
two claims is one case.

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, D head width, P page
size.

Tests: tests/checker/battery/decode/test_generate.py
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import pairs
from ..names import unique_by_name
from .case import LENGTHS, SEQUENCES, DecodeCase, crosses, length_of

if TYPE_CHECKING:
    from ...spec import Spec


class Requirement(NamedTuple):
    """A size a decode battery must hold: ``kind`` "length" (some sequence at length class
    ``value`` with pages ``page``), "cross" (an append crossing a page edge with pages
    ``page``), "width" (head width ``value``), "rows" (a call of more than ``value`` query
    rows, s_q * H) or "pool" (a pool of more than ``value`` pages)."""

    label: str
    kind: str
    page: str = ""
    value: Any = None

    def met(self, case: DecodeCase) -> bool:
        """Whether ``case`` meets it."""
        if self.kind == "width":
            return case.d == self.value
        if self.kind == "rows":
            return case.s_q * case.heads > self.value
        if self.kind == "pool":
            return case.pool_pages > self.value
        if page_label(case) != self.page:
            return False
        if self.kind == "cross":
            return crosses(case)
        return length_of(self.value, case.page_size, case.capacity, case.s_new) in case.seqlens


def page_label(case: DecodeCase) -> str:
    """The value of the "page" factor a case holds."""
    return "contiguous" if case.page_size is None else str(case.page_size)


@functools.cache
def default_battery(spec: Spec, key: frozenset[str] | None) -> tuple[DecodeCase, ...]:
    """The default battery of ``spec`` for a kernel claiming ``key`` (the claimed features that
    have a factor; None: every feature)."""
    seeds = () if key is None else tuple(c for c in default_battery(spec, None) if c.needs <= key)
    unmet = [r for r in spec.requirements(key) if not any(r.met(c) for c in seeds)]
    rows = list(spec.seed_rows()) if key is None else []
    known = [spec.values_of(c) for c in seeds] + rows
    rows += pairs.covering_rows(spec, key, known)
    turns: dict[str, int] = {}
    cases = [build(spec, row, unmet, turns) for row in rows]
    while unmet:
        wanted = unmet[0]
        case = build(spec, spec.row_for(wanted, key), unmet, turns)
        if wanted in unmet:
            raise ValueError(f"the {spec.name} battery cannot meet {wanted.label!r}")
        cases.append(case)
    return unique_by_name([*seeds, *cases])


def build(
    spec: Spec, row: pairs.Row, unmet: list[Requirement], turns: dict[str, int]
) -> DecodeCase:
    """The case of ``row`` at the head width and the cache lengths meeting the most of
    ``unmet`` (which loses what the case meets). The lengths' ties go round ``LENGTHS`` from
    where the row's page size left off, so that cases of one page size meet every length."""
    widths = spec.widths
    wanted = {r.value for r in unmet if r.kind == "width"}
    d = next((w for w in widths if w in wanted), widths[0])
    page = row.get("page", spec.fixed_page)
    start = turns.get(page, 0)
    order = LENGTHS[start % len(LENGTHS) :] + LENGTHS[: start % len(LENGTHS)]
    labels: list[str] = []
    for _ in range(SEQUENCES):
        free = [label for label in order if label not in labels] or list(order)

        def gain(label: str) -> int:
            case = spec.case_of(row, d, (*labels, label))
            return sum(r.met(case) for r in unmet)

        labels.append(max(free, key=lambda label: (gain(label), -free.index(label))))
    turns[page] = start + SEQUENCES
    case = spec.case_of(row, d, tuple(labels))
    unmet[:] = [r for r in unmet if not r.met(case)]
    return case
