"""Context parallelism: ring attention over the ranks of a torch.distributed process group.

A sequence too long for one device is split along N across the W ranks of a process group
(gloo on CPU, NCCL on GPU); every rank holds one shard of q, k and v and gets back its shard of
the output. ``ring_attention`` passes the key/value blocks around the ring: at step s rank r
holds the block of rank (r - s) mod W, attends its queries over it, and merges that partial
result into its running one through their log-sum-exps (``torch_attention.merge``), while the
next block is already travelling (asynchronous point-to-point ops). Nothing ever gathers the
whole K or V.

    forward, per rank and step:  (O_s, lse_s) = attention(Q_r, K_j, V_j) over global positions;
                                 (O, lse) = merge(O, lse, O_s, lse_s)
    backward (flash-style, with the final lse and delta = rowsum(dO * O)):
                                 P = exp(S - lse);  dV_j += P^T dO;  dP = dO V_j^T;
                                 dS = P * (dP - delta) (* (1 - tanh^2) under softcap);
                                 dQ_r += dS K_j * scale;  dK_j += dS^T Q_r * scale
    where dK_j, dV_j travel around the ring with K_j, V_j and arrive home after W steps.

Positions are global and N = M (self-attention): ``causal`` (j <= i) and ``window`` (i - left
<= j <= i + right) are read on them, so blocks that no query of a shard may see are skipped (the
data still moves). ``layout="contiguous"`` gives rank r positions [r N/W, (r+1) N/W);
``"zigzag"`` gives it chunk r and chunk 2W-1-r of 2W equal chunks, so that every rank does the
same causal work. ``gather_sequence`` / ``shard_sequence`` move between a shard and the whole
sequence in either layout (what a test or the kernel checker needs to judge a ring).

Every rank checks its own input, then all ranks exchange a small row of metadata (shapes, dtype,
options) before any point-to-point op: an input refused anywhere is an error on every rank,
never a deadlock. Every wait is bounded by the group's timeout (``init_process_group(timeout=)``
or ``new_group(timeout=)``). docs/context-parallel.md draws the schedule and the measurements.

This module is the ring and its public helpers; one step of it, a shard's queries against one
block (the visible part, the tiles, the forward/backward pair), is ``block_attention.py``; what
it asks of the process group (membership, the metadata exchange, the pass to the next rank),
``process_group.py``; the checks and the metadata rows every rank compares (and ``LAYOUTS``),
``ring_checks.py``.

Shape legend: B batch, H query heads, H_kv key/value heads, N whole sequence length, W ranks,
n = N/W positions per rank, D head width, Dv value head width; g = H / H_kv (GQA group).

Derivation: docs/derivations/merge.md (the merge), docs/derivations/lse.md and tiled.md (the
per-block backward from the final lse and delta). Tests: tests/torch_attention/test_distributed.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from . import validation
from .block_attention import Block, block_backward, block_forward, tiles, visible_block
from .merge import merge_attention
from .process_group import Exchange, exchange, membership, pass_on
from .ring_checks import (
    DTYPES,
    MAX_NDIM,
    RING_FIELDS,
    check_agreement,
    check_dtype,
    check_layout,
    check_ring_inputs,
    check_zigzag_length,
    ring_row,
    shape_of,
)
from .rules import ScoreRules, compute_dtype

# -- positions and layouts ------------------------------------------------------------------------


def _chunks(layout: str, rank: int, world: int, length: int) -> tuple[tuple[int, int], ...]:
    """The (global start, length) of each run of positions a rank holds, in shard order."""
    if layout == "contiguous":
        return ((rank * length, length),)
    half = length // 2
    return ((rank * half, half), ((2 * world - 1 - rank) * half, half))


def _chunk_positions(chunks: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    return torch.cat([torch.arange(start, start + size, device=device) for start, size in chunks])


def shard_positions(
    seq_len: int, rank: int, world_size: int, layout: str = "contiguous"
) -> torch.Tensor:
    """The global positions of the sequence that rank ``rank`` holds, (N/W,) int64.

    ``"contiguous"``: [rank N/W, (rank+1) N/W). ``"zigzag"``: chunk ``rank`` followed by chunk
    2W-1-rank of 2W equal chunks. These are the positions to give RoPE on each rank.
    """
    seq_len = validation.non_negative_int("seq_len", seq_len)
    world_size = validation.positive_int("world_size", world_size)
    rank = validation.non_negative_int("rank", rank)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    check_layout(layout)
    parts = world_size * (2 if layout == "zigzag" else 1)
    if seq_len % parts != 0:
        raise ValueError(
            f"layout {layout!r} over {world_size} ranks splits the sequence into {parts} equal "
            f"chunks; seq_len = {seq_len} is not a multiple of {parts}"
        )
    chunks = _chunks(layout, rank, world_size, seq_len // world_size)
    return _chunk_positions(chunks, torch.device("cpu"))


def shard_sequence(
    x: torch.Tensor, rank: int, world_size: int, *, layout: str = "contiguous"
) -> torch.Tensor:
    """Rank ``rank``'s shard of a whole sequence x (..., N, D) -> (..., N/W, D) (a copy)."""
    x = validation.float_tensor("x", x)
    if x.ndim < 2:
        raise ValueError(f"x must be (..., N, D), got shape {tuple(x.shape)}")
    positions = shard_positions(x.shape[-2], rank, world_size, layout)
    return x.index_select(-2, positions.to(x.device))


def gather_sequence(
    shard: torch.Tensor, *, group: dist.ProcessGroup | None = None, layout: str = "contiguous"
) -> torch.Tensor:
    """The whole sequence (..., N, D) on every rank, from every rank's shard (..., N/W, D).

    The inverse of ``shard_sequence``, for judging a ring against a single-device golden (not
    differentiable). Shards of different shapes or dtypes across ranks are an error on every
    rank, found by a metadata exchange before the gather.
    """
    rank, world = membership(group)
    try:
        shard = validation.float_tensor("shard", shard)
        check_dtype("shard", shard)
        if not 2 <= shard.ndim <= MAX_NDIM:
            raise ValueError(
                f"shard must be (..., N/W, D) with 2 to {MAX_NDIM} axes, got {tuple(shard.shape)}"
            )
        check_layout(layout)
        check_zigzag_length(layout, shard.shape[-2], "shard", tuple(shard.shape))
    except (TypeError, ValueError):
        exchange(group, MAX_NDIM + 1, None, "gather_sequence")  # the peers stop too
        raise
    shape = list(shard.shape) + [-1] * (MAX_NDIM - shard.ndim)
    row = [float(s) for s in shape] + [float(DTYPES.index(shard.dtype))]
    table = exchange(group, MAX_NDIM + 1, row, "gather_sequence")
    if not bool((table == table[0]).all()):
        listed = "; ".join(
            f"rank {r}: {shape_of(table[r, :MAX_NDIM])} {DTYPES[int(table[r, -1])]}"
            for r in range(world)
        )
        raise ValueError(f"gather_sequence: the shards differ across the ranks: {listed}")
    shard = shard.contiguous()
    pieces = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(pieces, shard, group=group)
    length = shard.shape[-2]
    positions = torch.cat(
        [_chunk_positions(_chunks(layout, r, world, length), shard.device) for r in range(world)]
    )  # the global position of each row of the concatenated shards
    whole = torch.empty(
        shard.shape[:-2] + (world * length, shard.shape[-1]), dtype=shard.dtype, device=shard.device
    )
    return whole.index_copy_(-2, positions, torch.cat(pieces, dim=-2))


# -- the ring -----------------------------------------------------------------------------------


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float = 0.0,
    window: tuple[int | None, int | None] | None = None,
    enable_gqa: bool = False,
    layout: str = "contiguous",
) -> torch.Tensor:
    """Attention over a sequence split across the ranks of ``group``; this rank's output shard.

    S = (Q K^T) * scale over global positions; S = softcap * tanh(S / softcap); S = -inf where
    causal (j > i) or outside the window; O = softmax(S) V. Every rank of the group must call
    it with shards of one shape and dtype and the same options, and must run the backward too.

    Args:
        q: (B, H, n, D), this rank's queries; n = N/W.
        k: (B, H_kv, n, D), this rank's keys (H_kv = H unless ``enable_gqa``).
        v: (B, H_kv, n, Dv), this rank's values.
        group: the process group (None: the default group); r = this rank within it.
        causal: query i sees keys j <= i (global positions, top-left, N = M).
        scale: multiplies q k^T; defaults to 1 / sqrt(D).
        softcap: > 0 caps the scores with ``softcap * tanh(S / softcap)``; 0 = off.
        window: (left, right), query i sees keys i - left <= j <= i + right; None = unbounded.
        enable_gqa: k and v may have H_kv heads with H % H_kv == 0; query head h reads kv head
            h // (H / H_kv); dK and dV sum over each group.
        layout: ``"contiguous"`` (rank r holds [r n, (r+1) n)) or ``"zigzag"`` (chunks r and
            2W-1-r of 2W, balanced causal work; n must be even).

    Returns:
        (B, H, n, Dv) in the inputs' dtype (float16 and bfloat16 computed in float32),
        differentiable: its backward runs a second ring that brings each rank the full dK, dV
        of its own shard.
    """
    rank, world = membership(group)
    try:
        rules = check_ring_inputs(q, k, v, causal, scale, softcap, window, enable_gqa, layout)
    except (TypeError, ValueError):
        exchange(group, len(RING_FIELDS), None, "ring_attention")  # the peers stop too
        raise
    row = ring_row(q, k, v, rules, causal, layout)
    check_agreement(exchange(group, len(RING_FIELDS), row, "ring_attention"))
    plan = _Plan(rules, layout, group, rank, world)
    return _RingAttention.apply(q, k, v, plan)


class _Plan(NamedTuple):
    """Everything the ring needs besides the tensors, checked."""

    rules: ScoreRules  # scale, softcap and the visible band (left, right), offset 0
    layout: str
    group: dist.ProcessGroup | None = None
    rank: int = 0
    world: int = 1


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan) -> Any:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = _ring_forward(q, k, v, plan)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return _ungroup(out).to(q.dtype)  # (B, H_kv, g, n, Dv) -> (B, H, n, Dv)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout, q, k, v, out, lse, ctx.plan)
        return _ungroup(dq).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def _visible_block(plan: _Plan, origin: int, rows: int, device: torch.device) -> Block | None:
    """The part of the block from rank ``origin`` that this rank's queries may see, or None
    when no query may see any of its keys (causal or window): the block is skipped."""
    q_chunks = _chunks(plan.layout, plan.rank, plan.world, rows)
    k_chunks = _chunks(plan.layout, origin, plan.world, rows)
    return visible_block(plan.rules, q_chunks, k_chunks, _chunk_positions(k_chunks, device))


def _kv_origin(rank: int, step: int, world: int) -> int:
    """The rank whose key/value block this rank holds at ``step``: blocks move to rank + 1."""
    return (rank - step) % world


def _ring_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan
) -> tuple[torch.Tensor, torch.Tensor]:
    """out (B, H_kv, g, n, Dv) and lse (B, H_kv, g, n), in the compute dtype."""
    compute = compute_dtype(q.dtype)
    q_scaled = _group(q, k).to(compute) * plan.rules.scale  # (B, H_kv, g, n, D)
    rows = q_scaled.shape[-2]
    qpos = _chunk_positions(_chunks(plan.layout, plan.rank, plan.world, rows), q.device)
    out = q_scaled.new_zeros(q_scaled.shape[:-1] + (v.shape[-1],))  # a dead state: out 0,
    lse = q_scaled.new_full(q_scaled.shape[:-1], float("-inf"))  # lse -inf
    for _, block, k_blk, v_blk in _ring_steps(k, v, plan, rows, compute):
        if block is not None:
            for tile, cols in tiles(plan.rules, block, qpos):
                part = block_forward(
                    q_scaled[..., tile, :],
                    k_blk[..., cols, :],
                    v_blk[..., cols, :],
                    qpos[tile],
                    block.kpos[cols],
                    plan.rules,
                )
                out[..., tile, :], lse[..., tile] = merge_attention(
                    out[..., tile, :], lse[..., tile], *part
                )
    return out, lse


def _ring_steps(
    k: torch.Tensor, v: torch.Tensor, plan: _Plan, rows: int, compute: torch.dtype
) -> Iterator[tuple[tuple[torch.Tensor, ...], Block | None, torch.Tensor, torch.Tensor]]:
    """The W steps of a ring: at each, the key/value block held (K, V as received), the part of
    it this rank's queries may see (None: skipped) and that part's K, V (B, H_kv, 1, cols, W) in
    the compute dtype. The send of the held block to the next rank is posted before the step is
    handed out and waited for after the caller is done with it: the transfer overlaps the
    caller's computation (and whatever the caller posts in between, the backward's dK, dV)."""
    held: tuple[torch.Tensor, ...] = (k, v)
    for step in range(plan.world):
        incoming = (
            pass_on(held, plan.group, plan.rank, plan.world, tag=0)
            if step < plan.world - 1
            else None
        )
        block = _visible_block(plan, _kv_origin(plan.rank, step, plan.world), rows, k.device)
        if block is None:
            yield held, None, k, v  # K, V unused: nothing to see
        else:
            k_blk, v_blk = (t[..., block.cols, :].to(compute).unsqueeze(2) for t in held)
            yield held, block, k_blk, v_blk
        if incoming is not None:
            held = incoming.wait()


def _ring_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    plan: _Plan,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq (B, H_kv, g, n, D), dk (B, H_kv, n, D), dv (B, H_kv, n, Dv), compute dtype.

    K/V go around the ring again; beside them travel the partial dK/dV of the block, to which
    each rank adds its queries' share before passing them on: after W steps the block is back
    home with the sum over every rank's queries. dq stays local.
    """
    compute = out.dtype
    q_scaled = _group(q, k).to(compute) * plan.rules.scale  # (B, H_kv, g, n, D)
    dout = _group(dout, k).to(compute)  # (B, H_kv, g, n, Dv)
    delta = (dout * out).sum(dim=-1)  # rowsum(dO * O), (B, H_kv, g, n)
    rows = q_scaled.shape[-2]
    qpos = _chunk_positions(_chunks(plan.layout, plan.rank, plan.world, rows), q.device)
    dq = torch.zeros_like(q_scaled)
    partial: Exchange | None = None  # the held block's dK/dV so far, from the previous rank
    for held, block, k_blk, v_blk in _ring_steps(k, v, plan, rows, compute):
        if block is not None:
            dk_blk, dv_blk = torch.zeros_like(k_blk), torch.zeros_like(v_blk)
            for tile, cols in tiles(plan.rules, block, qpos):
                dq_tile, dk_tile, dv_tile = block_backward(
                    q_scaled[..., tile, :],
                    k_blk[..., cols, :],
                    v_blk[..., cols, :],
                    dout[..., tile, :],
                    lse[..., tile],
                    delta[..., tile],
                    qpos[tile],
                    block.kpos[cols],
                    plan.rules,
                )
                dq[..., tile, :] += dq_tile
                dk_blk[..., cols, :] += dk_tile
                dv_blk[..., cols, :] += dv_tile
        dk_held, dv_held = (
            partial.wait()
            if partial is not None
            else (torch.zeros(t.shape, dtype=compute, device=t.device) for t in held)
        )
        if block is not None:
            dk_held[..., block.cols, :] += dk_blk.squeeze(2)
            dv_held[..., block.cols, :] += dv_blk.squeeze(2)
        if plan.world > 1:
            partial = pass_on(
                (dk_held, dv_held), plan.group, plan.rank, plan.world, tag=2
            )  # on to the next rank
    if partial is None:  # a ring of one rank: the block never left
        return dq, dk_held, dv_held
    dk, dv = partial.wait()  # the last hop brings this rank's own block home, complete
    return dq, dk, dv


def _group(x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """(B, H, n, W) -> (B, H_kv, g, n, W): query head h = (h // g, h % g)."""
    return x.unflatten(1, (kv.shape[1], -1))


def _ungroup(x: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, g, n, W) -> (B, H, n, W)."""
    return x.flatten(1, 2)
