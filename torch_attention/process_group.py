"""What ring attention asks of its torch.distributed process group: this process's place in it
(``membership``, with clear errors outside an initialized group), one row of metadata from every
rank (``exchange``, one all_gather before any point-to-point op, so that an input refused on any
rank is an error on every rank, never a deadlock), and the asynchronous pass of tensors to the
next rank of the ring (``pass_on``). Every wait is bounded by the group's timeout.

Shape legend: W ranks in the group.

Tests: tests/torch_attention/test_distributed.py (spawned groups: refusals on every rank, a rank
outside the group, the timeout).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist


class Exchange(NamedTuple):
    received: tuple[torch.Tensor, ...]
    works: list[Any]
    sent: tuple[torch.Tensor, ...]  # kept alive until the sends complete

    def wait(self) -> tuple[torch.Tensor, ...]:
        for work in self.works:
            work.wait()  # bounded by the group's timeout
        return self.received


def pass_on(
    tensors: tuple[torch.Tensor, ...],
    group: dist.ProcessGroup | None,
    rank: int,
    world: int,
    tag: int,
) -> Exchange:
    """Send each tensor to the next rank of the ring and receive its twin from the previous
    one, asynchronously; one tag per tensor, so that messages cannot be matched crosswise."""
    received = tuple(torch.empty_like(t) for t in tensors)
    following, previous = (rank + 1) % world, (rank - 1) % world
    ops = [
        dist.P2POp(dist.isend, t, group=group, group_peer=following, tag=tag + i)
        for i, t in enumerate(tensors)
    ] + [
        dist.P2POp(dist.irecv, t, group=group, group_peer=previous, tag=tag + i)
        for i, t in enumerate(received)
    ]
    return Exchange(received, dist.batch_isend_irecv(ops), tensors)


def membership(group: Any) -> tuple[int, int]:
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


def exchange(
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
