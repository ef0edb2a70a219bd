"""paged_prefill_forward and cascade_prefill_forward (numpy_attention.decode.prefill) in float64:
against a plain reference written here (each sequence's keys gathered from its pages by the test,
every query at its absolute position), against ``varlen_attention_forward`` on the packed keys,
against the decode step at one query per sequence; the cascade against the plain call; the
refusals of the prefill contract (serving_arguments.plan_prefill and check_prefix).

The batch mixes what a serving step mixes: a prefill (n_b = kv_len), a chunked prefill (1 < n_b
< kv_len), decodes (n_b = 1) and an empty sequence (n_b = 0), with lengths around page edges,
pages shuffled in the pool and a table wider than needed with garbage past the need.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pytest

from numpy_attention.decode.paged import kvcache_attention_forward
from numpy_attention.decode.prefill import cascade_prefill_forward, paged_prefill_forward
from numpy_attention.varlen import varlen_attention_forward

from ...conftest import assert_close

H, H_KV, D, DV, P = 4, 2, 8, 6, 4  # query heads, kv heads, head widths, page size
GARBAGE = 10**9  # a page id far outside the pool, past each sequence's need: never read
QUERIES = [5, 3, 1, 0, 1, 2]  # prefill, chunked prefill, decode, empty, decode, chunked
LENGTHS = [5, 11, 9, 4, 1, 8]  # kv_lens: page edge, 2 pages + 3, 2 + 1, one full, 1, 2 full


class Batch(NamedTuple):
    q: np.ndarray  # (T, H, D)
    k_pages: np.ndarray  # (num_pages, P, H_KV, D)
    v_pages: np.ndarray  # (num_pages, P, H_KV, DV)
    qo_indptr: np.ndarray  # (B + 1,)
    block_table: np.ndarray  # (B, max pages + 2), GARBAGE past the need
    kv_lens: np.ndarray  # (B,)
    keys: list[np.ndarray]  # per sequence, (kv_len, H_KV, D): what its pages hold, in order
    values: list[np.ndarray]

    def call(self) -> dict[str, Any]:
        """The arguments of paged_prefill_forward."""
        return {
            "q": self.q,
            "k_pages": self.k_pages,
            "v_pages": self.v_pages,
            "qo_indptr": self.qo_indptr,
            "block_table": self.block_table,
            "kv_lens": self.kv_lens,
        }


def make_batch(
    rng: np.random.Generator,
    queries: list[int] = QUERIES,
    lengths: list[int] = LENGTHS,
    *,
    prefix_pages: int = 0,
    shuffle: bool = True,
    dtype: Any = np.float64,
) -> Batch:
    """Sequences whose pages are drawn from a pool (shuffled, or in order), the first
    ``prefix_pages`` of every row being the same pages; the table is 2 columns wider than the
    longest sequence needs, GARBAGE there."""
    own = [-(-length // P) - prefix_pages for length in lengths]
    num_pages = prefix_pages + sum(own) + 3  # 3 pages nobody holds
    order = rng.permutation(num_pages) if shuffle else np.arange(num_pages)
    k_pages = rng.standard_normal((num_pages, P, H_KV, D)).astype(dtype)
    v_pages = rng.standard_normal((num_pages, P, H_KV, DV)).astype(dtype)
    table = np.full((len(lengths), prefix_pages + max(own, default=0) + 2), GARBAGE, np.int64)
    keys, values, at = [], [], prefix_pages
    for b, length in enumerate(lengths):
        pages = np.concatenate([order[:prefix_pages], order[at : at + own[b]]])
        at += own[b]
        table[b, : len(pages)] = pages
        keys.append(k_pages[pages].reshape(-1, H_KV, D)[:length])  # (kv_len, H_KV, D)
        values.append(v_pages[pages].reshape(-1, H_KV, DV)[:length])
    q = rng.standard_normal((sum(queries), H, D)).astype(dtype)
    qo_indptr = np.concatenate([[0], np.cumsum(queries)]).astype(np.int64)
    return Batch(q, k_pages, v_pages, qo_indptr, table, np.asarray(lengths), keys, values)


def plain_reference(batch: Batch, *, causal=False, window_left=-1, softcap=0.0, sinks=None):
    """FlashInfer's paged prefill semantics in plain NumPy on the test's own gathered keys:
    (out (T, H, DV), lse (T, H)), every query at its absolute position p_i = kv_len - n + i."""
    out = np.zeros(batch.q.shape[:2] + (DV,))
    lse = np.full(batch.q.shape[:2], -np.inf)
    for b, length in enumerate(batch.kv_lens):
        start, stop = batch.qo_indptr[b], batch.qo_indptr[b + 1]
        n = stop - start
        keys = np.repeat(batch.keys[b], H // H_KV, axis=1)  # (L, H, D)
        values = np.repeat(batch.values[b], H // H_KV, axis=1)
        scores = np.einsum("ihd,jhd->hij", batch.q[start:stop], keys) / math.sqrt(D)
        if softcap:
            scores = softcap * np.tanh(scores / softcap)
        p = (length - n + np.arange(n))[:, None]
        j = np.arange(length)[None, :]
        visible = np.ones((n, length), bool)
        if causal:
            visible &= j <= p
        if window_left >= 0:
            visible &= j >= p - window_left
        scores = np.where(visible, scores, -np.inf)  # (H, n, L)
        if sinks is not None:  # a column of the sink logit, with no value
            scores = np.concatenate([scores, np.broadcast_to(sinks[:, None, None], (H, n, 1))], 2)
            values = np.concatenate([values, np.zeros((1, H, DV))])
        top = scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores - top)
        total = weights.sum(axis=-1, keepdims=True)
        out[start:stop] = np.einsum("hij,jhd->ihd", weights / total, values)
        lse[start:stop] = (np.log(total) + top)[..., 0].T
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_left", [-1, 0, 3])
def test_mixed_batch_matches_the_plain_reference(rng, causal, window_left):
    batch = make_batch(rng)
    expected = plain_reference(batch, causal=causal, window_left=window_left)

    result = paged_prefill_forward(
        **batch.call(), causal=causal, window_left=window_left, return_lse=True
    )

    assert_close(result.out, expected[0], name="out")
    assert_close(result.lse, expected[1], name="lse")


@pytest.mark.parametrize("option", ["softcap", "sinks", "scale"])
def test_score_options_match_the_plain_reference(rng, option):
    batch = make_batch(rng)
    sinks = rng.standard_normal(H)
    given: dict[str, Any] = {
        "softcap": {"softcap": 1.5},
        "sinks": {"sinks": sinks},
        "scale": {"softmax_scale": 1 / math.sqrt(D)},  # the default, given explicitly
    }[option]
    expected = plain_reference(
        batch, causal=True, softcap=given.get("softcap", 0.0), sinks=given.get("sinks")
    )

    result = paged_prefill_forward(**batch.call(), causal=True, return_lse=True, **given)

    assert_close(result.out, expected[0], name="out")
    assert_close(result.lse, expected[1], name="lse")


@pytest.mark.parametrize("causal", [False, True])
def test_matches_varlen_on_the_packed_keys(rng, causal):
    batch = make_batch(rng)
    cu_k = np.concatenate([[0], np.cumsum(batch.kv_lens)])
    expected = varlen_attention_forward(
        batch.q, np.concatenate(batch.keys), np.concatenate(batch.values), batch.qo_indptr, cu_k,
        causal=causal, align="bottom-right", enable_gqa=True, return_lse=True,
    )  # fmt: skip

    result = paged_prefill_forward(**batch.call(), causal=causal, return_lse=True)

    assert_close(result.out, expected.out, name="out")
    assert_close(result.lse, expected.lse.T, name="lse")  # varlen's lse is (H, T)


@pytest.mark.parametrize("window_left", [-1, 2])
def test_one_query_per_sequence_is_the_decode_step(rng, window_left):
    batch = make_batch(rng, [1, 1, 1, 1], [1, 4, 5, 11])
    window = (window_left, 0)  # flash-attn's window with causal: FlashInfer's window_left

    result = paged_prefill_forward(
        **batch.call(), causal=True, window_left=window_left, return_lse=True
    )
    expected = kvcache_attention_forward(
        batch.q[:, None], batch.k_pages, batch.v_pages, cache_seqlens=batch.kv_lens,
        block_table=batch.block_table, causal=True, window_size=window, return_lse=True,
    )  # fmt: skip

    np.testing.assert_array_equal(result.out, expected.out[:, 0])
    assert expected.lse is not None
    np.testing.assert_array_equal(result.lse, expected.lse[:, :, 0])


def test_shuffled_pages_and_a_wider_table_read_the_same_keys(rng):
    batch = make_batch(rng, shuffle=False)
    order = rng.permutation(len(batch.k_pages))  # move page i to order[i]
    shuffled = np.empty_like(batch.k_pages), np.empty_like(batch.v_pages)
    shuffled[0][order], shuffled[1][order] = batch.k_pages, batch.v_pages
    needed = batch.block_table < GARBAGE
    table = np.where(needed, order[np.where(needed, batch.block_table, 0)], GARBAGE)
    trimmed = batch.block_table[:, : needed.sum(axis=1).max()]

    in_order = paged_prefill_forward(**batch.call(), causal=True, return_lse=True)
    moved = paged_prefill_forward(
        **{**batch.call(), "k_pages": shuffled[0], "v_pages": shuffled[1], "block_table": table},
        causal=True,
        return_lse=True,
    )
    narrow = paged_prefill_forward(
        **{**batch.call(), "block_table": trimmed}, causal=True, return_lse=True
    )

    assert not np.array_equal(table, batch.block_table)
    for result in (moved, narrow):
        np.testing.assert_array_equal(result.out, in_order.out)
        np.testing.assert_array_equal(result.lse, in_order.lse)


def test_an_empty_batch_and_empty_sequences(rng):
    batch = make_batch(rng, [0, 0], [0, 3])

    result = paged_prefill_forward(**batch.call(), return_lse=True)
    empty = paged_prefill_forward(
        batch.q[:0], batch.k_pages, batch.v_pages, qo_indptr=[0], block_table=np.zeros((0, 2), int),
        kv_lens=np.zeros(0, int), return_lse=True,
    )  # fmt: skip

    assert result.out.shape == (0, H, DV) and result.lse is not None and result.lse.shape == (0, H)
    assert empty.out.shape == (0, H, DV)


def test_float16_is_computed_in_float32_and_rounded_once(rng):
    batch = make_batch(rng, dtype=np.float16)
    wide = batch._replace(
        q=batch.q.astype(np.float64),
        keys=[k.astype(np.float64) for k in batch.keys],
        values=[v.astype(np.float64) for v in batch.values],
    )
    expected = plain_reference(wide, causal=True)

    result = paged_prefill_forward(**batch.call(), causal=True, return_lse=True)

    assert result.out.dtype == np.float16 and result.lse is not None
    assert result.lse.dtype == np.float32
    assert_close(result.out, expected[0], dtype=np.float16, name="out")
    assert_close(result.lse, expected[1], dtype=np.float16, name="lse")


def test_lse_is_none_unless_asked_for(rng):
    assert paged_prefill_forward(**make_batch(rng).call()).lse is None


# -- the cascade ----------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("option", ["plain", "sinks", "softcap"])
@pytest.mark.parametrize("prefix_pages", [0, 1, 2])
def test_cascade_equals_the_plain_call(rng, causal, option, prefix_pages):
    lengths = [9, 12, 11, 8]  # 8 keys of prefix at most: before every query
    batch = make_batch(rng, [1, 4, 3, 0], lengths, prefix_pages=prefix_pages)
    given: dict[str, Any] = {
        "plain": {},
        "sinks": {"sinks": rng.standard_normal(H)},
        "softcap": {"softcap": 1.5},
    }[option]
    expected = paged_prefill_forward(**batch.call(), causal=causal, return_lse=True, **given)

    result = cascade_prefill_forward(
        **batch.call(), prefix_len=prefix_pages * P, causal=causal, return_lse=True, **given
    )

    assert_close(result.out, expected.out, name="out")
    assert_close(result.lse, expected.lse, name="lse")


def test_cascade_with_a_window_and_no_prefix_is_the_windowed_call(rng):
    batch = make_batch(rng)
    expected = paged_prefill_forward(**batch.call(), causal=True, window_left=2, return_lse=True)

    result = cascade_prefill_forward(
        **batch.call(), prefix_len=0, causal=True, window_left=2, return_lse=True
    )

    assert_close(result.out, expected.out, name="out")
    assert_close(result.lse, expected.lse, name="lse")


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"prefix_len": 2}, ValueError, "multiple >= 0 of the page size 4"),
        ({"prefix_len": -4}, ValueError, "multiple >= 0"),
        ({"prefix_len": 4.0}, TypeError, "prefix_len must be an int"),
        ({"prefix_len": 12}, ValueError, "sequence 0: prefix_len 12 reaches past its 8 keys"),
        ({"prefix_len": 8, "window_left": 3}, ValueError, "with a window"),
        ({"prefix_len": 8, "swap": True}, ValueError, "sequence 2: its first 2 pages"),
    ],
)
def test_cascade_refusals(rng, change, error, match):
    batch = make_batch(rng, [1, 4, 3, 0], [9, 12, 11, 8], prefix_pages=2)
    call = {**batch.call(), "prefix_len": change["prefix_len"]}
    if change.get("swap"):  # sequence 2 holds the prefix pages in another order
        table = batch.block_table.copy()
        table[2, :2] = table[2, 1::-1]
        call["block_table"] = table
    with pytest.raises(error, match=match):
        cascade_prefill_forward(**call, causal=True, window_left=change.get("window_left", -1))


# -- refusals -------------------------------------------------------------------------------------


def _bad(batch: Batch, name: str) -> tuple[dict[str, Any], type, str]:
    """The call with one argument broken, the error and its message."""
    call = batch.call()
    table = batch.block_table.copy()
    if name == "more_queries_than_keys":
        call["kv_lens"] = np.array([5, 11, 9, 4, 1, 1])
        return call, ValueError, "sequence 5: 2 queries but kv_lens 1"
    if name == "length_past_the_table":
        call["kv_lens"] = np.array([5, 11, 9, 4, 1, 5 * P + 1])
        return call, ValueError, "sequence 5: kv_lens 21 keys, but its block_table row holds 20"
    if name == "page_outside_the_pool":
        table[1, 2] = len(batch.k_pages)
        call["block_table"] = table
        return call, ValueError, r"sequence 1: block_table\[1, 2\] = 15 is not one of the 15"
    if name == "negative_page":
        table[0, 0] = -1
        call["block_table"] = table
        return call, ValueError, r"block_table\[0, 0\] = -1"
    if name == "qo_indptr_decreasing":
        call["qo_indptr"] = np.array([0, 5, 4, 9, 9, 10, 12])
        return call, ValueError, "sequence 1: qo_indptr decreases, 5 then 4"
    if name == "qo_indptr_not_ending_at_T":
        call["qo_indptr"] = batch.qo_indptr[:-1]
        return call, ValueError, "qo_indptr must end at 12, got 10"
    if name == "qo_indptr_past_T":
        call["qo_indptr"] = batch.qo_indptr + np.arange(7)
        return call, ValueError, "qo_indptr must end at 12, got 18"
    if name == "float_table":
        call["block_table"] = table.astype(np.float64)
        return call, TypeError, "block_table must be an integer array, got dtype float64"
    if name == "kv_heads":
        call["k_pages"], call["v_pages"] = batch.k_pages[:, :, :1].repeat(3, 2), batch.v_pages
        return call, ValueError, "k_pages and v_pages must be"
    return call, ValueError, ""


@pytest.mark.parametrize(
    "name",
    [
        "more_queries_than_keys",
        "length_past_the_table",
        "page_outside_the_pool",
        "negative_page",
        "qo_indptr_decreasing",
        "qo_indptr_not_ending_at_T",
        "qo_indptr_past_T",
        "float_table",
        "kv_heads",
    ],
)
def test_bad_metadata_is_refused(rng, name):
    call, error, match = _bad(make_batch(rng), name)
    with pytest.raises(error, match=match):
        paged_prefill_forward(**call)


@pytest.mark.parametrize(
    ("option", "error", "match"),
    [
        ({"window_left": -2}, ValueError, "window_left must be >= 0, or -1"),
        ({"window_left": 1.0}, TypeError, "window_left must be an int"),
        ({"softcap": -1.0}, ValueError, "softcap must be >= 0"),
        ({"softmax_scale": float("nan")}, ValueError, "softmax_scale must be finite"),
        ({"causal": 1}, TypeError, "causal must be a bool"),
        ({"sinks": np.zeros(3)}, ValueError, r"sinks must be \(H,\) = \(4,\)"),
        ({"sinks": np.zeros(4, np.float32)}, TypeError, "inputs must share one dtype"),
        ({"sinks": np.full(4, np.inf)}, ValueError, "sinks must be finite"),
    ],
)
def test_bad_options_are_refused(rng, option, error, match):
    with pytest.raises(error, match=match):
        paged_prefill_forward(**make_batch(rng).call(), **option)
