"""The decode specs' common part: kernels over a cache (flash-attn's ``flash_attn_with_kvcache``,
FlashMLA's ``flash_mla_with_kvcache``), forward only by nature, judged on out, lse and the
caches they leave, on the cases of ``battery.decode``.

A subclass says what its signature is (``factors``, the options it can express and the values
where kernels differ; ``allowed``; ``values_of``), how a row of its covering array becomes a case
(``case_of``, at a head width and four cache lengths the builder chooses), how a case becomes
its call (``call``) and the same call computed plainly in the kernel's dtype (``baseline``);
the battery builder, the requirements, the limits, the fuzzer, the call's protection and the
verdict are the decode family's (``battery.decode``, ``running.decode``, ``judge.decode``).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/specs/test_flash_kvcache.py, tests/checker/running/test_decode.py
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..battery import pairs
from ..battery.decode import generate
from ..battery.decode.case import LENGTHS, SEQUENCES, DecodeCase
from ..battery.decode.generate import Requirement
from ..spec import Spec

if TYPE_CHECKING:
    from ..battery.limits import KernelLimits
    from ..report.rows import KernelError, KernelRow
    from ..running.request import Outcome, Request

# The head widths a fuzzed case draws among (the battery's, and other multiples of 8).
FUZZ_WIDTHS = (32, 64, 128, 256, 33, 40, 80, 96)


class DecodeSpec(Spec):
    """A decode kernel over a cache (see the module docstring)."""

    backward = False
    # The head widths of the battery: each is a requirement, the first the width of any row
    # that meets none.
    widths: ClassVar[tuple[int, ...]]
    # True: the kernel returns (out, lse) whether asked for lse or not (FlashMLA's).
    always_lse: ClassVar[bool] = False
    # The page of a spec without a "page" factor (FlashMLA's pages are always 64 tokens).
    fixed_page: ClassVar[str] = "contiguous"

    # -- the battery -----------------------------------------------------------------------------

    def default_battery(self, claimed: frozenset[str] | None = None) -> tuple[DecodeCase, ...]:
        """The battery built for ``claimed`` (None: every feature)."""
        return generate.default_battery(self, self.claim_key(claimed))

    def battery(self, name: str, claimed: frozenset[str] | None) -> tuple[DecodeCase, ...]:
        # A decode case is small: the default battery is the quick one too.
        return self.claimed_battery(lambda key: generate.default_battery(self, key), claimed)

    def lookup(self, name: str, claimed: frozenset[str] | None) -> DecodeCase:
        for key in (self.claim_key(claimed), None):
            for case in generate.default_battery(self, key):
                if case.name == name:
                    return case
        raise ValueError(f"unknown {self.name} case {name!r}; --list-cases --spec {self.name} "
                         "names them")  # fmt: skip

    def cannot_express(self, case: Any) -> str | None:
        if not isinstance(case, DecodeCase) or case.spec != self.name:
            what = getattr(case, "spec", type(case).__name__)
            return f"the {self.name} spec runs its own decode cases, not those of {what}"
        return None

    def pages(self, claimed: frozenset[str] | None) -> tuple[str, ...]:
        """The page values a battery for ``claimed`` holds."""
        if "page" not in self.factors:
            return (self.fixed_page,)
        return pairs.space(self, claimed)["page"]

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Requirement, ...]:
        """Every cache length of ``LENGTHS`` at every page size; with new tokens, an append
        crossing a page edge at every page size; every head width of ``widths``."""
        found = []
        appends = "append" in self.factors and len(pairs.space(self, claimed)["append"]) > 1
        for page in self.pages(claimed):
            where = "a contiguous cache" if page == "contiguous" else f"pages of {page}"
            found += [Requirement(f"{where}: a sequence of length {label}", "length", page, label)
                      for label in LENGTHS]  # fmt: skip
            if appends and page != "contiguous":
                found.append(Requirement(f"{where}: new tokens crossing a page", "cross", page))
        found += [Requirement(f"D = {d}", "width", value=d) for d in self.widths]
        return tuple(found)

    def seed_rows(self) -> tuple[pairs.Row, ...]:
        """Rows the full battery holds before its covering array's (none by default)."""
        return ()

    def row_for(self, requirement: Requirement, claimed: frozenset[str] | None) -> pairs.Row:
        """A row with every option off that can meet ``requirement``."""
        row = {factor: values[0] for factor, values in pairs.space(self, claimed).items()}
        if requirement.page and "page" in row:
            row["page"] = requirement.page
        return row

    @abc.abstractmethod
    def case_of(self, row: Mapping[str, str], d: int, lengths: tuple[str, ...]) -> DecodeCase:
        """The case of ``row`` at head width ``d``, its sequences' cache lengths given by
        their labels (``LENGTHS``), named by what it holds."""

    def fuzz_case(self, index, seed, claimed, limits) -> DecodeCase:
        claim = None if claimed is None else sorted(claimed)
        rng = random.Random(f"fuzz {self.name} {seed} {index} {claim}")
        domains = pairs.space(self, claimed)
        row: pairs.Row = {}
        for factor, values in domains.items():
            held = [v for v in values if pairs.extendable(self, domains, {**row, factor: v})]
            row[factor] = rng.choice(held)
        widths = self.widths if len(self.widths) == 1 else FUZZ_WIDTHS
        lengths = tuple(rng.choice(LENGTHS) for _ in range(SEQUENCES))
        case = self.case_of(row, rng.choice(widths), lengths)
        if limits is not None and self.outside(limits, case) is not None:
            case = self.nearest(limits, case)
        return self.renamed(case, f"fuzz{index}-{case.name}")

    @staticmethod
    def renamed(case: DecodeCase, name: str) -> DecodeCase:
        import dataclasses

        return dataclasses.replace(case, name=name)

    # -- limits --------------------------------------------------------------------------------

    def check_limits(self, limits: KernelLimits) -> None:
        if limits.seqlen_multiple > 1 or limits.equal_lengths:
            raise ValueError(
                f"the {self.name} spec takes no seqlen_multiple and no equal_lengths: its cache "
                "lengths (0, 1, a page edge +- 1) against s_q queries are what it tests"
            )
        fixed = self.fixed_widths()
        if fixed and limits.head_dims is not None and not set(fixed) <= set(limits.head_dims):
            raise ValueError(
                f"the {self.name} spec's cases have head widths {list(fixed)}, outside head_dims "
                f"{list(limits.head_dims)}"
            )
        pages = [int(p) for p in self.pages(None) if p != "contiguous"]
        if limits.page_sizes is not None and not set(pages) & set(limits.page_sizes):
            raise ValueError(
                f"the {self.name} spec's pages hold {pages} tokens, none in page_sizes "
                f"{list(limits.page_sizes)}"
            )

    def fixed_widths(self) -> tuple[int, ...]:
        """Widths every case has (a spec whose widths are not a choice), or ()."""
        return ()

    def outside(self, limits: KernelLimits, case: Any) -> str | None:
        reasons = []
        if limits.head_dims is not None and case.d not in limits.head_dims:
            reasons.append(f"D = {case.d} not in head_dims")
        pages = limits.page_sizes
        if pages is not None and case.page_size is not None and case.page_size not in pages:
            reasons.append(f"pages of {case.page_size} not in page_sizes")
        return "; ".join(reasons) or None

    def nearest(self, limits: KernelLimits, case: Any) -> DecodeCase:
        """The case with every option of ``case``, at the nearest allowed head width and page
        size (ties: the larger), its sequences' lengths the same labels at that page size."""
        row = dict(self.values_of(case))
        d = case.d
        if limits.head_dims is not None and d not in limits.head_dims:
            d = min(limits.head_dims, key=lambda w: (abs(w - d), -w))
        pages = limits.page_sizes
        if pages is not None and case.page_size is not None and case.page_size not in pages:
            size = case.page_size
            row["page"] = str(min(pages, key=lambda p: (abs(p - size), -p)))
        return self.case_of(row, d, case.length_labels)

    def outside_values(self, limits: KernelLimits) -> frozenset[tuple[str, str]]:
        if limits.page_sizes is None or "page" not in self.factors:
            return frozenset()
        allowed = {str(p) for p in limits.page_sizes} | {"contiguous"}
        return frozenset(("page", p) for p in self.factors["page"] if p not in allowed)

    # -- the call ------------------------------------------------------------------------------

    @abc.abstractmethod
    def call(
        self,
        kernel: Callable[..., Any],
        case: DecodeCase,
        given: dict[str, torch.Tensor],
        want_lse: bool,
        options: Mapping[str, Any],
    ) -> Any:
        """Call ``kernel`` as the spec's library is called, on the tensors ``given`` (copies:
        the kernel may write its caches)."""

    @abc.abstractmethod
    def baseline(
        self, case: DecodeCase, given: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(out, lse, the caches after the call) computed plainly in the inputs' dtype
        (``golden.decode_baseline``), on copies it may write."""

    def run(self, kernel: Callable[..., Any], request: Request) -> Outcome:
        from ..running.decode import run_decode

        return run_decode(self, kernel, request)

    def judge(
        self, request: Request, outcome: Outcome, errors: list[KernelError]
    ) -> list[KernelRow]:
        from ..judge.decode import judge_decode

        return judge_decode(self, request, outcome, errors)
