"""Launching the kernels from torch: the checked call as kernel arguments, the grids, the block
sizes (autotuned on a GPU, pinned under the interpreter), and the autograd Function.

``attention(q, k, v, rules)`` is the ``"triton"`` backend of ``functional.attention`` (a call
prepared by ``rules.prepare``); ``varlen_attention(...)`` runs packed sequences (flash-attn's
layout) in one launch. Both go through ``TritonAttention``, whose forward runs
``forward.attention_forward_kernel`` and whose backward computes ``delta = rowsum(dO * O) -
dlse`` and dsinks in torch, then runs the two backward kernels (under GQA the dK/dV kernel
writes one float32 gradient per query head, summed here over each kv head's group).

Every launch names every argument (``kernel[grid](q=q, ..., BLOCK_D=...)``): a kernel's
signature can change without a launch silently passing a stride for a scale. The grid is one
axis of cdiv(length, BLOCK) * (B * H) programs (``grid``), within CUDA's 2^31 - 1 where axes 1
and 2 stop at 65,535. Dropout's Philox key is a one-element int64 tensor drawn on the inputs'
device (``draw_seed``) that the kernels load: a CUDA graph that replays the call draws a fresh
key each time instead of the one a Python integer would have frozen into it.

The kernels see every tensor as a strided 4-D view (b, h, n, w): (B, H, N, W) views of the
caller's tensors (never copied, whatever their strides), or for packed sequences (1, H, T, W)
views with batch strides 0 and ``cu_seqlens``. The outputs are allocated in the memory order of
q (``_empty_like_order``), so that flash-attn's (B, N, H, Dv) comes back contiguous.

Limits (``limit_refusal``): a CUDA (or ROCm) GPU, or CPU under Triton's interpreter; float32,
float16, bfloat16 (not bfloat16 under the interpreter); head widths D, Dv <= 256; any strides,
lengths and layouts.

Shape legend: B batch, S packed sequences, H query heads, H_kv key/value heads, N query length,
M key length, T_q, T_k packed token counts, D head width, Dv value head width.

Derivation: docs/triton-kernel.md, and the pages the kernels name. Tests:
tests/torch_attention/triton/test_launch.py, test_flash.py.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import torch
import triton
from torch.autograd.function import once_differentiable
from triton.runtime.interpreter import InterpretedFunction

from ..rules import ScoreRules
from . import backward, forward, pipeline

# The widest head the kernels take: a block of rows of q, k, v, dk, dv (up to 256 wide, in
# float32 accumulators) must fit a GPU's registers and shared memory.
MAX_HEAD_DIM = 256
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Under the interpreter there is no GPU to autotune on: one configuration, pinned. Small blocks
# keep the interpreted programs short and put block edges within reach of small tests.
INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16}
# CUDA's limit of grid axis 0 (axes 1 and 2 stop at 65,535).
MAX_PROGRAMS = 2**31 - 1
# The GPU configurations the autotuner tries, (BLOCK_M, BLOCK_N, num_warps, num_stages); one
# that does not fit the GPU (shared memory at D = 256) is skipped by the autotuner.
FORWARD_CONFIGS = ((128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3),
                   (128, 32, 4, 3), (64, 32, 4, 4))  # fmt: skip
BACKWARD_CONFIGS = ((64, 128, 8, 2), (64, 64, 4, 3), (128, 64, 8, 2), (32, 128, 8, 2),
                    (32, 64, 4, 3), (128, 128, 8, 2))  # fmt: skip
_TUNING_KEY = ["BLOCK_D", "BLOCK_DV", "length_bucket", "HAS_LEFT", "HAS_RIGHT", "DROPOUT"]


def interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter: ``TRITON_INTERPRET=1`` was set when
    Triton and this package were first imported (Triton reads it when it decorates a kernel)."""
    return isinstance(forward.attention_forward_kernel, InterpretedFunction)


def limit_refusal(
    device: torch.device, dtype: torch.dtype, head_dim: int, value_dim: int
) -> str | None:
    """Why the kernels cannot take inputs on ``device`` in ``dtype`` with head widths D =
    ``head_dim`` and Dv = ``value_dim``, or None when they can."""
    if device.type == "cpu" and not interpreted():
        return (
            "CPU tensors (the Triton kernel runs on a GPU, or on CPU under Triton's interpreter: "
            "TRITON_INTERPRET=1 set before Triton is first imported)"
        )
    if device.type not in ("cpu", "cuda"):
        return f"tensors on {device} (the Triton kernel runs on CUDA and ROCm GPUs)"
    if dtype not in DTYPES:
        return f"{dtype} (the Triton kernel takes float32, float16 and bfloat16)"
    if dtype == torch.bfloat16 and interpreted():
        return (
            "bfloat16 under Triton's interpreter (it computes wrong bfloat16 values without an "
            "error); float32 and float16 run there, bfloat16 on a GPU"
        )
    if head_dim > MAX_HEAD_DIM or value_dim > MAX_HEAD_DIM:
        return (
            f"head widths D = {head_dim}, Dv = {value_dim} (the Triton kernel takes D, Dv <= "
            f"{MAX_HEAD_DIM})"
        )
    return None


class Launch(NamedTuple):
    """One call's options and geometry, as the kernels take them."""

    batch: int  # B, or S packed sequences
    heads: int  # H
    group: int  # query heads per kv head
    seqlen_q: int  # N, or the longest packed query sequence
    seqlen_k: int  # M, or the longest packed key sequence
    offset: int  # p_i - i; packed bottom-right calls compute it per sequence
    bottom_right: bool  # packed calls: align each sequence bottom-right
    scale: float
    softcap: float
    left: int | None
    right: int | None
    dropout_p: float
    seed: torch.Tensor | None  # dropout's Philox key, (1,) int64 on the device; None without
    cu_seqlens_q: torch.Tensor | None  # (S + 1,) int32, packed calls
    cu_seqlens_k: torch.Tensor | None


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rules: ScoreRules
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``"triton"`` backend: out (..., H, N, Dv) in q's dtype and lse (..., H, N) float32,
    differentiable in q, k, v, the sinks and the ALiBi slopes, for a call prepared by
    ``rules.prepare`` (masks and an explicit dropout mask are refused before this,
    ``backends``)."""
    lead = tuple(q.shape[:-2])
    heads = lead[-1] if lead else 1
    batch, kv_heads = math.prod(lead[:-1]), heads // rules.group
    n, m, dv = rules.n, rules.m, v.shape[-1]
    q4 = q.reshape(batch, heads, n, q.shape[-1])  # (..., H, N, D) -> (B, H, N, D), a view if it can
    k4 = k.reshape(batch, kv_heads, m, k.shape[-1])  # (B, H_kv, M, D)
    v4 = v.reshape(batch, kv_heads, m, dv)  # (B, H_kv, M, Dv)
    slopes = None
    if rules.slopes is not None:  # (H, 1, 1) or (B, 1, ..., H, 1, 1) -> (1 or B, H)
        slopes = rules.slopes.to(torch.float32)[..., 0, 0]
        slopes = slopes[None] if slopes.ndim == 1 else slopes.expand(lead).reshape(batch, heads)
    launch = Launch(
        batch=batch,
        heads=heads,
        group=rules.group,
        seqlen_q=n,
        seqlen_k=m,
        offset=rules.offset,
        bottom_right=False,
        scale=rules.scale,
        softcap=rules.softcap,
        left=rules.left,
        right=rules.right,
        dropout_p=rules.dropout_p,
        seed=draw_seed(rules.dropout_p, q.device) if n and m else None,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
    )
    sinks = None if rules.sinks is None else rules.sinks.reshape(-1)  # (H, 1, 1) -> (H,)
    out4, lse3 = TritonAttention.apply(q4, k4, v4, sinks, slopes, launch)
    return out4.reshape(lead + (n, dv)), lse3.reshape(lead + (n,))


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: list[int],
    cu_seqlens_k: list[int],
    rules: ScoreRules,
    slopes: torch.Tensor | None,
    bottom_right: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed sequences in one launch: q (T_q, H, D), k (T_k, H_kv, D), v (T_k, H_kv, Dv) with
    checked offsets, ``rules`` the options checked by ``rules.prepare`` (its lengths unused),
    ``slopes`` (H,) or (S, H) or None. Returns out (T_q, H, Dv) and lse (H, T_q) float32."""
    heads = q.shape[1]
    lengths_q = [b - a for a, b in zip(cu_seqlens_q, cu_seqlens_q[1:], strict=False)]
    lengths_k = [b - a for a, b in zip(cu_seqlens_k, cu_seqlens_k[1:], strict=False)]
    offsets = functools.partial(torch.tensor, dtype=torch.int32, device=q.device)
    if slopes is not None:  # (H,) or (S, H) -> (1 or S, H)
        slopes = slopes.to(device=q.device, dtype=torch.float32).reshape(-1, heads)
    launch = Launch(
        batch=len(lengths_q),
        heads=heads,
        group=rules.group,
        seqlen_q=max(lengths_q, default=0),
        seqlen_k=max(lengths_k, default=0),
        offset=0,
        bottom_right=bottom_right,
        scale=rules.scale,
        softcap=rules.softcap,
        left=rules.left,
        right=rules.right,
        dropout_p=rules.dropout_p,
        seed=draw_seed(rules.dropout_p, q.device),
        cu_seqlens_q=offsets(cu_seqlens_q),
        cu_seqlens_k=offsets(cu_seqlens_k),
    )
    sinks = None if rules.sinks is None else rules.sinks.reshape(-1)
    packed = (t.permute(1, 0, 2)[None] for t in (q, k, v))  # (T, H, W) -> (1, H, T, W)
    out4, lse3 = TritonAttention.apply(*packed, sinks, slopes, launch)
    return out4[0].permute(1, 0, 2), lse3[0]  # (T_q, H, Dv), (H, T_q)


def dropout_mask(
    seed: int | torch.Tensor, dropout_p: float, shape: tuple[int, ...], device: torch.device | str
) -> torch.Tensor:
    """The keep-mask (..., H, N, M), bool, that the kernels draw for ``seed`` (an integer, or
    the (1,) int64 tensor ``draw_seed`` gives) on a (non-packed) call whose scores have
    ``shape``: entry (g, i, j) of the flattened leading axes g is kept where Philox(seed) at
    (g * N + i) * M + j is >= ``dropout_p``."""
    *lead, n, m = shape
    rows = n * math.prod(lead)
    key = torch.as_tensor(seed, dtype=torch.int64, device=device).reshape(1)
    keep = torch.empty((rows, m), dtype=torch.int8, device=device)
    if rows and m:
        pipeline.dropout_mask_kernel[(rows, triton.cdiv(m, 256))](
            keep=keep, seed=key, dropout_p=dropout_p, keys_per_row=m, BLOCK_N=256
        )
    return keep.bool().reshape(shape)


def draw_seed(dropout_p: float, device: torch.device | str) -> torch.Tensor | None:
    """Dropout's Philox key, (1,) int64 on ``device``, drawn by that device's generator: on a
    GPU without a host round trip (a CUDA graph captures the draw and makes a new key at each
    replay), and ``torch.manual_seed`` reproduces a call (``dropout_mask`` reads its keep-mask
    back). None without dropout."""
    if dropout_p <= 0.0:
        return None
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


def grid(length: int, block: int, sequences: int) -> tuple[int, int, int]:
    """The launch grid of a kernel over ``length`` rows (or keys) in blocks of ``block``, for
    ``sequences`` (batch element, head) pairs: every program on axis 0, in the order
    ``pipeline.program_tile`` reads; a ``ValueError`` past CUDA's 2^31 - 1 programs."""
    programs = triton.cdiv(length, block) * sequences
    if programs > MAX_PROGRAMS:
        raise ValueError(
            f"{programs} programs (cdiv({length}, {block}) blocks x {sequences} batch elements "
            f"and heads) exceed CUDA's {MAX_PROGRAMS} on one grid axis"
        )
    return (programs, 1, 1)


class TritonAttention(torch.autograd.Function):
    """``apply(q, k, v, sinks, slopes, launch) -> (out, lse)`` on strided views q (B, H, N, D),
    k (B, H_kv, M, D), v (B, H_kv, M, Dv) (packed: B = 1, N, M = T_q, T_k), sinks (H,) float32
    or None, slopes (1 or B or S, H) float32 or None; out (B, H, N, Dv) in q's memory order,
    lse (B, H, N) float32."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        sinks: torch.Tensor | None,
        slopes: torch.Tensor | None,
        launch: Launch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = _empty_like_order(q, v.shape[-1])  # (B, H, N, Dv)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)  # (B, H, N)
        _run(
            forward.attention_forward_kernel,
            launch.seqlen_q,
            "BLOCK_M",
            launch,
            dict(
                q=q, k=k, v=v, out=out, lse=lse, sinks=sinks,
                **_strides("q", q, launch), **_strides("k", k, launch),
                **_strides("v", v, launch), **_strides("o", out, launch),
                **_strides("l", lse, launch),
                **_common(q, k, v, slopes, launch),
                SINKS=sinks is not None,
            ),
            FORWARD_CONFIGS,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, sinks, slopes)
        ctx.launch = launch
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: torch.Tensor, dlse: torch.Tensor) -> tuple[Any, ...]:
        """delta = rowsum(dO * O) - dlse once (tiled_attention_backward), dsinks from it, then
        the dK/dV pass and the dQ pass (which also gives each row's share of the slopes'
        gradient). Sinks: dsink_h = -sum over rows of exp(sink_h - lse) * delta
        (docs/derivations/sinks.md); slopes: dslope = -sum of dS * |p_i - j| (alibi.md)."""
        q, k, v, out, lse, sinks, slopes = ctx.saved_tensors
        launch: Launch = ctx.launch
        delta = (dout.to(torch.float32) * out.to(torch.float32)).sum(-1)  # (B, H, N)
        if dlse is not None:
            delta = delta - dlse  # dS = P * (dP - delta + dlse)
        delta = delta.contiguous()
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            sink_probs = torch.exp(sinks[:, None] - lse)  # (B, H, N)
            dsinks = -(sink_probs * delta).sum(dim=(0, 2))  # (H,)
        slope_grad = slopes is not None and ctx.needs_input_grad[4]
        dslope_rows = torch.zeros_like(lse) if slope_grad else None  # (B, H, N)
        common = dict(
            q=q, k=k, v=v, dout=dout, lse=lse, delta=delta,
            **_strides("q", q, launch), **_strides("k", k, launch),
            **_strides("v", v, launch), **_strides("g", dout, launch),
            **_strides("l", lse, launch),
            **_common(q, k, v, slopes, launch),
        )  # fmt: skip
        dk_heads, dv_heads = _key_grads_per_head(q, k, v, launch.group)
        _run(
            backward.attention_backward_dkdv_kernel,
            launch.seqlen_k,
            "BLOCK_N",
            launch,
            dict(common, dk=dk_heads, dv=dv_heads, **_strides("dk", dk_heads, launch),
                 **_strides("dv", dv_heads, launch)),
            BACKWARD_CONFIGS,
        )  # fmt: skip
        dq = torch.empty_like(q)
        _run(
            backward.attention_backward_dq_kernel,
            launch.seqlen_q,
            "BLOCK_M",
            launch,
            dict(common, dq=dq, dslope_rows=dslope_rows, **_strides("dq", dq, launch),
                 SLOPE_GRAD=slope_grad),
            BACKWARD_CONFIGS,
        )  # fmt: skip
        dk, dv = _group_sums(dk_heads, k), _group_sums(dv_heads, v)
        dslopes = None if dslope_rows is None else _slope_sums(dslope_rows, slopes, launch)
        return dq, dk, dv, dsinks, dslopes, None


def _key_grads_per_head(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the dK/dV kernel writes, one gradient per query head: dk, dv themselves (k's and
    v's layout and dtype) without GQA; under GQA float32 (B, H, M, D) and (B, H, M, Dv), which
    ``_group_sums`` reduces, so that each program writes its own head and needs no atomics."""
    if group == 1:
        return torch.empty_like(k), torch.empty_like(v)
    rows = (q.shape[0], q.shape[1], k.shape[2])  # (B, H, M)
    dk = torch.empty(rows + (k.shape[-1],), dtype=torch.float32, device=k.device)
    dv = torch.empty(rows + (v.shape[-1],), dtype=torch.float32, device=v.device)
    return dk, dv


def _group_sums(per_head: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """dK (or dV) of each kv head: the sum of its group's query heads, in head order (a fixed
    order: the backward stays deterministic), in ``like``'s dtype; ``per_head`` itself when it
    already has ``like``'s shape (no GQA)."""
    if per_head.shape == like.shape:
        return per_head
    batch, kv_heads = like.shape[:2]
    grouped = per_head.reshape(batch, kv_heads, -1, *per_head.shape[2:])  # (B, H_kv, group, M, W)
    return grouped.sum(dim=2).to(like.dtype)


def _common(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor | None, launch: Launch
) -> dict[str, Any]:
    """The arguments every kernel takes by the same name: the slopes, the seed, the packed
    offsets, the scalars and the constexpr options."""
    d, dv = q.shape[-1], v.shape[-1]
    slope_strides = (0, 0)
    if slopes is not None:  # batch stride 0 for one row of slopes (H,)
        slope_strides = (0 if slopes.shape[0] == 1 else slopes.stride(0), slopes.stride(1))
    return dict(
        slopes=slopes,
        seed=launch.seed,
        cu_seqlens_q=launch.cu_seqlens_q,
        cu_seqlens_k=launch.cu_seqlens_k,
        stride_slope_b=slope_strides[0],
        stride_slope_h=slope_strides[1],
        heads=launch.heads,
        group=launch.group,
        seqlen_q=launch.seqlen_q,
        seqlen_k=launch.seqlen_k,
        offset=launch.offset,
        head_dim=d,
        value_dim=dv,
        scale=float(launch.scale),
        softcap=float(launch.softcap) or 1.0,
        left=0 if launch.left is None else launch.left,
        right=0 if launch.right is None else launch.right,
        dropout_p=float(launch.dropout_p),
        rescale=1.0 / (1.0 - launch.dropout_p),
        lse_rows=q.shape[-2],  # the rows per head of lse: N, or T_q when packed
        keys_per_row=launch.seqlen_k,  # keys per row of the dropout grid
        length_bucket=triton.next_power_of_2(max(launch.seqlen_q, launch.seqlen_k, 1)),
        VARLEN=launch.cu_seqlens_q is not None,
        BOTTOM_RIGHT=launch.bottom_right,
        SOFTCAP=bool(launch.softcap),
        ALIBI=slopes is not None,
        HAS_LEFT=launch.left is not None,
        HAS_RIGHT=launch.right is not None,
        DROPOUT=launch.dropout_p > 0.0,
        # float32 products in IEEE float32: a GPU's default TF32 rounds inputs to 10 bits.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_DV=max(16, triton.next_power_of_2(dv)),
    )


def _strides(name: str, t: torch.Tensor, launch: Launch) -> dict[str, int]:
    """The strides of a (b, h, n[, w]) view as the kernels name them, ``stride_<name><axis>``
    for the axes b, h, n, d; a packed call's batch stride is 0 (its sequences are found through
    ``cu_seqlens``)."""
    strides = list(t.stride())
    if launch.cu_seqlens_q is not None:
        strides[0] = 0
    return {f"stride_{name}{axis}": s for axis, s in zip("bhnd", strides, strict=False)}


def _slope_sums(dslope_rows: torch.Tensor, slopes: torch.Tensor, launch: Launch) -> torch.Tensor:
    """The slopes' gradient (1 or B or S, H) from each row's share (B, H, N) (packed: (1, H,
    T_q)): summed over the rows of each batch element, or of each packed sequence."""
    if launch.cu_seqlens_q is None:
        per_batch = dslope_rows.sum(dim=-1)  # (B, H)
    else:  # sequence s holds rows cu[s]:cu[s + 1]: differences of a running sum at the offsets
        running = torch.nn.functional.pad(dslope_rows[0].cumsum(dim=-1), (1, 0))  # (H, T_q + 1)
        ends = running[:, launch.cu_seqlens_q.long()]  # (H, S + 1)
        per_batch = (ends[:, 1:] - ends[:, :-1]).T  # (S, H)
    return per_batch.sum(dim=0, keepdim=True) if slopes.shape[0] == 1 else per_batch


def _empty_like_order(t: torch.Tensor, width: int) -> torch.Tensor:
    """An empty tensor shaped like ``t`` with last axis ``width``, its axes laid out in memory in
    the order of ``t``'s strides: a (B, H, N, D) view of (B, N, H, D) memory gives (B, H, N, Dv)
    over (B, N, H, Dv) memory."""
    strides = t.stride()
    order = sorted(range(t.ndim - 1), key=lambda axis: -strides[axis])  # outermost first
    shape = [t.shape[axis] for axis in order] + [width]
    inverse = [order.index(axis) for axis in range(t.ndim - 1)] + [t.ndim - 1]
    return torch.empty(shape, dtype=t.dtype, device=t.device).permute(inverse)


def _run(
    kernel: Any,
    length: int,
    block: str,
    launch: Launch,
    arguments: dict[str, Any],
    configs: tuple[tuple[int, int, int, int], ...],
) -> None:
    """Launch ``kernel`` with every argument by name on ``grid(length, <block>, B * H)``;
    pinned blocks under the interpreter, autotuned ones on a GPU. A grid with no program is not
    launched."""
    sequences = launch.batch * launch.heads
    if length == 0 or sequences == 0:
        return
    if interpreted():
        pinned = grid(length, INTERPRETER_CONFIG[block], sequences)
        kernel[pinned](**arguments, **INTERPRETER_CONFIG)
    else:
        _tuned(kernel, configs)[lambda meta: grid(length, meta[block], sequences)](**arguments)


@functools.cache
def _tuned(kernel: Any, configs: tuple[tuple[int, int, int, int], ...]) -> Any:
    """``kernel`` autotuned over ``configs`` (built on first use: the autotuner needs a GPU)."""
    return triton.autotune(
        configs=[
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
            for bm, bn, warps, stages in configs
        ],
        key=_TUNING_KEY,
    )(kernel)
