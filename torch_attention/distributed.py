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

Shape legend: B batch, H query heads, H_kv key/value heads, N whole sequence length, W ranks,
n = N/W positions per rank, D head width, Dv value head width; g = H / H_kv (GQA group).

Derivation: docs/derivations/merge.md (the merge), docs/derivations/lse.md and tiled.md (the
per-block backward from the final lse and delta). Tests: tests/torch_attention/test_distributed.py.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from . import scores, validation
from .merge import merge_attention

LAYOUTS = ("contiguous", "zigzag")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Query rows attended per matmul within one block: the scores of a block are (tile x n), so the
# memory of a rank grows with n = N/W, not with n^2.
_QUERY_TILE = 256


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
    _check_layout(layout)
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
    rank, world = _membership(group)
    try:
        shard = validation.float_tensor("shard", shard)
        _check_dtype("shard", shard)
        if not 2 <= shard.ndim <= _MAX_NDIM:
            raise ValueError(
                f"shard must be (..., N/W, D) with 2 to {_MAX_NDIM} axes, got {tuple(shard.shape)}"
            )
        _check_layout(layout)
        _check_zigzag_length(layout, shard.shape[-2], "shard", tuple(shard.shape))
    except (TypeError, ValueError):
        _exchange(group, _MAX_NDIM + 1, None, "gather_sequence")  # the peers stop too
        raise
    shape = list(shard.shape) + [-1] * (_MAX_NDIM - shard.ndim)
    row = [float(s) for s in shape] + [float(_DTYPES.index(shard.dtype))]
    table = _exchange(group, _MAX_NDIM + 1, row, "gather_sequence")
    if not bool((table == table[0]).all()):
        listed = "; ".join(
            f"rank {r}: {_shape_of(table[r, :_MAX_NDIM])} {_DTYPES[int(table[r, -1])]}"
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
    rank, world = _membership(group)
    try:
        plan = _check_ring_inputs(q, k, v, causal, scale, softcap, window, enable_gqa, layout)
    except (TypeError, ValueError):
        _exchange(group, len(_RING_FIELDS), None, "ring_attention")  # the peers stop too
        raise
    row = _ring_row(q, k, v, plan, causal, layout)
    _check_agreement(_exchange(group, len(_RING_FIELDS), row, "ring_attention"))
    plan = plan._replace(group=group, rank=rank, world=world)
    return _RingAttention.apply(q, k, v, plan)


class _Plan(NamedTuple):
    """Everything the ring needs besides the tensors, checked."""

    rules: scores.ScoreRules  # scale, softcap and the visible band (left, right), offset 0
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


def _kv_origin(rank: int, step: int, world: int) -> int:
    """The rank whose key/value block this rank holds at ``step``: blocks move to rank + 1."""
    return (rank - step) % world


def _ring_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan
) -> tuple[torch.Tensor, torch.Tensor]:
    """out (B, H_kv, g, n, Dv) and lse (B, H_kv, g, n), in the compute dtype."""
    compute = scores.compute_dtype(q.dtype)
    q_scaled = _group(q, k).to(compute) * plan.rules.scale  # (B, H_kv, g, n, D)
    rows = q_scaled.shape[-2]
    qpos = _chunk_positions(_chunks(plan.layout, plan.rank, plan.world, rows), q.device)
    out = q_scaled.new_zeros(q_scaled.shape[:-1] + (v.shape[-1],))  # a dead state: out 0,
    lse = q_scaled.new_full(q_scaled.shape[:-1], float("-inf"))  # lse -inf
    for _, block, k_blk, v_blk in _ring_steps(k, v, plan, rows, compute):
        if block is not None:
            for tile, cols in _tiles(plan, block, qpos):
                part = _block_forward(
                    q_scaled[..., tile, :],
                    k_blk[..., cols, :],
                    v_blk[..., cols, :],
                    qpos[tile],
                    block.kpos[cols],
                    plan,
                )
                out[..., tile, :], lse[..., tile] = merge_attention(
                    out[..., tile, :], lse[..., tile], *part
                )
    return out, lse


def _ring_steps(
    k: torch.Tensor, v: torch.Tensor, plan: _Plan, rows: int, compute: torch.dtype
) -> Iterator[tuple[tuple[torch.Tensor, ...], _Block | None, torch.Tensor, torch.Tensor]]:
    """The W steps of a ring: at each, the key/value block held (K, V as received), the part of
    it this rank's queries may see (None: skipped) and that part's K, V (B, H_kv, 1, cols, W) in
    the compute dtype. The send of the held block to the next rank is posted before the step is
    handed out and waited for after the caller is done with it: the transfer overlaps the
    caller's computation (and whatever the caller posts in between, the backward's dK, dV)."""
    held: tuple[torch.Tensor, ...] = (k, v)
    for step in range(plan.world):
        incoming = _pass_on(held, plan, tag=0) if step < plan.world - 1 else None
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
    partial: _Exchange | None = None  # the held block's dK/dV so far, from the previous rank
    for held, block, k_blk, v_blk in _ring_steps(k, v, plan, rows, compute):
        if block is not None:
            dk_blk, dv_blk = torch.zeros_like(k_blk), torch.zeros_like(v_blk)
            for tile, cols in _tiles(plan, block, qpos):
                dq_tile, dk_tile, dv_tile = _block_backward(
                    q_scaled[..., tile, :],
                    k_blk[..., cols, :],
                    v_blk[..., cols, :],
                    dout[..., tile, :],
                    lse[..., tile],
                    delta[..., tile],
                    qpos[tile],
                    block.kpos[cols],
                    plan,
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
            partial = _pass_on((dk_held, dv_held), plan, tag=2)  # on to the next rank
    if partial is None:  # a ring of one rank: the block never left
        return dq, dk_held, dv_held
    dk, dv = partial.wait()  # the last hop brings this rank's own block home, complete
    return dq, dk, dv


# -- one block --------------------------------------------------------------------------------


class _Block(NamedTuple):
    rows: slice  # the shard's query rows that see some key of the block
    cols: slice  # the block's keys that some of those queries see
    kpos: torch.Tensor  # the global positions of those keys, ascending


def _visible_block(plan: _Plan, origin: int, rows: int, device: torch.device) -> _Block | None:
    """The part of the block from rank ``origin`` that this rank's queries may see, or None
    when no query may see any of its keys (causal or window): the block is skipped."""
    q_chunks = _chunks(plan.layout, plan.rank, plan.world, rows)
    k_chunks = _chunks(plan.layout, origin, plan.world, rows)
    seen = [
        (a, b)
        for a, (q_start, q_len) in enumerate(q_chunks)
        for b, (k_start, k_len) in enumerate(k_chunks)
        if _sees(plan, q_start, q_len, k_start, k_len)
    ]
    if not seen:
        return None
    row_span = _span(q_chunks, {a for a, _ in seen})
    col_span = _span(k_chunks, {b for _, b in seen})
    kpos = _chunk_positions(k_chunks, device)[col_span]
    return _Block(row_span, col_span, kpos)


def _sees(plan: _Plan, q_start: int, q_len: int, k_start: int, k_len: int) -> bool:
    """Whether some query in [q_start, q_start + q_len) may see some key in [k_start, ...)."""
    if q_len == 0 or k_len == 0:
        return False
    nearest = k_start - (q_start + q_len - 1)  # the smallest j - i of the two ranges
    farthest = k_start + k_len - 1 - q_start  # the largest
    left, right = plan.rules.left, plan.rules.right
    return (right is None or nearest <= right) and (left is None or farthest >= -left)


def _span(chunks: tuple[tuple[int, int], ...], chosen: set[int]) -> slice:
    """The local slice covering the chosen chunks (and any between them)."""
    starts = [sum(size for _, size in chunks[:i]) for i in range(len(chunks) + 1)]
    return slice(starts[min(chosen)], starts[max(chosen) + 1])


def _tiles(plan: _Plan, block: _Block, qpos: torch.Tensor) -> list[tuple[slice, slice]]:
    """The block's query rows in tiles of ``_QUERY_TILE``, each with the slice of the block's
    keys that it may see (causal and windows narrow it; positions ascend within a shard, so a
    tile's first and last queries bound its reach); a tile that sees nothing is left out."""
    first_positions = qpos[block.rows].tolist()
    keys = block.kpos.tolist()
    tiles = []
    for start in range(0, len(first_positions), _QUERY_TILE):
        stop = min(start + _QUERY_TILE, len(first_positions))
        first, last = first_positions[start], first_positions[stop - 1]
        left, right = plan.rules.left, plan.rules.right
        lo = 0 if left is None else bisect.bisect_left(keys, first - left)
        hi = len(keys) if right is None else bisect.bisect_right(keys, last + right)
        if lo < hi:
            offset = block.rows.start
            tiles.append((slice(offset + start, offset + stop), slice(lo, hi)))
    return tiles


def _scores(
    q_scaled: torch.Tensor,
    k: torch.Tensor,
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    plan: _Plan,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """S (B, H_kv, g, rows, cols) of queries at global positions ``qpos`` against keys at
    ``kpos``, hidden entries replaced by -inf; and tanh(S1 / softcap) for the backward."""
    logits = q_scaled @ k.transpose(-2, -1)  # S1 = (Q * scale) K^T
    capped = None
    if plan.rules.softcap:  # as in scores.scores_forward, keeping tanh for the backward
        capped = torch.tanh(logits / plan.rules.softcap)
        logits = plan.rules.softcap * capped
    visible = scores.band(plan.rules, qpos[:, None], kpos[None, :])  # on global positions
    if visible is not None:
        logits = logits.masked_fill(~visible, float("-inf"))  # replaced, never added to
    return logits, capped


def _block_forward(
    q_scaled: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    plan: _Plan,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (B, H_kv, g, rows, D) over one block k (B, H_kv, 1, cols, D), v (...,
    cols, Dv): out (B, H_kv, g, rows, Dv) and lse (B, H_kv, g, rows); a row that sees nothing
    in the block gets out 0 and lse -inf, which the merge weighs 0."""
    logits, _ = _scores(q_scaled, k, qpos, kpos, plan)
    shift = logits.amax(dim=-1, keepdim=True)  # (..., rows, 1)
    shift = shift.masked_fill(torch.isneginf(shift), 0.0)  # a dead row: -inf - (-inf) = NaN
    exps = (logits - shift).exp()
    total = exps.sum(dim=-1, keepdim=True)  # (..., rows, 1)
    out = (exps @ v) / total.masked_fill(total == 0, 1.0)  # (..., rows, Dv)
    lse = (shift + total.log()).squeeze(-1)  # log 0 = -inf on a dead row
    return out, lse


def _block_backward(
    q_scaled: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    plan: _Plan,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This block's share of dq (B, H_kv, g, rows, D), dk (B, H_kv, 1, cols, D) and dv, from
    the final lse and delta of the rows (the whole sequence's, not the block's).

    P = exp(S - lse);  dV = sum_g P^T dO;  dP = dO V^T;  dS = P * (dP - delta);
    dS1 = dS * (1 - tanh^2(S1 / softcap)) (softcap only);  dQ = dS1 K * scale;
    dK = sum_g dS1^T (Q * scale).
    """
    logits, capped = _scores(q_scaled, k, qpos, kpos, plan)
    lse = lse.masked_fill(torch.isneginf(lse), float("inf"))  # a dead row: P = exp(S - inf) = 0
    probs = (logits - lse[..., None]).exp()  # (..., rows, cols)
    dv = (probs.transpose(-2, -1) @ dout).sum(dim=2, keepdim=True)  # forward: O = P V
    dprobs = dout @ v.transpose(-2, -1)
    dscores = probs * (dprobs - delta[..., None])  # forward: P = softmax(S)
    if capped is not None:
        dscores = dscores * (1 - capped * capped)  # forward: S = softcap * tanh(S1 / softcap)
    dq = (dscores @ k) * plan.rules.scale  # forward: S1 = (Q * scale) K^T
    dk = (dscores.transpose(-2, -1) @ q_scaled).sum(dim=2, keepdim=True)
    return dq, dk, dv


# -- communication ------------------------------------------------------------------------------


class _Exchange(NamedTuple):
    received: tuple[torch.Tensor, ...]
    works: list[Any]
    sent: tuple[torch.Tensor, ...]  # kept alive until the sends complete

    def wait(self) -> tuple[torch.Tensor, ...]:
        for work in self.works:
            work.wait()  # bounded by the group's timeout
        return self.received


def _pass_on(tensors: tuple[torch.Tensor, ...], plan: _Plan, tag: int) -> _Exchange:
    """Send each tensor to the next rank of the ring and receive its twin from the previous
    one, asynchronously; one tag per tensor, so that messages cannot be matched crosswise."""
    received = tuple(torch.empty_like(t) for t in tensors)
    following, previous = (plan.rank + 1) % plan.world, (plan.rank - 1) % plan.world
    ops = [
        dist.P2POp(dist.isend, t, group=plan.group, group_peer=following, tag=tag + i)
        for i, t in enumerate(tensors)
    ] + [
        dist.P2POp(dist.irecv, t, group=plan.group, group_peer=previous, tag=tag + i)
        for i, t in enumerate(received)
    ]
    return _Exchange(received, dist.batch_isend_irecv(ops), tensors)


def _membership(group: Any) -> tuple[int, int]:
    """This process's rank within ``group`` and the group's size; clear errors otherwise."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "context parallelism needs an initialized torch.distributed process group: call "
            "torch.distributed.init_process_group(...) on every rank first (torchrun sets the "
            "environment it reads)"
        )
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            "this process is not a member of the group it passed (torch.distributed.new_group "
            "returns GroupMember.NON_GROUP_MEMBER to the ranks it leaves out)"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, got {group!r}")
    return dist.get_rank(group), dist.get_world_size(group)


def _exchange(
    group: dist.ProcessGroup | None, width: int, row: list[float] | None, caller: str
) -> torch.Tensor:
    """Every rank's row of metadata, (W, width) float64 on the CPU, after one all_gather.

    ``row=None`` says that this rank's own checks failed: it then raises its own error, and
    every other rank a ``RuntimeError`` naming it, so that all ranks stop together, before any
    point-to-point op.
    """
    backend = str(dist.get_backend(group))
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else None
    mine = torch.zeros(width + 1, dtype=torch.float64, device=device)
    if row is None:
        mine[0] = 1.0
    else:
        mine[1:] = torch.tensor(row, dtype=torch.float64)
    table = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(table, mine, group=group)
    gathered = torch.stack(table).cpu()
    refused = [r for r in range(len(gathered)) if gathered[r, 0] != 0]
    if refused and row is not None:
        raise RuntimeError(
            f"{caller}: rank(s) {refused} of the group refused their input (each raised its own "
            f"error); no rank computed anything"
        )
    return gathered[:, 1:]


# -- input checks -------------------------------------------------------------------------------

_MAX_NDIM = 8
# The metadata row of ring_attention, column by column.
_RING_FIELDS = (
    *(f"q.shape[{i}]" for i in range(4)),
    *(f"k.shape[{i}]" for i in range(4)),
    *(f"v.shape[{i}]" for i in range(4)),
    "dtype",
    "causal",
    "scale",
    "softcap",
    "left",  # the visible band, window and causal together
    "right",
    "layout",
    "backward",  # whether this rank's call records a backward (grad mode, inputs needing grad)
)


def _check_layout(layout: Any) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_dtype(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in _DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {tensor.dtype}")


def _check_zigzag_length(layout: str, length: int, name: str, shape: tuple[int, ...]) -> None:
    if layout == "zigzag" and length % 2 != 0:
        raise ValueError(
            f"layout 'zigzag' splits the sequence into 2W equal chunks, two per rank, so every "
            f"shard holds an even number of positions; got {length} ({name} {shape})"
        )


def _check_ring_inputs(
    q: Any,
    k: Any,
    v: Any,
    causal: Any,
    scale: Any,
    softcap: Any,
    window: Any,
    enable_gqa: Any,
    layout: Any,
) -> _Plan:
    """This rank's own checks, before any communication: the core's checks of attention
    (``scores.prepare``, its messages), then what a ring adds (4-D shards of one length)."""
    rules = scores.prepare(
        q, k, v, causal=causal, window=window, scale=scale, softcap=softcap, enable_gqa=enable_gqa
    ).rules
    _check_dtype("q", q)
    if len({t.device for t in (q, k, v)}) > 1:
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    if q.ndim != 4 or k.ndim != 4 or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q (B, H, n, D), k (B, H_kv, n, D) and v (B, H_kv, n, Dv) must be shards of one "
            f"length n (self-attention, N = M), got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    _check_layout(layout)
    _check_zigzag_length(layout, q.shape[2], "q", tuple(q.shape))
    return _Plan(rules=rules, layout=layout)


def _ring_row(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan, causal: bool, layout: str
) -> list[float]:
    """This rank's metadata, in the order of ``_RING_FIELDS`` (an unbounded side as -1)."""
    rules = plan.rules
    return [
        *(float(s) for t in (q, k, v) for s in t.shape),
        float(_DTYPES.index(q.dtype)),
        float(causal),
        rules.scale,
        rules.softcap,
        -1.0 if rules.left is None else float(rules.left),
        -1.0 if rules.right is None else float(rules.right),
        float(LAYOUTS.index(layout)),
        float(torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))),
    ]


def _check_agreement(table: torch.Tensor) -> None:
    """``ValueError`` (``TypeError`` for dtypes) on every rank unless all rows agree."""
    differ = [
        name for i, name in enumerate(_RING_FIELDS) if not bool((table[:, i] == table[0, i]).all())
    ]
    if not differ:
        return
    ranks = range(len(table))
    if differ == ["dtype"]:
        listed = ", ".join(f"rank {r} {_DTYPES[int(table[r, 12])]}" for r in ranks)
        raise TypeError(f"ring_attention: every rank must pass one dtype, got {listed}")
    if any(name.startswith(("q.", "k.", "v.")) for name in differ):
        listed = "; ".join(
            f"rank {r}: q {_shape_of(table[r, 0:4])}, k {_shape_of(table[r, 4:8])}, "
            f"v {_shape_of(table[r, 8:12])}"
            for r in ranks
        )
        raise ValueError(f"ring_attention: the shards differ in shape across the ranks: {listed}")
    columns = [_RING_FIELDS.index(name) for name in differ]
    listed = "; ".join(
        f"rank {r}: "
        + ", ".join(f"{_RING_FIELDS[i]} {_option(i, float(table[r, i]))}" for i in columns)
        for r in ranks
    )
    hint = (
        " (the backward is a ring too: every rank must run it, or none)"
        if "backward" in differ
        else ""
    )
    raise ValueError(f"ring_attention: every rank must pass the same options, got {listed}{hint}")


def _option(column: int, value: float) -> Any:
    """A column of the metadata row as the option was given."""
    name = _RING_FIELDS[column]
    if name == "layout":
        return LAYOUTS[int(value)]
    if name in ("causal", "backward"):
        return bool(value)
    if name in ("left", "right"):
        return None if value < 0 else int(value)
    return value


def _shape_of(row: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in row.tolist() if s >= 0)


def _group(x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """(B, H, n, W) -> (B, H_kv, g, n, W): query head h = (h // g, h % g)."""
    return x.unflatten(1, (kv.shape[1], -1))


def _ungroup(x: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, g, n, W) -> (B, H, n, W)."""
    return x.flatten(1, 2)
