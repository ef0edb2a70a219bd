"""The "sparse" spec: the torch twin's differentiable ``sparse_attention(q, k, v, indices, *,
softmax_scale=None, sinks=None, topk_length=None, d_v=None, return_lse=False)`` (token-major,
DeepSeek-V3.2's DSA; ``torch_attention.sparse``), judged with gradients: out, dq, dk, dv (dk alone
when V is K's latent) and dsinks, and lse (the core's: sink included).

Its factors: GQA (4 query heads over 4 key heads, or 8 over 2), ``latent`` (v None and ``d_v``:
V is the first 3/4 of K, whose gradient dk then carries), ``sinks``, ``topk_length`` and the
lists' pattern (``battery.sparse.PATTERNS``: overlap across queries, duplicates within a row,
sentinels of every kind, rows with nothing valid); head widths 32, 64, 128, 256 and an odd one.
Only the options a case holds are passed (a kernel without sinks is never given ``sinks=``).

Tests: tests/checker/specs/test_sparse.py
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..battery.sparse import TOPK, SparseCase
from ..running.calls import BadResult
from ._sparse import SparseSpec, on

S_Q = 24  # query tokens: enough that neighbouring queries share most keys


class SparseTwinSpec(SparseSpec):
    name = "sparse"
    signature = ("sparse_attention(q, k, v, indices, *, softmax_scale=None, sinks=None, "
                 "topk_length=None, d_v=None, return_lse=False)")  # fmt: skip
    features = frozenset({"gqa", "latent", "sinks", "topk_length", "lse"})
    widths = (64, 32, 128, 256, 40 + 1)
    fuzz_topks = (1, 40, 64, 100, 128, 256)  # any length: the twin's signature takes it
    factors = {
        "gqa": ("off", "on"),
        "latent": ("off", "on"),
        "sinks": ("off", "on"),
        "topk_length": ("off", "on"),
        "pattern": ("overlap", "duplicates", "sentinels", "dead"),
    }
    feature_factors = {"gqa": "gqa", "latent": "latent", "sinks": "sinks",
                       "topk_length": "topk_length"}  # fmt: skip

    def values_of(self, case: Any) -> dict[str, str]:
        return {
            "gqa": "on" if case.heads_kv != case.heads else "off",
            "latent": "on" if case.latent else "off",
            "sinks": "on" if case.sinks else "off",
            "topk_length": "on" if case.topk_length else "off",
            "pattern": case.pattern,
        }

    def case_of(self, row: Mapping[str, str], d: int) -> SparseCase:
        heads, heads_kv = (8, 2) if on(row["gqa"]) else (4, 4)
        latent = on(row["latent"])
        dv = max(1, 3 * d // 4) if latent else d
        flags = [row["pattern"], f"h{heads}-{heads_kv}", f"d{d}"]
        flags += [name for name in ("latent", "sinks", "topk_length") if on(row[name])]
        return SparseCase(
            "sparse-" + "-".join(flags), self.name, S_Q, S_Q + TOPK + 37, heads, heads_kv, d,
            dv, latent=latent, pattern=row["pattern"], sinks=on(row["sinks"]),
            topk_length=on(row["topk_length"]),
        )  # fmt: skip

    def call(self, kernel: Callable[..., Any], case: SparseCase, given: dict[str, torch.Tensor],
             want_lse: bool) -> Any:  # fmt: skip
        options: dict[str, Any] = {}
        if case.sinks:
            options["sinks"] = given["sinks"]
        if case.topk_length:
            options["topk_length"] = given["topk_length"]
        if case.latent:
            options["d_v"] = case.dv
        if case.scale is not None:
            options["softmax_scale"] = case.scale
        if want_lse:
            options["return_lse"] = True
        return kernel(given["q"], given["k"], given.get("v"), given["indices"], **options)

    def results(self, case: SparseCase, result: Any, want_lse: bool) -> dict:
        if want_lse:
            if not isinstance(result, (tuple, list)) or len(result) < 2:
                raise BadResult(f"the kernel returned {type(result).__name__}, the sparse spec "
                                "expects (out, lse) with return_lse=True")  # fmt: skip
            out, lse = result[0], result[1]
            return {"out": (out, (case.s_q, case.heads, case.dv)),
                    "lse": (lse, (case.s_q, case.heads))}  # fmt: skip
        return {"out": (result, (case.s_q, case.heads, case.dv))}

    def targets(self, device: Any, dtypes: tuple[str, ...]) -> list[Any]:
        from torch_attention.sparse import sparse_attention

        from ..golden.sparse_baseline import plain_sparse
        from ..targets.builtin import Target

        return [
            Target("torch_attention.sparse", sparse_attention, dtypes, self.name),
            Target("plain_sparse", plain_sparse, dtypes, self.name),
        ]


SPEC = SparseTwinSpec()
