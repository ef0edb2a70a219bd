"""The "flash_kvcache" spec: flash-attn's ``flash_attn_with_kvcache(q, k_cache, v_cache, k=None,
v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
cache_leftpad=None, block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
return_softmax_lse=False)``: q (B, s_q, H, D), a contiguous cache (B_cache, capacity, H_kv, D)
or pages (num_blocks, P, H_kv, D) through ``block_table``, ``cache_seqlens`` the lengths
*before* the new tokens, which are written in place; causal and windows bottom-right; returns
out (B, s_q, H, Dv), or (out, lse (B, H, s_q)) with ``return_softmax_lse=True``.

The checker passes ``cache_seqlens`` always and the other arguments only where they differ from
the defaults; integers are int32 and ALiBi slopes float32, as flash-attn takes them. Its
options, each a factor of the covering array (the first value what a kernel without the feature
gets): pages (contiguous, 16, 64, 256 tokens: ``paged``), H_kv of H = 4 (``gqa``), s_q 1 or 4,
new tokens (none, s_q of them, or one for several queries, a speculative step: ``append``),
``causal``, a window (none, (7, -1), (7, 3)), ``softcap``, ALiBi (none, per head, per
sequence), rotary (none, interleaved, half-split, partial: ``rotary``), ``leftpad``,
``batch_idx`` and ``num_splits`` 0, 1 or 3 (``splits``). flash-attn refuses leftpad and batch
indices with pages, and rotary rotates new keys (it needs some).

Shape legend: B sequences, s_q queries and s_new new tokens per sequence, H query heads, H_kv
key/value heads, D head width, Dv value head width, P page size.

Tests: tests/checker/specs/test_flash_kvcache.py
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..battery.decode.case import SEQUENCES, WIDE_IDS, DecodeCase, length_of
from ..battery.decode.generate import Requirement
from ..golden.decode_baseline import plain_kvcache
from ._decode import DecodeSpec

HEADS = 4
TABLE_EXTRA = 3  # a wide table's columns past those a sequence can fill
HUGE_POOL = 70_000  # pages of the case whose page ids need more than 16 bits
POOL = "_pool"  # a row's key (not a factor) asking for a pool of that many pages
WINDOWS = {"none": None, "left": (7, -1), "both": (7, 3)}
ALIBI = {"none": "none", "per-head": "H", "per-batch": "BH"}


class FlashKvcacheSpec(DecodeSpec):
    name = "flash_kvcache"
    signature = (
        "flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, "
        "rotary_sin=None, cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, "
        "block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1), "
        "softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0, "
        "return_softmax_lse=False)"
    )
    features = frozenset({"causal", "gqa", "window", "softcap", "alibi", "lse", "rotary",
                          "paged", "append", "leftpad", "batch_idx", "splits"})  # fmt: skip
    widths = (32, 64, 128, 256, 33)
    factors = {
        "page": ("contiguous", "1", "16", "64", "128", "160", "256"),
        "table": ("exact", "wide"),
        "kv": ("mha", "gqa", "mqa"),
        "s_q": ("1", "4"),
        "append": ("none", "s_q", "one"),
        "causal": ("off", "on"),
        "window": ("none", "left", "both"),
        "softcap": ("off", "on"),
        "alibi": ("none", "per-head", "per-batch"),
        "rotary": ("none", "interleaved", "half", "partial"),
        "leftpad": ("off", "on"),
        "batch_idx": ("off", "on"),
        "splits": ("0", "1", "3"),
    }
    feature_factors = {"paged": "page", "gqa": "kv", "append": "append", "causal": "causal",
                       "window": "window", "softcap": "softcap", "alibi": "alibi",
                       "rotary": "rotary", "leftpad": "leftpad", "batch_idx": "batch_idx",
                       "splits": "splits"}  # fmt: skip
    constrained = ("page", "table", "leftpad", "batch_idx", "rotary", "append", "s_q")

    def allowed(self, row: Mapping[str, str]) -> bool:
        """flash-attn refuses leftpad and batch indices with pages; rotary rotates the new
        keys (it needs some); one new token for one query is the s_q-new-tokens case."""
        get = row.get
        paged = get("page") not in (None, "contiguous")
        if paged and "on" in (get("leftpad"), get("batch_idx")):
            return False
        if get("table") == "wide" and get("page") == "contiguous":
            return False  # a contiguous cache has no table
        if get("rotary") not in (None, "none") and get("append") == "none":
            return False
        return not (get("append") == "one" and get("s_q") == "1")

    def values_of(self, case: Any) -> dict[str, str]:
        window = next(label for label, value in WINDOWS.items() if value == case.window)
        s_new, s_q = case.s_new, case.s_q
        return {
            "page": "contiguous" if case.page_size is None else str(case.page_size),
            "table": "wide" if case.table_extra else "exact",
            "kv": "mha" if case.heads_kv == case.heads else "mqa" if case.heads_kv == 1 else "gqa",
            "s_q": str(s_q),
            "append": "none" if not s_new else "s_q" if s_new == s_q else "one",
            "causal": "on" if case.causal else "off",
            "window": window,
            "softcap": "on" if case.softcap else "off",
            "alibi": {v: k for k, v in ALIBI.items()}[case.alibi],
            "rotary": case.rotary,
            "leftpad": "off" if case.leftpad is None else "on",
            "batch_idx": "on" if case.batch_idx else "off",
            "splits": str(case.num_splits),
        }

    def seed_rows(self) -> tuple[dict[str, str], ...]:
        """The plain decode step at every page size: GQA, causal, the new tokens appended and
        nothing else, so that a kernel without the other options (most have few) meets each
        page size at its plainest; one query, or four (a speculative step), alternately."""
        base = {factor: values[0] for factor, values in self.factors.items()}
        base.update(kv="gqa", append="s_q", causal="on")
        return tuple({**base, "page": page, "s_q": ("1", "4")[i % 2]}
                     for i, page in enumerate(self.factors["page"]))  # fmt: skip

    def requirements(self, claimed: frozenset[str] | None) -> tuple[Requirement, ...]:
        """Those of every decode spec, and with pages, one pool of more pages than 16 bits
        count (pages of 1 token: the pool stays small in memory)."""
        found = super().requirements(claimed)
        if "1" in self.pages(claimed):
            label = f"pages of 1: a pool of more than {WIDE_IDS:,} pages (ids past 16 bits)"
            found += (Requirement(label, "pool", "1", WIDE_IDS),)
        return found

    def row_for(self, requirement: Requirement, claimed: frozenset[str] | None) -> dict[str, str]:
        row = super().row_for(requirement, claimed)
        if requirement.kind == "cross":  # four new tokens: from P - 1 they cross an edge
            row.update(append="s_q", s_q="4")
        if requirement.kind == "pool":
            row[POOL] = str(HUGE_POOL)
        return row

    def case_of(self, row: Mapping[str, str], d: int, lengths: tuple[str, ...]) -> DecodeCase:
        page = None if row["page"] == "contiguous" else int(row["page"])
        s_q = int(row["s_q"])
        s_new = {"none": 0, "s_q": s_q, "one": 1}[row["append"]]
        capacity = 48 if page is None or page == 1 else page * (2 if page > 64 else 3)
        extra = TABLE_EXTRA if row["table"] == "wide" else 0
        pool = int(row.get(POOL, 0))
        seqlens = tuple(length_of(label, page, capacity, s_new) for label in lengths)
        window = WINDOWS[row["window"]]
        leftpad = None
        if row["leftpad"] == "on":  # from nothing hidden to everything cached hidden
            leftpad = tuple((n * i) // (SEQUENCES - 1) for i, n in enumerate(seqlens))
        kv = {"mha": HEADS, "gqa": 2, "mqa": 1}[row["kv"]]
        labels = [
            ("causal", row["causal"] == "on"),
            (f"win{window[0]}" + (f"+{window[1]}" if window[1] >= 0 else "") if window else "",
             window is not None),
            ("softcap", row["softcap"] == "on"),
            (f"alibi{ALIBI[row['alibi']]}", row["alibi"] != "none"),
            (f"rotary-{row['rotary']}", row["rotary"] != "none"),
            ("leftpad", row["leftpad"] == "on"),
            ("batchidx", row["batch_idx"] == "on"),
            (f"splits{row['splits']}", row["splits"] != "0"),
        ]  # fmt: skip
        where = "contig" if page is None else f"p{page}"
        where += "-wide" if extra else ""
        where += f"-pool{pool}" if pool else ""
        head = [where, f"h{HEADS}kv{kv}", f"q{s_q}n{s_new}"]
        tail = [f"d{d}", "L" + "_".join(str(n) for n in seqlens)]
        name = "-".join(head + [label for label, on in labels if on] + tail)
        softcap = row["softcap"] == "on"
        return DecodeCase(
            name, self.name, seqlens, s_q, s_new, HEADS, kv, d, d, page, capacity,
            causal=row["causal"] == "on", window=window, softcap=5.0 if softcap else 0.0,
            logits=30.0 if softcap else 1.0, alibi=ALIBI[row["alibi"]], rotary=row["rotary"],
            leftpad=leftpad, batch_idx=row["batch_idx"] == "on", num_splits=int(row["splits"]),
            length_labels=tuple(lengths), table_extra=extra, pool_pages=pool,
        )  # fmt: skip

    def call(self, kernel: Callable[..., Any], case: DecodeCase, given: dict[str, torch.Tensor],
             want_lse: bool, options: Mapping[str, Any]) -> Any:  # fmt: skip
        keywords = {n: t for n, t in given.items() if n not in ("q", "k_cache", "v_cache")}
        return kernel(given["q"], given["k_cache"], given["v_cache"],
                      **kvcache_keywords(case, keywords, want_lse))  # fmt: skip

    def baseline(self, case, given):
        q, k_cache, v_cache = given.pop("q"), given.pop("k_cache"), given.pop("v_cache")
        out, lse = plain_kvcache(q, k_cache, v_cache, **kvcache_keywords(case, given, True))
        return out, lse, {"k_cache": k_cache, "v_cache": v_cache}


def kvcache_keywords(case: DecodeCase, given: dict[str, torch.Tensor], lse: bool) -> dict:
    """flash_attn_with_kvcache's keywords that differ from their defaults (cache_seqlens
    always)."""
    kwargs: dict[str, Any] = {"cache_seqlens": given["cache_seqlens"]}
    for name in ("k", "v", "rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad",
                 "block_table", "alibi_slopes"):  # fmt: skip
        if name in given:
            kwargs[name] = given[name]
    if case.rotary in ("half", "partial"):
        kwargs["rotary_interleaved"] = False
    if case.scale is not None:
        kwargs["softmax_scale"] = case.scale
    if case.causal:
        kwargs["causal"] = True
    if case.window is not None:
        kwargs["window_size"] = case.window
    if case.softcap:
        kwargs["softcap"] = case.softcap
    if case.num_splits:
        kwargs["num_splits"] = case.num_splits
    if lse:
        kwargs["return_softmax_lse"] = True
    return kwargs


SPEC = FlashKvcacheSpec()
