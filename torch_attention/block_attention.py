"""One step of ring attention: a shard's queries against one key/value block at global
positions. ``visible_block`` finds the part of the block that some query may see (causal and
windows skip whole blocks, or narrow them), ``tiles`` cuts the queries into tiles of
``_QUERY_TILE`` rows with the keys each may see, and ``block_forward`` / ``block_backward`` are
the pair that ``distributed.ring_attention`` runs on each tile:

    forward:   S = (Q * scale) K^T over global positions (softcap, the band);
               out = softmax(S) V and lse = logsumexp(S), a row that sees nothing out 0, lse -inf
    backward:  from the final lse and delta = rowsum(dO * O) of the whole sequence:
               P = exp(S - lse);  dV = sum_g P^T dO;  dP = dO V^T;  dS = P * (dP - delta);
               dS1 = dS * (1 - tanh^2(S1 / softcap));  dQ = dS1 K * scale;  dK = sum_g dS1^T Q'

Shape legend: B batch, H_kv key/value heads, g = H / H_kv (the GQA group), rows and cols a
tile's queries and keys, D head width, Dv value head width.

Derivation: docs/derivations/lse.md and tiled.md (the per-block backward from the final lse and
delta), docs/context-parallel.md (the schedule). Tests: tests/torch_attention/test_distributed.py
(through the ring, and the visible blocks of every layout).
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

import torch

from . import scores
from .rules import ScoreRules

# Query rows attended per matmul within one block: the scores of a block are (tile x n), so the
# memory of a rank grows with n = N/W, not with n^2.
_QUERY_TILE = 256


class Block(NamedTuple):
    rows: slice  # the shard's query rows that see some key of the block
    cols: slice  # the block's keys that some of those queries see
    kpos: torch.Tensor  # the global positions of those keys, ascending


def visible_block(
    rules: ScoreRules,
    q_chunks: tuple[tuple[int, int], ...],
    k_chunks: tuple[tuple[int, int], ...],
    k_positions: torch.Tensor,
) -> Block | None:
    """The part of a key/value block that a shard's queries may see, or None when no query may
    see any of its keys (causal or window): the block is skipped. ``q_chunks`` and ``k_chunks``
    are the (global start, length) runs of positions the queries and the block hold, in shard
    order; ``k_positions`` the block's global key positions, (sum of the lengths,)."""
    seen = [
        (a, b)
        for a, (q_start, q_len) in enumerate(q_chunks)
        for b, (k_start, k_len) in enumerate(k_chunks)
        if _sees(rules, q_start, q_len, k_start, k_len)
    ]
    if not seen:
        return None
    row_span = _span(q_chunks, {a for a, _ in seen})
    col_span = _span(k_chunks, {b for _, b in seen})
    return Block(row_span, col_span, k_positions[col_span])


def _sees(rules: ScoreRules, q_start: int, q_len: int, k_start: int, k_len: int) -> bool:
    """Whether some query in [q_start, q_start + q_len) may see some key in [k_start, ...)."""
    if q_len == 0 or k_len == 0:
        return False
    nearest = k_start - (q_start + q_len - 1)  # the smallest j - i of the two ranges
    farthest = k_start + k_len - 1 - q_start  # the largest
    left, right = rules.left, rules.right
    return (right is None or nearest <= right) and (left is None or farthest >= -left)


def _span(chunks: tuple[tuple[int, int], ...], chosen: set[int]) -> slice:
    """The local slice covering the chosen chunks (and any between them)."""
    starts = [sum(size for _, size in chunks[:i]) for i in range(len(chunks) + 1)]
    return slice(starts[min(chosen)], starts[max(chosen) + 1])


def tiles(rules: ScoreRules, block: Block, qpos: torch.Tensor) -> list[tuple[slice, slice]]:
    """The block's query rows in tiles of ``_QUERY_TILE``, each with the slice of the block's
    keys that it may see (causal and windows narrow it; positions ascend within a shard, so a
    tile's first and last queries bound its reach); a tile that sees nothing is left out."""
    first_positions = qpos[block.rows].tolist()
    keys = block.kpos.tolist()
    tiles = []
    for start in range(0, len(first_positions), _QUERY_TILE):
        stop = min(start + _QUERY_TILE, len(first_positions))
        first, last = first_positions[start], first_positions[stop - 1]
        left, right = rules.left, rules.right
        lo = 0 if left is None else bisect.bisect_left(keys, first - left)
        hi = len(keys) if right is None else bisect.bisect_right(keys, last + right)
        if lo < hi:
            offset = block.rows.start
            tiles.append((slice(offset + start, offset + stop), slice(lo, hi)))
    return tiles


def _block_scores(
    q_scaled: torch.Tensor,
    k: torch.Tensor,
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    rules: ScoreRules,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """S (B, H_kv, g, rows, cols) of queries at global positions ``qpos`` against keys at
    ``kpos``, hidden entries replaced by -inf; and tanh(S1 / softcap) for the backward."""
    logits = q_scaled @ k.transpose(-2, -1)  # S1 = (Q * scale) K^T
    capped = None
    if rules.softcap:  # as in scores.scores_forward, keeping tanh for the backward
        capped = torch.tanh(logits / rules.softcap)
        logits = rules.softcap * capped
    visible = scores.band(rules, qpos[:, None], kpos[None, :])  # on global positions
    if visible is not None:
        logits = logits.masked_fill(~visible, float("-inf"))  # replaced, never added to
    return logits, capped


def block_forward(
    q_scaled: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    rules: ScoreRules,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (B, H_kv, g, rows, D) over one block k (B, H_kv, 1, cols, D), v (...,
    cols, Dv): out (B, H_kv, g, rows, Dv) and lse (B, H_kv, g, rows); a row that sees nothing
    in the block gets out 0 and lse -inf, which the merge weighs 0."""
    logits, _ = _block_scores(q_scaled, k, qpos, kpos, rules)
    shift = logits.amax(dim=-1, keepdim=True)  # (..., rows, 1)
    shift = shift.masked_fill(torch.isneginf(shift), 0.0)  # a dead row: -inf - (-inf) = NaN
    exps = (logits - shift).exp()
    total = exps.sum(dim=-1, keepdim=True)  # (..., rows, 1)
    out = (exps @ v) / total.masked_fill(total == 0, 1.0)  # (..., rows, Dv)
    lse = (shift + total.log()).squeeze(-1)  # log 0 = -inf on a dead row
    return out, lse


def block_backward(
    q_scaled: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    rules: ScoreRules,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This block's share of dq (B, H_kv, g, rows, D), dk (B, H_kv, 1, cols, D) and dv, from
    the final lse and delta of the rows (the whole sequence's, not the block's).

    P = exp(S - lse);  dV = sum_g P^T dO;  dP = dO V^T;  dS = P * (dP - delta);
    dS1 = dS * (1 - tanh^2(S1 / softcap)) (softcap only);  dQ = dS1 K * scale;
    dK = sum_g dS1^T (Q * scale).
    """
    logits, capped = _block_scores(q_scaled, k, qpos, kpos, rules)
    lse = lse.masked_fill(torch.isneginf(lse), float("inf"))  # a dead row: P = exp(S - inf) = 0
    probs = (logits - lse[..., None]).exp()  # (..., rows, cols)
    dv = (probs.transpose(-2, -1) @ dout).sum(dim=2, keepdim=True)  # forward: O = P V
    dprobs = dout @ v.transpose(-2, -1)
    dscores = probs * (dprobs - delta[..., None])  # forward: P = softmax(S)
    if capped is not None:
        dscores = dscores * (1 - capped * capped)  # forward: S = softcap * tanh(S1 / softcap)
    dq = (dscores @ k) * rules.scale  # forward: S1 = (Q * scale) K^T
    dk = (dscores.transpose(-2, -1) @ q_scaled).sum(dim=2, keepdim=True)
    return dq, dk, dv
