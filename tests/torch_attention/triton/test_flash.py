"""flash-attn's entries on the project's kernel (``torch_attention/triton/flash.py``), certified
by the kernel checker's "flash" and "flash_varlen" specs on a few small cases around the
interpreter's blocks of 16 that pair the spec's features (the full batteries are the opt-in
commands of docs/triton-kernel.md, minutes under the interpreter), and their bad input.
"""

from __future__ import annotations

import pytest
import torch

from parity_tests import check_kernel
from parity_tests.checker.battery.attention.case import Case

from .conftest import NEEDS_TRITON

pytest.importorskip("triton", reason=NEEDS_TRITON)
from torch_attention.triton import flash_attn_func, flash_attn_varlen_func, launch  # noqa: E402

BR = "bottom-right"
FLASH_CASES = (
    # N > M: the first rows see nothing; a causal window, softcap at logits it bends, GQA, Dv.
    Case("causal-window-softcap-gqa", 1, 2, 33, 17, 16, dv=24, heads_kv=1, causal=True,
         window=(5, None), softcap=2.0, logits=30.0, align=BR),
    # ALiBi per batch element with a two-sided window, a given scale, N < M.
    Case("alibi-bh-window-scale", 2, 2, 17, 33, 16, alibi="BH", window=(3, 4), scale=0.3,
         align=BR),
)  # fmt: skip
VARLEN_CASE = Case("varlen-causal-alibi-gqa", 4, 2, 36, 42, 16, dv=24, heads_kv=1, causal=True,
                   align=BR, alibi="BH", seqlens=((17, 20), (0, 5), (3, 0), (16, 17)))  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    ("spec", "kernel", "cases"),
    [("flash", flash_attn_func, FLASH_CASES),
     ("flash_varlen", flash_attn_varlen_func, (VARLEN_CASE,))],
    ids=["flash", "flash_varlen"],
)  # fmt: skip
def test_the_entries_pass_their_spec(spec, kernel, cases, dtype, device):
    report = check_kernel(kernel, spec=spec, device=device, dtypes=[dtype], cases=cases)

    assert report.passed, report.failures
    assert report.coverage == 1.0
    assert {"out", "dq", "dk", "dv", "lse"} <= {row.tensor for row in report.rows}


def test_the_output_comes_back_in_flash_attns_layout(device):
    q = torch.randn(2, 17, 4, 16, device=device)  # (B, N, H, D)
    k, v = torch.randn(2, 2, 20, 2, 16, device=device).unbind(0)  # (B, M, H_kv, D)

    out, lse, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)

    assert out.shape == (2, 17, 4, 16) and out.is_contiguous()
    assert lse.shape == (2, 4, 17) and lse.dtype == torch.float32 and probs is None


def test_a_max_seqlen_below_a_sequence_is_refused(device):
    q = torch.randn(7, 2, 16, device=device)
    cu = torch.tensor([0, 2, 7], dtype=torch.int32, device=device)

    with pytest.raises(ValueError, match="max_seqlen_q = 4 is below the longest sequence, 5"):
        flash_attn_varlen_func(q, q, q, cu, cu, 4, 5)


@pytest.mark.parametrize(
    ("dtype", "d", "named"),
    [(torch.float64, 16, "torch.float64"), (torch.float16, 320, "head widths D = 320")],
)
def test_inputs_beyond_the_limits_are_refused_naming_the_limit(dtype, d, named, device):
    q = torch.randn(1, 5, 2, d, dtype=dtype, device=device)

    with pytest.raises(ValueError, match=f"cannot compute this call: {named}"):
        flash_attn_func(q, q, q)


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(launch, "interpreted", lambda: False)
    q = torch.randn(1, 5, 2, 16)

    with pytest.raises(ValueError, match="CPU tensors"):
        flash_attn_func(q, q, q)
