"""``torch_attention/triton/pipeline.py``'s device functions, each called alone from a small test
kernel (on CPU under Triton's interpreter, on a GPU where there is one) and compared with what
they stand for: ``block_range`` with ``numpy_attention.tiled._block_range``, ``tanh`` with
torch's, ``dropout_keep`` on a tile with the whole keep-mask the launcher reads back (the forward
and both backward passes draw the same mask without storing it); ``program_tile`` (every block of
every head once, the last first where asked), ``interior_cols`` / ``interior_rows`` against the
tiles that a brute-force check of the band finds visible whole, and ``head_start`` /
``tile_offsets`` at strides whose products pass 2^31 (the interpreter wraps int32 as a GPU does).
The score pipeline itself runs in every kernel test (test_launch.py, test_forward.py,
test_backward.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .conftest import NEEDS_TRITON

triton = pytest.importorskip("triton", reason=NEEDS_TRITON)
import triton.language as tl  # noqa: E402

from numpy_attention import tiled  # noqa: E402
from torch_attention.triton import launch, pipeline  # noqa: E402


@triton.jit
def _block_range_kernel(bounds, out, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    first, stop = pipeline.block_range(tl.load(bounds + 2 * i), tl.load(bounds + 2 * i + 1), BLOCK)
    tl.store(out + 2 * i, first)
    tl.store(out + 2 * i + 1, stop)


@triton.jit
def _tanh_kernel(x, out, SIZE: tl.constexpr):
    offsets = tl.arange(0, SIZE)
    tl.store(out + offsets, pipeline.tanh(tl.load(x + offsets)))


@triton.jit
def _keep_tile_kernel(keep, seed, dropout_p, keys_per_row, row0, col0, BM: tl.constexpr,
                      BN: tl.constexpr):  # fmt: skip
    rows = row0 + tl.arange(0, BM).to(tl.int64)
    cols = col0 + tl.arange(0, BN)
    kept = pipeline.dropout_keep(seed, dropout_p, rows, cols, keys_per_row)
    tl.store(keep + tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :], kept.to(tl.int8))


@triton.jit
def _program_tile_kernel(out, blocks, REVERSE: tl.constexpr):
    which, block = pipeline.program_tile(blocks, REVERSE)
    tl.store(out + 2 * tl.program_id(0), which)
    tl.store(out + 2 * tl.program_id(0) + 1, block)


@triton.jit
def _interior_kernel(params, out, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Per program, params (start, seqlen_q, seqlen_k, offset, left, right): the forward's walk
    of query block [start, start + BLOCK_M) and the dK/dV walk of key block [start, start +
    BLOCK_N), each as (first, mid_first, mid_stop, stop)."""
    at = params + 6 * tl.program_id(0)
    start, seqlen_q, seqlen_k = tl.load(at), tl.load(at + 1), tl.load(at + 2)
    offset, left, right = tl.load(at + 3), tl.load(at + 4), tl.load(at + 5)
    row_stop = tl.minimum(start + BLOCK_M, seqlen_q)
    lo, hi = pipeline.visible_cols(start, row_stop, offset, left, right, seqlen_k, HAS_LEFT,
                                   HAS_RIGHT)  # fmt: skip
    first, stop = pipeline.block_range(lo, hi, BLOCK_N)
    mid_first, mid_stop = pipeline.interior_cols(
        start, row_stop, first, stop, offset, left, right, seqlen_k, HAS_LEFT, HAS_RIGHT, BLOCK_N
    )
    walk = out + 8 * tl.program_id(0)
    tl.store(walk, first)
    tl.store(walk + 1, mid_first)
    tl.store(walk + 2, mid_stop)
    tl.store(walk + 3, stop)
    col_stop = tl.minimum(start + BLOCK_N, seqlen_k)
    lo, hi = pipeline.visible_rows(start, col_stop, offset, left, right, seqlen_q, HAS_LEFT,
                                   HAS_RIGHT)  # fmt: skip
    first, stop = pipeline.block_range(lo, hi, BLOCK_M)
    mid_first, mid_stop = pipeline.interior_rows(
        start, col_stop, first, stop, offset, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M
    )
    tl.store(walk + 4, first)
    tl.store(walk + 5, mid_first)
    tl.store(walk + 6, mid_stop)
    tl.store(walk + 7, stop)


@triton.jit
def _offsets_kernel(out, b, h, start, stride_b, stride_h, stride_n, stride_d,
                    BLOCK: tl.constexpr):  # fmt: skip
    tl.store(out, pipeline.head_start(b, h, start, stride_b, stride_h, stride_n))
    index = tl.arange(0, BLOCK)
    offsets = pipeline.tile_offsets(index, index, stride_n, stride_d)  # (BLOCK, BLOCK)
    tl.store(out + 1 + index[:, None] * BLOCK + index[None, :], offsets)


@pytest.mark.parametrize("reverse", [False, True])
def test_program_tile_gives_every_block_of_every_head_once(reverse, device):
    blocks, heads = 5, 3
    out = torch.empty(2 * blocks * heads, dtype=torch.int32, device=device)

    _program_tile_kernel[(blocks * heads,)](out, blocks, REVERSE=reverse)

    tiles = [tuple(pair) for pair in out.reshape(-1, 2).tolist()]
    assert sorted(tiles) == [(w, b) for w in range(heads) for b in range(blocks)]
    assert [w for w, _ in tiles] == sorted(w for w, _ in tiles)  # a head's blocks are neighbours
    order = [b for w, b in tiles if w == 1]
    assert order == (list(range(blocks))[::-1] if reverse else list(range(blocks)))


def _fully_visible(rows, cols, offset, left, right):
    """Whether every (query i, key j) of the two ranges lies in the band p_i - left <= j <=
    p_i + right (None: that side unbounded), p_i = i + offset."""
    i, j = np.arange(rows.start, rows.stop)[:, None] + offset, np.arange(cols.start, cols.stop)
    return bool(((right is None) | (j <= i + (right or 0))).all()
                and ((left is None) | (j >= i - (left or 0))).all())  # fmt: skip


def _split(first, mid_first, mid_stop, stop, block):
    """The three walks as lists of block starts; they must partition range(first, stop)."""
    walks = [range(first, mid_first, block), range(mid_first, mid_stop, block),
             range(mid_stop, stop, block)]  # fmt: skip
    assert first <= mid_first <= mid_stop and [*walks[0], *walks[1], *walks[2]] == list(
        range(first, stop, block)
    )
    return set(walks[1])


@pytest.mark.parametrize(("has_left", "has_right"), [(False, False), (False, True),
                                                     (True, False), (True, True)])  # fmt: skip
def test_interior_tiles_are_exactly_the_tiles_every_row_sees_whole(has_left, has_right, device):
    """Forward and dQ walk: a key block is interior when it lies inside the keys and every
    real query row sees all of it. dK/dV walk: a query block is interior when each of its
    rows (those past the queries' end too) sees every real key of the key block."""
    block_m, block_n = 16, 8
    params = [  # offsets of every residue mod 16: each edge falls on and beside a block's edge
        (start, n, m, offset, left, right)
        for n, m in ((40, 37), (23, 47))
        for start in range(0, max(n, m), 8)
        for offset in range(-4, 12)
        for left, right in ((9, 0), (30, 7), (2, 20))
    ]
    flat = torch.tensor(params, dtype=torch.int32, device=device)
    out = torch.empty((len(params), 8), dtype=torch.int32, device=device)

    _interior_kernel[(len(params),)](flat, out, HAS_LEFT=has_left, HAS_RIGHT=has_right,
                                     BLOCK_M=block_m, BLOCK_N=block_n)  # fmt: skip

    for (start, n, m, offset, left, right), walks in zip(params, out.tolist(), strict=True):
        left, right = (left if has_left else None), (right if has_right else None)
        if start % block_m == 0 and start < n:  # query block [start, start + BLOCK_M)
            rows = range(start, min(start + block_m, n))
            interior = _split(*walks[:4], block_n)
            for c in range(walks[0], walks[3], block_n):
                whole = c + block_n <= m and _fully_visible(rows, range(c, c + block_n),
                                                            offset, left, right)  # fmt: skip
                assert (c in interior) == whole, (start, n, m, offset, left, right, c)
        if start % block_n == 0 and start < m:  # key block [start, start + BLOCK_N)
            cols = range(start, min(start + block_n, m))
            interior = _split(*walks[4:], block_m)
            for r in range(walks[4], walks[7], block_m):
                whole = _fully_visible(range(r, r + block_m), cols, offset, left, right)
                assert (r in interior) == whole, (start, n, m, offset, left, right, r)


def test_offsets_pass_2_to_the_31_in_64_bits(device):
    """Strides below 2^31 (int32 arguments) whose products pass it: b * stride_b, start *
    stride_n, and 15 * stride_d of a layout with D outermost. Wrapped in int32 they would
    address other elements."""
    block, strides = 16, (2**30, 2**20, 2**26, 2**28)  # (b, h, n, d)
    out = torch.empty(1 + block * block, dtype=torch.int64, device=device)

    _offsets_kernel[(1,)](out, 5, 7, 40, *strides, BLOCK=block)

    assert out[0].item() == 5 * strides[0] + 7 * strides[1] + 40 * strides[2]
    expected = [[i * strides[2] + w * strides[3] for w in range(block)] for i in range(block)]
    assert out[1:].reshape(block, block).tolist() == expected


@pytest.mark.parametrize("block", [16, 64])
def test_block_range_holds_the_blocks_tiled_would_visit(block, device):
    bounds = [(lo, hi) for lo in (0, 1, 15, 16, 17, 40) for hi in (0, 1, 16, 17, 33, 64, 65)]
    flat = torch.tensor([x for pair in bounds for x in pair], dtype=torch.int32, device=device)
    out = torch.empty_like(flat)

    _block_range_kernel[(len(bounds),)](flat, out, BLOCK=block)

    for i, (lo, hi) in enumerate(bounds):
        first, stop = out[2 * i].item(), out[2 * i + 1].item()
        expected = [b * block for b in tiled._block_range(lo, hi, block)]
        assert list(range(first, stop, block)) == expected, (lo, hi)


def test_tanh_is_torchs_also_where_exp_overflows(device):
    x = torch.tensor([-500.0, -30.0, -1.0, -1e-4, 0.0, 1e-4, 0.5, 3.0, 30.0, 500.0] + [0.0] * 6,
                     device=device)  # fmt: skip
    out = torch.empty_like(x)

    _tanh_kernel[(1,)](x, out, SIZE=16)

    torch.testing.assert_close(out, torch.tanh(x), rtol=4e-7, atol=1e-7)


def test_a_tiles_keep_mask_is_the_launchers_whole_mask_there(device):
    seed, p, shape = 1234, 0.3, (2, 3, 40, 70)  # (B, H, N, M): rows of all heads, 70 keys
    whole = launch.dropout_mask(seed, p, shape, device).reshape(-1, 70)
    tile = torch.empty((16, 32), dtype=torch.int8, device=device)

    _keep_tile_kernel[(1,)](tile, seed, p, 70, 100, 32, BM=16, BN=32)

    assert torch.equal(tile.bool(), whole[100:116, 32:64])
    kept = whole.float().mean().item()  # 16,800 draws: 1 - p within 6 binomial sigmas
    assert abs(kept - (1 - p)) < 6 * (p * (1 - p) / whole.numel()) ** 0.5
    assert not torch.equal(launch.dropout_mask(seed + 1, p, shape, device), whole.reshape(shape))
    assert not torch.equal(whole[1:, :-1], whole[:-1, 1:])  # each entry its own draw, no shifts
