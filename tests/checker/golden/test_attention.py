"""What a kernel is judged against: a case's inputs cast once and shared, a bool mask staying
bool; the float32 baseline within float32 rounding of the golden; flash-attn's causal ALiBi lse
recognised through the golden's shifted lse, and another shift not; float64 arrays on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity_tests import check_kernel
from parity_tests.checker.battery.attention.case import SHIFT, make_inputs
from parity_tests.checker.battery.attention.handwritten import NAMED
from parity_tests.checker.golden.attention import case_inputs, reference, to64
from parity_tests.checker.golden.attention_baseline import attention_scores, masked_softmax
from parity_tests.checker.targets import adapters
from parity_tests.tolerances import FLOAT32_RTOL

BY_NAME = {case.name: case for case in NAMED}


def test_a_cases_inputs_are_cast_once_and_shared_a_bool_mask_staying_bool():
    case = BY_NAME["bool-mask"]
    cpu = torch.device("cpu")
    drawn = make_inputs(case, 0)

    inputs = case_inputs(case, "bfloat16", cpu, 0)

    assert inputs is case_inputs(case, "bfloat16", cpu, 0)
    assert torch.equal(inputs.q, torch.from_numpy(drawn.q).to(torch.bfloat16))
    assert {t.dtype for t in (inputs.q, inputs.k, inputs.v, inputs.dout)} == {torch.bfloat16}
    assert inputs.attn_mask.dtype == torch.bool
    assert torch.equal(inputs.attn_mask, torch.from_numpy(drawn.attn_mask))


def test_float32_baseline_tracks_the_golden_to_float32_rounding():
    # The bound scales with the baseline's error, so a harness bug that hits kernel and baseline
    # alike (a dropped scale, a flipped mask) would widen the bound and hide itself; in float32
    # the baseline must stay at float32 rounding of the golden: of the scores, and on the rows
    # a shifted mask moves by SHIFT, of scores at that magnitude (float32's spacing at 1e5 is
    # 0.0078, which every kernel adding the mask in float32 pays alike).
    report = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases="quick")

    assert any(row.case.startswith("shifted") for row in report.rows)
    for row in report.rows:
        rounding = FLOAT32_RTOL * (abs(SHIFT) if row.case.startswith("shifted") else 1.0)
        if row.tensor != "keep":
            assert row.baseline <= rounding * row.golden_max, row


def _flash_alibi_convention(q, k, v, **kwargs):
    """The lse flash-attn's kernels return under causal ALiBi: shifted by slope_h * p_i."""
    out, lse, _ = adapters.flash_attn_func(q, k, v, **kwargs)
    n, m = q.shape[1], k.shape[1]
    slopes = kwargs["alibi_slopes"]
    p = torch.arange(n) + (m - n)  # bottom-right positions
    return out, lse + slopes.reshape(-1 if slopes.ndim == 2 else 1, slopes.shape[-1], 1) * p, None


def _wrong_alibi_shift(q, k, v, **kwargs):
    out, lse, _ = adapters.flash_attn_func(q, k, v, **kwargs)
    return out, lse + 0.5 * kwargs["alibi_slopes"][..., None], None


def _flash_backward(case, q, k, v, dout, mask=None, keep=None):
    """dq, dk, dv of (B, H, N, D) float64 tensors written out the FlashAttention way: delta' =
    rowsum(dO * O) from the output stored in float16, the weights recomputed from lse stored in
    float32, P' = exp(S - lse'), dS = P' * (dP - delta')."""
    group = case.heads // case.kv_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = case.scale or q.shape[-1] ** -0.5
    scores = attention_scores(q, k, mask, case.causal, scale, align=case.align)
    probs = masked_softmax(scores)
    lse = torch.logsumexp(scores, -1, keepdim=True)
    stored_lse = lse.float().double()
    recomputed = torch.where(torch.isfinite(lse), probs * torch.exp(lse - stored_lse), probs)
    dropped = probs if keep is None else probs * keep / (1 - case.dropout_p)
    out = dropped @ v
    dprobs = dout @ v.transpose(-2, -1)
    dropped_again = recomputed
    if keep is not None:
        dprobs = dprobs * keep / (1 - case.dropout_p)
        dropped_again = recomputed * keep / (1 - case.dropout_p)
    delta = (dout * out.half().double()).sum(-1, keepdim=True)
    dscores = recomputed * (dprobs - delta)
    dq = dscores @ k * scale
    dk = (dscores.transpose(-2, -1) @ q * scale).unflatten(1, (case.kv_heads, group)).sum(2)
    dv = (dropped_again.transpose(-2, -1) @ dout).unflatten(1, (case.kv_heads, group)).sum(2)
    return dq, dk, dv


@pytest.mark.parametrize("name", ["heavy-tailed", "gqa-2of4", "dead-rows-float", "dropout"])
def test_the_read_back_golden_is_flash_attentions_backward_from_its_stored_output(name):
    # The golden gets it as the exact backward given an lse cotangent; here it is written out.
    case, cpu = BY_NAME[name], torch.device("cpu")
    inputs = case_inputs(case, "float16", cpu, 0)
    q, k, v, dout = (t.double() for t in (inputs.q, inputs.k, inputs.v, inputs.dout))
    keep = None
    if case.dropout_p:
        shape = (case.batch, case.heads, case.n, case.m)
        keep = torch.rand(shape, generator=torch.Generator().manual_seed(1)) >= case.dropout_p
    dq, dk, dv = _flash_backward(case, q, k, v, dout, inputs.attn_mask, keep)

    golden, _ = reference(case, "float16", cpu, 0, keep)

    np.testing.assert_allclose(golden["dq_read_back"], dq.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(golden["dk_read_back"], dk.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(golden["dv_read_back"], dv.numpy(), rtol=1e-10, atol=1e-12)
    assert np.abs(golden["dk_read_back"] - golden["dk"]).max() > 1e-5  # it differs, by rounding


def test_the_read_back_golden_of_packed_sequences_is_each_sequences_own():
    case, cpu = BY_NAME["varlen-causal-gqa"], torch.device("cpu")
    inputs = case_inputs(case, "float16", cpu, 0)
    (cu_q, cu_k), parts = case.cu_seqlens, []
    for s in range(len(cu_q) - 1):
        rows, cols = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        q, dout = (t[rows].double().transpose(0, 1)[None] for t in (inputs.q, inputs.dout))
        k, v = (t[cols].double().transpose(0, 1)[None] for t in (inputs.k, inputs.v))
        parts.append([g[0].transpose(0, 1) for g in _flash_backward(case, q, k, v, dout)])
    dq, dk = (torch.cat([part[i] for part in parts]) for i in (0, 1))

    golden, _ = reference(case, "float16", cpu, 0)

    np.testing.assert_allclose(golden["dq_read_back"], dq.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(golden["dk_read_back"], dk.numpy(), rtol=1e-10, atol=1e-12)
    assert np.abs(golden["dq_read_back"] - golden["dq"]).max() > 1e-5


def test_flash_attns_causal_alibi_lse_is_recognised_and_another_shift_is_not():
    accepted = check_kernel(_flash_alibi_convention, spec="flash", dtypes=["float32"],
                            cases=["alibi-bh-causal"])  # fmt: skip
    refused = check_kernel(_wrong_alibi_shift, spec="flash", dtypes=["float32"],
                           cases=["alibi-bh-causal"])  # fmt: skip

    (row,) = [row for row in accepted.rows if row.tensor == "lse"]
    assert row.verdict == "pass" and "flash-attn's causal ALiBi convention" in row.detail
    assert [row.verdict for row in refused.rows if row.tensor == "lse"] == ["fail"]


@pytest.mark.parametrize(
    ("tensor", "dtype"),
    [
        (torch.tensor([0.1, -2.5], dtype=torch.bfloat16, requires_grad=True), np.float64),
        (torch.tensor([True, False]), np.bool_),
    ],
)
def test_to64_is_float64_on_the_cpu_and_a_bool_tensor_stays_bool(tensor, dtype):
    array = to64(tensor)

    assert isinstance(array, np.ndarray) and array.dtype == dtype
    assert array.tolist() == tensor.tolist()
