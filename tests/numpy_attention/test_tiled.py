"""Tiled attention (numpy_attention.tiled) against the dense core, in float64 to FLOAT64_RTOL.

The dense path (numpy_attention.functional, impl="dense") is the oracle: it is itself checked
against torch autograd and finite differences in test_functional.py and
test_functional_options.py. Here: every option on both paths, on both sides of ``impl="auto"``'s
threshold, gradcheck, the blocks a window or causal mask skips, bit-reproducibility, dtypes and
memory.
"""

from __future__ import annotations

import math
import os
import tracemalloc

import numpy as np
import pytest

from numpy_attention import functional, masks, no_grad, scores, threads, tiled
from numpy_attention.gradcheck import gradcheck
from numpy_attention.rules import prepare

from ..conftest import assert_close, assert_gradcheck
from .cases import OPTIONS, make_case

# (leading axes, N, M): odd lengths that no block size below divides, N == M, N < M, N > M,
# B = H = 1, and an unbatched q.
SHAPES = {
    "B2H3-N37-M37": ((2, 3), 37, 37),
    "B2H3-N37-M113": ((2, 3), 37, 113),
    "B1H1-N203-M113": ((1, 1), 203, 113),
    "B3-N113-M37": ((3,), 113, 37),
    "unbatched-N37-M203": ((), 37, 203),
}
BATCHED = [name for name, (lead, _, _) in SHAPES.items() if lead]
# (block_q, block_k): square, oblong, and one block covering all of a short sequence.
BLOCKS = [(16, 16), (32, 8), (256, 64)]
D, DV = 8, 5


def make_qkv(rng, lead, n, m, dtype=np.float64):
    q = rng.standard_normal((*lead, n, D)).astype(dtype)
    k = rng.standard_normal((*lead, m, D)).astype(dtype)
    v = rng.standard_normal((*lead, m, DV)).astype(dtype)
    return q, k, v


def run_both(generator, q, k, v, *, blocks=(16, 16), tiled_kwargs=None, **kwargs):
    """Forward (with lse) and backward on both paths with one random upstream gradient.

    Returns {name: (tiled value, dense value)} for out, lse, dq, dk, dv.
    """
    block_q, block_k = blocks
    out_t, lse_t, ctx_t = tiled.tiled_attention_forward(
        q, k, v, block_q=block_q, block_k=block_k, return_lse=True, **kwargs, **(tiled_kwargs or {})
    )
    out_d, lse_d, ctx_d = functional.attention_forward(
        q, k, v, impl="dense", return_lse=True, **kwargs
    )
    dout = generator.standard_normal(out_d.shape).astype(out_d.dtype)
    grads_t = functional.attention_backward(dout, ctx_t)[:3]
    grads_d = functional.attention_backward(dout, ctx_d)[:3]
    names = ("out", "lse", "dq", "dk", "dv")
    return dict(
        zip(
            names, zip((out_t, lse_t, *grads_t), (out_d, lse_d, *grads_d), strict=True), strict=True
        )
    )


def assert_all_close(pairs):
    for name, (actual, expected) in pairs.items():
        assert actual.shape == expected.shape, name
        finite = np.isfinite(expected)
        np.testing.assert_array_equal(np.isfinite(actual), finite, err_msg=name)
        assert_close(np.where(finite, actual, 0), np.where(finite, expected, 0), name=name)


# -- parity with the dense path ----------------------------------------------------------------


@pytest.mark.parametrize("shape_name", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", BLOCKS)
def test_matches_dense(rng, shape_name, causal, blocks):
    lead, n, m = SHAPES[shape_name]
    q, k, v = make_qkv(rng, lead, n, m)

    pairs = run_both(rng, q, k, v, blocks=blocks, causal=causal)

    assert_all_close(pairs)


@pytest.mark.parametrize("shape_name", BATCHED)
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_with_a_fully_padded_element(rng, shape_name, causal):
    lead, n, m = SHAPES[shape_name]
    q, k, v = make_qkv(rng, lead, n, m)
    padding = rng.random((lead[0], m)) < 0.3
    padding[0] = True  # element 0 has nothing to attend to

    pairs = run_both(rng, q, k, v, causal=causal, key_padding_mask=padding)

    assert_all_close(pairs)
    out, lse, dq, dk, dv = (pairs[name][0][0] for name in ("out", "lse", "dq", "dk", "dv"))
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    assert np.all(dq == 0) and np.all(dk == 0) and np.all(dv == 0)


@pytest.mark.parametrize("shape_name", SHAPES)
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
def test_attn_mask(rng, shape_name, kind, causal):
    """A (N, M) mask with a fully masked query row; the float kind also carries a bias."""
    lead, n, m = SHAPES[shape_name]
    q, k, v = make_qkv(rng, lead, n, m)
    allowed = rng.random((n, m)) > 0.3
    allowed[1] = False
    mask = allowed if kind == "bool" else np.where(allowed, rng.standard_normal((n, m)), -np.inf)

    pairs = run_both(rng, q, k, v, causal=causal, attn_mask=mask)

    assert_all_close(pairs)
    assert np.all(np.isneginf(pairs["lse"][0][..., 1]))


def test_attn_mask_per_batch_and_head(rng):
    """A mask with its own leading axes (B, 1, N, M) is sliced per tile along them too."""
    lead, n, m = SHAPES["B2H3-N37-M113"]
    q, k, v = make_qkv(rng, lead, n, m)
    mask = rng.random((lead[0], 1, n, m)) > 0.3

    pairs = run_both(rng, q, k, v, attn_mask=mask)

    assert_all_close(pairs)


@pytest.mark.parametrize("shape_name", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_explicit_dropout_mask(rng, shape_name, causal):
    lead, n, m = SHAPES[shape_name]
    q, k, v = make_qkv(rng, lead, n, m)
    keep = rng.random((*lead, n, m)) >= 0.25

    pairs = run_both(rng, q, k, v, causal=causal, dropout_p=0.25, dropout_mask=keep)

    assert_all_close(pairs)


@pytest.mark.parametrize("shape_name", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_seeded_dropout_is_the_same_mask_on_both_paths(rng, shape_name, causal):
    """Both paths regenerate the keep-mask from one seed on the same block grid: the same
    results as each other, and as the dense path given the materialized mask."""
    lead, n, m = SHAPES[shape_name]
    q, k, v = make_qkv(rng, lead, n, m)

    pairs = run_both(rng, q, k, v, causal=causal, dropout_p=0.25, rng=7)
    seed = tiled.tiled_attention_forward(q, k, v, dropout_p=0.25, rng=7).ctx.rules.seed
    keep = scores.dropout_mask_from_seed(seed, (*lead, n, m), 0.25)
    explicit = functional.attention(
        q, k, v, causal=causal, dropout_p=0.25, dropout_mask=keep, impl="dense"
    )

    assert_all_close(pairs)
    assert_close(pairs["out"][0], explicit, name="out")
    assert 0.6 < keep.mean() < 0.9  # a real dropout, not an all-kept mask


def test_seeded_dropout_does_not_depend_on_blocks_or_tile_grouping(rng, monkeypatch):
    """The per-block streams are keyed by (head, block of the dropout grid), not by tiles."""
    lead, n, m = SHAPES["B2H3-N37-M113"]
    q, k, v = make_qkv(rng, lead, n, m)
    kwargs = {"dropout_p": 0.25, "rng": 7}
    reference = tiled.tiled_attention_forward(q, k, v, **kwargs).out
    other_blocks = tiled.tiled_attention_forward(q, k, v, block_q=16, block_k=8, **kwargs).out
    monkeypatch.setattr(tiled, "TILE_ENTRIES", 1)  # one head per tile

    single, _, ctx = tiled.tiled_attention_forward(q, k, v, block_q=5, block_k=7, **kwargs)

    assert ctx.blocks.kv_chunk == 1
    assert_close(other_blocks, reference, name="blocks 16 x 8")
    assert_close(single, reference, name="one head per tile")


def test_strided_heads_are_read_in_place(rng):
    """q, k, v as head views of one fused projection (B, N, 3 * H * D), as the fused layers
    pass them: same results as dense, and the tiles read them without copying them first."""
    b, h, n = 2, 3, 113
    fused = rng.standard_normal((b, n, 3 * h * D))
    q, k, v = (
        part.reshape(b, n, h, D).swapaxes(1, 2) for part in np.split(fused, 3, axis=-1)
    )  # 3 x (B, N, H*D) -> (B, H, N, D)

    pairs = run_both(rng, q, k, v, causal=True)
    ctx = tiled.tiled_attention_forward(q, k, v, causal=True).ctx

    assert_all_close(pairs)
    assert all(np.shares_memory(t, fused) for t in (ctx.k, ctx.v))  # q is scaled once, a copy


# -- today's options ------------------------------------------------------------------------------


def option_pairs(rng, name, lengths, blocks, **draw):
    arrays, kwargs, dout, dlse = make_case(rng, name, lengths, **draw)
    sinks = arrays.get("sinks")
    runs = {}
    for impl, extra in (("tiled", {"block_q": blocks[0], "block_k": blocks[1]}), ("dense", {})):
        forward = tiled.tiled_attention_forward if impl == "tiled" else functional.attention_forward
        if impl == "dense":
            extra = {"impl": "dense"}
        result = forward(
            arrays["q"], arrays["k"], arrays["v"], sinks=sinks, return_lse=True, **kwargs, **extra
        )
        grads = functional.attention_backward(dout, result.ctx, dlse)
        runs[impl] = {"out": result.out, "lse": result.lse, "dq": grads.dq, "dk": grads.dk}
        runs[impl].update(dv=grads.dv, dsinks=grads.dsinks)
    return {
        name: (runs["tiled"][name], runs["dense"][name])
        for name in runs["dense"]
        if runs["dense"][name] is not None
    }


@pytest.mark.parametrize("blocks", [(2, 3), (4, 4), (64, 64)])
@pytest.mark.parametrize("name", OPTIONS)
def test_every_option_matches_dense(rng, name, blocks):
    pairs = option_pairs(rng, name, "N9-M5", blocks)

    assert_all_close(pairs)


@pytest.mark.parametrize("shift", ["bound", "running max"])
@pytest.mark.parametrize("name", OPTIONS)
def test_every_option_matches_dense_under_both_shifts(rng, name, shift, monkeypatch):
    """The forward's softmax shifts by a bound known in advance where ``scores.fixed_shift``
    allows it (unit-variance inputs: nearly every case), else by the running row max; forced
    to the running max, every option gives the dense path's results too."""
    arrays, kwargs, _, _ = make_case(rng, name, "N5-M9")
    q, k = arrays["q"], arrays["k"]
    bound = scores.fixed_shift(prepare(q, k, arrays["v"], sinks=arrays.get("sinks"),
                                              **kwargs).rules)  # fmt: skip
    if shift == "running max":
        monkeypatch.setattr(scores, "fixed_shift", lambda rules: None)
    elif bound is None:  # the bound does not apply: only a negative slope or a hidden key
        assert name in ("alibi-BH", "everything") or "padding" in name, name

    assert_all_close(option_pairs(rng, name, "N5-M9", (2, 3)))


@pytest.mark.parametrize("why", ["padding hides the near keys", "N > M: rows past the keys"])
def test_a_row_whose_nearest_visible_key_is_far_keeps_the_running_max(rng, why):
    """Steep ALiBi, and rows whose nearest visible key is far from their own position (padding
    leaves only key 0; or top-left with N > M, where row i > M - 1 is i - M + 1 from key
    M - 1): such a row's scores lie far below any bound on the row max, so a fixed shift would
    flush all its weights (float32's floor is -71.4) and leave it dead. The fixed shift is
    refused, and the tiled path gives the dense path's results."""
    n, m = (96, 96) if why.startswith("padding") else (96, 16)
    q, k, v = (rng.standard_normal((1, 2, length, 8)).astype(np.float32) for length in (n, m, m))
    kwargs = {"causal": True, "alibi_slopes": np.array([2.0, 8.0], np.float32)}
    if why.startswith("padding"):
        kwargs["key_padding_mask"] = np.arange(m)[None, :] > 0  # only key 0 is seen

    rules = prepare(q, k, v, **kwargs).rules
    out = tiled.tiled_attention_forward(q, k, v, block_q=16, block_k=16, **kwargs).out
    dense = functional.attention_forward(q, k, v, impl="dense", **kwargs).out

    assert scores.fixed_shift(rules) is None
    assert_close(out, dense, name="out")


def test_negative_slopes_raise_far_keys_above_any_bound_so_they_keep_the_running_max(rng):
    """A negative ALiBi slope lifts far keys by |slope| * distance: the bound on the scores no
    longer bounds the row max, and a fixed shift would overflow exp in float32 (a key 90 away at
    slope -3 sits 270 above it). The running max keeps the float32 result finite and right."""
    q, k, v = (rng.standard_normal((1, 2, 96, 8)).astype(np.float32) for _ in range(3))
    kwargs = {"alibi_slopes": np.array([-3.0, 0.5], np.float32)}

    rules = prepare(q, k, v, **kwargs).rules
    out = tiled.tiled_attention_forward(q, k, v, block_q=16, block_k=16, **kwargs).out
    wide = (t.astype(np.float64) for t in (q, k, v))
    expected = functional.attention_forward(*wide, alibi_slopes=np.array([-3.0, 0.5]))

    assert scores.fixed_shift(rules) is None
    assert_close(out, expected.out, dtype=np.float32, name="out")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_visible_infinite_key_makes_its_rows_nan_under_either_shift(rng, monkeypatch):
    q, k, v = (rng.standard_normal((1, 1, 8, 4)) for _ in range(3))
    q[..., 6:, :] = np.abs(q[..., 6:, :])  # rows 6, 7: q . k = +inf exactly
    k[..., 5, :] = np.inf  # seen by rows 5..7 under causal; q . k is NaN for row 5
    results = {}
    for shift in ("bound", "running max"):
        if shift == "running max":
            monkeypatch.setattr(scores, "fixed_shift", lambda rules: None)
        results[shift] = tiled.tiled_attention_forward(
            q, k, v, causal=True, return_lse=True, block_q=4, block_k=4
        )

    dense = functional.attention_forward(q, k, v, causal=True, return_lse=True, impl="dense")
    for result in results.values():
        np.testing.assert_array_equal(np.isnan(result.out), np.isnan(dense.out))
        np.testing.assert_array_equal(np.isnan(result.lse), np.isnan(dense.lse))
        assert_close(result.out[..., :5, :], dense.out[..., :5, :], name="rows before the key")


@pytest.mark.parametrize("lengths", ["N5-M9", "N7-M7"])
@pytest.mark.parametrize("name", OPTIONS)
def test_every_option_matches_dense_with_unequal_lengths(rng, name, lengths):
    pairs = option_pairs(rng, name, lengths, (3, 2))

    assert_all_close(pairs)


@pytest.mark.parametrize("side", ["below", "at"])
@pytest.mark.parametrize("name", OPTIONS)
def test_every_option_agrees_on_both_sides_of_the_auto_threshold(rng, name, side, monkeypatch):
    """N * M just below the threshold (auto runs dense) and at it (auto runs tiled): the other
    path gives the same results. The cases' lengths are small, so the threshold is lowered to
    them; the real one is tested above (test_auto_picks_tiled_from_the_threshold)."""
    arrays, kwargs, dout, dlse = make_case(rng, name, "N9-M5", batch=1)
    monkeypatch.setattr(functional, "_TILED_FROM", 9 * 5 + (side == "below"))
    q, k, v, sinks = arrays["q"], arrays["k"], arrays["v"], arrays.get("sinks")
    auto = functional.attention_forward(q, k, v, sinks=sinks, return_lse=True, **kwargs)
    other = "dense" if side == "at" else "tiled"
    forced = functional.attention_forward(
        q, k, v, sinks=sinks, return_lse=True, impl=other, **kwargs
    )
    grads = [functional.attention_backward(dout, r.ctx, dlse) for r in (auto, forced)]

    picked = tiled.TiledAttentionCtx if side == "at" else functional.AttentionCtx
    assert type(auto.ctx) is picked and type(forced.ctx) is not picked
    pairs = {"out": (auto.out, forced.out), "lse": (auto.lse, forced.lse)}
    for field in ("dq", "dk", "dv", "dsinks"):
        if getattr(grads[0], field) is not None:
            pairs[field] = (getattr(grads[0], field), getattr(grads[1], field))
    assert_all_close(pairs)


@pytest.mark.parametrize("name", OPTIONS)
def test_every_option_gradcheck(rng, name):
    arrays, kwargs, _, _ = make_case(rng, name, "N5-M9", batch=1)
    names = list(arrays)

    def forward(*tensors):
        given = dict(zip(names, tensors, strict=True))
        result = tiled.tiled_attention_forward(
            given["q"], given["k"], given["v"], sinks=given.get("sinks"), return_lse=True,
            block_q=2, block_k=3, **kwargs,
        )  # fmt: skip
        lse = np.where(np.isfinite(result.lse), result.lse, 0.0)
        return np.concatenate([result.out, lse[..., None]], axis=-1), result.ctx

    def backward(dcombined, ctx):
        return tiled.tiled_attention_backward(dcombined[..., :-1], ctx, dcombined[..., -1])

    assert_gradcheck(gradcheck(forward, *arrays.values(), backward=backward))


def visible_tiles(n, m, block, **kwargs):
    """The (query block, key block) pairs holding at least one visible score, by brute force."""
    probs = functional.attention_forward(
        np.zeros((1, n, 1)), np.zeros((1, m, 1)), np.zeros((1, m, 1)), impl="dense", **kwargs
    ).ctx.probs[0]
    return {(i // block, j // block) for i, j in zip(*np.nonzero(probs), strict=True)}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window": (64, 0)},
        {"window": (40, 40)},
        {"causal": True},
        {"causal": True, "align": "bottom-right"},
        {"window": (None, 0), "align": "bottom-right"},
        {},
    ],
)
@pytest.mark.parametrize("lengths", [(512, 512), (320, 512), (512, 320)])
def test_only_the_tiles_someone_sees_are_computed(rng, kwargs, lengths, monkeypatch):
    """Causal masks, windows and alignment skip whole tiles, forward and backward: a window's
    cost grows linearly in N. Every tile computed holds a visible score, and every tile
    holding one is computed."""
    n, m = lengths
    block = 32
    expected = visible_tiles(n, m, block, **kwargs)
    computed = []
    apply = scores.apply

    def counting(rules, tile_scores, tile, **kwargs):
        computed.append((tile.rows.start // block, tile.cols.start // block))
        return apply(rules, tile_scores, tile, **kwargs)

    monkeypatch.setattr(scores, "apply", counting)
    q, k, v = (rng.standard_normal((1, length, 2)) for length in (n, m, m))
    result = tiled.tiled_attention_forward(q, k, v, block_q=block, block_k=block, **kwargs)
    forward = list(computed)
    computed.clear()
    tiled.tiled_attention_backward(np.ones(result.out.shape), result.ctx)

    assert sorted(forward) == sorted(expected)
    assert sorted(computed) == sorted(expected)
    if "window" in kwargs and None not in kwargs["window"]:  # linear in N, not quadratic:
        left, right = kwargs["window"]  # a query block's keys span block + left + right
        per_block = -(-(block + left + right) // block) + 1
        assert len(expected) <= per_block * -(-n // block)


@pytest.mark.parametrize("name", ["plain", "gqa-2", "everything"])
def test_backward_is_bit_reproducible_whatever_the_thread_timing(rng, name, monkeypatch):
    """float32, one head (one part) in many key blocks: the tiles of different key blocks add
    into the same rows of dq on different threads. Their order is fixed, so every run, and a
    serial run, give the very same bits."""
    n = 192
    if name == "plain":
        arrays = {key: rng.standard_normal((1, 1, n, 16)) for key in "qkv"}
        kwargs, sinks = {"causal": True}, None
    else:
        arrays, kwargs, _, _ = make_case(rng, name, "N7-M7", d=16, dv=16, batch=1)
        sinks = arrays.pop("sinks", None)
        arrays = {
            key: rng.standard_normal(a.shape[:-2] + (n,) + a.shape[-1:])
            for key, a in arrays.items()
        }
        kwargs.pop("dropout_mask", None)
        kwargs.pop("key_padding_mask", None)
        kwargs.pop("dropout_p", None)
    q, k, v = (arrays[key].astype(np.float32) for key in "qkv")
    sinks = None if sinks is None else sinks.astype(np.float32)
    dout = rng.standard_normal(q.shape[:-1] + v.shape[-1:]).astype(np.float32)

    def run():
        result = tiled.tiled_attention_forward(
            q, k, v, sinks=sinks, block_q=16, block_k=16, **kwargs
        )
        return (result.out, *functional.attention_backward(dout, result.ctx)[:3])

    first = run()
    again = [run() for _ in range(4)]
    monkeypatch.setattr(threads, "_blas_threads", lambda: None)
    serial = run()

    for other in [*again, serial]:
        for a, b in zip(first, other, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_steep_alibi_flushes_the_same_weights_on_both_paths(rng, dtype, causal):
    """ALiBi steep enough that most weights fall below exp(floor) in some tiles and none in
    others: the tiled path flushes tile by tile, the dense path in one piece, and they agree;
    the float64 run is checked against the dense path to FLOAT64_RTOL."""
    q, k, v = (rng.standard_normal((1, 4, 203, 8)).astype(dtype) for _ in range(3))
    dout = rng.standard_normal((1, 4, 203, 8)).astype(dtype)
    slopes = np.array([9.0, 2.0, 0.05, 0.0], dtype=dtype)  # float64's floor is -672
    kwargs = {"alibi_slopes": slopes, "causal": causal, "return_lse": True}

    results = {}
    for impl in ("dense", "tiled"):
        forward = functional.attention_forward(q, k, v, impl=impl, **kwargs)
        grads = functional.attention_backward(dout, forward.ctx)
        results[impl] = {"out": forward.out, "lse": forward.lse, **grads._asdict()}

    for key in ("out", "lse", "dq", "dk", "dv"):
        assert_close(results["tiled"][key], results["dense"][key], dtype=dtype, name=key)


def test_tiles_that_may_underflow_are_flushed_before_exp(rng, monkeypatch):
    """Forward and backward hand every tile's shifted scores to ``flush_underflow`` with its
    own floor: the far tiles get one, and after it no finite shifted score is left
    below it (no weight below exp(floor) reaches a product); the tiles near the diagonal get
    None."""
    q, k, v = (rng.standard_normal((1, 2, 96, 8), dtype=np.float32) for _ in range(3))
    floor = float(np.log(np.finfo(np.float32).tiny / np.finfo(np.float32).eps))
    calls = []

    def spy(shifted, exp_floor):
        result = scores.flush_underflow.__wrapped__(shifted, exp_floor)
        calls.append((exp_floor is not None, bool(np.any(np.isfinite(result) & (result < floor)))))
        return result

    spy.__wrapped__ = scores.flush_underflow
    monkeypatch.setattr(scores, "flush_underflow", spy)
    forward = tiled.tiled_attention_forward(
        q, k, v, causal=True, alibi_slopes=np.array([2.0, 0.01], np.float32), block_q=16,
        block_k=16,
    )  # fmt: skip
    in_forward = calls[:]
    calls.clear()
    tiled.tiled_attention_backward(np.ones_like(forward.out), forward.ctx)

    for phase in (in_forward, calls):
        flushed = [left for flushes, left in phase if flushes]
        assert 0 < len(flushed) < len(phase) == 21  # one call per visible tile: 6 * 7 / 2
        assert not any(flushed)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    "name", ["gqa-2", "window-3-2", "softcap", "alibi-H", "sinks", "everything"]
)
def test_low_precision_results_are_as_accurate_as_their_dtype(rng, dtype, name):
    """Outputs and every gradient against the float64 result on the same rounded inputs, each
    tensor on its own scale, with the suite's tolerance for the dtype (float16 is computed in
    float32 and rounded once)."""
    arrays, kwargs, dout, dlse = make_case(rng, name, "N9-M5", d=16, dv=8)
    if "attn_mask" in kwargs:
        kwargs["attn_mask"] = kwargs["attn_mask"].astype(dtype)
    rounded = {key: a.astype(dtype) for key, a in arrays.items()}
    dout, dlse = dout.astype(dtype), dlse.astype(dtype)

    def run(given, upstream, lse_upstream):
        result = tiled.tiled_attention_forward(
            given["q"], given["k"], given["v"], sinks=given.get("sinks"), return_lse=True,
            block_q=4, block_k=2, **kwargs,
        )  # fmt: skip
        grads = tiled.tiled_attention_backward(upstream, result.ctx, lse_upstream)
        return {"out": result.out, "dq": grads.dq, "dk": grads.dk, "dv": grads.dv}

    actual = run(rounded, dout, dlse)
    expected = run(
        {key: a.astype(np.float64) for key, a in rounded.items()},
        dout.astype(np.float64),
        dlse.astype(np.float64),
    )

    for key, value in actual.items():
        assert value.dtype == dtype, key
        assert_close(value, expected[key], dtype=dtype, name=key)


# -- gradient check of the tiled pair ----------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dropout", ["none", "explicit", "regenerated"])
def test_gradcheck(rng, causal, dropout):
    q = rng.standard_normal((2, 2, 7, 3))
    k = rng.standard_normal((2, 2, 5, 3))
    v = rng.standard_normal((2, 2, 5, 4))
    padding = np.zeros((2, 5), dtype=bool)
    padding[1, -2:] = True
    kwargs = {"causal": causal, "key_padding_mask": padding, "block_q": 3, "block_k": 2}
    if dropout == "explicit":
        kwargs.update(dropout_p=0.3, dropout_mask=rng.random((2, 2, 7, 5)) >= 0.3)
    elif dropout == "regenerated":
        kwargs.update(dropout_p=0.3, rng=11)  # one seed: every forward regenerates one mask

    report = gradcheck(
        tiled.tiled_attention_forward, q, k, v, backward=tiled.tiled_attention_backward, **kwargs
    )

    assert_gradcheck(report)


# -- dtypes, inference, dispatch ---------------------------------------------------------------


def test_float32_stays_float32(rng):
    lead, n, m = SHAPES["B2H3-N37-M113"]
    q, k, v = make_qkv(rng, lead, n, m, dtype=np.float32)
    padding = np.zeros((lead[0], m), dtype=bool)
    padding[1, :5] = True

    out, lse, ctx = tiled.tiled_attention_forward(
        q, k, v, causal=True, key_padding_mask=padding, dropout_p=0.1, rng=3, return_lse=True
    )
    grads = tiled.tiled_attention_backward(rng.standard_normal(out.shape).astype(np.float32), ctx)[
        :3
    ]

    stored = [ctx.q_scaled, ctx.k, ctx.v, ctx.out, ctx.lse, np.asarray(ctx.rules.scale)]
    stored.append(np.asarray(ctx.rules.rescale))
    assert all(a.dtype == np.float32 for a in [out, lse, *grads, *stored])


def test_float16_is_computed_in_float32(rng):
    lead, n, m = SHAPES["B2H3-N37-M113"]
    q, k, v = make_qkv(rng, lead, n, m, dtype=np.float16)

    out, lse, ctx = tiled.tiled_attention_forward(q, k, v, causal=True, return_lse=True)
    grads = tiled.tiled_attention_backward(rng.standard_normal(out.shape).astype(np.float16), ctx)[
        :3
    ]
    out_d, lse_d, _ = functional.attention_forward(
        q, k, v, causal=True, impl="dense", return_lse=True
    )

    assert out.dtype == np.float16 and all(g.dtype == np.float16 for g in grads)
    assert lse.dtype == ctx.q_scaled.dtype == np.float32
    assert_close(lse, lse_d, dtype=np.float32, name="lse")
    assert_close(out.astype(np.float32), out_d.astype(np.float32), dtype=np.float32, name="out")


@pytest.mark.parametrize("impl", ["dense", "tiled"])
def test_no_grad_caches_nothing(rng, impl):
    q, k, v = make_qkv(rng, (2, 3), 37, 37)

    with no_grad():
        out, _, ctx = functional.attention_forward(q, k, v, causal=True, impl=impl)

    assert ctx is None
    with pytest.raises(TypeError, match="no_grad"):
        functional.attention_backward(np.ones_like(out), ctx)


def test_attention_returns_the_output_alone(rng):
    q, k, v = make_qkv(rng, (2, 3), 37, 113)

    out = functional.attention(q, k, v, causal=True, impl="tiled")

    assert_close(out, functional.attention_forward(q, k, v, causal=True, impl="dense").out)


def test_dense_lse_is_the_log_sum_exp_of_the_scores(rng):
    """The dense path's lse, the oracle of the tiled lse, against its definition."""
    q, k, v = make_qkv(rng, (2, 3), 37, 113)
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    scores = np.where(masks.causal_mask(37, 113), scores, -np.inf)

    _, lse, _ = functional.attention_forward(q, k, v, causal=True, impl="dense", return_lse=True)

    assert_close(lse, np.log(np.exp(scores).sum(axis=-1)))


@pytest.mark.parametrize(
    ("below", "expected"), [(1, functional.AttentionCtx), (0, tiled.TiledAttentionCtx)]
)
def test_auto_picks_tiled_from_the_threshold(rng, below, expected):
    m = 512
    n = math.ceil(functional._TILED_FROM / m) - below  # N * M just below or at the threshold
    q, k, v = make_qkv(rng, (), n, m)

    ctx = functional.attention_forward(q, k, v, causal=True).ctx

    assert type(ctx) is expected


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"impl": "flash"}, ValueError),
        ({"impl": "tiled", "dropout_mask": np.ones((2, 3, 37, 37), dtype=bool)}, ValueError),
        ({"impl": "tiled", "attn_mask": np.ones((36, 37), dtype=bool)}, ValueError),
        ({"impl": "tiled", "key_padding_mask": np.zeros((2, 36), dtype=bool)}, ValueError),
        ({"impl": "tiled", "dropout_p": 1.0}, ValueError),
        ({"impl": "tiled", "attn_mask": np.ones((37, 37), dtype=np.int64)}, TypeError),
    ],
)
def test_bad_input_is_rejected_before_any_work(rng, kwargs, error):
    q, k, v = make_qkv(rng, (2, 3), 37, 37)

    with pytest.raises(error):
        functional.attention_forward(q, k, v, **kwargs)


@pytest.mark.parametrize(
    ("size", "error"), [(0, ValueError), (-16, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_block_sizes_must_be_positive_integers(rng, size, error):
    q, k, v = make_qkv(rng, (2, 3), 37, 37)

    with pytest.raises(error, match="block_k must be"):
        tiled.tiled_attention_forward(q, k, v, block_k=size)


def test_backward_checks_dout(rng):
    q, k, v = make_qkv(rng, (2, 3), 37, 37)
    out, _, ctx = tiled.tiled_attention_forward(q, k, v)

    with pytest.raises(ValueError, match="dout"):
        tiled.tiled_attention_backward(np.ones(out.shape[:-1] + (DV + 1,)), ctx)


# -- memory ------------------------------------------------------------------------------------


def test_memory_is_o_n_times_block_not_n_squared(rng):
    """tracemalloc peak of a causal forward + backward, against a bound computed from shapes.

    The bound allows 16 arrays of (G, N, D) (inputs, output, gradients, their copies) and, per
    pool thread, 8 tiles of (group_chunk, block_q, block_k): O(N * block). One (G, N, N) array of
    scores, which the dense path holds three of, is 8x larger than that bound.
    """
    lead, n, d = (1, 2), 4096, 16
    q, k, v, dout = (rng.standard_normal((*lead, n, d)).astype(np.float32) for _ in range(4))
    groups, itemsize = 2, 4
    tile = min(groups, tiled.TILE_ENTRIES // tiled.BLOCK_Q**2) * tiled.BLOCK_Q**2 * itemsize
    workers = 1 if threads._blas_threads() is None else os.cpu_count()
    bound = 16 * groups * n * d * itemsize + 8 * workers * tile
    assert 8 * bound <= groups * n * n * itemsize

    tracemalloc.start()
    try:
        out, _, ctx = tiled.tiled_attention_forward(q, k, v, causal=True)
        tiled.tiled_attention_backward(dout, ctx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak <= bound, f"peak {peak / 2**20:.1f} MiB > bound {bound / 2**20:.1f} MiB"
