"""The tiled forward without a backward (numpy_attention.tiled under ``no_grad()``): each tile
scales its own rows of q as it reads them, where a forward that keeps its ctx scales the whole of
q once for the backward. Both give the same bits; the forward alone holds no scaled copy of q.
Everything else about the tiled path: test_tiled.py.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from numpy_attention import no_grad, tiled

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
