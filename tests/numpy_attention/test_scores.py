"""The score pipeline (numpy_attention.scores) on the rules of a call: the band of visible keys
and the tiles it skips, masks and dropout sliced per tile, hidden scores replaced, the softmax's
floor and fixed shift. The rules themselves: test_rules.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numpy_attention import scores
from numpy_attention.rules import prepare
from numpy_attention.scores import Tile

from ..conftest import assert_close
from .test_rules import rules_for


def band(n, m, left, right, offset):
    """Bool (N, M): key j visible to query i, by the definition p_i - left <= j <= p_i + right."""
    i, j = np.arange(n)[:, None] + offset, np.arange(m)[None, :]
    visible = np.ones((n, m), dtype=bool)
    if left is not None:
        visible &= j >= i - left
    if right is not None:
        visible &= j <= i + right
    return visible


SIDES = st.one_of(st.none(), st.integers(0, 12))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 40),
    m=st.integers(1, 40),
    left=SIDES,
    right=SIDES,
    causal=st.booleans(),
    bottom_right=st.booleans(),
    block=st.integers(1, 9),
)
def test_visible_ranges_hold_exactly_the_band(n, m, left, right, causal, bottom_right, block):
    """For every block of queries (keys), visible_cols (visible_rows) is the smallest range of
    keys (queries) holding every visible pair of that block; the band grid of a tile that
    straddles it hides exactly what the definition hides."""
    align = "bottom-right" if bottom_right else "top-left"
    rules = rules_for(n, m, window=(left, right), causal=causal, align=align)
    visible = band(n, m, left, 0 if causal and right is None else (
        min(right, 0) if causal else right), rules.offset)  # fmt: skip

    for start in range(0, n, block):
        rows = slice(start, min(start + block, n))
        seen = np.nonzero(visible[rows].any(axis=0))[0]
        lo, hi = scores.visible_cols(rules, rows)
        assert (lo, hi) == ((seen[0], seen[-1] + 1) if len(seen) else (lo, lo))
    for start in range(0, m, block):
        cols = slice(start, min(start + block, m))
        seen = np.nonzero(visible[:, cols].any(axis=1))[0]
        lo, hi = scores.visible_rows(rules, cols)
        assert (lo, hi) == ((seen[0], seen[-1] + 1) if len(seen) else (lo, lo))
    for transposed in (False, True):
        tile = Tile(slice(0, 1), slice(0, n), slice(0, m), transposed)
        hidden = scores._band_hidden(rules, tile)
        expected = ~visible.T if transposed else ~visible
        if hidden is None:
            assert not expected.any()
        else:
            np.testing.assert_array_equal(hidden, expected)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 30),
    m=st.integers(1, 30),
    chunk=st.integers(1, 7),
    start=st.integers(-3, 8),
    causal=st.booleans(),
    bottom_right=st.booleans(),
    block=st.integers(1, 9),
)
def test_chunks_hide_exactly_other_chunks_and_skip_no_visible_tile(
    n, m, chunk, start, causal, bottom_right, block
):
    """A chunk's hidden grid, on tiles of every size (and transposed), is the definition's
    (j - s) // C != (p_i - s) // C; visible_cols (visible_rows) keep every key (query) of a
    block that a query (key) of it sees."""
    align = "bottom-right" if bottom_right else "top-left"
    rules = rules_for(n, m, causal=causal, align=align, chunk_size=chunk, chunk_start=start)
    p, j = np.arange(n)[:, None] + rules.offset, np.arange(m)[None, :]
    same = (j - start) // chunk == (p - start) // chunk
    visible = same & (j <= p) if causal else same

    for r0 in range(0, n, block):
        for c0 in range(0, m, block):
            rows, cols = slice(r0, min(r0 + block, n)), slice(c0, min(c0 + block, m))
            for transposed in (False, True):
                hidden = scores._chunk_hidden(rules, Tile(slice(0, 1), rows, cols, transposed))
                expected = ~same[rows, cols]
                expected = expected.T if transposed else expected
                if hidden is None:
                    assert not expected.any()
                else:
                    np.testing.assert_array_equal(np.broadcast_to(hidden, expected.shape), expected)
        lo, hi = scores.visible_cols(rules, slice(r0, min(r0 + block, n)))
        seen = np.nonzero(visible[r0 : r0 + block].any(axis=0))[0]
        assert all(lo <= key < hi for key in seen)
    for c0 in range(0, m, block):
        lo, hi = scores.visible_rows(rules, slice(c0, min(c0 + block, m)))
        seen = np.nonzero(visible[:, c0 : c0 + block].any(axis=1))[0]
        assert all(lo <= query < hi for query in seen)


def test_apply_replaces_hidden_scores_never_adds_to_them():
    rules = rules_for(3, 4, causal=True, attn_mask=np.array([0.0, -np.inf, 1.0, 2.0]))
    logits = np.full((6, 3, 4), np.nan)  # every score NaN, as from a NaN key
    tile = Tile(slice(0, 6), slice(0, 3), slice(0, 4), transposed=False)

    scores.apply(rules, logits, tile)

    hidden = ~band(3, 4, None, 0, 0) | (np.arange(4) == 1)
    assert np.all(np.isneginf(logits[:, hidden]))
    assert np.all(np.isnan(logits[:, ~hidden]))


def test_softcap_and_alibi_on_a_transposed_tile():
    slopes = np.array([0.5, 0.25, 0.125])
    rules = rules_for(4, 6, softcap=2.0, alibi_slopes=slopes, align="bottom-right")
    logits = np.random.default_rng(0).standard_normal((6, 4, 6)) * 5  # (G, N, M)
    tile = Tile(slice(0, 6), slice(1, 3), slice(2, 6), transposed=True)
    block = logits[:, 1:3, 2:6].swapaxes(-1, -2) / 2.0  # (g, bk, bq): S1 / softcap, as Q carries it

    capped = scores.apply(rules, block, tile, keep_capped=True)

    distance = np.abs(np.arange(1, 3)[:, None] + 2 - np.arange(2, 6)[None, :])  # |p_i - j|
    expected = (
        2.0 * np.tanh(logits[:, 1:3, 2:6] / 2.0) - np.tile(slopes, 2)[:, None, None] * distance
    )
    np.testing.assert_allclose(block.swapaxes(-1, -2), expected, rtol=0, atol=1e-14)
    np.testing.assert_allclose(capped.swapaxes(-1, -2), np.tanh(logits[:, 1:3, 2:6] / 2.0))


TILE22 = Tile(slice(0, 6), slice(0, 2), slice(0, 2), transposed=False)


def test_backward_applies_the_tanh_chain_only_with_softcap():
    dscores = np.ones((1, 2, 2))
    capped = np.array([[[0.0, 0.5], [-0.5, 0.9]]])

    np.testing.assert_array_equal(scores.backward(rules_for(2, 2), dscores.copy(), None), dscores)
    np.testing.assert_allclose(
        scores.backward(rules_for(2, 2, softcap=1.0), dscores.copy(), capped.copy()), 1 - capped**2
    )
    assert rules_for(2, 2, softcap=4.0, scale=0.5).query_scale == np.float64(0.125)
    assert scores.apply(rules_for(2, 2, softcap=1.0), np.zeros((6, 2, 2)), TILE22) is None


def test_masks_are_sliced_per_tile_without_materializing_the_broadcast():
    per_batch = np.random.default_rng(1).random((2, 1, 5, 7)) > 0.5  # (B, 1, N, M)
    rules = rules_for(5, 7, attn_mask=per_batch)
    tile = Tile(slice(2, 5), slice(1, 4), slice(3, 7), transposed=False)  # heads 2..4: b 0, 1

    (hidden,) = rules.hidden
    block = scores._tile(hidden, rules.lead, tile)

    np.testing.assert_array_equal(block, ~per_batch[[0, 1, 1], 0][:, 1:4, 3:7])


@pytest.mark.parametrize(
    ("rows", "cols"), [((0, 300), (0, 300)), ((5, 37), (250, 530)), ((256, 257), (0, 1))]
)
def test_seeded_keep_mask_is_the_same_whatever_the_tiles(rows, cols):
    whole = scores.dropout_mask_from_seed(123, (2, 600, 600), 0.3)
    groups = slice(0, 2)
    tile = Tile(groups, slice(*rows), slice(*cols), transposed=False)
    rules = rules_for(600, 600, dropout_p=0.3)._replace(seed=123, lead=(2,))

    block = scores.keep_tile(rules, tile)

    np.testing.assert_array_equal(block, whole[:, slice(*rows), slice(*cols)])
    assert abs(whole.mean() - 0.7) < 0.01


def test_different_seeds_and_heads_draw_different_masks():
    whole = scores.dropout_mask_from_seed(5, (2, 64, 64), 0.5)
    other = scores.dropout_mask_from_seed(6, (2, 64, 64), 0.5)

    assert not np.array_equal(whole[0], whole[1])
    assert not np.array_equal(whole, other)


# -- weights too small to be worth a product ----------------------------------------------------


def test_flush_underflow_sends_only_scores_below_the_floor_to_minus_inf():
    shifted = np.array([0.0, -70.0, -71.5, -300.0, -np.inf, np.nan])

    untouched = scores.flush_underflow(shifted.copy(), None)
    flushed = scores.flush_underflow(shifted.copy(), -71.4)

    np.testing.assert_array_equal(untouched, shifted)
    np.testing.assert_array_equal(flushed, [0.0, -70.0, -np.inf, -np.inf, -np.inf, np.nan])
    assert rules_for(2, 2).floor == pytest.approx(np.log(np.finfo(np.float64).tiny / 2.0**-52))


SPREAD_OPTIONS = {
    "plain": {},
    "softcap": {"softcap": 3.0},
    "alibi": {"alibi_slopes": np.array([4.0, 1.0, 0.25])},
    "alibi-mixed": {"alibi_slopes": np.array([2.0, -3.0, 0.0]), "align": "bottom-right"},
    "alibi-negative": {"alibi_slopes": np.array([-3.0, -1.0, -2.0])},
    "float-mask": {"attn_mask": np.array([[0.0, -np.inf, 40.0, -25.0, 3.0]])},
    "sinks": {"sinks": np.array([50.0, -80.0, 0.0])},
}


def loosest_floor(rules, tile):
    """The floor at which ``exp_floor`` just lets ``tile`` pass: minus its bound on row max - S,
    found by bisection (the bound itself is not public)."""
    lo, hi = -1e6, 0.0  # exp_floor passes at lo, asks for a flush at hi
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if scores.exp_floor(rules._replace(floor=mid), tile) is None else (
            lo, mid)  # fmt: skip
    return lo


@pytest.mark.parametrize("name", SPREAD_OPTIONS)
@pytest.mark.parametrize("magnitude", [1.0, 12.0])
def test_exp_floor_bounds_every_shifted_score(name, magnitude):
    """row max (the sink included) - S_ij, over every finite score of a tile, stays below the
    bound that ``exp_floor`` checks against the floor: tile by tile, each at the loosest floor
    that lets it pass, so a weight it calls safe never falls below the floor."""
    rng = np.random.default_rng(7)
    n, m = 7, 5
    q = rng.standard_normal((2, 3, n, 4)) * magnitude
    k = rng.standard_normal((2, 3, m, 4)) * magnitude
    rules = prepare(q, k, k, **SPREAD_OPTIONS[name]).rules
    whole = Tile(slice(0, 6), slice(0, n), slice(0, m), transposed=False)
    logits = (q * rules.query_scale).reshape(6, n, 4) @ k.reshape(6, m, 4).swapaxes(-1, -2)
    scores.apply(rules, logits, whole)
    row_max = logits.max(axis=-1, keepdims=True)
    if rules.sinks is not None:
        row_max = np.maximum(row_max, rules.sinks[:, None, None])
    below = np.where(np.isfinite(logits), row_max - logits, -np.inf)  # (G, N, M)

    for rows in (slice(0, 3), slice(3, 7)):
        for cols in (slice(0, 2), slice(2, 5)):
            for groups in (slice(0, 2), slice(2, 6)):
                tile = Tile(groups, rows, cols, transposed=True)
                floor = loosest_floor(rules, tile)
                assert below[groups, rows, cols].max() < -floor, (rows, cols, groups)


def test_ordinary_inputs_need_no_flush():
    """Unit-variance q and k at head width 64 (and softcap, sinks, mild ALiBi): the bound shows
    that no weight can underflow, so the plain path never pays the flush's two passes."""
    rng = np.random.default_rng(3)
    q, k = (rng.standard_normal((1, 4, 2048, 64), dtype=np.float32) for _ in range(2))
    whole = Tile(slice(0, 4), slice(0, 2048), slice(0, 2048), transposed=False)

    for options in ({}, {"softcap": 30.0}, {"sinks": rng.standard_normal(4, dtype=np.float32)}):
        assert scores.exp_floor(prepare(q, k, k, **options).rules, whole) is None
    steep = prepare(q, k, k, alibi_slopes=np.full(4, 0.5, np.float32)).rules
    assert scores.exp_floor(steep, whole) == steep.floor


SHIFTS = {  # options, whether a fixed shift applies (q (2, 3, 5, 4), k (2, 3, 7, 4): N < M)
    "plain": ({}, True),
    "softcap": ({"softcap": 3.0}, True),
    "alibi": ({"alibi_slopes": np.array([4.0, 1.0, 0.25])}, True),
    "alibi bottom-right causal": (
        {"alibi_slopes": np.array([4.0, 1.0, 0.25]), "causal": True, "align": "bottom-right"},
        True,
    ),
    "sinks": ({"sinks": np.array([5.0, -8.0, 0.0])}, True),
    "float mask": ({"attn_mask": np.array([0.0, 4.0, -3.0, 1.0, 2.0, 0.5, -1.0])}, True),
    "alibi, a negative slope": ({"alibi_slopes": np.array([2.0, -3.0, 0.0])}, False),
    "alibi, a hidden key": (
        {"alibi_slopes": np.ones(3), "attn_mask": np.array([0.0, -np.inf, 0, 0, 0, 0, 0])},
        False,
    ),
    "a sink far above the scores": ({"sinks": np.array([80.0, 0.0, 0.0])}, False),
}


@pytest.mark.parametrize("name", SHIFTS)
def test_a_fixed_shift_bounds_every_score_and_stays_near_every_row_max(name):
    """Where ``fixed_shift`` gives a shift, it is >= every score and the sink, and each row's
    max lies within -floor of it: every row keeps a weight of at least exp(floor). Where a
    negative slope lifts far keys, a hidden key may leave a row only far keys, or the bound is
    too loose, it gives none."""
    rng = np.random.default_rng(11)
    q, k = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 7, 4))
    options, applies = SHIFTS[name]
    rules = prepare(q, k, k, **options).rules._replace(floor=-60.0)
    logits = (q * rules.query_scale).reshape(6, 5, 4) @ k.reshape(6, 7, 4).swapaxes(-1, -2)
    scores.apply(rules, logits, Tile(slice(0, 6), slice(0, 5), slice(0, 7), transposed=False))
    row_max = logits.max(axis=-1)
    if rules.sinks is not None:
        row_max = np.maximum(row_max, rules.sinks[:, None])

    shift = scores.fixed_shift(rules)

    assert (shift is not None) == applies
    if applies:
        assert np.all(row_max <= shift) and np.all(row_max - shift > rules.floor)


def test_large_float32_logits_keep_the_running_max():
    q = np.random.default_rng(0).standard_normal((1, 2, 16, 64), dtype=np.float32) * 4

    assert scores.fixed_shift(prepare(q, q, q).rules) is None  # spread ~ 340 > 71.4


@pytest.mark.parametrize("options", [{}, {"alibi_slopes": np.array([0.5, 0.25, 0.125])}], ids=str)
@pytest.mark.parametrize("per_row", [False, True])
def test_apply_subtracts_a_shift_as_the_softmax_would_next(options, per_row):
    """``apply(..., shift=c)`` gives S - c: a scalar (the forward's fixed shift) or one value per
    row of each leading index (the backward's lse), folded into ALiBi's pass when there is one."""
    rules = rules_for(4, 6, causal=True, **options)
    logits = np.random.default_rng(2).standard_normal((6, 4, 6))
    tile = Tile(slice(0, 6), slice(0, 4), slice(0, 6), transposed=True)
    block = logits.swapaxes(-1, -2).copy()  # (g, bk, bq)
    shift = np.arange(24.0).reshape(6, 1, 4) if per_row else 7.5

    expected = block.copy()
    scores.apply(rules, expected, tile)
    expected -= shift
    shifted = block.copy()
    scores.apply(rules, shifted, tile, shift=shift)

    finite = np.isfinite(expected)
    assert np.array_equal(np.isneginf(shifted), ~finite)
    assert_close(np.where(finite, shifted, 0), np.where(finite, expected, 0), name="S - shift")
