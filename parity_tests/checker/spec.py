"""A spec: one kernel API as the checker's plugin. Everything particular to one real library's
signature lives in one subclass of ``Spec`` in its own module under ``checker.specs`` (and its
broken kernels under ``checker.pitfalls``); the core loop (``checker.pipeline``: battery -> call
-> golden -> judge -> report) knows no API by name and calls only the hooks below.

The hooks, in the order a case meets them (docs/checker-map.md draws the path):

- **What it claims.** ``name``; ``signature`` (the real library's call, for people);
  ``features``, the options its signature can express (each spec's default claim: a kernel that
  claims fewer gets a battery built for what it claims); ``opt_in``, those a kernel may claim
  besides, never claimed by default ("deterministic").
- **The battery.** ``factors`` (the ways a case varies, each value a code path: the covering
  array's space, ``battery.pairs``), ``allowed`` (which values one case can hold together),
  ``values_of`` (a case's values, read back from its fields); ``battery`` (the cases of a named
  battery for the claimed features), ``lookup`` (a case by name), ``cannot_express``,
  ``requirements`` (the sizes a battery must hold), ``fuzz_case`` (one random case), and the
  kernel's limits (``check_limits``, ``outside``, ``nearest``).
- **The call and the verdict.** ``options`` (the keyword arguments of ``check_kernel`` this spec
  takes besides the common ones), ``run`` (one case and dtype of the kernel, protected: an
  ``Outcome``, never an exception), ``run_all`` (a spec that must run its whole battery at once,
  on spawned ranks, returns its outcomes; None: the pipeline calls ``run`` per case, in this
  process or isolated), ``judge`` (the rows of one case and dtype: golden and baseline, the
  policy on each tensor), ``exercised`` (the features one case exercises, for "not covered").
- **Its clients.** ``targets`` (correct kernels of this API the main job checks). Its teeth, the
  broken kernels with its signature, live in ``checker.pitfalls.<name>``, found by name.

Tests: tests/checker/test_spec.py (every registered spec: tests/checker/specs/)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .battery.names import unique_by_name

if TYPE_CHECKING:
    from .battery.limits import KernelLimits
    from .report.rows import KernelError, KernelRow
    from .running.request import Outcome, Request

Row = dict[str, str]
# The options that every spec judges on every case it runs when the kernel claims them (lse is
# a tensor, not a factor: no case "needs" it).
JUDGED_EVERYWHERE = frozenset({"lse"})


class Spec(abc.ABC):
    """One kernel API. Subclasses are singletons, registered by ``checker.specs``."""

    name: ClassVar[str]
    signature: ClassVar[str]
    features: ClassVar[frozenset[str]]
    # Features a kernel may claim beyond ``features``, never part of the default claim.
    opt_in: ClassVar[frozenset[str]] = frozenset()
    # Features that name no factor of the space (judged on every case when claimed).
    judged_everywhere: ClassVar[frozenset[str]] = JUDGED_EVERYWHERE
    # False: forward only by nature (a decode kernel has no backward).
    backward: ClassVar[bool] = True
    # False: its calls run in processes of its own (ranks), never isolated one by one.
    isolatable: ClassVar[bool] = True
    # The batteries a kernel of this spec may ask for by name.
    batteries: ClassVar[tuple[str, ...]] = ("default", "quick")

    def __repr__(self) -> str:
        return f"<spec {self.name}>"

    # -- the battery ----------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def factors(self) -> dict[str, tuple[str, ...]]:
        """Each factor and its values, "off" first (the first value of a feature's factor is
        what a kernel without the feature gets)."""

    @property
    @abc.abstractmethod
    def feature_factors(self) -> Mapping[str, str]:
        """The factor each feature turns on (a feature absent here has none: ``lse``)."""

    @property
    def constrained(self) -> tuple[str, ...]:
        """The factors ``allowed`` reads (the others are free: any value completes a row)."""
        return tuple(self.factors)

    def allowed(self, row: Mapping[str, str]) -> bool:
        """False when the values assigned so far in ``row`` cannot meet in one case."""
        return True

    def na(self, factor: str) -> str | None:
        """A value of ``factor`` meaning "does not apply" (never part of a pair), or None."""
        return None

    @abc.abstractmethod
    def values_of(self, case: Any) -> Row:
        """The value of each factor that ``case`` holds, read from its fields."""

    def claim_key(self, claimed: frozenset[str] | None) -> frozenset[str] | None:
        """The claimed features that shape a battery (those with a factor); None for all."""
        if claimed is None:
            return None
        factors = frozenset(self.feature_factors)
        held = frozenset(claimed) & factors
        return None if held == factors else held

    def claimed_battery(
        self,
        build: Callable[[frozenset[str] | None], tuple[Any, ...]],
        claimed: frozenset[str] | None,
    ) -> tuple[Any, ...]:
        """The cases ``build`` makes for the claim (``claim_key``), then those it makes for every
        feature that need features not claimed (a report lists them as not run)."""
        key = self.claim_key(claimed)
        cases = build(key)
        if key is not None:
            cases = unique_by_name(cases + tuple(c for c in build(None) if c.needs - key))
        return cases

    @abc.abstractmethod
    def battery(self, name: str, claimed: frozenset[str] | None) -> tuple[Any, ...]:
        """The cases of battery ``name`` (one of ``batteries``) for a kernel claiming
        ``claimed`` (None: every feature): those built for it, then the spec's cases that need
        features not claimed (listed as not run)."""

    @abc.abstractmethod
    def lookup(self, name: str, claimed: frozenset[str] | None) -> Any:
        """The case called ``name`` among this spec's (a ValueError when none is)."""

    def cannot_express(self, case: Any) -> str | None:
        """Why this spec's signature cannot express ``case`` at all, or None."""
        return None

    def named_cases(self) -> tuple[Any, ...]:
        """Hand-written cases outside the batteries, run by name (``cases=[...]``)."""
        return ()

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Any, ...]:
        """The size requirements of the default battery (``battery.sizes.Requirement``-like:
        ``label`` and ``met_by(case)``)."""
        return ()

    def size_summary(self, cases: list[Any], claimed: frozenset[str] | None) -> list[str]:
        """Which requirements ``cases`` meet, as lines: each with the first case meeting it."""
        lines = []
        for requirement in self.requirements(claimed):
            found = next((case for case in cases if requirement.met(case)), None)
            lines.append(f"{requirement.label}: {found.name if found else 'NOT MET'}")
        return lines

    def check_options(self, battery: tuple[Any, ...], options: Mapping[str, Any]) -> None:
        """A ValueError when the spec's own arguments cannot run ``battery`` (decided before
        any work); none by default."""
        return None

    def fuzz_case(
        self, index: int, seed: int, claimed: frozenset[str] | None, limits: KernelLimits | None
    ) -> Any:
        """Case ``index`` of this spec's fuzzer for ``seed``."""
        raise ValueError(f"the {self.name} spec has no fuzzer")

    def check_limits(self, limits: KernelLimits) -> None:
        """A ValueError naming a limit this spec's battery cannot honour; none by default."""
        return None

    def outside(self, limits: KernelLimits, case: Any) -> str | None:
        """Why ``case`` is outside ``limits``, or None."""
        return None

    def nearest(self, limits: KernelLimits, case: Any) -> Any:
        """The case inside ``limits`` nearest to ``case``, with every option of it."""
        return case

    def outside_values(self, limits: KernelLimits) -> frozenset[tuple[str, str]]:
        """The (factor, value) pairs no case inside ``limits`` can hold."""
        return frozenset()

    # -- the call and the verdict ------------------------------------------------------------

    def options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The spec's own keyword arguments of ``check_kernel`` (``given``: those not None),
        checked: a ValueError for one this spec does not take."""
        if given:
            names = ", ".join(sorted(given))
            raise ValueError(f"{names} is not an argument of the {self.name} spec")
        return {}

    @abc.abstractmethod
    def run(self, kernel: Callable[..., Any], request: Request) -> Outcome:
        """One case and dtype of ``kernel``: every failure of the kernel is an ``Outcome``."""

    def run_all(
        self,
        kernel: Callable[..., Any] | str,
        requests: Sequence[Request],
        options: Mapping[str, Any],
        progress: Callable[[str], None] | None,
    ) -> dict[tuple[str, str], Outcome] | None:
        """The outcomes of every request at once, for a spec whose calls cannot be made one by
        one in this process (ranks that must all join); None: the pipeline makes them."""
        return None

    @abc.abstractmethod
    def judge(
        self, request: Request, outcome: Outcome, errors: list[KernelError]
    ) -> list[KernelRow]:
        """The rows of one case and dtype from what the kernel gave."""

    def exercised(self, case: Any, claimed: frozenset[str]) -> frozenset[str]:
        """The claimed features a judged case of this spec exercises."""
        return frozenset(case.needs) | (claimed & self.judged_everywhere)

    # -- teeth and clients ---------------------------------------------------------------------

    def targets(self, device: Any, dtypes: tuple[str, ...]) -> list[Any]:
        """Correct kernels of this API that the main job checks (``targets.builtin.Target``s,
        beyond those of ``checker.targets``)."""
        return []
