"""The linear-attention specs' plain kernel: the gated delta rule computed plainly in torch, one
token at a time (float32 for half inputs, float64 for float64), differentiable by autograd,
behind flash-linear-attention's ``chunk_gated_delta_rule`` signature, and ``chunk_kda``'s (the
same signature; g (B, T, H, K), one gate per key channel, is read as such from its shape), with
the switches the pitfalls (``checker.pitfalls.fla_gdn``, ``checker.pitfalls.fla_kda``) turn to
make one mistake each, all off by default.
Independent of the torch twin (``torch_attention.linear_attention``, the baseline the bounds
scale).

Shape legend: B batch, T tokens, H heads, K key width, V value width, N states (sequences).

Tests: tests/checker/specs/test_linear.py
"""

from __future__ import annotations

import torch


def plain_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, cu_seqlens=None,
                           use_qk_l2norm_in_kernel=False, *, half_state=False,
                           gate_is_log=True, forget_after=False, reset_at_starts=True,
                           ignore_initial_state=False, roll_final_state=False,
                           one_channel_gate=False):  # fmt: skip
    """``S = a S + beta k (v - a S^T k)^T; o = scale S^T q`` per sequence, ``a = exp(g)``; for
    g (B, T, H, K) (KDA) ``a S`` is ``diag(exp(g)) S``, the gate scaling the state's K rows.

    The switches: ``half_state`` keeps the state in the inputs' dtype (rounded after every
    token); ``gate_is_log=False`` reads g as the gate itself (a = g); ``forget_after`` applies
    the gate after the delta update, ``S = a (S + beta k (v - S^T k)^T)``;
    ``reset_at_starts=False`` carries the state across a ``cu_seqlens`` boundary;
    ``ignore_initial_state`` starts every sequence from 0; ``roll_final_state`` returns
    sequence n's final state as sequence n + 1's; ``one_channel_gate`` (KDA) applies the first
    key channel's gate to every channel.
    """
    dtype = q.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    kept = dtype if half_state else compute
    q, k, v, g, beta = (t.to(compute) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    batch, _, heads, width = q.shape
    scale = width**-0.5 if scale is None else scale
    if cu_seqlens is None:
        spans = [(slice(None), 0, q.shape[1])]
    else:
        offsets = [int(n) for n in cu_seqlens]
        bounds = zip(offsets[:-1], offsets[1:], strict=True)
        spans = [(slice(n, n + 1), a, b) for n, (a, b) in enumerate(bounds)]
    count = batch if cu_seqlens is None else len(spans)
    zeros = q.new_zeros((count, heads, width, v.shape[-1]))
    start = zeros if initial_state is None or ignore_initial_state else initial_state.to(compute)
    outs, finals = [], []
    state = None
    for rows, first, last in spans:
        if state is None or reset_at_starts:
            state = start[rows]  # (b, H, K, V)
        for t in range(first, last):
            k_t, v_t = k[:, t, :, :, None], v[:, t, :, None, :]  # (b, H, K, 1), (b, H, 1, V)
            # (b, H, 1, 1), or (b, H, K, 1) per key channel: the gate scales S's K rows
            a = g[:, t, :, :, None] if g.dim() == 4 else g[:, t, :, None, None]
            a = a[:, :, :1] if one_channel_gate else a
            a = a.exp() if gate_is_log else a
            b = beta[:, t, :, None, None]
            if forget_after:  # S = a (S + beta k (v - S^T k)^T)
                state = a * (state + b * k_t * (v_t - (state * k_t).sum(-2, keepdim=True)))
            else:  # S = a S + beta k (v - a S^T k)^T
                state = a * state
                state = state + b * k_t * (v_t - (state * k_t).sum(-2, keepdim=True))
            state = state.to(kept).to(compute)
            outs.append(scale * (q[:, t, :, :, None] * state).sum(-2))  # (b, H, V)
        finals.append(state)
    out = torch.stack(outs, dim=1).to(dtype) if outs else v.to(dtype)  # (B, T, H, V)
    final = torch.cat(finals)
    if roll_final_state:
        final = final.roll(1, dims=0)
    return out, (final if output_final_state else None)
