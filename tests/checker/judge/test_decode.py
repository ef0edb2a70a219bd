"""Where a decode kernel is wrong: a failing row of out, lse or a cache names the sequence, its
cache length, and the query and head (or the cache slot and key/value head) of its worst error;
passing rows say nothing, and no verdict changes."""

from __future__ import annotations

import pytest

from parity_tests import check_kernel
from parity_tests.checker.specs import get
from parity_tests.checker.targets import decode as decode_kernels

# Four sequences in pages of 16, four queries each, four new tokens appended.
CASE = next(c for c in get("flash_kvcache").default_battery()
            if c.page_size == 16 and c.s_q == 4 and c.s_new == 4)  # fmt: skip


def _check(change):
    """The report of the correct kernel with ``change(out, lse, caches, kwargs)`` after it."""

    def kernel(q, k_cache, v_cache, **kwargs):
        out, lse = decode_kernels.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
        out, lse = out.clone(), lse.clone()
        change(out, lse, {"k_cache": k_cache, "v_cache": v_cache}, kwargs)
        return out, lse

    return check_kernel(kernel, spec="flash_kvcache", dtypes=["float32"], cases=[CASE.name])


def _out(out, lse, caches, kwargs):
    out[2, 1, 3] += 1.0  # sequence 2, query 1, head 3


def _lse(out, lse, caches, kwargs):
    lse[3, 2, 0] -= 1.0  # sequence 3, head 2, query 0


def _new_token(out, lse, caches, kwargs):
    position = CASE.seqlens[1] + 3  # sequence 1's last new token
    page = kwargs["block_table"][1, position // 16]
    caches["v_cache"][page, position % 16, 1, 0] += 1.0


# A sequence with a token in its cache before the new ones, and that token's slot.
OLD = next(b for b, length in enumerate(CASE.seqlens) if length)
OLD_SLOT = CASE.seqlens[OLD] - 1


def _old_token(out, lse, caches, kwargs):
    page = kwargs["block_table"][OLD, OLD_SLOT // 16]
    caches["k_cache"][page, OLD_SLOT % 16, 1, 0] += 1.0


@pytest.mark.parametrize(
    ("change", "tensor", "where"),
    [
        (_out, "out", f"worst at sequence 2 (cache_seqlens {CASE.seqlens[2]}), query 1, head 3"),
        (_lse, "lse", f"worst at sequence 3 (cache_seqlens {CASE.seqlens[3]}), query 0, head 2"),
        (_new_token, "v_cache", f"worst at sequence 1 (cache_seqlens {CASE.seqlens[1]}), "
         f"slot {CASE.seqlens[1] + 3}, kv head 1"),
    ],
    ids=["out", "lse", "new-token"],
)  # fmt: skip
def test_a_failing_row_names_the_sequence_and_slot_of_its_worst_error(change, tensor, where):
    report = _check(change)

    (row,) = report.failures
    assert (row.tensor, row.verdict, row.detail) == (tensor, "fail", where)
    assert all(other.detail == "" for other in report.rows if not other.failed)


def test_a_slot_changed_outside_the_new_tokens_is_named_beside_the_rule():
    report = _check(_old_token)

    (row,) = report.failures
    assert row.detail == (
        "slots outside the new tokens' [cache_seqlens, cache_seqlens + s_new) changed; "
        f"worst at sequence {OLD} (cache_seqlens {CASE.seqlens[OLD]}), slot {OLD_SLOT}, kv head 1"
    )
