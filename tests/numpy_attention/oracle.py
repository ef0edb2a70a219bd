"""The oracle of the NumPy core's tests: today's attention written in plain torch ops, backward by
torch autograd.

It is written from docs/design.md's pipeline alone, the naive way, sharing no code with
numpy_attention: K and V are repeated for GQA (``repeat_interleave``), positions and the band are
explicit (N, M) grids, the sink is one more column of the softmax, hidden scores are replaced with
``masked_fill``. Rows with nothing to attend to are computed on zeros and then set to out 0,
lse -inf, so that no NaN reaches autograd.

Shape legend: B batch, H query heads, H_kv kv heads, N query length, M key length, D, Dv widths.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def attention(q, k, v, *, causal=False, window=None, align="top-left", key_padding_mask=None,
              attn_mask=None, scale=None, softcap=0.0, alibi_slopes=None, sinks=None,
              enable_gqa=False, dropout_p=0.0, dropout_mask=None, chunk_size=None,
              chunk_start=None):  # fmt: skip
    """(out, lse) of q (..., H, N, D), k (..., H_kv, M, D), v (..., H_kv, M, Dv), torch tensors."""
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale  # (..., H, N, M)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    position = torch.arange(n)[:, None] + (m - n if align == "bottom-right" else 0)  # p_i
    key = torch.arange(m)[None, :]
    if alibi_slopes is not None:
        slopes = (
            alibi_slopes
            if alibi_slopes.dim() == 1
            else alibi_slopes.reshape(
                alibi_slopes.shape[:1] + (1,) * (q.dim() - 4) + alibi_slopes.shape[1:]
            )
        )
        scores = scores - slopes[..., None, None] * (position - key).abs()
    visible = torch.ones(scores.shape, dtype=torch.bool)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        visible = visible & attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask
        visible = visible & ~torch.isneginf(attn_mask)
    if causal:
        visible = visible & (key <= position)
    if window is not None:
        left, right = window
        if left is not None:
            visible = visible & (key >= position - left)
        if right is not None:
            visible = visible & (key <= position + right)
    if chunk_size is not None:  # chunk c holds keys s + c * C .. s + c * C + C - 1
        start = 0 if chunk_start is None else torch.as_tensor(chunk_start)
        if torch.is_tensor(start) and start.dim() == 1:
            start = start.reshape(start.shape + (1,) * (q.dim() - 1))
        key_chunk = torch.floor((key - start) / chunk_size)
        visible = visible & (key_chunk == torch.floor((position - start) / chunk_size))
    if key_padding_mask is not None:
        view = (key_padding_mask.shape[0],) + (1,) * (q.dim() - 2) + (m,)
        visible = visible & ~key_padding_mask.reshape(view)
    scores = scores.masked_fill(~visible, -math.inf)
    if sinks is not None:
        column = sinks[:, None, None].expand(scores.shape[:-1] + (1,))
        scores = torch.cat([scores, column], dim=-1)  # the sink: one more logit, no value
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    safe = scores.masked_fill(dead, 0.0)
    lse = torch.logsumexp(safe, dim=-1, keepdim=True)
    probs = torch.exp(safe - lse).masked_fill(dead, 0.0)[..., :m]
    if dropout_mask is not None:
        probs = probs * dropout_mask / (1.0 - dropout_p)
    out = probs @ v
    return out, lse.masked_fill(dead, -math.inf)[..., 0]


def attention_and_grads(arrays, dout, dlse=None, **options):
    """Forward and torch-autograd backward of ``attention`` on NumPy arrays (float64).

    Args:
        arrays: dict with q, k, v and optionally sinks (differentiated), as NumPy arrays.
        dout: upstream gradient of out; dlse: of lse (None for 0).
        **options: the other keywords of ``attention`` as NumPy arrays or plain values.

    Returns:
        dict of NumPy arrays: out, lse, dq, dk, dv (and dsinks).
    """
    leaves = {
        name: torch.from_numpy(np.array(a)).requires_grad_(True) for name, a in arrays.items()
    }
    kwargs = {
        name: torch.from_numpy(np.asarray(value)) if isinstance(value, np.ndarray) else value
        for name, value in options.items()
    }
    q, k, v = leaves["q"], leaves["k"], leaves["v"]
    out, lse = attention(q, k, v, sinks=leaves.get("sinks"), **kwargs)
    outputs, upstream = [out], [torch.from_numpy(dout)]
    if dlse is not None:
        finite = torch.isfinite(lse)
        outputs.append(torch.where(finite, lse, torch.zeros_like(lse)))
        upstream.append(torch.from_numpy(dlse))
    grads = torch.autograd.grad(outputs, list(leaves.values()), upstream, allow_unused=True)
    result = {"out": out.detach().numpy(), "lse": lse.detach().numpy()}
    for name, tensor, grad in zip(leaves, leaves.values(), grads, strict=True):
        result["d" + name] = torch.zeros_like(tensor).numpy() if grad is None else grad.numpy()
    return result
