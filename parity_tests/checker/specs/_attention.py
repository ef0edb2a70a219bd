"""The attention specs' common part: kernels over whole sequences of queries and keys (SDPA's,
flash-attn's and its varlen form, FlexAttention's, ``ring_attention``'s), judged forward and
backward on the cases of ``battery.attention``.

Every attention spec takes the feature "deterministic", never in a default claim (``opt_in``):
judged on every case, it runs each case's backward twice and compares the gradients bit for bit
(the forward is compared for every kernel not declared nondeterministic).

A subclass says what its signature is (``factor_names``: the factors it can express;
``align``: where its causal, windows and ALiBi sit; ``dropout``: whether it returns the
keep-mask or is judged by draws; ``quick_teeth``: the cases its pitfalls need), how a case
becomes its call (``layout`` and ``unlayout`` between the canonical (B, H, L, W) and its layout,
``extras``, ``invoke``, ``split_result``) and which cases it cannot express; the battery, the
limits, the fuzzer, the call and the verdict are the attention family's (``battery.attention``,
``running.calls``).

Shape legend: B batch, H heads, H_kv key/value heads, N query length, M key/value length,
D head width, Dv value width; T packed token count.

Tests: tests/checker/specs/ (one file per spec)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..battery.attention import generate, quick, space
from ..battery.attention import limits as attention_limits
from ..battery.attention.case import Case
from ..battery.attention.handwritten import NAMED, STRESS
from ..battery.attention.sizes import Requirement, requirements, size_summary
from ..spec import JUDGED_EVERYWHERE, Spec

if TYPE_CHECKING:
    from ..battery.limits import KernelLimits
    from ..report.rows import KernelError, KernelRow
    from ..running.request import Outcome, Request


class AttentionSpec(Spec):
    """A kernel over whole sequences (see the module docstring)."""

    factor_names: ClassVar[tuple[str, ...]]
    align: ClassVar[str | None]  # None: the case says (FlexAttention's masks)
    dropout: ClassVar[str | None] = None  # "readback" (SDPA's), "draws" (flash-attn's) or None
    quick_teeth: ClassVar[tuple[str, ...]] = ()
    batteries: ClassVar[tuple[str, ...]] = ("default", "quick", "stress")
    # "deterministic": the backward gives the same bits every call (flash-attn's signature
    # takes deterministic=True; through the others it is a promise). Claimed explicitly, judged
    # on every case: the backward runs twice too (``running.calls.repeated``).
    opt_in: ClassVar[frozenset[str]] = frozenset({"deterministic"})
    judged_everywhere: ClassVar[frozenset[str]] = JUDGED_EVERYWHERE | opt_in

    # -- the space -----------------------------------------------------------------------------

    @functools.cached_property
    def factors(self) -> dict[str, tuple[str, ...]]:
        return space.domains(self.factor_names)

    @functools.cached_property
    def feature_factors(self) -> Mapping[str, str]:
        return {f: f for f in space.FEATURE_FACTORS if f in self.factor_names}

    @functools.cached_property
    def constrained(self) -> tuple[str, ...]:
        return tuple(f for f in space.CONSTRAINED if f in self.factor_names)

    def allowed(self, row: Mapping[str, str]) -> bool:
        return space.allowed(self.factor_names, row)

    def na(self, factor: str) -> str | None:
        return space.NA if factor == "align" else None

    def values_of(self, case: Any) -> dict[str, str]:
        return space.case_values(self.factor_names, case)

    # -- batteries ---------------------------------------------------------------------------

    def default_battery(self, claimed: frozenset[str] | None = None) -> tuple[Case, ...]:
        """The default battery built for ``claimed`` (None: every feature)."""
        return generate.default_battery(self, self.claim_key(claimed))

    def battery(self, name: str, claimed: frozenset[str] | None) -> tuple[Case, ...]:
        if name == "stress":
            return tuple(case for case in STRESS if self.cannot_express(case) is None)
        build = quick.quick_battery if name == "quick" else generate.default_battery
        cases = self.claimed_battery(lambda key: build(self, key), claimed)
        return tuple(case for case in cases if self.cannot_express(case) is None)

    def lookup(self, name: str, claimed: frozenset[str] | None) -> Case:
        key = self.claim_key(claimed)
        pools = (generate.default_battery(self, key), quick.quick_battery(self, key), STRESS)
        for pool in (*pools, generate.default_battery(self, None), NAMED):
            for case in pool:
                if case.name == name:
                    return case
        raise ValueError(f"unknown case {name!r}; --list-cases names them")

    def named_cases(self) -> tuple[Case, ...]:
        return NAMED

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Requirement, ...]:
        return requirements(claimed)

    def size_summary(self, cases: list[Any], claimed: frozenset[str] | None) -> list[str]:
        return size_summary(self.requirements(claimed), cases)

    def fuzz_case(self, index, seed, claimed, limits) -> Case:
        from ..battery.attention.fuzz import fuzz_case

        return fuzz_case(self, index, seed, claimed, limits)

    def check_limits(self, limits: KernelLimits) -> None:
        if limits.page_sizes is not None:
            raise ValueError(f"the {self.name} spec takes no page_sizes: its keys are not paged")

    def outside(self, limits: KernelLimits, case: Any) -> str | None:
        return attention_limits.outside(limits, case)

    def nearest(self, limits: KernelLimits, case: Any) -> Case:
        return attention_limits.nearest(limits, case)

    def outside_values(self, limits: KernelLimits) -> frozenset[tuple[str, str]]:
        return frozenset(
            value for value in attention_limits.outside_values(limits) if value[0] in self.factors
        )

    def cannot_express(self, case: Any) -> str | None:
        if not isinstance(case, Case):
            return f"the {self.name} spec runs attention cases, not {type(case).__name__}"
        if case.layout != "contiguous":
            return "only the ring spec shards a sequence"
        if case.packed and "sequences" not in self.factor_names:
            return "packed sequences need the flash_varlen spec"
        if case.mask != "none" and "mask" not in self.factor_names:
            return f"{self.name} takes no attention mask"
        if case.dropout_p and self.dropout is None:
            return f"{self.name} has no dropout"
        return self.cannot_express_options(case) or self._misaligned(case)

    def cannot_express_options(self, case: Case) -> str | None:
        """The spec's own reasons (an option its signature has no argument for)."""
        return None

    def _misaligned(self, case: Case) -> str | None:
        if self.align is not None and case.positioned and case.align != self.align:
            return (
                f"{self.name} aligns causal, windows and ALiBi {self.align}, the case {case.align}"
            )
        return None

    # -- the call ------------------------------------------------------------------------------

    def judged_case(self, case: Case) -> Case:
        """The case whose golden the kernel's output, gradients and lse are judged against: for
        a spec whose dropout is judged by draws, the case at p = 0 (the draws are judged
        apart)."""
        if case.dropout_p and self.dropout == "draws":
            return dataclasses.replace(case, dropout_p=0.0)
        return case

    def heads_first(self, case: Case) -> bool:
        """Whether the spec's layout puts the heads axis before the length axis ((B, H, L, W)),
        rather than after it (flash-attn's (B, L, H, W), packed (T, H, W))."""
        return not case.packed

    def layout(self, case: Case, t: torch.Tensor) -> torch.Tensor:
        """A canonical q, k, v or dout, (B, H, L, W) (packed: (T, H, W)), in the spec's
        layout."""
        return t

    def unlayout(self, case: Case, t: torch.Tensor, heads: int) -> torch.Tensor:
        """The inverse of ``layout`` for a result with ``heads`` heads."""
        return t

    def lse_shape(self, case: Case) -> tuple[int, ...]:
        """The shape of lse as the spec's library returns it."""
        return (case.heads, case.n) if case.packed else (case.batch, case.heads, case.n)

    def unlayout_lse(self, case: Case, lse: torch.Tensor) -> torch.Tensor:
        """The kernel's lse in the canonical layout: (B, H, N), or (H, T) for a packed case."""
        return lse

    def extras(
        self,
        case: Case,
        attn_mask: torch.Tensor | None,
        slopes: torch.Tensor | None,
        device: torch.device,
    ) -> dict[str, torch.Tensor]:
        """The tensors besides q, k, v that the kernel gets (and must leave as they were)."""
        given: dict[str, torch.Tensor] = {}
        if attn_mask is not None:
            given["attn_mask"] = attn_mask
        if slopes is not None:
            given["alibi_slopes"] = slopes.float()  # flash-attn takes float32 slopes
        return given

    def invoke(
        self,
        kernel: Callable[..., Any],
        case: Case,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        given: dict[str, torch.Tensor],
        want_lse: bool,
        *,
        deterministic: bool = False,
    ) -> Any:
        """Call ``kernel`` as the spec's library would be called, q, k, v in its layout;
        ``deterministic``: the kernel claims the feature (flash-attn's signature passes it on,
        the others have no such argument)."""
        raise ValueError(f"spec {self.name!r} is not called in-process")

    def split_result(self, result: Any, want_lse: bool) -> tuple[Any, Any]:
        """(out, lse) from what the kernel returned; lse None when not asked for. A result that
        is not shaped as the library's raises ``TypeError`` saying what was expected."""
        if not want_lse:
            return result, None
        if not isinstance(result, (tuple, list)) or len(result) < 2:
            raise TypeError(
                f"asked for lse, the kernel returned {type(result).__name__}; the {self.name} "
                "spec expects a tuple (out, lse, ...)"
            )
        out, lse = result[0], result[1]
        return out, getattr(lse, "lse", lse)  # torch 2.13's AuxOutput holds lse as a field

    def run(self, kernel: Callable[..., Any], request: Request) -> Outcome:
        from ..running.calls import run_case

        return run_case(self, kernel, request)

    def judge(
        self, request: Request, outcome: Outcome, errors: list[KernelError]
    ) -> list[KernelRow]:
        from ..judge.attention import judge_outcome

        return judge_outcome(self, request, outcome, errors)
