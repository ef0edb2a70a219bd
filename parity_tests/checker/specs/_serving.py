"""The serving specs' common part: a serving engine's attention calls (FlashInfer's paged
wrappers and cascade merge, vLLM's paged backend), forward only by nature, judged on the cases of
``battery.serving`` against ``golden.serving``.

A subclass says what its signature is (``factors``, ``feature_factors``, ``values_of``,
``allowed``), how a row of its covering array becomes a case (``case_of``), how a case becomes
its call (``call``) and how the call's results map onto the golden's names with their shapes
(``results``); the battery builder (``battery.widths``: every head width of ``widths`` is a
requirement, and one pool past 16-bit page ids for a paged spec), the call's protection and
the verdict are the serving family's (``running.serving``, ``judge.serving``).

Shape legend: T query tokens, H query heads, D head width, P page size.

Tests: tests/checker/specs/test_serving.py
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..battery import pairs
from ..battery.serving import WIDE_IDS, WINDOW, MergeCase, PagedCase, Requirement
from ._widths import WidthBatterySpec

if TYPE_CHECKING:
    from ..battery.limits import KernelLimits
    from ..report.rows import KernelError, KernelRow
    from ..running.request import Outcome, Request

POOL = WIDE_IDS + 4464  # the pages of the pool past 16-bit ids (70,000)


class ServingSpec(WidthBatterySpec):
    """A serving engine's attention call (see the module docstring)."""

    backward = False
    widths: ClassVar[tuple[int, ...]] = (64, 128, 32, 256, 40 + 1)
    case_types = (PagedCase, MergeCase)
    family = "serving cases"

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Requirement, ...]:
        """Every head width of ``widths``."""
        return tuple(Requirement(f"D = {d}", "width", d) for d in self.widths)

    def row_for(self, requirement: Requirement, claimed: frozenset[str] | None) -> pairs.Row:
        """A row with every option off; for the pool, pages of one token and two KV heads (a
        pool of 70,000 pages of 16 tokens would take gigabytes as the checker holds it)."""
        row = super().row_for(requirement, claimed)
        if requirement.kind == "pool":
            row["page"], row["pool"] = "1", str(POOL)
        return row

    @abc.abstractmethod
    def case_of(self, row: Mapping[str, str], d: int) -> Any:
        """The case of ``row`` at head width ``d``, named by what it holds."""

    def fuzz_case(self, index, seed, claimed, limits) -> Any:
        row, rng = self.fuzz_row(index, seed, claimed)
        case = self.case_of(row, rng.choice(self.widths))
        if limits is not None and self.outside(limits, case) is not None:
            case = self.nearest(limits, case)
        return dataclasses.replace(case, name=f"fuzz{index}-{case.name}")

    # -- limits --------------------------------------------------------------------------------

    def check_limits(self, limits: KernelLimits) -> None:
        """head_dims and page_sizes are honoured (a case at another width or page is judged at
        the nearest allowed one); the limits of whole sequences are refused."""
        foreign = [name for name, held in (("seqlen_multiple", limits.seqlen_multiple != 1),
                                            ("equal_lengths", limits.equal_lengths)) if held]
        if foreign:
            raise ValueError(f"the {self.name} spec takes no {', '.join(foreign)}: its batches "
                             "mix sequence lengths by design")  # fmt: skip

    def outside(self, limits: KernelLimits, case: Any) -> str | None:
        reasons = []
        if limits.head_dims is not None and case.d not in limits.head_dims:
            reasons.append(f"D = {case.d} not in head_dims")
        page = getattr(case, "page_size", None)
        if limits.page_sizes is not None and page is not None and page not in limits.page_sizes:
            reasons.append(f"pages of {page} not in page_sizes")
        return "; ".join(reasons) or None

    def nearest(self, limits: KernelLimits, case: Any) -> Any:
        """The case with every option of ``case`` at the nearest allowed head width and page
        size (ties: the larger)."""
        d, row = case.d, dict(self.values_of(case))
        if limits.head_dims is not None and d not in limits.head_dims:
            d = min(limits.head_dims, key=lambda w: (abs(w - d), -w))
        page = getattr(case, "page_size", None)
        if limits.page_sizes is not None and page is not None and page not in limits.page_sizes:
            row["page"] = str(min(limits.page_sizes, key=lambda p: (abs(p - page), -p)))
        if getattr(case, "pool_pages", 0):
            row["pool"] = str(case.pool_pages)
        return self.case_of(row, d)

    def outside_values(self, limits: KernelLimits) -> frozenset[tuple[str, str]]:
        if limits.page_sizes is None or "page" not in self.factors:
            return frozenset()
        allowed = {str(p) for p in limits.page_sizes}
        return frozenset(("page", p) for p in self.factors["page"] if p not in allowed)

    # -- the call ------------------------------------------------------------------------------

    @abc.abstractmethod
    def call(self, kernel: Callable[..., Any], case: Any, given: dict[str, torch.Tensor],
             want_lse: bool, options: Mapping[str, Any]) -> Any:  # fmt: skip
        """Call ``kernel`` as the spec's library is called, on the tensors ``given`` (copies;
        what the call builds from them, a vLLM cache, goes back into ``given``)."""

    @abc.abstractmethod
    def results(self, case: Any, result: Any, given: dict[str, torch.Tensor],
                want_lse: bool) -> dict[str, tuple[Any, tuple[int, ...]]]:  # fmt: skip
        """The call's results by the golden's names, each with the shape it must have; a
        ``running.calls.BadResult`` for a result of the wrong kind."""

    def run(self, kernel: Callable[..., Any], request: Request) -> Outcome:
        from ..running.serving import run_serving

        return run_serving(self, kernel, request)

    def judge(
        self, request: Request, outcome: Outcome, errors: list[KernelError]
    ) -> list[KernelRow]:
        from ..judge.serving import judge_serving

        return judge_serving(self, request, outcome, errors)


class PagedSpec(ServingSpec):
    """A paged serving kernel: mixed batches over pages, one pool past 16-bit page ids."""

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Requirement, ...]:
        """Every head width, and a pool of more than 65,536 pages (ids past 16 bits)."""
        pool = Requirement(f"a pool of more than {WIDE_IDS:,} pages (ids past 16 bits)", "pool",
                           WIDE_IDS)  # fmt: skip
        return (*super().requirements(claimed), pool)

    def paged_case(self, row: Mapping[str, str], d: int, **extra: Any) -> PagedCase:
        """The case of ``row`` at head width ``d`` with the options every paged spec has."""
        heads, heads_kv = (8, 2) if on(row["gqa"]) else (4, 4)
        pool = int(row.get("pool", 0))
        if pool:  # two KV heads: the pool's memory stays ~70 MB in float64
            heads, heads_kv = heads // 2, heads_kv // 2 if heads_kv == heads else heads_kv // 2
        page = int(row["page"])
        flags = [row["batch"], f"p{page}", f"h{heads}-{heads_kv}", f"d{d}"]
        flags += [name for name in ("causal", "window", "softcap", "sinks") if on(row[name])]
        flags += [row["values"]] if row["values"] != "gauss" else []
        flags += [f"{key}{value}" for key, value in extra.items() if key in ("layout", "cache")
                  and value not in ("NHD", "pair")]  # fmt: skip
        if extra.get("prefix"):
            flags.append("cascade")
        if pool:
            flags.append(f"pool{pool}")
        return PagedCase(
            f"{self.name.split('_')[0]}-" + "-".join(flags), self.name, row["batch"], page,
            heads, heads_kv, d, causal=on(row["causal"]),
            window=page // 2 + WINDOW if on(row["window"]) else -1,
            softcap=3.0 if on(row["softcap"]) else 0.0, sinks=on(row["sinks"]),
            values=row["values"], pool_pages=pool, **extra,
        )  # fmt: skip

    def paged_values(self, case: Any) -> dict[str, str]:
        return {
            "batch": case.batch,
            "causal": flag(case.causal),
            "gqa": flag(case.heads_kv != case.heads),
            "window": flag(case.window >= 0),
            "softcap": flag(bool(case.softcap)),
            "sinks": flag(case.sinks),
            "page": str(case.page_size),
            "values": case.values,
        }


def on(value: str) -> bool:
    return value == "on"


def flag(held: bool) -> str:
    return "on" if held else "off"
