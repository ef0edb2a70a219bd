"""The "ring" spec: a user's context-parallel attention with ``ring_attention``'s signature,
judged like every other kernel, on spawned gloo ranks.

``kernel(q, k, v, *, causal=False, scale=None, softcap=0.0, window=None, enable_gqa=False,
layout="contiguous")`` (``torch_attention.distributed.ring_attention``'s signature; the checker
passes only the options that differ from these defaults, and the default process group) gets
this rank's shard of q (B, H, N/W, D), k and v (B, H_kv, N/W, D) and returns its output shard.
``world_size`` processes are spawned (``multiprocessing``'s "spawn"), join a gloo group on
127.0.0.1 at a free port, and run every case and dtype: each rank shards the case's whole
sequence by the case's layout (``shard_sequence``), runs the kernel forward and backward under
the case's upstream gradient, and the shards of out, dq, dk, dv are gathered
(``gather_sequence``); then the call again (forward only, unless the kernel claims
"deterministic"), whose gathered results must be the first's bit for bit (``calls.compared``).
The parent judges the gathered tensors against the float64 golden of the whole sequence with
the same policy as every spec (``calls.judge_outcome``). Every wait is bounded: the group's
timeout for a collective, and a deadline for the whole run, after which every rank is killed
and what did not finish is an "error" naming the limit; a rank killed by a signal is named with
it. The kernel must pickle (a module-level function, or
"module:function"): each rank imports it.

Shape legend: B batch, H heads, H_kv key/value heads, N sequence length, W ranks, D head width.

Tests: tests/checker/running/test_ranks.py
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
import socket
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...tolerances import ISOLATE_TIME_LIMIT_S
from ..battery.attention.case import Case
from ..golden.attention import case_inputs
from ..report.rows import KernelRow
from .calls import BadResult, Kernel, Outcome, Request, compared, load_kernel, run_protected

# Any collective of a healthy group on the battery's small cases takes far less; a rank that
# never arrives (its kernel raised before a collective the others are in) fails its peers then.
GROUP_TIMEOUT = timedelta(seconds=30)
STARTUP_S = 120.0  # spawning W interpreters that import torch, on a shared 2-core machine


def check_world_size(battery: tuple[Case, ...], world_size: Any) -> None:
    """``ValueError`` unless ``world_size`` is an integer >= 1 that splits every case of
    ``battery`` into its layout's equal chunks (W, or 2W for zigzag)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    for case in battery:
        parts = world_size * (2 if case.layout == "zigzag" else 1)
        if case.n % parts:
            raise ValueError(
                f"case {case.name}: N = {case.n} does not split into {parts} equal chunks "
                f"({case.layout} layout over {world_size} ranks)"
            )


def run_ranks(
    kernel: Kernel | str,
    requests: Sequence[Request],
    world_size: int,
    progress: Any,
) -> dict[tuple[str, str], Outcome]:
    """The outcome of every request of ``kernel`` (a "module:function" is imported by each
    rank by that name), run on ``world_size`` spawned ranks; by (case, dtype)."""
    check_world_size(tuple({request.case.name: request.case for request in requests}.values()),
                     world_size)  # fmt: skip
    devices = {request.device.type for request in requests}
    if devices - {"cpu"}:
        raise ValueError(f"the ring spec runs gloo ranks on CPU, got device {devices.pop()}")
    try:
        payload = pickle.dumps(kernel)
    except Exception as exc:  # what pickle raises for closures, lambdas, local classes
        raise TypeError(
            f"the ring spec sends the kernel to {world_size} spawned ranks by pickle, and "
            f"{getattr(kernel, '__qualname__', kernel)!r} does not pickle ({exc}); pass a "
            "module-level function, or 'module:function'"
        ) from exc
    name = getattr(load_kernel(kernel), "__name__", repr(kernel))
    if progress is not None:
        progress(f"{name}: {len(requests)} case-dtype groups on {world_size} gloo ranks")
    return _spawn(payload, list(requests), world_size)


def _spawn(payload: bytes, requests: list[Request], world: int) -> dict[tuple, Outcome]:
    """Run the requests on ``world`` ranks; an Outcome per (case, dtype), an "error" one for
    what did not finish."""
    context = multiprocessing.get_context("spawn")
    deadline = STARTUP_S + ISOLATE_TIME_LIMIT_S
    with tempfile.TemporaryDirectory() as outdir:
        args = (world, _free_port(), outdir, payload, requests)
        processes = [
            context.Process(target=_rank, args=(rank, *args), daemon=True) for rank in range(world)
        ]
        for process in processes:
            process.start()
        started = time.monotonic()
        for process in processes:
            process.join(max(0.0, deadline - (time.monotonic() - started)))
        ended = [_ending(process, deadline) for process in processes]
        path = Path(outdir) / "rank0.pkl"
        found: dict[tuple, Outcome] = pickle.loads(path.read_bytes()) if path.exists() else {}
    why = "; ".join(f"rank {r} {text}" for r, text in enumerate(ended) if text)
    missing = Outcome("error", {}, {}, [], None, f"no result: {why or 'the ranks wrote none'}")
    return {(q.case.name, q.dtype): found.get((q.case.name, q.dtype), missing) for q in requests}


def _ending(process: Any, deadline: float) -> str:
    """How a rank ended, if not cleanly; it is killed if still running past the deadline."""
    if process.is_alive():
        process.kill()
        process.join(10)
        return f"did not finish within the time limit of {deadline:g} s and was stopped"
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return "" if code == 0 else f"exited with code {code}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(rank: int, world: int, port: int, outdir: str, payload: bytes, requests: list) -> None:
    """One spawned rank: every request, then rank 0 writes the outcomes."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # W ranks share the machine's cores
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=GROUP_TIMEOUT,
    )
    try:
        kernel = load_kernel(pickle.loads(payload))  # "module:function" imported by its name
        outcomes = {(q.case.name, q.dtype): _one(kernel, q, rank, world) for q in requests}
        if rank == 0:
            (Path(outdir) / "rank0.pkl").write_bytes(pickle.dumps(outcomes))
    finally:
        dist.destroy_process_group()


def _one(kernel: Kernel, request: Request, rank: int, world: int) -> Outcome:
    """One case and dtype on this rank, called twice (``calls.repeated``); every rank returns
    the same kind of outcome (the ranks agree on success before gathering, so that a failure on
    one rank cannot hang the others)."""
    from torch_attention.distributed import shard_sequence

    case = request.case
    inputs = case_inputs(case, request.dtype, request.device, request.seed)
    shards = {
        name: shard_sequence(t, rank, world, layout=case.layout)
        for name, t in zip(("q", "k", "v", "dout"), (*inputs[:3], inputs.dout), strict=True)
    }
    changed: list[KernelRow] = []

    def call(backward: bool) -> tuple:
        given = {name: shards[name].clone() for name in "qkv"}
        leaves = [given[name].requires_grad_(backward) for name in "qkv"]
        out = kernel(*leaves, **_options(case))
        changed.extend(_changed(request, given, shards, rank, "forward", changed))
        expected = tuple(shards["dout"].shape)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise BadResult(f"kernel returned out {got} on rank {rank}, expected {expected}")
        if not backward:
            return (out.detach(),)
        out.backward(shards["dout"].to(out.dtype))
        changed.extend(_changed(request, given, shards, rank, "backward", changed))
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]
        return (out.detach(), *grads)

    first = run_protected(lambda: call(not request.forward_only), changed)
    outcome = _gathered(case, *first, changed)
    if outcome.kind != "ok" or request.nondeterministic:
        return outcome
    twice = request.deterministic and not request.forward_only  # the backward compared too
    second = run_protected(lambda: call(twice), changed)
    return compared(outcome, _gathered(case, *second, changed))


def _gathered(case: Case, results: Any, failure: Outcome | None, changed: list) -> Outcome:
    """The outcome of one call on every rank: the gathered out (dq, dk, dv) when it returned on
    every rank, else this rank's failure, or that of a peer."""
    import torch.distributed as dist

    from torch_attention.distributed import gather_sequence

    try:
        status = torch.tensor([0.0 if failure is None else 1.0])
        dist.all_reduce(status)
        if status.item():  # some rank failed: report this rank's failure, or that of a peer
            if failure is not None:
                return failure
            return Outcome("error", {}, {}, changed, None, "the kernel failed on another rank")
        gathered = [gather_sequence(t.contiguous(), layout=case.layout) for t in results]
    except RuntimeError as exc:  # a peer that never arrived: the group's timeout, not a hang
        lost = f"the ranks lost each other ({str(exc).splitlines()[0]})"
        return failure if failure is not None else Outcome("error", {}, {}, changed, None, lost)
    names = ("out", "dq", "dk", "dv")
    arrays = {n: t.to(torch.float64).numpy() for n, t in zip(names, gathered, strict=False)}
    dtypes = {n: str(t.dtype).removeprefix("torch.") for n, t in zip(names, results, strict=False)}
    return Outcome("ok", arrays, dtypes, changed)


def _options(case: Case) -> dict[str, Any]:
    """``ring_attention``'s keywords that differ from their defaults."""
    options: dict[str, Any] = {}
    if case.causal:
        options["causal"] = True
    if case.scale is not None:
        options["scale"] = case.scale
    if case.softcap:
        options["softcap"] = case.softcap
    if case.window is not None:
        options["window"] = case.window
    if case.kv_heads != case.heads:
        options["enable_gqa"] = True
    if case.layout != "contiguous":
        options["layout"] = case.layout
    return options


def _changed(request, given, shards, rank: int, when: str, known) -> list[KernelRow]:
    seen = {row.tensor for row in known}
    rows = []
    for name in "qkv":
        after, before = given[name].detach(), shards[name]
        if name in seen or torch.equal(after, before):
            continue
        error = (after.double() - before.double()).abs().max().item()
        detail = f"{name} changed in place by the kernel's {when} on rank {rank}"
        error = error if np.isfinite(error) else np.inf
        nan = float("nan")
        rows.append(
            KernelRow(request.case.name, request.dtype, name, error, nan, nan, 0.0, "inplace",
                      detail)
        )  # fmt: skip
    return rows
