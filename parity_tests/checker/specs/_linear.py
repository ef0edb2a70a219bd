"""The linear-attention specs' common part: kernels of attention as a recurrence
(flash-linear-attention's ``chunk_gated_delta_rule``), judged on the cases of
``battery.linear`` against ``golden.linear``.

A subclass says what its signature is (``factors``, ``feature_factors``, ``values_of``), how a
row of its covering array becomes a case (``case_of``), how a case becomes its call (``call``)
and how the call's results map onto the golden's names with their shapes (``results``); the
battery builder, the call's protection and the verdict are the linear family's
(``battery.linear``, ``running.linear``, ``judge.linear``).

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..battery.linear import LinearCase, Requirement, seqlens_of
from ._widths import WidthBatterySpec

FUZZ_LENGTHS = (1, 2, 31, 63, 64, 65, 100, 128, 129, 200)  # tokens of a fuzzed sequence

if TYPE_CHECKING:
    from ..battery.limits import KernelLimits
    from ..report.rows import KernelError, KernelRow
    from ..running.request import Outcome, Request


class LinearSpec(WidthBatterySpec):
    """A kernel of linear attention as a recurrence (see the module docstring)."""

    # The key widths of the battery: each is a requirement, the first the width of any row
    # that meets none.
    widths: ClassVar[tuple[int, ...]]
    # The final state is a result of every call, judged on every case: no feature of it.
    judged_everywhere = frozenset()
    case_types = (LinearCase,)
    family = "linear cases"

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Requirement, ...]:
        """Every key width of ``widths``."""
        return tuple(Requirement(f"K = {k}", "width", k) for k in self.widths)

    def fuzz_case(self, index, seed, claimed, limits) -> LinearCase:
        row, rng = self.fuzz_row(index, seed, claimed)
        widths = self.widths
        if limits is not None and limits.head_dims is not None:
            widths = tuple(w for w in widths if w in limits.head_dims) or widths
        case = self.case_of(row, rng.choice(widths))
        length = rng.choice(FUZZ_LENGTHS)
        seqlens = seqlens_of(length, case.varlen)
        if case.varlen:
            seqlens = tuple(rng.choice(FUZZ_LENGTHS) for _ in range(rng.randrange(1, 5)))
        name = f"fuzz{index}-{case.name}-t{'_'.join(map(str, seqlens))}"
        return dataclasses.replace(case, name=name, seqlens=seqlens)

    # -- limits --------------------------------------------------------------------------------

    def check_limits(self, limits: KernelLimits) -> None:
        """head_dims (the key width K) is honoured (a case at another width is judged at the
        nearest allowed one); the limits of pages mean nothing to a recurrence, and are refused."""
        given = {
            "seqlen_multiple": limits.seqlen_multiple != 1,
            "equal_lengths": limits.equal_lengths,
            "page_sizes": limits.page_sizes is not None,
        }
        foreign = [name for name, held in given.items() if held]
        if foreign:
            raise ValueError(
                f"the {self.name} spec takes no {', '.join(foreign)}: its sequence lengths are "
                "the battery's (chunk edges, a one-token sequence)"
            )

    def outside(self, limits: KernelLimits, case: Any) -> str | None:
        if limits.head_dims is not None and case.k not in limits.head_dims:
            return f"K = {case.k} not in head_dims"
        return None

    def nearest(self, limits: KernelLimits, case: Any) -> LinearCase:
        """The case with every option of ``case`` at the nearest allowed key width (ties: the
        larger)."""
        width = case.k
        if limits.head_dims is not None and width not in limits.head_dims:
            width = min(limits.head_dims, key=lambda w: (abs(w - width), -w))
        return self.case_of(self.values_of(case), width)

    @abc.abstractmethod
    def case_of(self, row: Mapping[str, str], k: int) -> LinearCase:
        """The case of ``row`` at key width ``k``, named by what it holds."""

    # -- the call ------------------------------------------------------------------------------

    @abc.abstractmethod
    def call(
        self, kernel: Callable[..., Any], case: LinearCase, given: dict[str, torch.Tensor]
    ) -> Any:
        """Call ``kernel`` as the spec's library is called, on the tensors ``given`` (copies;
        q, k, v, g, beta and initial_state are leaves requiring grad when the backward runs)."""

    @abc.abstractmethod
    def results(self, case: LinearCase, result: Any) -> dict[str, tuple[Any, tuple[int, ...]]]:
        """The call's results by the golden's names, each with the shape it must have ("out"
        first); a ``running.calls.BadResult`` for a result of the wrong kind."""

    def run(self, kernel: Callable[..., Any], request: Request) -> Outcome:
        from ..running.linear import run_linear

        return run_linear(self, kernel, request)

    def judge(
        self, request: Request, outcome: Outcome, errors: list[KernelError]
    ) -> list[KernelRow]:
        from ..judge.linear import judge_linear

        return judge_linear(self, request, outcome, errors)


def on(value: str) -> bool:
    return value == "on"
