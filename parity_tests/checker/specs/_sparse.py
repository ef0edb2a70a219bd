"""The sparse specs' common part: kernels of attention by indices (the torch twin's
``sparse_attention``, FlashMLA's ``flash_mla_sparse_fwd``), judged on the cases of
``battery.sparse`` against ``golden.sparse``.

A subclass says what its signature is (``factors``, ``feature_factors``, ``values_of``), how a
row of its covering array becomes a case (``case_of``), how a case becomes its call (``call``)
and how the call's results map onto the golden's names with their shapes (``results``); the
battery builder, the call's protection and the verdict are the sparse family's
(``battery.sparse``, ``running.sparse``, ``judge.sparse``).

Shape legend: S_q query tokens, S_kv key tokens, H query heads, H_kv key heads, D head width,
Dv value width, topk entries per list.

Tests: tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..battery.sparse import Requirement, SparseCase
from ._widths import WidthBatterySpec

FUZZ_QUERIES = (1, 2, 5, 8, 24)  # query tokens of a fuzzed case

if TYPE_CHECKING:
    from ..battery.limits import KernelLimits
    from ..report.rows import KernelError, KernelRow
    from ..running.request import Outcome, Request


class SparseSpec(WidthBatterySpec):
    """A kernel of attention by indices (see the module docstring)."""

    # The head widths of the battery: each is a requirement, the first the width of any row
    # that meets none.
    widths: ClassVar[tuple[int, ...]]
    # The list lengths a fuzzed case draws among.
    fuzz_topks: ClassVar[tuple[int, ...]] = (64, 128, 192, 256)
    case_types = (SparseCase,)
    family = "sparse cases"

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Requirement, ...]:
        """Every head width of ``widths``."""
        return tuple(Requirement(f"D = {d}", "width", d) for d in self.widths)

    def fuzz_case(self, index, seed, claimed, limits) -> SparseCase:
        row, rng = self.fuzz_row(index, seed, claimed)
        case = self.case_of(row, rng.choice(self.widths))
        s_q, topk = rng.choice(FUZZ_QUERIES), rng.choice(self.fuzz_topks)
        s_kv = s_q + topk + rng.randrange(200)
        name = f"fuzz{index}-{case.name}-q{s_q}-k{s_kv}-topk{topk}"
        return dataclasses.replace(case, name=name, s_q=s_q, s_kv=s_kv, topk=topk)

    # -- limits --------------------------------------------------------------------------------

    def check_limits(self, limits: KernelLimits) -> None:
        """head_dims is honoured (a case at another width is judged at the nearest allowed one);
        the limits of sequences and pages mean nothing to lists of indices, and are refused."""
        given = {
            "seqlen_multiple": limits.seqlen_multiple != 1,
            "equal_lengths": limits.equal_lengths,
            "page_sizes": limits.page_sizes is not None,
        }
        foreign = [name for name, held in given.items() if held]
        if foreign:
            raise ValueError(
                f"the {self.name} spec takes no {', '.join(foreign)}: its cases are lists of "
                "indices over one sequence of keys"
            )
        if limits.head_dims is not None and len(self.widths) == 1:
            if self.widths[0] not in limits.head_dims:
                raise ValueError(
                    f"the {self.name} spec's cases have head width {self.widths[0]}, outside "
                    f"head_dims {list(limits.head_dims)}"
                )

    def outside(self, limits: KernelLimits, case: Any) -> str | None:
        if limits.head_dims is not None and case.d not in limits.head_dims:
            return f"D = {case.d} not in head_dims"
        return None

    def nearest(self, limits: KernelLimits, case: Any) -> SparseCase:
        """The case with every option of ``case`` at the nearest allowed head width (ties: the
        larger)."""
        d = case.d
        if limits.head_dims is not None and d not in limits.head_dims:
            d = min(limits.head_dims, key=lambda w: (abs(w - d), -w))
        return self.case_of(self.values_of(case), d)

    @abc.abstractmethod
    def case_of(self, row: Mapping[str, str], d: int) -> SparseCase:
        """The case of ``row`` at head width ``d``, named by what it holds."""

    # -- the call ------------------------------------------------------------------------------

    @abc.abstractmethod
    def call(self, kernel: Callable[..., Any], case: SparseCase, given: dict[str, torch.Tensor],
             want_lse: bool) -> Any:  # fmt: skip
        """Call ``kernel`` as the spec's library is called, on the tensors ``given`` (copies;
        q, k, v and sinks are leaves requiring grad when the backward runs)."""

    @abc.abstractmethod
    def results(
        self, case: SparseCase, result: Any, want_lse: bool
    ) -> dict[str, tuple[Any, tuple[int, ...]]]:
        """The call's results by the golden's names, each with the shape it must have ("out"
        first); a ``running.calls.BadResult`` for a result of the wrong kind."""

    def run(self, kernel: Callable[..., Any], request: Request) -> Outcome:
        from ..running.sparse import run_sparse

        return run_sparse(self, kernel, request)

    def judge(
        self, request: Request, outcome: Outcome, errors: list[KernelError]
    ) -> list[KernelRow]:
        from ..judge.sparse import judge_sparse

        return judge_sparse(self, request, outcome, errors)


def on(value: str) -> bool:
    return value == "on"
