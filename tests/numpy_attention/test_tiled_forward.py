"""The tiled forward without a backward (numpy_attention.tiled under ``no_grad()``): each tile
scales its own rows of q as it reads them, where a forward that keeps its ctx scales the whole of
q once for the backward. Both give the same bits; the forward alone holds no scaled copy of q.
On a tile a band cuts (causal, windows, chunks) the forward takes exp only over the pieces of
keys some query sees: every visible score lies in a piece, and the bits are exp over the whole
tile's. Everything else about the tiled path: test_tiled.py.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from numpy_attention import functional, no_grad, scores, tiled
from numpy_attention.rules import prepare

from .test_tiled import make_qkv

OPTIONS = {
    "plain": {},
    "causal": {"causal": True},
    "softcap": {"causal": True, "softcap": 2.0},
    "gqa": {"enable_gqa": True},
    "scale and window": {"scale": 0.3, "window": (5, 2)},
    "sinks": {"sinks": np.array([0.5, -1.0, 2.0, 0.0], np.float32)},
}


@pytest.mark.parametrize("name", OPTIONS)
def test_a_forward_alone_gives_the_bits_of_one_that_keeps_its_ctx(rng, name):
    kv_heads = 2 if name == "gqa" else 4
    q = rng.standard_normal((2, 4, 70, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, kv_heads, 90, 8)).astype(np.float32) for _ in range(2))
    kwargs = {"block_q": 16, "block_k": 32, "return_lse": True, **OPTIONS[name]}

    kept = tiled.tiled_attention_forward(q, k, v, **kwargs)
    with no_grad():
        alone = tiled.tiled_attention_forward(q, k, v, **kwargs)

    assert kept.ctx is not None and alone.ctx is None
    np.testing.assert_array_equal(alone.out, kept.out)
    np.testing.assert_array_equal(alone.lse, kept.lse)


def test_a_forward_alone_holds_no_scaled_copy_of_q(rng):
    """(1, 1, 8192, 64) float32 in tiles of 64: q and the output are 2 MiB each, a tile's
    buffers a few KiB. The forward's peak traced memory is the output, lse and the tiles', well
    under the output and a copy of q."""
    q, k, v = (rng.standard_normal((1, 1, 8192, 64)).astype(np.float32) for _ in range(3))
    with no_grad():
        tiled.tiled_attention_forward(q, k, v, causal=True, block_q=64, block_k=64)  # warm-up
        tracemalloc.start()
        try:
            out = tiled.tiled_attention_forward(q, k, v, causal=True, block_q=64, block_k=64).out
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    assert peak < out.nbytes + q.nbytes // 2, peak


CUT_TILES = [
    {"causal": True},
    {"causal": True, "align": "bottom-right"},
    {"window": (40, 0)},
    {"window": (24, 24)},
    {"window": (None, 0), "align": "bottom-right"},
    {"causal": True, "chunk_size": 40},
]


@pytest.mark.parametrize("kwargs", CUT_TILES)
@pytest.mark.parametrize("lengths", [(203, 203), (113, 203), (203, 113)])
def test_the_pieces_of_a_cut_tile_hold_every_visible_score(kwargs, lengths, monkeypatch):
    """The forward takes exp only over the pieces of a tile a band cuts and writes 0 elsewhere:
    every visible score, by brute force, lies in a piece, and the pieces leave some out."""
    monkeypatch.setattr(tiled, "PIECE_KEYS", 8)
    n, m = lengths
    q, k, v = np.zeros((1, n, 1)), np.zeros((1, m, 1)), np.zeros((1, m, 1))
    probs = functional.attention_forward(q, k, v, impl="dense", **kwargs).ctx.probs[0]
    visible = probs > 0  # (N, M)
    rules = prepare(q, k, v, **kwargs).rules
    blocks = tiled._blocks(rules, 32, 32)
    left_out = 0
    for bi in range(-(-n // 32)):
        rows = slice(bi * 32, min(bi * 32 + 32, n))
        for cols, pieces in tiled._key_tiles(rules, blocks, rows):
            covered = np.ones((cols.stop - cols.start, rows.stop - rows.start), bool)  # (bk, bq)
            if pieces is not None:
                covered[:] = False
                for piece in pieces:
                    covered[piece.keys, piece.queries] = True
            assert not (visible[rows, cols].T & ~covered).any(), (rows, cols)
            left_out += (~covered).sum()
    assert left_out > 0


@pytest.mark.parametrize("kwargs", CUT_TILES)
@pytest.mark.parametrize("shift", ["bound", "running max"])
def test_exp_over_the_pieces_gives_the_bits_of_exp_over_the_whole_tile(
    rng, kwargs, shift, monkeypatch
):
    """The weights outside the pieces are exp(-inf) = 0 either way: out and lse are the same
    bits as a forward that takes exp over every cut tile whole, under either shift."""
    monkeypatch.setattr(tiled, "PIECE_KEYS", 8)
    q, k, v = make_qkv(rng, (2, 3), 113, 203, np.float32)
    sinks = rng.standard_normal(3).astype(np.float32)
    options = dict(kwargs, alibi_slopes=rng.random(3), sinks=sinks, softcap=3.0)
    bound = scores.fixed_shift(prepare(q, k, v, **options).rules)
    if shift == "running max":
        monkeypatch.setattr(scores, "fixed_shift", lambda rules: None)
    else:
        assert bound is not None

    def forward():
        return tiled.tiled_attention_forward(
            q, k, v, block_q=32, block_k=48, return_lse=True, **options
        )

    pieces = forward()
    monkeypatch.setattr(tiled, "_pieces", lambda rules, rows, cols: None)
    whole = forward()

    assert pieces.out.tobytes() == whole.out.tobytes()
    assert pieces.lse.tobytes() == whole.lse.tobytes()
