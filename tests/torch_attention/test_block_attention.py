"""torch_attention.block_attention: which part of a key/value block a shard's queries may see."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from torch_attention.block_attention import visible_block

CAUSAL = SimpleNamespace(left=None, right=0)  # key j visible from query i when j - i <= 0
FULL = SimpleNamespace(left=None, right=None)


def test_a_block_wholly_in_the_future_of_the_queries_is_skipped():
    keys = torch.arange(8, 12)

    assert visible_block(CAUSAL, ((0, 4),), ((8, 4),), keys) is None
    assert visible_block(FULL, ((0, 4),), ((8, 4),), keys) is not None


def test_only_the_chunks_some_query_sees_are_kept():
    # queries at 4..7; keys in two chunks, 0..3 (seen) and 12..15 (future: not seen)
    keys = torch.tensor([0, 1, 2, 3, 12, 13, 14, 15])

    block = visible_block(CAUSAL, ((4, 4),), ((0, 4), (12, 4)), keys)

    assert block is not None
    assert (block.rows, block.cols) == (slice(0, 4), slice(0, 4))
    assert torch.equal(block.kpos, torch.arange(4))
