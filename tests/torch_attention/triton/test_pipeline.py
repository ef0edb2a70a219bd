"""``torch_attention/triton/pipeline.py``'s device functions, each called alone from a small test
kernel (on CPU under Triton's interpreter, on a GPU where there is one) and compared with what
they stand for: ``block_range`` with ``numpy_attention.tiled._block_range``, ``tanh`` with
torch's, ``dropout_keep`` on a tile with the whole keep-mask the launcher reads back (the forward
and both backward passes draw the same mask without storing it). The score pipeline itself runs
in every kernel test (test_launch.py, test_forward.py, test_backward.py)."""

from __future__ import annotations

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
