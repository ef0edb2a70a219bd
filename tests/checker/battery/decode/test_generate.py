"""The decode batteries: the covering array meets every allowed pair of option values, every
page size meets every length where kernels break, pages are shuffled, inputs are reproducible,
and a case that no call could make is refused."""

from __future__ import annotations

import numpy as np
import pytest

from parity_tests.checker.battery.decode_case import (
    FACTORS,
    KVCACHE,
    LENGTHS,
    MLA,
    MLA_SCALE,
    DecodeCase,
    allowed,
    covered_pairs,
    covering_cases,
    make_decode_inputs,
    required_pairs,
    resolve_decode,
)


def test_every_allowed_pair_of_option_values_meets_in_some_case():
    rows = covering_cases()

    covered = set().union(*(covered_pairs(row) for row in rows))

    assert required_pairs() <= covered
    assert all(allowed(row) for row in rows)
    assert len(KVCACHE) == len(rows) + len(FACTORS["page"])  # and the plain step per page size


def test_the_constraints_are_flash_attns():
    assert not allowed({"page": 16, "leftpad": True})
    assert not allowed({"page": 64, "batch_idx": True})
    assert not allowed({"rotary": "half", "append": "none"})
    assert allowed({"page": None, "leftpad": True}) and allowed({"page": 16, "rotary": "half"})


def _length_names(case: DecodeCase) -> set[str]:
    size = case.page_size or case.capacity // 2
    values = {"0": 0, "1": 1, "odd": size + size // 2 + 1, "P-1": size - 1, "P": size,
              "P+1": size + 1}  # fmt: skip
    names = {name for name, value in values.items() if value in case.seqlens}
    if any(n + case.s_new == case.capacity for n in case.seqlens):
        names.add("full")
    return names


@pytest.mark.parametrize("battery", [KVCACHE, MLA], ids=["flash_kvcache", "flash_mla"])
def test_every_page_size_meets_every_length(battery):
    for page in {case.page_size for case in battery}:
        met = set().union(*(_length_names(c) for c in battery if c.page_size == page))

        assert met == set(LENGTHS), (page, set(LENGTHS) - met)


def test_the_battery_holds_s_q_1_and_more_mqa_and_gqa_and_every_split_count():
    assert {c.s_q for c in KVCACHE} == {1, 4} and {c.s_q for c in MLA} == {1, 2}
    assert {c.heads_kv for c in KVCACHE} == {1, 2, 4}
    assert {c.num_splits for c in KVCACHE} == {0, 1, 3}
    assert {c.page_size for c in KVCACHE} == {None, 16, 64, 256}


def test_pages_are_shuffled_and_every_slot_holds_numbers():
    case = next(c for c in KVCACHE if c.page_size == 16)

    inputs = make_decode_inputs(case, 0)

    table = inputs.block_table
    assert table.dtype == np.int32 and table.shape == (case.batch, case.pages_per_sequence)
    assert not all(np.all(np.diff(row) == 1) for row in table)  # not laid out in order
    assert len(set(table.ravel())) == table.size < len(inputs.k_cache)  # spare pages too
    assert np.all(inputs.k_cache != 0)


def test_inputs_are_reproducible_per_case_and_seed():
    case = KVCACHE[1]

    first, again, other = (make_decode_inputs(case, seed) for seed in (0, 0, 1))

    np.testing.assert_array_equal(first.q, again.q)
    np.testing.assert_array_equal(first.k_cache, again.k_cache)
    assert not np.array_equal(first.q, other.q)


def test_the_mla_battery_is_flashmlas_shape_with_the_layers_scale():
    inputs = make_decode_inputs(MLA[0], 0)

    assert all(c.d == 576 and c.dv == 512 and c.heads_kv == 1 for c in MLA)
    assert all(c.scale == MLA_SCALE != 576**-0.5 and c.s_new == 0 for c in MLA)
    assert inputs.v_cache is None and inputs.k_cache.shape[1:] == (64, 1, 576)


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


def test_resolve_names_the_spec_battery_and_refuses_others():
    assert resolve_decode("flash_mla", None) == MLA == resolve_decode("flash_mla", "quick")
    assert resolve_decode("flash_kvcache", [KVCACHE[2].name]) == (KVCACHE[2],)
    with pytest.raises(ValueError, match="runs its own battery"):
        resolve_decode("flash_kvcache", "stress")
    with pytest.raises(ValueError, match="unknown flash_mla case"):
        resolve_decode("flash_mla", [KVCACHE[0].name])
