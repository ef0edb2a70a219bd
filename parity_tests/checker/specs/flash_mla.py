"""The "flash_mla" spec: FlashMLA's ``flash_mla_with_kvcache(q, k_cache, block_table,
cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits, softmax_scale=None,
causal=False)``: q (B, s_q, H, 576), one latent head of 576 = 512 + 64 numbers in pages of 64
(V the first ``head_dim_v`` = 512 of K), ``cache_seqlens`` the lengths *including* the queries'
own tokens (already in the cache), the layer's scale (DeepSeek-V3's (128 + 64)^-0.5); returns
(out (B, s_q, H, 512), lse (B, H, s_q)).

The metadata and ``num_splits`` come from the user's hook ``mla_metadata(cache_seqlens,
s_q * H // H_kv, H_kv)`` (FlashMLA's ``get_mla_metadata``; ``check_kernel(...,
mla_metadata=...)``), or None and None without one. Its factors: s_q 1 or 2, causal, and 16, 64
or 128 query heads (DeepSeek's shards): with s_q * H past 64 the kernel folds the query rows
into more than one 64-row tile. Its features: ``causal`` and ``lse`` (its pages, its one latent
head and its scale are not options).

Shape legend: B sequences, s_q queries per sequence, H query heads, P page size.

Tests: tests/checker/running/test_decode.py, tests/checker/battery/decode/test_generate.py,
tests/checker/test_spec.py
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..battery.decode.case import MLA_D, MLA_DV, MLA_PAGE, MLA_SCALE, DecodeCase, length_of
from ..battery.decode.generate import Requirement
from ..golden.decode_baseline import plain_mla
from ._decode import DecodeSpec

TILE = 64  # FlashMLA's tile of query rows (s_q * H of them per sequence)


class FlashMlaSpec(DecodeSpec):
    name = "flash_mla"
    signature = (
        "flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, "
        "tile_scheduler_metadata, num_splits, softmax_scale=None, causal=False)"
    )
    features = frozenset({"causal", "lse"})
    widths = (MLA_D,)
    fixed_page = str(MLA_PAGE)
    always_lse = True
    factors = {"s_q": ("1", "2"), "causal": ("off", "on"), "heads": ("16", "64", "128")}
    feature_factors = {"causal": "causal"}

    def values_of(self, case: Any) -> dict[str, str]:
        return {"s_q": str(case.s_q), "causal": "on" if case.causal else "off",
                "heads": str(case.heads)}  # fmt: skip

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Requirement, ...]:
        """The lengths at FlashMLA's pages, and a call of more query rows than one tile."""
        rows = Requirement(f"s_q * H > {TILE} (a second tile of query rows)", "rows", value=TILE)
        lengths = tuple(r for r in super().requirements(claimed) if r.kind != "width")
        return (*lengths, rows)

    def row_for(self, requirement: Requirement, claimed: frozenset[str] | None) -> dict[str, str]:
        row = super().row_for(requirement, claimed)
        if requirement.kind == "rows":
            row["heads"] = self.factors["heads"][-1]
        return row

    def fixed_widths(self) -> tuple[int, ...]:
        return (MLA_D, MLA_DV)

    def options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        foreign = sorted(set(given) - {"mla_metadata"})
        if foreign:
            return super().options({name: given[name] for name in foreign})
        return {"mla_metadata": given.get("mla_metadata")}

    def case_of(self, row: Mapping[str, str], d: int, lengths: tuple[str, ...]) -> DecodeCase:
        s_q, heads, causal = int(row["s_q"]), int(row["heads"]), row["causal"] == "on"
        capacity = 3 * MLA_PAGE
        seqlens = tuple(length_of(label, MLA_PAGE, capacity, 0) for label in lengths)
        name = (f"mla-p{MLA_PAGE}-h{heads}-q{s_q}" + ("-causal" if causal else "")
                + "-L" + "_".join(str(n) for n in seqlens))  # fmt: skip
        return DecodeCase(
            name, self.name, seqlens, s_q, 0, heads, 1, MLA_D, MLA_DV, MLA_PAGE, capacity,
            causal=causal, scale=MLA_SCALE, length_labels=tuple(lengths),
        )  # fmt: skip

    def call(self, kernel: Callable[..., Any], case: DecodeCase, given: dict[str, torch.Tensor],
             want_lse: bool, options: Mapping[str, Any]) -> Any:  # fmt: skip
        return kernel(**mla_arguments(case, given, options.get("mla_metadata")))

    def baseline(self, case, given):
        out, lse = plain_mla(**mla_arguments(case, given, None))
        return out, lse, {"k_cache": given["k_cache"], "v_cache": given["k_cache"][..., : case.dv]}


def mla_arguments(
    case: DecodeCase, given: dict[str, torch.Tensor], hook: Callable[..., Any] | None
) -> dict[str, Any]:
    """flash_mla_with_kvcache's arguments, the metadata from the user's hook (or None)."""
    metadata, splits = None, None
    if hook is not None:
        metadata, splits = hook(given["cache_seqlens"], case.s_q * case.heads, case.heads_kv)
    arguments: dict[str, Any] = {
        "q": given["q"],
        "k_cache": given["k_cache"],
        "block_table": given["block_table"],
        "cache_seqlens": given["cache_seqlens"],
        "head_dim_v": case.dv,
        "tile_scheduler_metadata": metadata,
        "num_splits": splits,
        "softmax_scale": case.scale,
    }
    if case.causal:
        arguments["causal"] = True
    return arguments


SPEC = FlashMlaSpec()
