"""torch_attention.distributed: ring attention on gloo processes against the float64 golden.

Four processes are started once for the whole file (torch.multiprocessing, forked from a fork
server that has imported torch once; gloo on 127.0.0.1 at a free port; every wait bounded by
the group's timeout, the whole run by a deadline, every rank killed if it overstays). The world
group runs the cases of W = 4; two pairs of ranks, {0, 1} and {2, 3} (where group ranks differ
from global ranks), take turns on the cases of W = 2. Every case shards one whole sequence with
``shard_sequence``, runs ``ring_attention`` forward and backward under a random upstream
gradient, and gathers out, dq, dk and dv with ``gather_sequence``; the parent judges them
against the NumPy golden on the whole sequence (``attention_forward`` / ``attention_backward``
in float64 on the case's inputs): FLOAT64_RTOL in float64, FLOAT32_RTOL in float32 and
FLOAT16_RTOL in float16. The ranks cut every block into query tiles of 5 rows, so that blocks
span several tiles, a partial last one included.

The same processes run deliberately broken rings (a wrong block offset, a merge that does not
rescale the running output), which the same judgement must reject, and the bad inputs, each of
which must be an error on every rank of the group, in bounded time. The schedule itself (which
blocks each rank computes, and how much) is checked without processes.
"""

from __future__ import annotations

import pickle
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from numpy_attention.functional import attention_backward, attention_forward
from parity_tests.tolerances import FLOAT64_RTOL, rel_error
from torch_attention import block_attention, distributed
from torch_attention.distributed import (
    gather_sequence,
    ring_attention,
    shard_positions,
    shard_sequence,
)
from torch_attention.merge import MergeOutput
from torch_attention.ring_checks import LAYOUTS
from torch_attention.rules import prepare

from ..conftest import SEED, assert_close

WORLD = 4
GROUP_TIMEOUT = timedelta(seconds=60)  # any wait of a healthy group: far above what it needs
SHORT_TIMEOUT = timedelta(seconds=2)  # the group of the timeout case
SPAWN_DEADLINE_S = 120.0  # the whole spawned run, imports included; then every process is killed
B, H, N, D = 2, 4, 24, 8  # N splits into 2W = 8 chunks of 3 for W = 4

OPTIONS = {
    "plain": {},
    "gqa": {"enable_gqa": True},  # H_kv = 2
    "window": {"window": (5, 3)},  # skips whole blocks for W = 4
    "softcap": {"softcap": 2.0, "scale": 0.5},
}


class Case(NamedTuple):
    world: int
    layout: str
    causal: bool
    option: str
    dtype: str

    @property
    def name(self) -> str:
        return "-".join(
            [f"W{self.world}", self.layout, "causal" if self.causal else "full", self.option]
            + [self.dtype]
        )

    @property
    def options(self) -> dict:
        return {"causal": self.causal, **OPTIONS[self.option]}


# Every option in float64 on both world sizes, layouts and causal settings; float32 and float16
# (computed in float32, sent around the ring in float16) on the plain case of each.
DTYPES = [(option, "float64") for option in OPTIONS] + [("plain", "float32"), ("plain", "float16")]
CASES = [
    Case(world, layout, causal, option, dtype)
    for world in (2, 4)
    for layout in LAYOUTS
    for causal in (False, True)
    for option, dtype in DTYPES
]
# Broken rings, each run causal (a wrong offset only shows where positions matter) on both
# layouts and both world sizes.
BROKEN = ["wrong-block-offset", "merge-without-rescale"]
BROKEN_CASES = [
    Case(world, layout, True, "plain", "float64") for world in (2, 4) for layout in LAYOUTS
]


def case_inputs(case: Case) -> dict[str, np.ndarray]:
    """The whole sequence's q, k, v and upstream gradient of a case, the same in every process:
    float64 values, rounded to the case's dtype."""
    rng = np.random.default_rng([SEED, CASES.index(case)])
    kv_heads = 2 if case.option == "gqa" else H
    arrays = {
        "q": rng.standard_normal((B, H, N, D)),
        "k": rng.standard_normal((B, kv_heads, N, D)),
        "v": rng.standard_normal((B, kv_heads, N, D)),
        "dout": rng.standard_normal((B, H, N, D)),
    }
    return {name: a.astype(case.dtype) for name, a in arrays.items()}


# -- what the spawned ranks run -----------------------------------------------------------------


def wrong_block_offset(rank: int, step: int, world: int) -> int:
    """A ring that believes each block comes from one rank further than it does."""
    return (rank - step + 1) % world


def merge_without_rescale(out_a, lse_a, out_b, lse_b):
    """An online softmax that forgets to rescale the running output when lse grows."""
    lse = torch.logaddexp(lse_a, lse_b)
    return MergeOutput(out_a + (lse_b - lse).exp()[..., None] * out_b, lse)


# What each break gets wrong. A merge without the rescale leaves lse right, and with it dV,
# which the backward computes from the final lse (P = exp(S - lse)) and dout alone.
WRONG = {
    "wrong-block-offset": ["out", "dq", "dk", "dv"],
    "merge-without-rescale": ["out", "dq", "dk"],
}
BREAKS = {
    "wrong-block-offset": ("_kv_origin", wrong_block_offset),
    "merge-without-rescale": ("merge_attention", merge_without_rescale),
}


def run_ring(case: Case, group) -> dict[str, np.ndarray]:
    """One case on one group: shard, ring forward and backward, gather (on every rank)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    whole = {name: torch.from_numpy(a) for name, a in case_inputs(case).items()}
    q, k, v, dout = (
        shard_sequence(whole[name], rank, world, layout=case.layout)
        for name in ("q", "k", "v", "dout")
    )
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = ring_attention(q, k, v, group=group, layout=case.layout, **case.options)
    out.backward(dout)
    # One gather for all four: stacked along the heads axis, which the layout leaves alone.
    shards = [out.detach(), q.grad, k.grad, v.grad]
    gathered = gather_sequence(torch.cat(shards, dim=1), group=group, layout=case.layout)
    parts = gathered.split([t.shape[1] for t in shards], dim=1)
    return {name: part.numpy() for name, part in zip(["out", "dq", "dk", "dv"], parts, strict=True)}


def group_of(case: Case, rank: int, pairs: list) -> tuple[str, object] | None:
    """The group that runs a case, if this rank is in it: the world for W = 4; for W = 2 the
    pairs take turns, case by case, so that both run, each half of the cases."""
    if case.world == WORLD:
        return "world", None
    pair = CASES.index(case) % 2
    return (f"pair{pair}", pairs[pair]) if rank // 2 == pair else None


def bad_call(kind: str, rank: int):
    """The call of one bad-input case on this rank: every rank of the world group calls, only
    some with bad input. Returns what the call returned (it should raise)."""
    shape = (1, 2, 6, 4)  # N = 24 over 4 ranks
    q = k = v = torch.zeros(shape, dtype=torch.float64)
    options: dict = {}
    if kind == "zigzag-odd-length":
        q = k = v = torch.zeros(1, 2, 5, 4, dtype=torch.float64)  # N = 20: not 8 chunks
        options = {"layout": "zigzag"}
    elif kind == "shapes-differ" and rank == 1:
        q = k = v = torch.zeros(1, 2, 8, 4, dtype=torch.float64)
    elif kind == "dtypes-differ" and rank == 1:
        q = k = v = torch.zeros(shape, dtype=torch.float32)
    elif kind == "options-differ":
        options = {"causal": rank == 3}
    elif kind == "one-rank-refuses" and rank == 2:
        options = {"causal": "yes"}
    elif kind == "one-rank-without-backward" and rank != 1:
        q = q.clone().requires_grad_()  # rank 1 would never join the backward's ring
    elif kind == "gather-shapes-differ":
        return gather_sequence(torch.zeros(1, 2, 7 if rank == 0 else 6, 4))
    return ring_attention(q, k, v, **options)


BAD = {
    # kind: {rank: (error type, words its message must contain)}, "*" for every other rank
    "zigzag-odd-length": {"*": ("ValueError", ["zigzag", "(1, 2, 5, 4)"])},
    "shapes-differ": {"*": ("ValueError", ["rank 1: q (1, 2, 8, 4)", "rank 0: q (1, 2, 6, 4)"])},
    "dtypes-differ": {"*": ("TypeError", ["rank 1 torch.float32", "rank 0 torch.float64"])},
    "options-differ": {"*": ("ValueError", ["causal", "rank 3: causal True"])},
    "one-rank-refuses": {
        2: ("TypeError", ["causal must be a bool"]),
        "*": ("RuntimeError", ["rank(s) [2]", "refused"]),
    },
    "gather-shapes-differ": {"*": ("ValueError", ["rank 0: (1, 2, 7, 4)", "rank 1: (1, 2, 6, 4)"])},
    "one-rank-without-backward": {
        "*": ("ValueError", ["rank 1: backward False", "rank 0: backward True", "every rank"])
    },
}


def worker(rank: int, port: int, outdir: str) -> None:
    """One rank of the spawned group: every case, broken ring and bad input, then a file of
    results (the gathered arrays from each group's rank 0, the errors from every rank)."""
    torch.set_num_threads(1)  # four ranks share the machine's cores: no intra-op threads
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=GROUP_TIMEOUT,
    )
    block_attention._QUERY_TILE = 5
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    short = dist.new_group([0, 1], timeout=SHORT_TIMEOUT)
    results: dict = {"runs": {}, "broken": {}, "errors": {}, "groups": {}}
    for case in CASES:
        if (chosen := group_of(case, rank, pairs)) is not None:
            gathered = run_ring(case, chosen[1])
            if dist.get_rank(chosen[1]) == 0:
                results["runs"][chosen[0], case.name] = gathered
    for broken in BROKEN:
        attribute, replacement = BREAKS[broken]
        with mock.patch.object(distributed, attribute, replacement):
            for case in BROKEN_CASES:
                if (chosen := group_of(case, rank, pairs)) is not None:
                    gathered = run_ring(case, chosen[1])
                    if dist.get_rank(chosen[1]) == 0:
                        results["broken"][chosen[0], broken, case.name] = gathered
    for kind in BAD:
        try:
            returned = bad_call(kind, rank)
            results["errors"][kind] = ("no error", repr(returned.shape))
        except Exception as error:  # every error is recorded and judged by the parent
            results["errors"][kind] = (type(error).__name__, str(error))
    # Groups a rank cannot use: refused at once, with no message sent.
    tensors = [torch.zeros(1, 1, 4, 2) for _ in "qkv"]
    for kind, group in [("not-a-member", pairs[1 - rank // 2]), ("not-a-group", "world")]:
        try:
            ring_attention(*tensors, group=group)
            results["groups"][kind] = ("no error", "")
        except Exception as error:  # judged by the parent
            results["groups"][kind] = (type(error).__name__, str(error))
    # A rank that never calls: its peer must get an error within the short group's timeout.
    if rank == 0:
        start = time.monotonic()
        try:
            ring_attention(*(torch.zeros(1, 1, 4, 2) for _ in "qkv"), group=short)
            results["timeout"] = ("no error", "", time.monotonic() - start)
        except Exception as error:  # judged by the parent
            results["timeout"] = (type(error).__name__, str(error), time.monotonic() - start)
    dist.barrier()  # rank 1 stays alive (and silent on the short group) until rank 0 is done
    (Path(outdir) / f"rank{rank}.pkl").write_bytes(pickle.dumps(results))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Spawn the four ranks once, wait for them within a deadline, and read their results;
    every process is gone when this returns or raises."""
    outdir = tmp_path_factory.mktemp("ring")
    # A fork server (a fresh process, like spawn's) that imports torch and this module once, so
    # that the four ranks fork from it instead of importing torch four times at once.
    mp.get_context("forkserver").set_forkserver_preload(["torch", __name__])
    context = mp.start_processes(
        worker, args=(free_port(), str(outdir)), nprocs=WORLD, join=False, start_method="forkserver"
    )
    deadline = time.monotonic() + SPAWN_DEADLINE_S
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the ranks did not finish within {SPAWN_DEADLINE_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
    return [pickle.loads((outdir / f"rank{r}.pkl").read_bytes()) for r in range(WORLD)]


# -- the proof: the gathered ring against the golden on the whole sequence ----------------------


def golden(case: Case) -> dict[str, np.ndarray]:
    """out, dq, dk, dv of the whole sequence: NumPy, float64, on the case's (rounded) inputs."""
    arrays = {name: a.astype(np.float64) for name, a in case_inputs(case).items()}
    forward = attention_forward(arrays["q"], arrays["k"], arrays["v"], **case.options)
    grads = attention_backward(arrays["dout"], forward.ctx)
    return {"out": forward.out, "dq": grads.dq, "dk": grads.dk, "dv": grads.dv}


def runs_of(ranks: list[dict], key) -> dict:
    merged: dict = {}
    for results in ranks:
        merged.update(results[key])
    return merged


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_ring_equals_attention_on_the_whole_sequence(ranks, case):
    expected = golden(case)
    runs = runs_of(ranks, "runs")

    (gathered,) = [run for (_, name), run in runs.items() if name == case.name]
    for name, value in expected.items():
        assert gathered[name].dtype == np.dtype(case.dtype)
        assert_close(gathered[name], value, dtype=case.dtype, name=name)


@pytest.mark.parametrize("broken", BROKEN)
@pytest.mark.parametrize("case", BROKEN_CASES, ids=[case.name for case in BROKEN_CASES])
def test_a_broken_ring_is_caught(ranks, broken, case):
    expected = golden(case)
    broken_runs = runs_of(ranks, "broken")

    (gathered,) = [
        run for (_, b, name), run in broken_runs.items() if (b, name) == (broken, case.name)
    ]

    errors = {name: rel_error(gathered[name], value) for name, value in expected.items()}
    assert all(errors[name] > FLOAT64_RTOL for name in WRONG[broken]), errors


# -- bad input: an error on every rank, never a hang --------------------------------------------


@pytest.mark.parametrize("kind", BAD)
def test_bad_input_is_an_error_on_every_rank(ranks, kind):
    for rank, results in enumerate(ranks):
        error_type, words = BAD[kind].get(rank, BAD[kind]["*"])
        raised, message = results["errors"][kind]
        assert raised == error_type, f"rank {rank}: {raised}: {message}"
        for word in words:
            assert word in message, f"rank {rank}: {message!r} lacks {word!r}"


@pytest.mark.parametrize(
    ("kind", "error", "words"),
    [
        ("not-a-member", "ValueError", "not a member of the group"),
        ("not-a-group", "TypeError", "group must be a torch.distributed.ProcessGroup"),
    ],
)
def test_a_group_the_rank_cannot_use_is_refused(ranks, kind, error, words):
    for rank, results in enumerate(ranks):
        raised, message = results["groups"][kind]
        assert raised == error, f"rank {rank}: {raised}: {message}"
        assert words in message, f"rank {rank}: {message!r}"


def test_a_rank_that_never_calls_times_out_its_peer(ranks):
    raised, message, elapsed = ranks[0]["timeout"]

    assert raised == "RuntimeError", message
    assert "Timed out" in message or "timeout" in message.lower(), message
    assert elapsed < SHORT_TIMEOUT.total_seconds() + 10  # bounded by the group, not hanging


def test_without_a_process_group_the_error_says_how_to_start_one():
    tensors = [torch.zeros(1, 1, 4, 2) for _ in "qkv"]

    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(*tensors)
    with pytest.raises(RuntimeError, match="init_process_group"):
        gather_sequence(tensors[0])


# -- layouts and the schedule, without processes ------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("contiguous", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("zigzag", [[0, 1, 6, 7], [2, 3, 4, 5]]),
    ],
)
def test_shard_positions_of_each_layout(layout, expected):
    positions = [shard_positions(8, rank, 2, layout).tolist() for rank in range(2)]

    assert positions == expected


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shards_of_every_rank_make_up_the_sequence(layout):
    x = torch.arange(2 * 24 * 3, dtype=torch.float64).reshape(2, 24, 3)

    shards = [shard_sequence(x, rank, 4, layout=layout) for rank in range(4)]
    positions = torch.cat([shard_positions(24, rank, 4, layout) for rank in range(4)])

    assert sorted(positions.tolist()) == list(range(24))
    assert torch.equal(torch.cat(shards, dim=-2), x[:, positions])


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((10, 0, 4, "contiguous"), ValueError, "not a multiple of 4"),
        ((12, 0, 4, "zigzag"), ValueError, "not a multiple of 8"),
        ((8, 2, 2, "contiguous"), ValueError, r"rank must be in \[0, 2\)"),
        ((8, 0, 2, "striped"), ValueError, "layout must be one of"),
        ((8.0, 0, 2, "contiguous"), TypeError, "seq_len"),
    ],
)
def test_shard_positions_refuse_what_the_layout_cannot_split(args, error, match):
    with pytest.raises(error, match=match):
        shard_positions(*args)


def computed_blocks(layout: str, causal: bool, world: int, rows: int, window=None):
    """{(rank, step): (query rows, keys)} of the blocks each rank computes; the rest skip."""
    shard = torch.zeros(1, 1, rows, 1)
    rules = prepare(shard, shard, shard, causal=causal, window=window).rules
    blocks = {}
    for rank in range(world):
        plan = distributed._Plan(rules, layout, None, rank, world)
        for step in range(world):
            origin = distributed._kv_origin(rank, step, world)
            block = distributed._visible_block(plan, origin, rows, torch.device("cpu"))
            if block is not None:
                blocks[rank, step] = (block.rows.stop - block.rows.start, len(block.kpos))
    return blocks


def test_causal_contiguous_ranks_skip_the_blocks_of_later_ranks():
    blocks = computed_blocks("contiguous", True, 4, 6)

    assert set(blocks) == {(rank, step) for rank in range(4) for step in range(rank + 1)}
    assert set(blocks.values()) == {(6, 6)}  # whole blocks, the diagonal one masked


def test_causal_zigzag_gives_every_rank_the_same_work():
    blocks = computed_blocks("zigzag", True, 4, 6)

    assert set(blocks) == {(rank, step) for rank in range(4) for step in range(4)}
    for rank in range(4):
        assert blocks[rank, 0] == (6, 6)  # its own block, causal within
        assert all(
            blocks[rank, step] == (6, 3) or blocks[rank, step] == (3, 6) for step in (1, 2, 3)
        )


def test_without_causal_or_window_every_block_is_computed_whole():
    blocks = computed_blocks("zigzag", False, 4, 6)

    assert blocks == {(rank, step): (6, 6) for rank in range(4) for step in range(4)}


def test_a_window_skips_the_blocks_out_of_its_reach():
    blocks = computed_blocks("contiguous", False, 4, 6, window=(5, 3))

    expected = {
        (rank, step)
        for rank in range(4)
        for step in range(4)
        if abs(distributed._kv_origin(rank, step, 4) - rank) <= 1
    }
    assert set(blocks) == expected
