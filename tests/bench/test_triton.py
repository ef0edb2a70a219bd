"""parity_tests/bench/triton.py without a GPU: the one-line refusal, and the report on hand-made
timings (the measurement itself needs CUDA: docs/triton-kernel.md)."""

from __future__ import annotations

import pytest
import torch

from parity_tests.bench import triton as bench_triton
from parity_tests.bench.triton import SHAPE, TARGET, Row, report_lines, tflops, visible_scores


def test_without_cuda_it_refuses_in_one_line_with_exit_code_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    code = bench_triton.main([])

    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "needs a CUDA GPU" in err


def test_visible_scores_and_throughput():
    assert visible_scores(4, None) == 10  # 1 + 2 + 3 + 4
    assert visible_scores(4, (1, 0)) == 7  # 1 + 2 + 2 + 2
    b, h, n, d = SHAPE
    one_second_of_forward = b * h * visible_scores(n, None) * 4 * d / 1e12

    assert tflops(1000.0, "fwd", None) == pytest.approx(one_second_of_forward)
    assert tflops(1000.0, "fwd+bwd", None) == pytest.approx(3.5 * one_second_of_forward)


@pytest.mark.parametrize(("sdpa_ms", "verdict"), [(7.0, "met"), (6.0, "NOT met")])
def test_the_report_gives_throughput_ratios_and_the_target(sdpa_ms, verdict):
    rows = [
        Row("causal", "fwd+bwd", {"triton": 10.0, "sdpa-flash": sdpa_ms, "flex-compiled": 20.0}),
        Row("window 1024", "fwd", {"triton": 2.0, "sdpa-flash": None, "flex-compiled": 3.0}),
    ]

    lines = report_lines(rows, "a GPU")

    assert f"{sdpa_ms / 10:.2f}x" in lines[2] and "2.00x" in lines[2]
    assert lines[3].split().count("-") == 2 and "1.50x" in lines[3]  # no SDPA window
    assert lines[-1].endswith(f"{sdpa_ms / 10:.2f}x: {verdict}") and f">= {TARGET}x" in lines[-1]


def test_compile_only_refuses_the_interpreter_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    code = bench_triton.main(["--compile-only"])

    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "unset TRITON_INTERPRET" in err


def test_compile_only_types_every_argument_of_every_kernel():
    pytest.importorskip("triton", reason="the kernels need the optional extra 'triton'")
    from torch_attention.triton import backward, forward

    for kernel in (
        forward.attention_forward_kernel,
        backward.attention_backward_dkdv_kernel,
        backward.attention_backward_dq_kernel,
    ):
        signature, values = bench_triton.kernel_signature(kernel, "bf16", {"HAS_RIGHT": True}, {})
        with_dropout, _ = bench_triton.kernel_signature(kernel, "bf16", {"DROPOUT": True}, {})

        assert list(signature) == kernel.arg_names
        assert signature["q"] == "*bf16" and with_dropout["seed"] == "*i64"  # read on the device
        assert values["HAS_RIGHT"] is True and values["VARLEN"] is False
        assert values["cu_seqlens_q"] is None and values["slopes"] is None
        assert signature["seed"] == "constexpr" and values["seed"] is None
