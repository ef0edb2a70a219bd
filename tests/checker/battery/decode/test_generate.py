"""The decode batteries, built by the one battery builder: for every claim, the covering array
meets every allowed pair of option values and every page size meets every length where kernels
break, an append crosses a page at every page size, every head width is held; pages are
shuffled, inputs are reproducible, and a case that no call could make is refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from parity_tests.checker.battery import pairs
from parity_tests.checker.battery.catalog import select
from parity_tests.checker.battery.decode.case import (
    LENGTHS,
    MLA_SCALE,
    DecodeCase,
    crosses,
    length_of,
    make_decode_inputs,
)
from parity_tests.checker.specs import get

KVCACHE = get("flash_kvcache").default_battery()
MLA = get("flash_mla").default_battery()
# The claims a test builds a battery for: everything, the paged decode step of a hand-written
# kernel (the user: no GQA), and one feature.
CLAIMS = [None, frozenset({"causal", "paged", "append", "lse"}), frozenset({"paged"})]


def _judged(spec, claimed):
    """The cases of ``spec``'s battery that a kernel claiming ``claimed`` runs."""
    key = spec.features if claimed is None else claimed
    return [case for case in select(spec, None, claimed) if case.needs <= key]


@pytest.mark.parametrize("claimed", CLAIMS, ids=["all", "paged-step", "paged"])
def test_every_allowed_pair_of_the_claimed_options_meets_in_a_judged_case(claimed):
    spec = get("flash_kvcache")

    cases = _judged(spec, claimed)

    assert not pairs.uncovered(spec, cases, claimed)
    assert all(spec.allowed(spec.values_of(case)) for case in cases)


@pytest.mark.parametrize("claimed", CLAIMS, ids=["all", "paged-step", "paged"])
def test_every_page_size_meets_every_length_and_an_append_across_a_page(claimed):
    spec = get("flash_kvcache")
    cases = _judged(spec, claimed)

    for page in spec.pages(claimed):
        held = [c for c in cases if (c.page_size and str(c.page_size)) == page
                or (page == "contiguous" and c.page_size is None)]  # fmt: skip
        lengths = {label for c in held for label in LENGTHS
                   if length_of(label, c.page_size, c.capacity, c.s_new) in c.seqlens}  # fmt: skip
        assert lengths == set(LENGTHS), (page, set(LENGTHS) - lengths)
        if page != "contiguous" and (claimed is None or "append" in claimed):
            assert any(crosses(c) for c in held if c.page_size), page


def test_the_users_paged_kernel_is_judged_on_pages_of_every_size():
    cases = _judged(get("flash_kvcache"), CLAIMS[1])

    assert {c.page_size for c in cases} == {None, 1, 16, 64, 128, 160, 256}
    assert all(c.heads_kv == c.heads for c in cases)  # no GQA: it was not claimed
    assert sum(c.page_size is not None for c in cases) >= 3


def test_every_head_width_and_both_query_counts_and_every_split_count():
    assert {c.d for c in KVCACHE} >= {32, 64, 128, 256, 33}
    assert {c.s_q for c in KVCACHE} == {1, 4}
    assert {c.heads_kv for c in KVCACHE} == {1, 2, 4}
    assert {c.num_splits for c in KVCACHE} == {0, 1, 3}
    assert {c.page_size for c in KVCACHE} == {None, 1, 16, 64, 128, 160, 256}


def test_the_constraints_are_flash_attns():
    allowed = get("flash_kvcache").allowed
    assert not allowed({"page": "16", "leftpad": "on"})
    assert not allowed({"page": "64", "batch_idx": "on"})
    assert not allowed({"rotary": "half", "append": "none"})
    assert allowed({"page": "contiguous", "leftpad": "on"})
    assert allowed({"page": "16", "rotary": "half"})


def test_the_mla_battery_is_flashmlas_shape_with_more_than_one_tile_of_query_rows():
    inputs = make_decode_inputs(MLA[0], 0)

    assert all(c.d == 576 and c.dv == 512 and c.heads_kv == 1 for c in MLA)
    assert all(c.scale == MLA_SCALE != 576**-0.5 and c.s_new == 0 for c in MLA)
    assert inputs.v_cache is None and inputs.k_cache.shape[1:] == (64, 1, 576)
    assert {c.heads for c in MLA} == {16, 64, 128} and {c.s_q for c in MLA} == {1, 2}
    assert any(c.s_q * c.heads > 64 for c in MLA)
    lengths = {label for c in MLA for label in LENGTHS
               if length_of(label, c.page_size, c.capacity, 0) in c.seqlens}  # fmt: skip
    assert lengths == set(LENGTHS)


def test_a_kernel_claiming_fewer_features_keeps_the_full_batterys_cases_it_can_run():
    claimed = CLAIMS[1]

    built = set(get("flash_kvcache").default_battery(claimed))

    assert {c for c in KVCACHE if c.needs <= claimed} <= built


def test_pages_are_shuffled_and_every_slot_holds_numbers():
    case = next(c for c in KVCACHE if c.page_size == 16)

    inputs = make_decode_inputs(case, 0)

    table = inputs.block_table
    assert table.dtype == np.int32 and table.shape == (case.batch, case.pages_per_sequence)
    assert not all(np.all(np.diff(row) == 1) for row in table)  # not laid out in order
    assert len(set(table.ravel())) == table.size < len(inputs.k_cache)  # spare pages too
    assert np.all(inputs.k_cache != 0)


def test_a_pool_past_16_bit_ids_draws_only_the_pages_its_table_names():
    case = next(c for c in KVCACHE if c.pool_pages > 65536)

    inputs = make_decode_inputs(case, 0)

    named = np.unique(inputs.block_table)
    assert len(inputs.k_cache) >= case.pool_pages and named.max() >= 65536
    assert np.all(inputs.k_cache[named] != 0) and np.all(inputs.v_cache[named] != 0)
    spare = np.setdiff1d(np.arange(len(inputs.k_cache)), named)
    assert not np.any(inputs.k_cache[spare])


@pytest.mark.parametrize("seed", [0, 42])
def test_a_page_id_past_16_bits_is_on_a_page_the_kernel_reads(seed):
    # the page of the longest sequence's last token; sequence 0 of this case is empty, so its
    # first page (where the wide id was) is never read, and on seed 42 no other id was past 16
    # bits: a kernel truncating ids passed
    case = next(c for c in KVCACHE if c.pool_pages > 65536)

    inputs = make_decode_inputs(case, seed)

    totals = inputs.cache_seqlens + case.s_new
    seq = int(np.argmax(totals))
    assert inputs.block_table[seq, (totals[seq] - 1) // case.page_size] >= 65536


def test_a_pool_too_large_for_memory_is_refused_before_it_is_drawn():
    case = next(c for c in KVCACHE if c.pool_pages > 65536)
    huge = dataclasses.replace(case, pool_pages=2**40)

    with pytest.raises(MemoryError, match=r"pool of 1,099,511,627,776 pages .* GiB"):
        make_decode_inputs(huge, 0)


def test_inputs_are_reproducible_per_case_and_seed():
    case = KVCACHE[1]

    first, again, other = (make_decode_inputs(case, seed) for seed in (0, 0, 1))

    np.testing.assert_array_equal(first.q, again.q)
    np.testing.assert_array_equal(first.k_cache, again.k_cache)
    assert not np.array_equal(first.q, other.q)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"leftpad": (0, 0)}, "leftpad and batch_idx are for contiguous caches"),
        ({"rotary": "half", "s_new": 0}, "rotary rotates the new keys"),
        ({"seqlens": (30, 0)}, r"lengths \(30, 0\) \+ 3 must fit in \[0, 32\]"),
    ],
)
def test_a_case_no_call_could_make_is_refused(changes, match):
    base = {"name": "c", "spec": "flash_kvcache", "seqlens": (0, 1), "s_q": 3, "s_new": 3,
            "heads": 4, "heads_kv": 2, "d": 8, "dv": 8, "page_size": 16,
            "capacity": 32}  # fmt: skip

    with pytest.raises(ValueError, match=match):
        DecodeCase(**{**base, **changes})


def test_cases_are_found_by_name_in_their_own_specs_battery_only():
    assert select("flash_mla", None) == MLA == select("flash_mla", "quick")
    assert select("flash_kvcache", [KVCACHE[2].name]) == (KVCACHE[2],)
    with pytest.raises(ValueError, match="cases must be one of"):
        select("flash_kvcache", "stress")
    with pytest.raises(ValueError, match="cannot run case"):
        select("flash_mla", [KVCACHE[0].name])
