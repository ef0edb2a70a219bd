"""The serving specs ("flashinfer_paged", "vllm_paged", "flashinfer_merge"): their batteries hold
what serving kernels got wrong in 2025-2026 (mixed prefill/decode batches, every page edge, pages
past 128 tokens, tables wider than needed, page ids past 16 bits, far-below-zero logits, base-2
lse, -inf states), the twins pass them in every dtype, the plain kernel of the pitfalls is
correct without its mistake, and a kernel's failures are rows that say where."""

from __future__ import annotations

import math

import numpy as np
import pytest

from parity_tests import check_kernel, plan_groups
from parity_tests.checker import specs
from parity_tests.checker.battery.limits import KernelLimits
from parity_tests.checker.battery.serving import (
    SHIFT,
    TABLE_EXTRA,
    WIDE_IDS,
    make_merge_inputs,
    make_paged_inputs,
)
from parity_tests.checker.golden.serving import serving_inputs
from parity_tests.checker.pitfalls import flashinfer_merge as merge_pitfalls
from parity_tests.checker.pitfalls import vllm_paged as vllm_pitfalls
from parity_tests.checker.targets.serving import (
    flashinfer_wrapper,
    merge,
    plain_flashinfer_wrapper,
    plain_merge,
    plain_vllm_attention,
    vllm_attention,
)

ALL_DTYPES = ["float64", "float32", "float16", "bfloat16"]
TARGETS = {"flashinfer_paged": flashinfer_wrapper, "vllm_paged": vllm_attention,
           "flashinfer_merge": merge}  # fmt: skip


def _battery(name: str):
    return specs.get(name).default_battery()


@pytest.mark.parametrize("name", ["flashinfer_paged", "vllm_paged"])
def test_paged_batteries_hold_every_page_edge_mixed_batches_and_wide_ids(name):
    battery = _battery(name)
    pages = {c.page_size for c in battery}

    assert {16, 64, 128, 256} <= pages and any(p > 128 and p & (p - 1) for p in pages)
    for case in battery:  # every page edge at every page size
        assert {max(case.page_size - 1, 1), case.page_size, case.page_size + 1} <= set(
            n - case.prefix for n in case.kv_lens)
    mixed = next(c for c in battery if c.batch == "mixed" and c.page_size > 1)
    kinds = {(n == kv) or (n, kv) for n, kv in zip(mixed.q_lens, mixed.kv_lens, strict=True)}
    assert True in kinds and any(n == 1 for n in mixed.q_lens) and 0 in mixed.q_lens
    assert any(1 < n < kv for n, kv in zip(mixed.q_lens, mixed.kv_lens, strict=True))
    assert {32, 64, 128, 256} <= {c.d for c in battery} and any(c.d % 2 for c in battery)
    wide = next(c for c in battery if c.pool_pages > WIDE_IDS)
    drawn = make_paged_inputs(wide, 0)
    read = [drawn.block_table[b, : -(-n // wide.page_size)] for b, n in enumerate(wide.kv_lens)
            if wide.q_lens[b]]  # fmt: skip
    assert max(int(ids.max()) for ids in read) >= WIDE_IDS  # a page past 16 bits is read


def test_tables_are_wider_than_needed_and_vllm_keeps_block_0_null():
    fi = next(c for c in _battery("flashinfer_paged") if c.batch == "mixed")
    given = serving_inputs(fi, "float32", _cpu(), 0)
    assert len(given["paged_kv_indices"]) > int(given["paged_kv_indptr"][-1])  # spare entries
    assert {str(t.dtype) for n, t in given.items() if n.startswith(("paged", "qo"))} == {
        "torch.int32"}

    case = next(c for c in _battery("vllm_paged") if c.batch == "mixed")
    drawn = make_paged_inputs(case, 0)
    for b, n in enumerate(case.kv_lens):
        needed = -(-n // case.page_size)
        assert (drawn.block_table[b, :needed] > 0).all()  # never the null block
        assert (drawn.block_table[b, needed:] == 0).all()  # padded with it
    assert drawn.block_table.shape[1] >= max(-(-n // case.page_size) for n in case.kv_lens) + \
        TABLE_EXTRA
    pages, offsets = drawn.slot_mapping // case.page_size, drawn.slot_mapping % case.page_size
    assert not np.array_equal(drawn.k_pages[pages, offsets], drawn.key)  # not written yet


def test_shifted_values_move_some_queries_far_below_zero():
    case = next(c for c in _battery("flashinfer_paged") if c.values == "shifted")
    drawn = make_paged_inputs(case, 0)
    shift = drawn.k_pages[drawn.block_table[0, 0], 0, 0] - 0  # one key: ~ c + noise
    group = case.heads // case.heads_kv
    moved = drawn.q[:, ::group] @ shift / math.sqrt(case.d)  # (T, H_kv) ~ each query's shift

    assert (moved < -SHIFT / 4).any() and (moved > SHIFT / 4).any()


def test_merge_patterns_reach_overflow_and_dead_tokens():
    battery = _battery("flashinfer_merge")
    far = make_merge_inputs(next(c for c in battery if c.pattern == "far"), 0).s
    dead = make_merge_inputs(next(c for c in battery if c.pattern == "dead"), 0).s

    assert np.ptp(far[np.isfinite(far)]) > 256  # 2^256 overflows float32
    assert np.isneginf(dead).all(axis=1).any()
    assert {2, 3} == {c.states for c in battery}


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_twins_pass_the_serving_batteries(name, dtype):
    report = check_kernel(TARGETS[name], spec=name, dtypes=[dtype])

    assert report.passed, report.failures
    judged = {row.tensor for row in report.rows if row.verdict == "pass"}
    expected = {"flashinfer_paged": {"out", "lse"}, "vllm_paged": {"out", "kv_cache"},
                "flashinfer_merge": {"v", "s"}}[name]  # fmt: skip
    assert expected <= judged


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize(("name", "kernel"), [("flashinfer_paged", plain_flashinfer_wrapper),
                                              ("vllm_paged", plain_vllm_attention),
                                              ("flashinfer_merge", plain_merge)])
def test_the_plain_kernel_of_the_pitfalls_is_correct_without_its_mistake(name, kernel, dtype):
    report = check_kernel(kernel, spec=name, dtypes=[dtype])

    assert report.passed, report.failures
    if dtype != "float64":  # not the baseline itself: its rounding is its own somewhere
        twin = {(r.case, r.tensor): r.error for r in check_kernel(
            TARGETS[name], spec=name, dtypes=[dtype]).rows}  # fmt: skip
        assert any(row.error != twin[row.case, row.tensor] for row in report.rows
                   if row.verdict == "pass")  # fmt: skip


def test_a_wrong_table_stride_names_a_later_sequence():
    case = vllm_pitfalls.PITFALLS["vllm_table_stride"].case
    report = check_kernel(vllm_pitfalls.vllm_table_stride, spec="vllm_paged",
                          dtypes=["float64"], cases=[case])  # fmt: skip

    row = next(row for row in report.failures if row.tensor == "out")
    assert "worst at sequence" in row.detail and "worst at sequence 0 " not in row.detail


def test_a_write_outside_slot_mapping_fails_the_cache_row_however_small():
    def stray(query, key, value, kv_cache, attn_metadata, **options):
        out = vllm_attention(query, key, value, kv_cache, attn_metadata, **options)
        kv_cache[1, 0, 0, 0, 0] += 1e-12  # the null block, never a sequence's
        return out

    report = check_kernel(stray, spec="vllm_paged", dtypes=["float64"],
                          cases=[_battery("vllm_paged")[0].name])  # fmt: skip

    row = next(row for row in report.failures if row.tensor == "kv_cache")
    assert "outside slot_mapping" in row.detail and "page 0" in row.detail


def test_a_dead_token_s_must_stay_minus_inf():
    case = merge_pitfalls.PITFALLS["merge_dead_lse_zero"].case
    report = check_kernel(merge_pitfalls.merge_dead_lse_zero, spec="flashinfer_merge",
                          dtypes=["float32"], cases=[case])  # fmt: skip

    row = next(row for row in report.failures if row.tensor == "s")
    assert row.error == math.inf and "every state saw nothing" in row.detail


def test_a_kernel_claiming_no_sinks_is_never_given_sinks():
    given = []

    def no_sinks(kv_layout):
        wrapper = flashinfer_wrapper(kv_layout)
        run = wrapper.run

        def checked_run(q, cache, **options):
            given.append("sinks" in options)
            return run(q, cache, **options)

        wrapper.run = checked_run
        return wrapper

    features = specs.get("flashinfer_paged").features - {"sinks"}
    report = check_kernel(no_sinks, spec="flashinfer_paged", dtypes=["float32"],
                          features=features)  # fmt: skip

    assert report.passed and given and not any(given)
    assert {row.verdict for row in report.rows if "sinks" in row.case} <= {"not-run"}


def test_limits_move_cases_to_the_pages_and_widths_a_kernel_takes():
    limits = KernelLimits(head_dims=(64, 128, 256), page_sizes=(16, 64))
    groups = plan_groups("flashinfer_paged", dtypes=["float32"], cases="default", limits=limits)
    instead = [g for g in groups if not g.runs]
    runs = {g.case for g in groups if g.runs}
    moved = next(g.detail.rpartition("judged instead: ")[2] for g in instead
                 if "pages of 1 " in g.detail)  # fmt: skip

    assert instead and moved in runs
    assert "-p16-" in moved or "-p64-" in moved
    assert not any(f"-d{d}-" in name for name in runs for d in (32, 41))
    report = check_kernel(flashinfer_wrapper, spec="flashinfer_paged", dtypes=["float32"],
                          cases=[moved], limits=limits)  # fmt: skip
    assert report.passed, report.failures


def _cpu():
    import torch

    return torch.device("cpu")
