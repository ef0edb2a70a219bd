"""Broken kernels with ``ring_attention``'s signature: a block placed at the wrong positions.

Tests: tests/checker/pitfalls/test_init.py
"""

from __future__ import annotations

from . import Pitfall


def ring_wrong_block_offset(q, k, v, **options):
    """Ring attention that believes each key/value block comes from one rank further back than
    it does (a wrong block offset): every block is placed at the wrong positions."""
    from unittest import mock

    from torch_attention import distributed

    def origin(rank: int, step: int, world: int) -> int:
        return (rank - step + 1) % world

    with mock.patch.object(distributed, "_kv_origin", origin):
        return distributed.ring_attention(q, k, v, **options)


PITFALLS: dict[str, Pitfall] = {
    "ring_wrong_block_offset": Pitfall(ring_wrong_block_offset, "ring-causal", "out", "ring"),
}
