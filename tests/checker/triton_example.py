"""A small Triton attention kernel of the project's own, the worked example of
docs/triton-on-cpu.md: judged by the kernel checker under Triton's interpreter in CI
(tests/checker/test_triton_example.py), as any third-party Triton kernel can be.

It is what a first tiled kernel usually is: flash-attn's signature (q, k, v of shape (B, N, H, D)),
forward only, one program per block of query rows and (batch, head), an online softmax over
blocks of keys, bottom-right causal alignment as flash-attn's, any strides. Its limits are real:
``tl.arange`` needs a power-of-two head width, ``tl.dot`` one of at least 16, so it takes D = Dv in
16, 32, 64, 128 (``LIMITS``), and no dropout, windows, softcap, ALiBi, GQA or lse (``FEATURES``);
what it does not take it refuses with a ValueError, which the checker reports as a refusal.

The kernel is autotuned over two configurations on a GPU. Autotuning benchmarks each
configuration on the device, which the interpreter has not got, so under it the configurations
are pinned to one: with a single configuration Triton's autotuner runs it without benchmarking.
That is the whole trick, ``CONFIGS`` below.

Run the checker on it by hand (about a minute):

    TRITON_INTERPRET=1 python -m parity_tests --kernel tests.checker.triton_example:attention \\
        --spec flash --features causal --forward-only --head-dims 16,32,64,128 \\
        --dtype float32 --dtype float16
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from parity_tests.checker.battery.limits import KernelLimits

# What it claims and takes, as the checker is told (check_kernel's features= and limits=).
FEATURES = frozenset({"causal"})
LIMITS = KernelLimits(head_dims=(16, 32, 64, 128))

# On a GPU the autotuner picks one of these per (N, M, D); under the interpreter there is no
# device to time them on, so one is pinned (small blocks: the interpreter runs programs one
# after another, and fewer, larger tiles are no faster there).
GPU_CONFIGS = [
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=2),
]
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CONFIGS = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16})] if INTERPRETED else GPU_CONFIGS


@triton.autotune(configs=CONFIGS, key=["N", "M", "D"])
@triton.jit
def _forward(
    Q, K, V, Out,
    stride_qb, stride_qn, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_ob, stride_on, stride_oh, stride_od,
    H, N, M, scale,
    CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Rows [program_id(0) * BLOCK_M, + BLOCK_M) of head program_id(1) % H of batch element
    program_id(1) // H: O = softmax(scale * Q K^T) V over the keys each row sees."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    batch, head = tl.program_id(1) // H, tl.program_id(1) % H
    width = tl.arange(0, D)
    q_ptrs = Q + batch * stride_qb + head * stride_qh
    q = tl.load(q_ptrs + rows[:, None] * stride_qn + width[None, :] * stride_qd,
                mask=rows[:, None] < N, other=0.0)  # fmt: skip
    k_base = K + batch * stride_kb + head * stride_kh
    v_base = V + batch * stride_vb + head * stride_vh
    # Running row maximum, row sum of exp and unnormalized output, in float32.
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, M, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + keys[:, None] * stride_kn + width[None, :] * stride_kd,
                    mask=keys[:, None] < M, other=0.0)  # fmt: skip
        scores = tl.dot(q, tl.trans(k)) * scale
        seen = keys[None, :] < M
        if CAUSAL:  # bottom-right: query i sees keys j <= i + M - N
            seen = seen & (keys[None, :] <= rows[:, None] + (M - N))
        scores = tl.where(seen, scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, 1))
        # A row that has seen no key yet keeps a maximum of -inf: shift it by 0 instead, so
        # that exp(-inf - shift) is 0 and never exp(nan).
        shift = tl.where(new_top == float("-inf"), 0.0, new_top)
        p = tl.exp(scores - shift[:, None])
        rescale = tl.exp(top - shift)
        total = total * rescale + tl.sum(p, 1)
        v = tl.load(v_base + keys[:, None] * stride_vn + width[None, :] * stride_vd,
                    mask=keys[:, None] < M, other=0.0)  # fmt: skip
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        top = new_top
    # A row that sees no key at all (causal with N > M) is 0 (acc is), as flash-attn's.
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    o_ptrs = Out + batch * stride_ob + head * stride_oh
    tl.store(o_ptrs + rows[:, None] * stride_on + width[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=rows[:, None] < N)  # fmt: skip


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    **options: object,
) -> torch.Tensor:
    """flash-attn's ``flash_attn_func`` for what this kernel takes: q (B, N, H, D), k and v
    (B, M, H, D), returns (B, N, H, D). Anything else is a ValueError (a refusal)."""
    if dropout_p != 0.0 or options:
        given = sorted(options) + (["dropout_p"] if dropout_p != 0.0 else [])
        raise ValueError(f"this kernel takes no {', '.join(given)}")
    (batch, _, heads, width), m = q.shape, k.shape[1]
    if k.shape != (batch, m, heads, width) or v.shape != k.shape:
        raise ValueError(f"q, k, v of one width and head count, got {q.shape}, {k.shape}, "
                         f"{v.shape}")  # fmt: skip
    if width not in LIMITS.head_dims:  # type: ignore[operator]
        raise ValueError(f"head width {width} not in {LIMITS.head_dims}")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype {q.dtype} not taken")
    scale = width**-0.5 if softmax_scale is None else softmax_scale
    return launch(q, k, v, scale, causal, v.stride())


def launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    v_strides: tuple[int, ...],
) -> torch.Tensor:
    """Run ``_forward``, v read with ``v_strides`` (``v.stride()``; the tests pass k's, the
    bug of a real kernel that the checker's k-and-v-of-different-strides layout catches)."""
    (batch, n, heads, width), m = q.shape, k.shape[1]
    out = torch.empty_like(q)

    def grid(config: dict[str, int]) -> tuple[int, int]:
        return (triton.cdiv(n, config["BLOCK_M"]), batch * heads)

    _forward[grid](q, k, v, out, *q.stride(), *k.stride(), *v_strides, *out.stride(),
                   heads, n, m, scale, CAUSAL=causal, D=width)  # fmt: skip
    return out
