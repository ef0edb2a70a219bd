"""numpy_attention.decode.serving in float64: FlashInfer's CSR page table (values and refusals),
its paged prefill in every cache layout against ``paged_prefill_forward``, base-2 lse, its merge
operators against ``merge_attention_forward`` and against attention over the union of the keys;
vLLM's call: the slot writes land where the block table says (-1 skipped), the attention is
``paged_prefill_forward``'s on the cache after them, the cascade is the plain call, and every bad
input is one clear error with the cache untouched.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from numpy_attention.decode.prefill import paged_prefill_forward
from numpy_attention.decode.serving import (
    csr_block_table,
    flashinfer_paged_forward,
    merge_state,
    merge_states,
    vllm_paged_forward,
)
from numpy_attention.functional import attention_forward
from numpy_attention.merge import merge_attention_forward

from ...conftest import assert_close
from .test_prefill import DV, GARBAGE, H_KV, Batch, H, P, make_batch

I32 = np.int32


def csr(batch: Batch) -> dict[str, np.ndarray]:
    """The batch's block table as FlashInfer's int32 CSR arrays."""
    pairs = list(zip(batch.block_table, batch.kv_lens, strict=True))
    rows = [row[row < GARBAGE][: -(-int(n) // P)] for row, n in pairs]
    last = [
        n - (len(row) - 1) * P if len(row) else 0 for row, (_, n) in zip(rows, pairs, strict=True)
    ]
    return {
        "paged_kv_indptr": np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(I32),
        "paged_kv_indices": np.concatenate([[], *rows]).astype(I32),
        "paged_kv_last_page_len": np.asarray(last, I32),
    }


# -- FlashInfer: the CSR table --------------------------------------------------------------------


def test_csr_block_table_reads_each_row_and_length():
    table, lens = csr_block_table(
        np.array([0, 2, 2, 5], I32), np.array([7, 3, 0, 1, 4], I32), np.array([1, 0, 4], I32),
        page_size=4, num_pages=8,
    )  # fmt: skip

    np.testing.assert_array_equal(table, [[7, 3, 0], [0, 0, 0], [0, 1, 4]])
    np.testing.assert_array_equal(lens, [5, 0, 12])
    assert table.dtype == np.int64 and lens.dtype == np.int64


CSR_GOOD = {
    "paged_kv_indptr": np.array([0, 2, 3], I32),
    "paged_kv_indices": np.array([1, 2, 0], I32),
    "paged_kv_last_page_len": np.array([3, 4], I32),
}


@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        ("paged_kv_indptr", np.array([[0, 2, 3]], I32), ValueError, "paged_kv_indptr must be 1-D"),
        ("paged_kv_indices", np.array([1, 2, 0]), TypeError, "must be int32.*FlashInfer #725"),
        ("paged_kv_indptr", np.array([1, 2, 3], I32), ValueError, "must start at 0"),
        (
            "paged_kv_indptr",
            np.array([0, 3, 2], I32),
            ValueError,
            "sequence 1: paged_kv_indptr dec",
        ),
        ("paged_kv_indptr", np.array([0, 2, 4], I32), ValueError, "must end at or before 3, got 4"),
        (
            "paged_kv_last_page_len",
            np.array([0, 4], I32),
            ValueError,
            r"sequence 0: .* outside \[1",
        ),
        (
            "paged_kv_last_page_len",
            np.array([3, 5], I32),
            ValueError,
            "sequence 1: .* 5 is outside",
        ),
        ("paged_kv_last_page_len", np.array([-1, 4], I32), ValueError, "-1 is outside"),
        ("paged_kv_last_page_len", np.array([3], I32), ValueError, r"must have shape \(2,\)"),
        ("paged_kv_indices", np.array([1, 2, 5], I32), ValueError, r"indices\[2\] = 5 is not one"),
        ("paged_kv_indices", np.array([1, -1, 0], I32), ValueError, r"sequence 0: .*\[1\] = -1"),
    ],
)
def test_csr_block_table_refusals(name, value, error, match):
    with pytest.raises(error, match=match):
        csr_block_table(**{**CSR_GOOD, name: value}, page_size=4, num_pages=5)


def test_csr_sequence_without_pages_must_have_last_page_len_0():
    with pytest.raises(ValueError, match="sequence 1: no pages but paged_kv_last_page_len 2"):
        csr_block_table(np.array([0, 1, 1], I32), np.array([0], I32), np.array([1, 2], I32), 4, 1)


# -- FlashInfer: the paged prefill ----------------------------------------------------------------


def _layouts(batch: Batch) -> dict[str, tuple[Any, str]]:
    """The batch's pages as each paged_kv_cache form (the 5-D forms only when D == Dv)."""
    k, v = batch.k_pages, batch.v_pages
    hnd = (np.ascontiguousarray(k.swapaxes(1, 2)), np.ascontiguousarray(v.swapaxes(1, 2)))
    forms: dict[str, tuple[Any, str]] = {"NHD pair": ((k, v), "NHD"), "HND pair": (hnd, "HND")}
    if k.shape == v.shape:
        forms["NHD 5-D"] = (np.stack([k, v], axis=1), "NHD")
        forms["HND 5-D"] = (np.stack(hnd, axis=1), "HND")
    return forms


@pytest.mark.parametrize("layout", ["NHD pair", "HND pair", "NHD 5-D", "HND 5-D"])
@pytest.mark.parametrize("causal", [False, True])
def test_flashinfer_layouts_are_the_paged_prefill(rng, layout, causal):
    batch = make_batch(rng)
    batch = batch._replace(v_pages=rng.standard_normal(batch.k_pages.shape))  # Dv = D for 5-D
    cache, kv_layout = _layouts(batch)[layout]
    expected = paged_prefill_forward(**batch.call(), causal=causal, window_left=3, return_lse=True)

    out, lse = flashinfer_paged_forward(
        batch.q, cache, qo_indptr=batch.qo_indptr.astype(I32), **csr(batch), kv_layout=kv_layout,
        causal=causal, window_left=3, return_lse=True,
    )  # fmt: skip

    np.testing.assert_array_equal(out, expected.out)
    np.testing.assert_array_equal(lse, expected.lse / math.log(2))  # base 2 = natural / ln 2


def test_flashinfer_lse_is_base_2_in_float32_for_float16(rng):
    batch = make_batch(rng, dtype=np.float16)

    out, lse = flashinfer_paged_forward(
        batch.q, (batch.k_pages, batch.v_pages), qo_indptr=batch.qo_indptr.astype(I32),
        **csr(batch), causal=True, logits_soft_cap=2.0, return_lse=True,
    )  # fmt: skip
    natural = paged_prefill_forward(**batch.call(), causal=True, softcap=2.0, return_lse=True)

    assert out.dtype == np.float16 and lse.dtype == np.float32
    assert natural.lse is not None
    assert_close(np.exp2(lse), np.exp(natural.lse), name="sum of exp")


def test_flashinfer_returns_out_alone_by_default(rng):
    batch = make_batch(rng)
    out = flashinfer_paged_forward(
        batch.q, (batch.k_pages, batch.v_pages), qo_indptr=batch.qo_indptr.astype(I32),
        **csr(batch),
    )  # fmt: skip
    assert isinstance(out, np.ndarray) and out.shape == (len(batch.q), H, DV)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"qo_indptr": np.array([0, 12])}, TypeError, "qo_indptr must be int32"),
        ({"kv_layout": "NDH"}, ValueError, "kv_layout must be 'NHD' or 'HND'"),
        ({"paged_kv_cache": "5-D of 3"}, ValueError, r"one array must be \(num_pages, 2"),
        ({"paged_kv_cache": "triple"}, ValueError, "one 5-D array or a"),
    ],
)
def test_flashinfer_refusals(rng, change, error, match):
    batch = make_batch(rng)
    call: dict[str, Any] = {
        "paged_kv_cache": (batch.k_pages, batch.v_pages),
        "qo_indptr": batch.qo_indptr.astype(I32),
        **csr(batch),
    }
    call.update(change)
    if call["paged_kv_cache"] == "5-D of 3":
        call["paged_kv_cache"] = np.stack([batch.k_pages] * 3, axis=1)
    elif call["paged_kv_cache"] == "triple":
        call["paged_kv_cache"] = (batch.k_pages, batch.k_pages, batch.k_pages)
    with pytest.raises(error, match=match):
        flashinfer_paged_forward(batch.q, **call)


# -- FlashInfer: merge_state, merge_states --------------------------------------------------------


def _states(rng, splits: list[int]) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Attention of 5 queries over keys split into parts of ``splits`` keys: the output over
    all keys (5, H, DV), and each part's state (v (5, H, DV), s (5, H) base 2)."""
    q = rng.standard_normal((1, H, 5, 8))
    k = rng.standard_normal((1, H, sum(splits), 8))
    v = rng.standard_normal((1, H, sum(splits), DV))
    full = attention_forward(q, k, v).out[0].swapaxes(0, 1)
    states, at = [], 0
    for size in splits:
        part = attention_forward(
            q, k[:, :, at : at + size], v[:, :, at : at + size], return_lse=True
        )
        assert part.lse is not None
        states.append((part.out[0].swapaxes(0, 1), part.lse[0].T / math.log(2)))
        at += size
    return full, states


def test_merge_state_is_the_natural_merge_in_base_2(rng):
    (_, [(v_a, s_a), (v_b, s_b)]) = _states(rng, [3, 6])
    s_b[1, 2] = -np.inf  # a state that saw nothing weighs 0
    expected = merge_attention_forward(v_a, s_a * math.log(2), v_b, s_b * math.log(2))

    v, s = merge_state(v_a, s_a, v_b, s_b)

    np.testing.assert_array_equal(v, expected.out)
    assert_close(s * math.log(2), expected.lse, name="s")
    np.testing.assert_array_equal(v[1, 2], v_a[1, 2])


def test_merge_states_is_the_attention_over_all_keys(rng):
    full, states = _states(rng, [2, 5, 1, 4])
    v = np.stack([state[0] for state in states], axis=1)  # (T, S, H, DV)
    s = np.stack([state[1] for state in states], axis=1)  # (T, S, H)

    merged, lse = merge_states(v, s)
    pair, _ = merge_state(
        *merge_state(*states[0], *states[1]), *merge_state(*states[2], *states[3])
    )

    assert_close(merged, full, name="v")
    assert_close(pair, full, name="v of merge_state")
    assert lse.shape == (5, H)


def test_dead_states_merge_to_zero_and_minus_inf(rng):
    v = rng.standard_normal((2, 3, H, DV))
    s = np.full((2, 3, H), -np.inf)

    merged, lse = merge_states(v, s)
    pair_v, pair_s = merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
    empty_v, empty_s = merge_states(v[:, :0], s[:, :0])

    for out, log in ((merged, lse), (pair_v, pair_s), (empty_v, empty_s)):
        np.testing.assert_array_equal(out, 0.0)
        assert np.all(np.isneginf(log))


def test_merge_refusals(rng):
    v = rng.standard_normal((2, H, DV))
    with pytest.raises(ValueError, match=r"v_b must be \(T, H, D\) and s_b \(T, H\)"):
        merge_state(v, np.zeros((2, H)), v, np.zeros((2, H + 1)))
    with pytest.raises(ValueError, match=r"v must be \(T, S, H, D\)"):
        merge_states(v, np.zeros((2, H)))


# -- vLLM -----------------------------------------------------------------------------------------


def vllm_step(rng, queries=(4, 2, 1, 0), lengths=(4, 9, 6, 5), *, prefix_pages=0, padding=1):
    """A vLLM step: a cache whose block 0 is the null block, each sequence's blocks drawn from
    the rest, its last n_b tokens new (written by the call at the slots the table gives), and
    ``padding`` padding tokens at the end with slot -1."""
    batch = make_batch(rng, list(queries), list(lengths), prefix_pages=prefix_pages)
    used = batch.block_table < GARBAGE
    table = np.where(used, batch.block_table + 1, 0)  # block 0 free: the null block, never used
    cache = np.zeros((2, len(batch.k_pages) + 1, P, H_KV, 8))
    cache[0, 1:] = batch.k_pages
    cache[1, 1:] = batch.v_pages[..., :2].repeat(4, axis=-1)  # vLLM's values have D too
    tokens = sum(queries) + padding
    key, value = rng.standard_normal((2, tokens, H_KV, 8))
    slots = np.full(tokens, -1, np.int64)
    for b, (n, length) in enumerate(zip(queries, lengths, strict=True)):
        start = sum(queries[:b])
        for i, position in enumerate(range(length - n, length)):
            slots[start + i] = table[b, position // P] * P + position % P
    query = rng.standard_normal((tokens, H, 8))
    call = {
        "query": query, "key": key, "value": value, "kv_cache": cache,
        "query_start_loc": np.concatenate([[0], np.cumsum(queries)]).astype(I32),
        "seq_lens": np.asarray(lengths, I32), "block_table": table.astype(I32),
        "slot_mapping": slots,
    }  # fmt: skip
    return call


def test_vllm_writes_each_new_token_where_the_table_says_and_attends(rng):
    call = vllm_step(rng)
    before = call["kv_cache"].copy()

    out, lse = vllm_paged_forward(**call, return_lse=True)

    cache, slots, end = call["kv_cache"], call["slot_mapping"], call["query_start_loc"][-1]
    for t, slot in enumerate(slots):
        if slot >= 0:
            np.testing.assert_array_equal(cache[0, slot // P, slot % P], call["key"][t])
            np.testing.assert_array_equal(cache[1, slot // P, slot % P], call["value"][t])
    written = np.zeros(cache.shape[1:3], bool)
    written[slots[slots >= 0] // P, slots[slots >= 0] % P] = True
    np.testing.assert_array_equal(cache[:, ~written], before[:, ~written])  # nothing else
    assert (slots == -1).sum() == 1  # the padding token: not written, out 0, lse -inf
    expected = paged_prefill_forward(
        call["query"][:end], cache[0], cache[1], qo_indptr=call["query_start_loc"],
        block_table=call["block_table"], kv_lens=call["seq_lens"], causal=True, return_lse=True,
    )  # fmt: skip
    np.testing.assert_array_equal(out[:end], expected.out)
    np.testing.assert_array_equal(lse[:end], expected.lse)
    np.testing.assert_array_equal(out[end:], 0.0)
    assert np.all(np.isneginf(lse[end:]))


@pytest.mark.parametrize("sinks", [False, True])
def test_vllm_common_prefix_is_the_plain_call(rng, sinks):
    options = {"sinks": rng.standard_normal(H)} if sinks else {}
    plain = vllm_step(rng, (1, 3, 2), (10, 11, 10), prefix_pages=2)
    cascade = {**plain, "kv_cache": plain["kv_cache"].copy()}

    expected = vllm_paged_forward(**plain, return_lse=True, **options)
    result = vllm_paged_forward(**cascade, common_prefix_len=2 * P, return_lse=True, **options)

    end = plain["query_start_loc"][-1]  # the padding token's lse is -inf in both
    np.testing.assert_array_equal(cascade["kv_cache"], plain["kv_cache"])
    assert_close(result[0], expected[0], name="out")
    assert_close(result[1][:end], expected[1][:end], name="lse")
    assert np.all(np.isneginf(result[1][end:])) and np.all(np.isneginf(expected[1][end:]))


def _vllm_bad(call: dict[str, Any], name: str) -> tuple[type, str]:
    """Break one argument of ``call`` in place; the error and message expected."""
    slots, table = call["slot_mapping"], call["block_table"]
    pool = call["kv_cache"].shape[1] * P
    if name == "slot_past_the_pool":
        slots[0] = pool
        return ValueError, f"token 0: slot_mapping {pool} is outside the pool's"
    if name == "slot_below_minus_1":
        slots[1] = -2
        return ValueError, "token 1: slot_mapping -2 is outside"
    if name == "duplicate_slot":
        slots[5] = slots[2]
        return ValueError, "tokens 2 and 5 both write slot"
    if name == "slot_in_the_null_block":
        slots[3] = 1
        return ValueError, "token 3: slot_mapping 1 lies in block 0, .* null block"
    if name == "null_block_in_the_table":
        table[1, 2] = 0
        return ValueError, r"sequence 1: block_table\[1, 2\] = 0, but block 0 is the null block"
    if name == "length_past_the_table":
        call["seq_lens"] = np.array([4, 9, 6, table.shape[1] * P + 1], I32)
        return ValueError, "sequence 3: seq_lens .* but its block_table row holds"
    if name == "query_start_loc_decreasing":
        call["query_start_loc"] = np.array([0, 4, 3, 7, 7], I32)
        return ValueError, "sequence 1: query_start_loc decreases, 4 then 3"
    if name == "query_start_loc_past_T":
        call["query_start_loc"] = np.array([0, 4, 6, 7, 9], I32)
        return ValueError, "query_start_loc must end at or before 8, got 9"
    if name == "float_slots":
        call["slot_mapping"] = slots.astype(np.float64)
        return TypeError, "slot_mapping must be an integer array"
    if name == "float_seq_lens":
        call["seq_lens"] = call["seq_lens"].astype(np.float32)
        return TypeError, "seq_lens must be an integer array"
    if name == "prefix_not_whole_blocks":
        call["common_prefix_len"] = 2
        return ValueError, "common_prefix_len must be a multiple >= 0 of the page size 4"
    if name == "prefix_past_a_query":
        call["common_prefix_len"] = 4
        return ValueError, "sequence 0: common_prefix_len 4 reaches past its 0 keys"
    call["key"] = call["key"][:, :1]
    return ValueError, r"key and value must be \(T, H_kv, D\)"


@pytest.mark.parametrize(
    "name",
    [
        "slot_past_the_pool",
        "slot_below_minus_1",
        "duplicate_slot",
        "slot_in_the_null_block",
        "null_block_in_the_table",
        "length_past_the_table",
        "query_start_loc_decreasing",
        "query_start_loc_past_T",
        "float_slots",
        "float_seq_lens",
        "prefix_not_whole_blocks",
        "prefix_past_a_query",
        "key_shape",
    ],
)
def test_vllm_bad_input_is_refused_before_anything_is_written(rng, name):
    call = vllm_step(rng)
    error, match = _vllm_bad(call, name)
    before = call["kv_cache"].copy()

    with pytest.raises(error, match=match):
        vllm_paged_forward(**call)

    np.testing.assert_array_equal(call["kv_cache"], before)


def test_float32_sinks_are_taken_as_the_serving_apis_give_them(rng):
    batch = make_batch(rng)
    sinks = rng.standard_normal(H).astype(np.float32)  # FlashInfer's and vLLM's sinks dtype
    expected = paged_prefill_forward(**batch.call(), sinks=sinks.astype(np.float64))
    call = vllm_step(rng)
    plain = {**call, "kv_cache": call["kv_cache"].copy()}

    out = flashinfer_paged_forward(
        batch.q, (batch.k_pages, batch.v_pages), qo_indptr=batch.qo_indptr.astype(I32),
        **csr(batch), sinks=sinks,
    )  # fmt: skip
    vllm_out = vllm_paged_forward(**call, sinks=sinks)

    np.testing.assert_array_equal(out, expected.out)
    np.testing.assert_array_equal(vllm_out, vllm_paged_forward(**plain, sinks=sinks.astype(float)))
