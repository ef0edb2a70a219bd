"""``python -m parity_tests``: exit codes, the tables, --json, --kernel and bad usage."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from parity_tests import check_kernel, registry
from parity_tests.checker import targets
from parity_tests.cli import main
from parity_tests.registry import ParityRow

SDPA = "torch.nn.functional:scaled_dot_product_attention"
BROKEN = "parity_tests.checker.pitfalls:scale_by_d"


def test_user_kernel_passes_with_json(tmp_path, capsys):
    path = tmp_path / "report.json"

    argv = ["--kernel", SDPA, "--quick", "--seed", "3", "--device", "cpu"]

    code = main([*argv, "--json", str(path)])

    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    assert code == 0 and report["passed"] is True
    assert "layers" not in report
    (check,) = report["kernels"]
    assert check["target"] == SDPA and check["battery"] == "quick"
    assert {group["status"] for group in check["groups"]} == {"pass"}
    assert {group["dtype"] for group in check["groups"]} == {"float32", "float16", "bfloat16"}
    direct = check_kernel(
        F.scaled_dot_product_attention, dtypes=["float32"], cases=["plain"], seed=3
    )
    assert check["groups"][0]["rows"][0]["error"] == direct.rows[0].error
    assert "plain" in out and out.rstrip().endswith("OK")


def test_broken_kernel_exits_1_and_names_the_failure(capsys):
    code = main(["--kernel", BROKEN, "--quick", "--dtype", "float32", "--device", "cpu"])

    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL (out fail" in out and "FAILED" in out
    assert "float32" in out and "float16" not in out


def test_builtin_targets_show_expected_failures_as_xfail(capsys):
    code = main(["--no-layers", "--quick", "--dtype", "float32", "--device", "cpu"])

    out = capsys.readouterr().out
    assert code == 0
    assert "-- mha[need_weights=True] on cpu --" in out
    assert "XFAIL dead-rows-bool: nn.MultiheadAttention with need_weights=True" in out


def test_an_expected_failure_that_passes_is_an_xpass_and_fails_the_run(monkeypatch, capsys):
    entry = targets.ExpectedFailure(SDPA, "plain", "pretend it fails")
    monkeypatch.setattr(targets, "EXPECTED_FAILURES", (entry,))

    code = main(["--kernel", SDPA, "--quick", "--dtype", "float32", "--device", "cpu"])

    out = capsys.readouterr().out
    assert code == 1
    assert "XPASS plain: expected to fail: pretend it fails" in out


def test_stress_findings_do_not_change_the_exit_status(tmp_path, capsys):
    path = tmp_path / "report.json"
    argv = ["--kernel", "parity_tests.checker.pitfalls:no_max_shift", "--dtype", "float32"]

    code = main([*argv, "--no-kernels", "--stress", "--device", "cpu", "--json", str(path)])

    report = json.loads(path.read_text())
    statuses = {g["status"] for check in report["stress"] for g in check["groups"]}
    assert "FAIL" in statuses
    assert code == 0 and "kernels" not in report
    assert "stress battery (findings, not part of the verdict)" in capsys.readouterr().out


def _fake_rows(*, device, dtypes, quick, progress):
    progress("fake registry")
    return [
        ParityRow("Layer/ok", "Layer", "float64", device, "math", "out", 1e-16, 1e-10, True),
        ParityRow("Layer/bad", "Layer", "float32", device, "math", "dx", 1e-3, 2e-5, False),
    ]


def test_a_layer_failure_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(registry, "run_registry", _fake_rows)

    code = main(["--no-kernels", "--device", "cpu"])

    out = capsys.readouterr().out
    assert code == 1
    assert "Layer/bad" in out and "FAIL" in out and "layers: 2 groups, 1 failing" in out


def test_progress_goes_to_stderr(capsys):
    main(["--kernel", SDPA, "--quick", "--dtype", "float32", "--device", "cpu"])

    err = capsys.readouterr().err
    assert f"{SDPA} on cpu (quick battery)" in err


def test_calibration_reports_the_policy_tables(capsys):
    code = main(["--calibrate", "1", "--quick", "--dtype", "bfloat16", "--device", "cpu"])

    out = capsys.readouterr().out
    assert code == 0
    assert "| bfloat16 | dq |" in out and "| backward_without_rowsum |" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--kernel", "no_colon_here"],
        ["--kernel", "parity_tests.no_such_module:f"],
        ["--kernel", "parity_tests.checker.pitfalls:no_such_function"],
        ["--kernel", "parity_tests.checker.pitfalls:PITFALLS"],
        ["--dtype", "float64"],
        ["--device", "tpu"],
        ["--seed", "one"],
        ["--calibrate", "0"],
        ["--calibrate", "1", "--kernel", SDPA],
        ["--no-such-flag"],
    ],
)
def test_bad_usage_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)

    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_bad_usage():
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "cuda"])

    assert exit_info.value.code == 2


def test_python_dash_m_runs_the_cli():
    argv = ["--kernel", SDPA, "--quick", "--dtype", "float32", "--device", "cpu"]

    result = subprocess.run(
        [sys.executable, "-m", "parity_tests", *argv], capture_output=True, text=True, timeout=300
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("OK")
