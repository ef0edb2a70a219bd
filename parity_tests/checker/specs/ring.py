"""The "ring" spec: ``torch_attention.distributed.ring_attention(q, k, v, *, group, causal,
scale, softcap, window, enable_gqa, layout)`` on spawned gloo ranks (``running.ranks``); shards
of (B, H, N, D); top-left, N = M.

Its battery is its own: self-attention of 48 positions that the ranks split, a covering array
of its factors grown from the named ring cases (``battery.attention.generate.ring_battery``);
it has no stress battery (its cases must split over the ranks), no fuzzer, no
``seqlen_multiple`` limit, and takes ``world_size`` (default 2). Every call of a battery is made
at once on the ranks (``run_all``); each rank imports the kernel, so it must pickle (a
module-level function, or "module:function").

Shape legend: B batch, H heads, H_kv key/value heads, N sequence length, D head width.

Tests: tests/checker/running/test_ranks.py, tests/checker/test_spec.py (every claim's coverage)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..battery.attention import generate
from ..battery.attention.case import Case
from ..battery.limits import KernelLimits
from ..running.calls import Outcome, Request
from ._attention import AttentionSpec

WORLD_SIZE = 2


class RingSpec(AttentionSpec):
    name = "ring"
    signature = (
        "ring_attention(q, k, v, *, causal=False, scale=None, softcap=0.0, window=None, "
        "enable_gqa=False, layout='contiguous')"
    )
    features = frozenset({"causal", "window", "softcap", "gqa", "dv"})
    # The ring's cases are self-attention of one length that the ranks split; q, k, v are
    # each rank's own shards, so neither lengths nor memory layouts vary there.
    factor_names = ("causal", "window", "softcap", "gqa", "dv", "scale", "layout")
    align = "top-left"
    batteries = ("default", "quick", "ring", "stress")
    isolatable = False

    def default_battery(self, claimed: frozenset[str] | None = None) -> tuple[Case, ...]:
        return generate.ring_battery(self, self.claim_key(claimed))

    def battery(self, name: str, claimed: frozenset[str] | None) -> tuple[Case, ...]:
        if name == "stress":
            raise ValueError(
                "the ring spec has no stress battery (its cases must split over the ranks): "
                "run its own battery, 'ring', or name cases"
            )
        return self.claimed_battery(lambda key: generate.ring_battery(self, key), claimed)

    def lookup(self, name: str, claimed: frozenset[str] | None) -> Case:
        for case in generate.ring_battery(self, self.claim_key(claimed)):
            if case.name == name:
                return case
        return super().lookup(name, claimed)

    def requirements(self, claimed: frozenset[str] | None) -> tuple:
        return ()  # the ranks split one length: no sizes to meet

    def fuzz_case(self, index, seed, claimed, limits) -> Case:
        raise ValueError(
            "the ring spec has no fuzzer (its battery splits one length over ranks): fuzz one "
            "of the sdpa, flash, flash_varlen or flex specs"
        )

    def check_limits(self, limits: KernelLimits) -> None:
        super().check_limits(limits)
        if limits.seqlen_multiple > 1:
            raise ValueError(
                "the ring spec takes no seqlen_multiple: its ranks split one length (48) into "
                "shards its battery fixes"
            )

    def cannot_express(self, case: Any) -> str | None:
        if not isinstance(case, Case):
            return f"the ring spec runs attention cases, not {type(case).__name__}"
        if case.n != case.m or case.packed or case.mask != "none":
            return "the ring spec is self-attention (N = M) with no mask"
        if case.dropout_p or case.alibi != "none":
            return "the ring spec has no dropout and no ALiBi"
        if case.memory != "contiguous":
            return "the ring spec's ranks get shards of their own, contiguous"
        return None

    def options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        foreign = sorted(set(given) - {"world_size"})
        if foreign:
            return super().options({name: given[name] for name in foreign})
        return {"world_size": given.get("world_size", WORLD_SIZE)}

    def check_options(self, battery: tuple[Any, ...], options: Mapping[str, Any]) -> None:
        from ..running.ranks import check_world_size

        world = options["world_size"]
        try:
            check_world_size(battery, world)
        except ValueError as exc:
            raise ValueError(f"world_size {world}: {exc}") from exc

    def run(self, kernel: Callable[..., Any], request: Request) -> Outcome:
        raise ValueError("the ring spec runs in spawned ranks of its own (run_all)")

    def run_all(self, kernel, requests: Sequence[Request], options, progress) -> dict:
        from ..running.ranks import run_ranks

        return run_ranks(kernel, requests, options["world_size"], progress)


SPEC = RingSpec()
