"""flash-linear-attention's naive NSA (``fla.ops.nsa.naive.naive_nsa``, fla-core 0.6.0, the extra
``fla``) as the oracle of numpy_attention.nsa: the output, the blocks chosen and every gradient
(autograd through fla's reference) against ``nsa_forward`` / ``nsa_backward``.

fla's reference runs on CPU with two stand-ins, both set here for the test's duration:
- ``mean_pooling`` is a Triton kernel behind ``@triton.autotune``, which needs a device to time
  its configurations; here fla's own forward and backward kernels run under Triton's interpreter
  with one configuration (BD = 16), their autotuner skipped.
- the sliding window calls ``flash_attn_func`` (CUDA): here a dense causal-window attention
  written below; with it the window branch checks fla's gate mixing, not a kernel.

fla computes its branches in float32 (``.float()``), its selection scores in the inputs' dtype:
float64 inputs, judged at float32's tolerance. Its group size H / H_kv must be a power of two
>= 16. With ``block_counts`` < 3 the forced blocks (0, current, previous) tie and ``torch.topk``
orders ties as it likes, so the comparison keeps ``block_counts`` >= 3.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.nsa import nsa_backward, nsa_forward

from ..conftest import assert_close, to_numpy, to_torch

naive = pytest.importorskip(
    "fla.ops.nsa.naive", reason="needs the fla extra: pip install -e '.[fla]'"
)
pooling = pytest.importorskip("fla.ops.utils.pooling")
triton = pytest.importorskip("triton")
from fla.ops.utils.index import prepare_chunk_indices  # noqa: E402

T, D, BLOCK, WINDOW = 29, 8, 4, 5  # T not a multiple of the block
PACKED = np.array([0, 11, 29])


class FlaMeanPooling(torch.autograd.Function):
    """fla's mean-pooling kernels, forward and backward, launched without their autotuner."""

    @staticmethod
    def forward(ctx, x, chunk_size, cu_seqlens):
        ctx.shape, ctx.chunk_size, ctx.cu_seqlens = x.shape, chunk_size, cu_seqlens
        out = x.new_empty(x.shape[0], _chunks(x.shape[1], chunk_size, cu_seqlens), *x.shape[2:])
        _launch(pooling.mean_pooling_fwd_kernel, x, out, x.shape, chunk_size, cu_seqlens)
        return out

    @staticmethod
    def backward(ctx, dout):
        dx = dout.new_empty(ctx.shape)
        _launch(pooling.mean_pooling_bwd_kernel, dout.contiguous(), dx, ctx.shape, ctx.chunk_size,
                ctx.cu_seqlens)  # fmt: skip
        return dx, None, None


def _chunks(t, chunk_size, cu_seqlens):
    if cu_seqlens is None:
        return triton.cdiv(t, chunk_size)
    return len(prepare_chunk_indices(cu_seqlens, chunk_size))


def _launch(kernel, src, dst, shape, chunk_size, cu_seqlens):
    batch, t, heads, width = shape
    indices = None if cu_seqlens is None else prepare_chunk_indices(cu_seqlens, chunk_size)
    grid = (triton.cdiv(width, 16) * _chunks(t, chunk_size, cu_seqlens), batch * heads)
    kernel.fn.fn[grid](src, dst, cu_seqlens, indices, T=t, H=heads, D=width, BT=chunk_size,
                       BD=16, IS_VARLEN=cu_seqlens is not None)  # fmt: skip


def window_attention(q, k, v, *, causal, window_size, cu_seqlens_q=None, **_):
    """flash_attn_func / flash_attn_varlen_func's causal window (left, 0), dense, (B, T, H, D)."""
    assert causal and window_size[1] == 0
    if q.dim() == 3:  # varlen: packed (T, H, D), one sequence after another
        parts = [
            window_attention(q[None, a:b], k[None, a:b], v[None, a:b], causal=True,
                             window_size=window_size)[0]
            for a, b in zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist(), strict=True)
        ]  # fmt: skip
        return torch.cat(parts)
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    t = torch.arange(q.shape[1])
    shown = (t[None, :] <= t[:, None]) & (t[None, :] >= t[:, None] - window_size[0])
    scores = torch.einsum("bthd,bshd->bhts", q, k) * q.shape[-1] ** -0.5
    probs = scores.masked_fill(~shown, -torch.inf).softmax(-1)
    return torch.einsum("bhts,bshd->bthd", probs, v)


@pytest.fixture
def fla_on_cpu(monkeypatch):
    monkeypatch.setattr(naive, "mean_pooling", FlaMeanPooling.apply)
    monkeypatch.setattr(naive, "flash_attn_func", window_attention)
    monkeypatch.setattr(naive, "flash_attn_varlen_func", window_attention)


def inputs(rng, heads, kv_heads):
    q = rng.standard_normal((T, heads, D))
    k = rng.standard_normal((T, kv_heads, D))
    v = rng.standard_normal((T, kv_heads, D))
    gates = [rng.uniform(0.1, 1.0, (T, heads)) for _ in range(3)]
    return q, k, v, gates


@pytest.mark.parametrize("window", [0, WINDOW])
@pytest.mark.parametrize("cu_seqlens", [None, PACKED])
@pytest.mark.parametrize(("heads", "kv_heads", "counts"), [(16, 1, 4), (32, 2, 5)])
def test_nsa_equals_flas_naive_nsa(rng, fla_on_cpu, window, cu_seqlens, heads, kv_heads, counts):
    q, k, v, gates = inputs(rng, heads, kv_heads)
    g_swa = gates[2] if window else None
    ref = nsa_forward(
        q, k, v, gates[0], gates[1], g_swa, block_size=BLOCK, block_counts=counts,
        window_size=window, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    dout = rng.standard_normal(ref.out.shape)
    grads = nsa_backward(dout, ref.ctx)

    names = ["q", "k", "v", "g_cmp", "g_slc"] + (["g_swa"] if window else [])
    tensors = {
        n: to_torch(a[None], requires_grad=True)
        for n, a in zip(names, [q, k, v, *gates], strict=False)
    }
    out, chosen = naive.naive_nsa(
        *tensors.values(), *([None] if not window else []), block_counts=counts,
        block_size=BLOCK, window_size=window, return_block_indices=True,
        cu_seqlens=None if cu_seqlens is None else torch.from_numpy(cu_seqlens),
    )  # fmt: skip
    assert np.array_equal(np.sort(to_numpy(chosen[0]), -1), np.sort(ref.block_indices, -1))
    assert_close(out[0], ref.out, dtype=np.float32, name="out")
    (out[0] * to_torch(dout)).sum().backward()
    for name, tensor in tensors.items():
        assert_close(tensor.grad[0], getattr(grads, "d" + name), dtype=np.float32, name=name)
