"""The sparse specs ("sparse", "flash_mla_sparse"): their batteries hold what 2025-2026's sparse
kernels got wrong (lists that overlap across queries, duplicates within a list, sentinels of
every kind, rows with nothing valid, topk_length around 64-entry tiles beside sinks), their
correct targets pass in every dtype, FlashMLA's conventions are judged exactly, and a kernel's
failures are rows that say where."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from parity_tests import check_kernel
from parity_tests.checker import specs
from parity_tests.checker.battery.sparse import INT32_MAX, TILE, make_sparse_inputs
from parity_tests.checker.golden.sparse_baseline import plain_sparse
from parity_tests.checker.judge.sparse import judge_exact_nonfinite
from parity_tests.checker.targets.sparse import flash_mla_sparse_fwd, plain_flash_mla_sparse_fwd
from torch_attention.sparse import sparse_attention

ALL_DTYPES = ["float64", "float32", "float16", "bfloat16"]


def _battery(name: str):
    return specs.get(name).default_battery()


@pytest.mark.parametrize("name", ["sparse", "flash_mla_sparse"])
def test_the_lists_overlap_across_queries_as_an_indexer_s_do(name):
    case = next(c for c in _battery(name) if c.pattern == "overlap")
    indices = make_sparse_inputs(case, 0).indices[:, 0]

    shared = [len(np.intersect1d(indices[t], indices[t + 1])) for t in range(case.s_q - 1)]
    named = np.bincount(indices[(indices >= 0) & (indices < case.s_kv)], minlength=case.s_kv)

    assert min(shared) >= case.topk // 2  # neighbours share at least the recent half
    assert named.max() == case.s_q  # some key row is every query's: its gradient is a sum


@pytest.mark.parametrize("name", ["sparse", "flash_mla_sparse"])
def test_every_pattern_holds_what_it_is_for(name):
    battery = _battery(name)
    by_pattern = {c.pattern: make_sparse_inputs(c, 0).indices for c in battery}
    case = next(c for c in battery if c.pattern == "dead")

    duplicates = by_pattern["duplicates"]
    assert any(len(np.unique(row)) < len(row) for row in duplicates.reshape(-1, case.topk))
    sentinels = set(np.unique(by_pattern["sentinels"]).tolist())
    s_kv = case.s_kv
    assert {-1, -2, s_kv, s_kv + 1, INT32_MAX} <= sentinels
    dead = by_pattern["dead"]
    assert (((dead < 0) | (dead >= s_kv)).all(axis=-1)).any()


@pytest.mark.parametrize("name", ["sparse", "flash_mla_sparse"])
def test_topk_length_reaches_0_1_the_tile_edges_and_topk_beside_sinks(name):
    battery = _battery(name)
    case = next(c for c in battery if c.topk_length and c.sinks)
    drawn = make_sparse_inputs(case, 0)

    assert {0, 1, TILE - 1, TILE, TILE + 1, case.topk} <= set(drawn.topk_length.tolist())
    if case.pattern == "overlap":  # the entries past a length are valid keys: reading shows
        assert ((drawn.indices >= 0) & (drawn.indices < case.s_kv)).all()


def test_flash_mla_sparse_holds_a_second_tile_of_query_rows_and_deepseek_s_shape():
    battery = _battery("flash_mla_sparse")

    assert {c.heads for c in battery} == {16, 64, 128}
    assert any(c.s_q * c.heads > 64 for c in battery)
    assert all((c.d, c.dv, c.heads_kv, c.latent) == (576, 512, 1, True) for c in battery)


def test_sparse_battery_holds_every_head_width_gqa_and_the_latent_form():
    battery = _battery("sparse")

    assert {32, 64, 128, 256} <= {c.d for c in battery}
    assert any(c.d % 2 for c in battery)
    assert any(c.heads_kv != c.heads for c in battery)
    assert any(c.latent for c in battery) and any(not c.latent for c in battery)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_the_torch_twin_passes_the_sparse_battery_with_its_gradients(dtype):
    report = check_kernel(sparse_attention, spec="sparse", dtypes=[dtype])

    assert report.passed, report.failures
    judged = {row.tensor for row in report.rows if row.verdict == "pass"}
    assert {"out", "lse", "dq", "dk", "dv", "dsinks"} <= judged


@pytest.mark.parametrize("kernel", [flash_mla_sparse_fwd, plain_flash_mla_sparse_fwd])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_flash_mla_sparse_s_targets_pass_with_its_conventions(dtype, kernel):
    report = check_kernel(kernel, spec="flash_mla_sparse", dtypes=[dtype])

    assert report.passed, report.failures
    judged = {row.tensor for row in report.rows if row.verdict == "pass"}
    assert {"out", "lse_mla", "max_logits"} <= judged


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_the_plain_kernel_of_the_pitfalls_is_correct_without_its_mistake(dtype):
    report = check_kernel(plain_sparse, spec="sparse", dtypes=[dtype])

    assert report.passed, report.failures
    base = {(r.case, r.tensor): r for r in check_kernel(sparse_attention, spec="sparse",
                                                          dtypes=[dtype]).rows}  # fmt: skip
    # not the baseline itself: its rounding is its own somewhere
    assert any(row.error != base[row.case, row.tensor].error for row in report.rows
               if row.verdict == "pass")  # fmt: skip


def test_a_lonely_query_s_lse_must_be_plus_inf_exactly():
    gold = np.array([[1.0, math.inf], [0.5, 2.0]])

    right = judge_exact_nonfinite("c", "float32", "lse_mla", gold.copy(), gold, gold)
    minus = judge_exact_nonfinite(
        "c", "float32", "lse_mla", np.where(np.isinf(gold), -np.inf, gold), gold, gold
    )
    finite = judge_exact_nonfinite(
        "c", "float32", "lse_mla", np.where(np.isinf(gold), 80.0, gold), gold, gold
    )

    assert right.verdict == "pass"
    assert minus.verdict == "fail" and "FlashMLA's convention" in minus.detail
    assert minus.error / minus.bound == math.inf  # the calibration reads an infinite flag
    assert finite.verdict == "fail"


def test_a_kernel_without_sinks_is_never_given_sinks_and_their_cases_are_not_run():
    given: list[set[str]] = []

    def no_sinks(q, k, v, indices, *, softmax_scale=None, topk_length=None, d_v=None,
                 return_lse=False):  # fmt: skip
        given.append({"topk_length"} if topk_length is not None else set())
        return sparse_attention(q, k, v, indices, softmax_scale=softmax_scale,
                                topk_length=topk_length, d_v=d_v,
                                return_lse=return_lse)  # fmt: skip

    report = check_kernel(no_sinks, spec="sparse", dtypes=["float32"],
                          features={"gqa", "latent", "topk_length", "lse"})  # fmt: skip

    assert report.passed and given
    not_run = {row.case for row in report.rows if row.verdict == "not-run"}
    assert not_run and all("sinks" in name for name in not_run)


def test_a_failing_key_gradient_names_its_key_row():
    def shifted_dk(q, k, v, indices, **options):
        out = sparse_attention(q, k, v, indices, **options)
        first = out[0] if isinstance(out, tuple) else out
        bent = first + 1e-3 * (k[-1].sum() - k[-1].sum().detach())  # dk's last row: 1e-3
        return (bent, out[1]) if isinstance(out, tuple) else bent

    report = check_kernel(shifted_dk, spec="sparse", dtypes=["float64"],
                          cases=[_battery("sparse")[0].name])  # fmt: skip

    row = next(row for row in report.failures if row.tensor == "dk")
    case = _battery("sparse")[0]
    assert f"key row {case.s_kv - 1}" in row.detail


def test_a_result_of_the_wrong_shape_is_an_error_row():
    def transposed(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
        out, logits, lse = flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink,
                                                topk_length)  # fmt: skip
        return out, logits, lse.T

    case = _battery("flash_mla_sparse")[0]
    report = check_kernel(transposed, spec="flash_mla_sparse", dtypes=["float32"],
                          cases=[case.name])  # fmt: skip

    assert [row.verdict for row in report.failures] == ["error"]
    assert "lse_mla" in report.failures[0].detail


def test_indices_reach_the_kernel_as_int32_and_sinks_as_float32_for_flash_mla():
    seen = {}

    def spy(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
        seen["indices"], seen["sinks"] = indices.dtype, attn_sink.dtype
        return flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)

    case = next(c for c in _battery("flash_mla_sparse") if c.sinks)
    check_kernel(spy, spec="flash_mla_sparse", dtypes=["bfloat16"], cases=[case.name])

    assert seen == {"indices": torch.int32, "sinks": torch.float32}


def test_fla_s_naive_dsa_fails_where_its_contract_differs_and_passes_elsewhere():
    # What flash-linear-attention's pure-torch DSA reference showed (docs/kernel-verification.md,
    # "Sparse kernels"): it turns the lists into a dense mask (a duplicate counts once), takes
    # only -1 and T as sentinels (2^31 - 1 raises), gives NaN to a query with no valid entry,
    # and computes in float32; on plain overlapping lists it is right.
    pytest.importorskip("fla.ops.dsa.naive")
    from parity_tests.checker.targets.sparse import fla_naive_dsa

    report = check_kernel(fla_naive_dsa, spec="sparse", dtypes=["float32"],
                          features={"gqa", "latent"})  # fmt: skip

    verdicts: dict[str, set[str]] = {}
    for row in report.rows:
        if row.verdict != "not-run":
            verdicts.setdefault(row.case.split("-")[1], set()).add(row.verdict)
    assert verdicts == {"overlap": {"pass"}, "duplicates": {"fail"}, "sentinels": {"error"},
                        "dead": {"pass", "nonfinite"}}  # fmt: skip
    errors = [row.detail for row in report.rows if row.verdict == "error"]
    assert all("2147483647 is out of bounds" in detail for detail in errors)


def test_head_dims_limits_judge_each_case_at_the_nearest_width_and_other_limits_are_refused():
    from parity_tests.checker.battery.limits import KernelLimits

    report = check_kernel(sparse_attention, spec="sparse", dtypes=["float32"],
                          limits=KernelLimits(head_dims=(64, 128)))  # fmt: skip

    assert report.passed
    judged = {row.case for row in report.rows if row.verdict == "pass"}
    assert {report.cases[name].d for name in judged} == {64, 128}
    assert all(why.startswith("D = ") for why, _ in report.excluded.values())
    with pytest.raises(ValueError, match="takes no page_sizes"):
        check_kernel(sparse_attention, spec="sparse", limits=KernelLimits(page_sizes=(16,)))
    with pytest.raises(ValueError, match="head width 576, outside head_dims"):
        check_kernel(flash_mla_sparse_fwd, spec="flash_mla_sparse",
                     limits=KernelLimits(head_dims=(64,)))  # fmt: skip
