"""Tiled attention (numpy_attention.tiled) against the dense core, in float64 to FLOAT64_RTOL.

The dense path (numpy_attention.functional, impl="dense") is the oracle: it is itself checked
against torch autograd and finite differences in test_core_attention.py.
"""

from __future__ import annotations

import math
import os
import tracemalloc

import numpy as np
import pytest

from numpy_attention import functional, masks, no_grad, threads, tiled
from numpy_attention.gradcheck import gradcheck

from ..conftest import assert_close, assert_gradcheck

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


def run_both(rng, q, k, v, *, blocks=(16, 16), tiled_kwargs=None, **kwargs):
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
    dout = rng.standard_normal(out_d.shape).astype(out_d.dtype)
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
def test_regenerated_dropout_matches_its_materialized_mask(rng, shape_name, causal):
    """The tiled path regenerates keep-masks per tile; dense with the materialized mask agrees."""
    lead, n, m = SHAPES[shape_name]
    q, k, v = make_qkv(rng, lead, n, m)
    out_t, lse_t, ctx = tiled.tiled_attention_forward(
        q, k, v, causal=causal, dropout_p=0.25, rng=rng, block_q=16, block_k=8, return_lse=True
    )
    keep = tiled.tiled_dropout_mask(ctx.plan.seed, (*lead, n, m), 0.25, block_q=16, block_k=8)
    out_d, lse_d, ctx_d = functional.attention_forward(
        q, k, v, causal=causal, dropout_p=0.25, dropout_mask=keep, impl="dense", return_lse=True
    )
    dout = rng.standard_normal(out_d.shape)

    grads_t = functional.attention_backward(dout, ctx)[:3]
    grads_d = functional.attention_backward(dout, ctx_d)[:3]

    assert_close(out_t, out_d, name="out")
    assert_close(lse_t, lse_d, name="lse")
    for name, grad_t, grad_d in zip(("dq", "dk", "dv"), grads_t, grads_d, strict=True):
        assert_close(grad_t, grad_d, name=name)


def test_regenerated_dropout_does_not_depend_on_tile_grouping(rng, monkeypatch):
    """The per-block streams are keyed by (group, block), not by how tiles group them."""
    lead, n, m = SHAPES["B2H3-N37-M113"]
    q, k, v = make_qkv(rng, lead, n, m)
    kwargs = {"dropout_p": 0.25, "rng": 7, "block_q": 16, "block_k": 8}
    out_grouped = tiled.tiled_attention_forward(q, k, v, **kwargs).out
    monkeypatch.setattr(tiled, "TILE_ENTRIES", 1)  # one leading index per tile

    out_single, _, ctx = tiled.tiled_attention_forward(q, k, v, **kwargs)

    assert ctx.plan.group_chunk == 1
    np.testing.assert_array_equal(out_single, out_grouped)


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
    assert all(np.shares_memory(t, fused) for t in (ctx.q, ctx.k, ctx.v))


def test_serial_fallback_without_blas_thread_control(rng, monkeypatch):
    """Where NumPy's BLAS cannot be limited per thread, tiles run in the calling thread."""
    lead, n, m = SHAPES["B2H3-N37-M113"]
    q, k, v = make_qkv(rng, lead, n, m)
    monkeypatch.setattr(threads, "_blas_threads", lambda: None)

    pairs = run_both(rng, q, k, v, causal=True)

    assert_all_close(pairs)


def test_the_callers_blas_threads_are_left_as_they_were(rng):
    """Pool threads limit their BLAS to one thread; the caller's count must survive that."""
    blas = threads._blas_threads()
    if blas is None or os.cpu_count() < 2:
        pytest.skip("no pool here: NumPy's BLAS offers no per-thread control, or one core")
    q, k, v = make_qkv(rng, (2, 3), 37, 113)
    original = blas.get()
    blas.set_local(2)  # a known count above 1, whatever earlier tests left
    try:
        tiled.tiled_attention_forward(q, k, v, block_q=16)  # 3 query blocks: tiles on the pool
        after = blas.get()
    finally:
        blas.set_local(original)

    assert after == 2


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

    stored = [ctx.q, ctx.k, ctx.v, ctx.out, ctx.lse, np.asarray(ctx.plan.scale)]
    stored.append(np.asarray(ctx.plan.rescale))
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
    assert lse.dtype == ctx.q.dtype == np.float32
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


@pytest.mark.parametrize("size", [0, -16, 2.5, True])
def test_block_sizes_must_be_positive_integers(rng, size):
    q, k, v = make_qkv(rng, (2, 3), 37, 37)

    with pytest.raises(ValueError, match="block_k"):
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
