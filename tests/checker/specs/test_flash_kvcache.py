"""The flash_kvcache spec as a kernel engineer meets it: a hand-written paged decode kernel that
claims "causal,paged,append,lse" (no GQA) is judged on pages of every size, every length at the
page edges and appends crossing a page, so that a page-crossing append bug is flagged where it
once passed on one contiguous case; written correctly, the same kernel passes every group."""

from __future__ import annotations

import torch

from parity_tests import check_kernel
from parity_tests.checker.battery.decode.case import crosses
from parity_tests.checker.specs import get
from parity_tests.checker.targets import decode as decode_kernels

CLAIMED = ["causal", "paged", "append", "lse"]


def _appending(crossing_bug: bool):
    """A paged decode kernel that writes the new tokens itself, then attends through the
    correct twin (k=None, the lengths counting the new tokens). With ``crossing_bug`` every new
    token goes to the page of the first one: right unless the append crosses a page edge."""

    def kernel(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
               causal=False, return_softmax_lse=False):  # fmt: skip
        seqlens = cache_seqlens
        if k is not None:
            size = k_cache.shape[1]  # P, or a contiguous row's capacity
            for b, start in enumerate(seqlens.tolist()):
                for i in range(k.shape[1]):
                    where = start if crossing_bug else start + i
                    if block_table is None:
                        page, slot = b, start + i
                    else:
                        page, slot = int(block_table[b, where // size]), (start + i) % size
                    k_cache[page, slot], v_cache[page, slot] = k[b, i], v[b, i]
            seqlens = seqlens + k.shape[1]
        return decode_kernels.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seqlens, block_table=block_table, causal=causal,
            return_softmax_lse=return_softmax_lse,
        )  # fmt: skip

    return kernel


def test_a_page_crossing_append_bug_is_flagged_on_the_crossing_cases():
    report = check_kernel(_appending(crossing_bug=True), spec="flash_kvcache", features=CLAIMED,
                          dtypes=["float32"])  # fmt: skip

    assert not report.passed
    flagged = {row.case for row in report.failures}
    crossing = {name for name, case in report.cases.items() if crosses(case)}
    assert flagged and flagged <= crossing


def test_the_same_kernel_written_correctly_passes_on_paged_cases_of_every_size():
    report = check_kernel(_appending(crossing_bug=False), spec="flash_kvcache", features=CLAIMED,
                          dtypes=["float32"])  # fmt: skip

    assert report.passed, report.failures
    judged = [report.cases[case] for (case, _), status in report.groups.items()
              if status == "pass"]  # fmt: skip
    assert {case.page_size for case in judged} == {None, 1, 16, 64, 128, 160, 256}
    assert sum(crosses(case) for case in judged) >= 3
    assert not report.not_covered


def test_the_battery_a_narrow_claim_gets_is_built_for_it():
    spec = get("flash_kvcache")

    battery = spec.battery("default", frozenset(CLAIMED))

    runs = [case for case in battery if case.needs <= set(CLAIMED)]
    assert len(runs) >= 10 and all(case.heads_kv == case.heads for case in runs)
    assert torch.tensor([case.s_q for case in runs]).unique().tolist() == [1, 4]
