"""``python -m parity_tests`` and ``parity-tests``: exit codes, the tables (compact, and every
group with --verbose), the JSON schema and its versions, --kernel, --version, the CLI without
torch, and bad usage refused in one line before any work; a run stopped by a signal keeps every
group it finished in its JSON, reruns carry their environment, and bfloat16 under Triton's
interpreter is one warning line."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parity_tests
from parity_tests import check_kernel
from parity_tests.checker import pitfalls
from parity_tests.checker.calibration import calibrate as calibration
from parity_tests.checker.report.render import SCHEMA_VERSION
from parity_tests.checker.targets import builtin as targets
from parity_tests.checker.targets import expected
from parity_tests.cli import VERSION, main
from parity_tests.parity import run as parity_run
from parity_tests.parity.run import ParityRow

SDPA = "torch.nn.functional:scaled_dot_product_attention"
FLASH = "parity_tests.checker.targets.adapters:flash_attn_func"
BROKEN = "parity_tests.checker.pitfalls:scale_by_d"
QUICK_F32 = ["--quick", "--dtype", "float32", "--device", "cpu"]
BUILTIN_TARGETS = targets.builtin_targets  # before any test replaces it


def _module(tmp_path, monkeypatch, name: str, source: str) -> None:
    """A module ``name`` in tmp_path, importable for this test."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_user_kernel_passes_with_json(tmp_path, capsys):
    path = tmp_path / "report.json"
    argv = ["--kernel", SDPA, "--quick", "--seed", "3", "--device", "cpu"]

    code = main([*argv, "--json", str(path)])

    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    assert code == 0 and report["verdict"] == "pass"
    assert report["schema_version"] == SCHEMA_VERSION and report["argv"] == [
        *argv,
        "--json",
        str(path),
    ]
    assert report["layers"] is None and report["stress"] is None and report["state"] == "finished"
    (check,) = report["kernels"]
    assert check["target"] == SDPA and check["battery"] == "quick" and check["verdict"] == "pass"
    assert check["finished"] is True and check["diagnosis"] == []
    assert {group["status"] for group in check["groups"]} == {"pass"}
    assert {group["dtype"] for group in check["groups"]} == {"float32", "float16", "bfloat16"}
    first = check["groups"][0]["case"]
    direct = check_kernel(F.scaled_dot_product_attention, dtypes=["float32"], cases=[first], seed=3)
    assert check["groups"][0]["rows"][0]["error"] == direct.rows[0].error
    assert check["groups"][0]["shape"] == direct.cases[first].shape
    assert f"cpu     {SDPA:40} pass" in out and out.rstrip().endswith("OK")


def test_json_names_the_versions_and_the_device(tmp_path):
    path = tmp_path / "report.json"

    main(["--kernel", SDPA, *QUICK_F32, "--json", str(path)])

    report = json.loads(path.read_text())
    assert report["project"] == {"name": "attention-parity", "version": parity_tests.__version__}
    packages = report["environment"]["packages"]
    assert packages["torch"] == torch.__version__ and packages["numpy"] == np.__version__
    assert {"python", "platform"} <= set(report["environment"])
    assert report["kernels"][0]["device_name"] == report["environment"]["devices"]["cpu"]


def _hf_sdpa_targets(device, dtypes):
    from parity_tests.checker.targets import third_party

    return [targets.Target("hf.sdpa_attention_forward", third_party.hf_sdpa, dtypes)]


def test_json_names_transformers_when_its_targets_ran(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    monkeypatch.setattr(targets, "builtin_targets", _hf_sdpa_targets)
    path = tmp_path / "report.json"

    main(["--no-layers", "--case", "plain", "--dtype", "float32", "--json", str(path)])

    report = json.loads(path.read_text())
    assert report["kernels"][0]["target"] == "hf.sdpa_attention_forward"
    assert report["environment"]["packages"]["transformers"] == (
        importlib.metadata.version("transformers")
    )


def test_json_is_strict_with_non_finite_numbers_as_null_and_a_flag(tmp_path):
    path = tmp_path / "report.json"
    kernel = "parity_tests.checker.pitfalls:nan_on_dead_rows"

    code = main(["--kernel", kernel, *QUICK_F32, "--json", str(path)])

    def refuse(constant):
        raise AssertionError(f"{constant} in strict JSON")

    report = json.loads(path.read_text(), parse_constant=refuse)
    rows = [row for group in report["kernels"][0]["groups"] for row in group["rows"]]
    nonfinite = [row for row in rows if row["verdict"] == "nonfinite"]
    assert code == 1 and nonfinite
    assert all(row["error"] is None and row["nonfinite"]["error"] == "inf" for row in nonfinite)


def test_broken_kernel_exits_1_and_names_the_failure(capsys):
    code = main(["--kernel", BROKEN, *QUICK_F32])

    out = capsys.readouterr().out
    assert code == 1
    assert f"cpu     {BROKEN:40} fail" in out and "FAILED" in out
    assert "float32" in out and "float16" not in out
    summary = out[out.index("== failing rows") :]
    shape = r"\(B=\d+ H=\d+ N=\d+ M=\d+ D=\d+ Dv=\d+\)"
    assert re.search(rf"{re.escape(BROKEN)} on cpu: \S+ float32 {shape}: out fail", summary)


def _mha_targets(device, dtypes):
    return [t for t in BUILTIN_TARGETS(device, dtypes) if t.name.startswith("mha")]


def test_builtin_targets_show_expected_failures_as_xfail(monkeypatch, capsys):
    monkeypatch.setattr(targets, "builtin_targets", _mha_targets)

    code = main(["--no-layers", *QUICK_F32, "--verbose"])

    out = capsys.readouterr().out
    assert code == 0
    assert "-- mha[need_weights=True] on cpu (quick battery) --" in out
    assert re.search(r"xfail dead-[^:]*: nn.MultiheadAttention with need_weights=True", out)
    assert re.search(r"not-run \S+.*: needs (dv, )?gqa.*, not in the kernel's features", out)
    judged = r"pass: \d+ of \d+ case-dtype groups judged \(\d+%\)"
    assert re.search(judged + r", [1-9]\d* expected failures?, .*\d+ not run", out)


def _raises_with_a_compiler_log(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                scale=None):  # fmt: skip
    """Raises on causal cases with a message as long as compiled FlexAttention's gcc log."""
    if is_causal:
        log = "\n".join(f"file.h:{i}: warning: comparison of integers" for i in range(3000))
        raise RuntimeError(f"CppCompileError: C++ compile error\n{log}")
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                          scale=scale)  # fmt: skip


def _compiled_like_targets(device, dtypes):
    return [targets.Target("compiled-like", _raises_with_a_compiler_log, ("float32",))]


@pytest.fixture
def compiled_like(monkeypatch):
    """One built-in target whose causal cases fail as documented, with a 3000-line message."""
    entry = expected.ExpectedFailure("compiled-like", "causal-n<m", "the compiler fails, as known",
                                     detail="CppCompileError")  # fmt: skip
    monkeypatch.setattr(expected, "EXPECTED_FAILURES", (entry,))
    monkeypatch.setattr(targets, "builtin_targets", _compiled_like_targets)
    monkeypatch.setattr(parity_run, "run_registry", _fake_rows_passing)


def test_a_passing_run_prints_a_table_not_a_compiler_log(compiled_like, tmp_path, capsys):
    path = tmp_path / "report.json"
    argv = ["--case", "plain", "--case", "causal-n<m", "--device", "cpu", "--json", str(path)]

    code = main(argv)

    out = capsys.readouterr().out
    assert code == 0 and len(out.splitlines()) < 30
    assert "warning" not in out and "Traceback" not in out
    assert "        xfail causal-n<m: the compiler fails, as known" in out
    row = next(line for line in out.splitlines() if "compiled-like" in line)
    # verdict, judged, flagged, refused, errors, expected failures
    assert row.split()[:8] == ["cpu", "compiled-like", "pass", "1", "0", "0", "0", "1"]
    assert "kernels: pass, 1 of 1 targets on cpu pass; 1 of 2 case-dtype groups judged, " in out
    assert "layers: pass, 1 of 1 layers on cpu pass; 1 groups" in out
    assert out.rstrip().endswith("OK")
    (error,) = json.loads(path.read_text())["kernels"][0]["errors"]
    assert error["traceback"].count("warning: comparison") == 3000


def test_verbose_prints_every_group_and_each_traceback(compiled_like, capsys):
    code = main(["--case", "plain", "--case", "causal-n<m", "--device", "cpu", "--verbose"])

    out = capsys.readouterr().out
    assert code == 0 and out.count("warning: comparison") == 3000
    assert "== layers: NumPy vs torch (norm-wise relative error, bound) ==" in out
    assert "-- compiled-like on cpu (cases battery) --" in out


def test_an_expected_failure_that_passes_is_an_xpass_and_fails_the_run(monkeypatch, capsys):
    entry = expected.ExpectedFailure(SDPA, "*", "pretend it fails")
    monkeypatch.setattr(expected, "EXPECTED_FAILURES", (entry,))

    code = main(["--kernel", SDPA, *QUICK_F32])

    out = capsys.readouterr().out
    assert code == 1
    assert re.search(r"xpass \S+.*: expected to fail: pretend it fails", out)


def test_stress_findings_do_not_change_the_exit_status(tmp_path, capsys):
    path = tmp_path / "report.json"
    argv = ["--kernel", "parity_tests.checker.pitfalls:no_max_shift", "--dtype", "float32"]

    code = main([*argv, "--no-kernels", "--stress", "--device", "cpu", "--json", str(path)])

    report = json.loads(path.read_text())
    statuses = {g["status"] for check in report["stress"] for g in check["groups"]}
    assert "fail" in statuses
    assert code == 0 and report["kernels"] is None and report["verdict"] is None
    out = capsys.readouterr().out
    assert "stress battery (findings, not part of the verdict)" in out
    assert out.rstrip().endswith("no verdict: the stress battery's findings only, nothing judged")


def _fake_rows(*, device, dtypes, quick, progress):
    progress("fake registry")
    return [
        ParityRow("Layer/ok", "Layer", "float64", device, "math", "out", 1e-16, 1e-10, True),
        ParityRow("Layer/bad", "Layer", "float32", device, "math", "dx", 1e-3, 2e-5, False, (2, 5)),
    ]


def _fake_rows_passing(*, device, dtypes, quick, progress):
    return _fake_rows(device=device, dtypes=dtypes, quick=quick, progress=progress)[:1]


def test_a_layer_failure_exits_1_with_lowercase_verdicts_in_json(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(parity_run, "run_registry", _fake_rows)
    path = tmp_path / "report.json"

    code = main(["--no-kernels", "--device", "cpu", "--json", str(path)])

    out = capsys.readouterr().out
    assert code == 1
    assert "cpu     Layer                                    fail         2       1" in out
    assert (
        "layers: fail, 0 of 1 layers on cpu pass; 2 groups (case, dtype, backend) judged, 1 "
        "failing" in out
    )
    assert "layers on cpu: Layer/bad float32 math: dx (2, 5) fail: error 1.00e-03" in out
    layers = json.loads(path.read_text())["layers"]
    assert layers["verdict"] == "fail"
    assert [row["verdict"] for row in layers["rows"]] == ["pass", "fail"]
    assert all("passed" not in row for row in layers["rows"])
    assert layers["rows"][1]["shape"] == [2, 5]


def test_progress_goes_to_stderr_with_the_groups_done(capsys):
    main(["--kernel", SDPA, *QUICK_F32])

    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(f"{SDPA} on cpu (quick battery)")
    assert re.search(r"quick battery\): (\d+) of \1 groups, \d+s spent$", err[-1])


def test_calibration_reports_the_policy_tables(monkeypatch, capsys):
    # One correct target and one pitfall: the measurement itself is tested in test_calibration.
    sdpa = targets.Target("sdpa", F.scaled_dot_product_attention, ("bfloat16",))
    monkeypatch.setattr(calibration, "builtin_targets", lambda device, dtypes: [sdpa])
    monkeypatch.setattr(
        calibration,
        "all_pitfalls",
        lambda: {"rowsum": pitfalls.PITFALLS["backward_without_rowsum"]},
    )

    code = main(["--calibrate", "1", "--quick", "--dtype", "bfloat16", "--device", "cpu"])

    out = capsys.readouterr().out
    assert code == 0
    assert "| bfloat16 | dq |" in out and "| rowsum |" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--kernel", "no_colon_here"],
        ["--kernel", "parity_tests.no_such_module:f"],
        ["--kernel", "parity_tests.checker.pitfalls:no_such_function"],
        ["--kernel", "parity_tests.checker.pitfalls:PITFALLS"],
        ["--dtype", "float8"],
        ["--kernel", SDPA, "--spec", "xformers"],
        ["--kernel", SDPA, "--features", "causal,telepathy"],
        ["--kernel", SDPA, "--features", "lse"],
        ["--kernel", SDPA, "--case", "no-such-case"],
        ["--no-layers", "--case", "no-such-case"],
        ["--kernel", FLASH, "--spec", "flash", "--case", "causal-n<m"],
        ["--spec", "flash"],
        ["--forward-only"],
        ["--kernel", SDPA, "--world-size", "2"],
        ["--kernel", SDPA, "--spec", "ring", "--world-size", "0"],
        ["--kernel", SDPA, "--spec", "ring", "--world-size", "5"],
        ["--kernel", SDPA, "--isolate", "0"],
        ["--kernel", SDPA, "--isolate", "soon"],
        ["--kernel", SDPA, "--isolate", "--timeout", "-1"],
        ["--kernel", SDPA, "--timeout", "5"],  # a time limit needs a child to end
        ["--kernel", SDPA, "--isolate", "5", "--timeout", "5"],
        ["--kernel", SDPA, "--spec", "ring", "--isolate"],
        ["--kernel", SDPA, "--head-dims", "16,x"],
        ["--kernel", SDPA, "--head-dims", "16,0"],
        ["--kernel", SDPA, "--seqlen-multiple", "0"],
        ["--kernel", SDPA, "--seqlen-multiple", "100000"],  # cases past any calibrated length
        ["--kernel", SDPA, "--case", "plain", "--seqlen-multiple", "64"],  # the limits exclude it
        ["--kernel", SDPA, "--spec", "ring", "--seqlen-multiple", "16"],
        ["--kernel", SDPA, "--spec", "flash_mla", "--head-dims", "64"],
        ["--head-dims", "64"],
        ["--kernel", SDPA, "--fuzz", "0"],
        ["--kernel", SDPA, "--fuzz", "2", "--fuzz-case", "1"],
        ["--kernel", SDPA, "--fuzz", "2", "--quick"],
        ["--kernel", SDPA, "--fuzz-case", "-1"],
        ["--kernel", SDPA, "--spec", "ring", "--fuzz", "2"],
        ["--fuzz", "2"],
        ["--device", "tpu"],
        ["--seed", "one"],
        ["--seed", "-1"],
        ["--seed", str(2**64)],
        ["--calibrate", "0"],
        ["--calibrate", "1", "--kernel", SDPA],
        ["--calibrate", "1", "--json", "calibration.json"],
        ["--calibrate", "1", "--case", "plain"],
        ["--no-layers", "--no-kernels"],
        ["--kernel", SDPA, "--no-kernels"],
        ["--kernel", SDPA, "--json", "/no/such/directory/report.json"],
        ["--no-such-flag"],
        # options that the others would ignore
        ["--list-cases", "--json", "cases.json"],
        ["--list-cases", "--kernel", SDPA],
        ["--list-cases", "--dtype", "float32"],
        ["--list-cases", "--case", "plain", "--quick"],
        ["--list-cases", "--case", "no-such-case"],
        ["--calibrate", "1", "--stress"],
        ["--calibrate", "1", "--device", "cpu", "--device", "cpu"],
        ["--no-kernels", "--dtype", "float32"],
        ["--no-kernels", "--seed", "1"],
        ["--no-kernels", "--stress", "--case", "plain"],
        ["--kernel", SDPA, "--quick", "--case", "plain"],
        ["--spec", "sdpa"],
    ],
)
def test_bad_usage_exits_2_in_one_line_before_any_work(argv, monkeypatch, capsys):
    monkeypatch.setattr(parity_run, "run_registry", None)  # any work would crash, not exit 2
    monkeypatch.setattr("parity_tests.checker.targets.builtin.check_kernel", None)

    with pytest.raises(SystemExit) as exit_info:
        main(argv)

    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("python -m parity_tests: error: ") and "Traceback" not in line
    assert captured.out == ""


def test_a_kernel_that_is_not_callable_is_named_with_its_type(capsys):
    with pytest.raises(SystemExit):
        main(["--kernel", "parity_tests.checker.pitfalls:PITFALLS"])

    assert "--kernel 'parity_tests.checker.pitfalls:PITFALLS': PITFALLS is not callable (its " in (
        capsys.readouterr().err
    )


def test_a_json_path_that_is_a_directory_is_bad_usage(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--kernel", SDPA, *QUICK_F32, "--json", str(tmp_path)])

    assert exit_info.value.code == 2 and "cannot write there" in capsys.readouterr().err


def test_the_json_check_leaves_no_file_behind(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    monkeypatch.setattr("parity_tests.checker.targets.builtin.check_kernel", None)

    with pytest.raises(TypeError):  # the run itself, after the usage checks
        main(["--kernel", SDPA, *QUICK_F32, "--json", str(path)])

    assert not path.exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
        ("def f(:\n", "SyntaxError"),
        ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
    ],
    ids=["raises", "syntax-error", "sys-exit"],
)
def test_a_kernel_module_that_cannot_be_imported_is_bad_usage(
    source, message, tmp_path, monkeypatch, capsys
):
    name = f"kernel_{abs(hash(source))}"
    _module(tmp_path, monkeypatch, name, source)

    with pytest.raises(SystemExit) as exit_info:
        main(["--kernel", f"{name}:f", *QUICK_F32])

    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert message in err and "Traceback" not in err


def test_a_kernel_calling_sys_exit_gets_an_error_verdict(tmp_path, monkeypatch, capsys):
    _module(
        tmp_path,
        monkeypatch,
        "exits_kernel",
        "import sys\ndef f(*args, **kwargs):\n    sys.exit(0)\n",
    )

    code = main(["--kernel", "exits_kernel:f", *QUICK_F32])

    out = capsys.readouterr().out
    assert code == 1
    assert "SystemExit: 0" in out and "FAILED" in out


def test_ctrl_c_in_a_kernel_exits_130_keeping_the_groups_finished(tmp_path, monkeypatch, capsys):
    source = """
        import torch.nn.functional as F
        shapes = set()
        def f(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
            shapes.add(query.shape)
            if len(shapes) == 3:  # Ctrl-C in the third case: two finished, or more
                raise KeyboardInterrupt
            return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                  is_causal, scale=scale, enable_gqa=enable_gqa)
    """
    _module(tmp_path, monkeypatch, "interrupted_kernel", source)
    path = tmp_path / "report.json"

    code = main(["--kernel", "interrupted_kernel:f", *QUICK_F32, "--forward-only",
                 "--json", str(path)])  # fmt: skip

    report = json.loads(path.read_text())
    assert code == 130 and "interrupted" in capsys.readouterr().err
    assert report["state"] == "interrupted" and report["verdict"] is None
    statuses = [group["status"] for group in report["kernels"][0]["groups"]]
    assert len(statuses) >= 2 and set(statuses) == {"pass"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_bad_usage():
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "cuda"])

    assert exit_info.value.code == 2


def test_python_dash_m_runs_the_cli(tmp_path):
    path = tmp_path / "report.json"
    argv = ["--kernel", SDPA, *QUICK_F32, "--json", str(path)]

    result = subprocess.run(
        [sys.executable, "-m", "parity_tests", *argv], capture_output=True, text=True, timeout=300
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("OK")
    packages = json.loads(path.read_text())["environment"]["packages"]
    assert {"numpy", "torch"} <= set(packages) and "transformers" not in packages  # not run


# What pip writes for the ``parity-tests`` entry point of setup.cfg.
CONSOLE_SCRIPT = """\
import sys
from parity_tests.__main__ import main
if __name__ == "__main__":
    sys.exit(main())
"""


def _console_script(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    """Run the console script as pip installs it (its own directory first on sys.path), from a
    working directory that holds a kernel module of its own."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    work.mkdir()
    (bin_dir / "parity-tests").write_text(CONSOLE_SCRIPT)
    (work / "my_kernel.py").write_text(
        "import torch.nn.functional as F\nattention = F.scaled_dot_product_attention\n"
    )
    return subprocess.run(
        [sys.executable, str(bin_dir / "parity-tests"), *argv],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_console_script_finds_kernels_in_the_current_directory(tmp_path):
    result = _console_script(tmp_path, "--kernel", "my_kernel:attention", *QUICK_F32)

    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("OK")


def test_the_console_script_names_itself(tmp_path):
    result = _console_script(tmp_path, "--seed", "-1")

    assert result.returncode == 2
    assert result.stderr.startswith("parity-tests: error: argument --seed")


def test_list_cases_names_each_case_its_shape_and_needs(capsys):
    code = main(["--list-cases", "--spec", "flash"])

    out = capsys.readouterr().out
    assert code == 0 and out.startswith("default battery, flash spec")
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "alibi, causal" in lines["alibi-bh-causal"]
    assert "not in this spec" in lines["causal-n<m"] and "not in this spec" not in lines["softcap"]


def test_list_cases_lists_only_the_cases_named(capsys):
    code = main(["--list-cases", "--spec", "flash", "--case", "softcap", "--case", "causal-n<m"])

    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[0] == "named cases, flash spec: 2 cases"
    assert out[1].split() == ["case", "B", "H", "N", "M", "D", "Dv", "needs"]
    assert [line.split()[0] for line in out[2:]] == ["softcap", "causal-n<m"]
    assert "not in this spec" in out[3]


def test_version_names_the_project_and_its_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])

    assert exit_info.value.code == 0
    assert (
        capsys.readouterr().out
        == f"attention-parity {parity_tests.__version__}\n"
        == (VERSION + "\n")
    )


# torch made missing, as in a NumPy-only install: the import fails as Python fails it.
WITHOUT_TORCH = r"""
import runpy, sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Missing())
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    ("argv", "code"),
    [([], 2), (["--kernel", SDPA], 2), (["--list-cases"], 2), (["--version"], 0)],
)
def test_without_torch_the_cli_says_what_to_install_in_one_line(argv, code):
    result = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, "parity_tests", *argv],
                            capture_output=True, text=True, timeout=120)  # fmt: skip

    assert result.returncode == code, result.stderr
    if code == 2:
        assert result.stdout == ""
        assert result.stderr.splitlines() == [
            "python -m parity_tests: error: torch is not installed, and this command needs it: "
            'pip install ".[torch]"'
        ]
    else:
        assert result.stdout == f"attention-parity {parity_tests.__version__}\n"


@pytest.mark.parametrize("module", ["bench", "bench.distributed", "bench.triton"])
def test_without_torch_the_benchmarks_say_what_to_install_in_one_line(module):
    name = f"parity_tests.{module}"
    result = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, name],
                            capture_output=True, text=True, timeout=120)  # fmt: skip

    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"python -m {name}: error: torch is not installed, and this command needs it: "
        'pip install ".[torch]"'
    ]


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["--kernel", FLASH, "--spec", "flash", "--case", "window-causal", "--case", "alibi-h"], 0,
         ["flash spec", "window-causal", "alibi-h", "pass: 2 of 2"]),
        (["--kernel", "parity_tests.checker.pitfalls:alibi_sign", "--spec", "flash",
          "--case", "alibi-h"], 1, ["alibi-h float32", "FAILED"]),
        (["--kernel", "torch.nn.attention.flex_attention:flex_attention", "--spec", "flex",
          "--forward-only", "--case", "dead-rows-bool", "--case", "window-tl"], 0,
         ["flex spec", "pass: 2 of 2"]),
        (["--kernel", FLASH, "--spec", "flash", "--features", "causal,lse",
          "--case", "causal-br-n<m", "--case", "softcap"], 0,
         ["1 not run (features not declared)", "needs softcap"]),
        (["--kernel", SDPA, "--dtype", "float64", "--case", "gqa-2of4"], 0, ["float64 ", "OK"]),
    ],
    ids=["flash", "flash-pitfall", "flex-library-function", "features", "float64"],
)  # fmt: skip
def test_kernels_of_every_spec_from_the_command_line(argv, code, words, capsys):
    assert main([*argv, "--dtype", "float32", "--device", "cpu", "--verbose"]) == code

    out = capsys.readouterr().out
    assert all(word in out for word in words), out


def test_the_ring_spec_from_the_command_line(tmp_path):
    path = tmp_path / "ring.json"
    argv = ["--kernel", "torch_attention.distributed:ring_attention", "--spec", "ring",
            "--world-size", "2", "--case", "ring-causal-zigzag", "--dtype", "float32"]  # fmt: skip

    code = main([*argv, "--json", str(path)])

    report = json.loads(path.read_text())
    assert code == 0 and report["settings"]["spec"] == "ring"
    (check,) = report["kernels"]
    assert check["spec"] == "ring" and check["verdict"] == "pass"
    assert [row["tensor"] for row in check["groups"][0]["rows"]] == ["out", "dq", "dk", "dv"]


def test_an_isolated_kernel_that_crashes_gets_an_error_verdict(tmp_path, monkeypatch, capsys):
    source = (
        "import os, signal\ndef f(*args, **kwargs):\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    _module(tmp_path, monkeypatch, "crashing_kernel", source)

    code = main(["--kernel", "crashing_kernel:f", "--isolate", "60", "--case", "plain",
                 "--dtype", "float32"])  # fmt: skip

    out = capsys.readouterr().out
    assert code == 1 and "killed by signal SIGSEGV" in out


def test_a_reader_that_goes_away_stops_the_output_quietly():
    """``python -m parity_tests --list-cases | head -1``: the pipe closes before the output is
    written; the CLI stops with exit 1 and no traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "parity_tests", "--list-cases"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # nobody reads: the first write meets a closed pipe

    stderr = process.communicate(timeout=120)[1].decode()

    assert process.returncode == 2  # the report could not be written: not a failed check
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr


@pytest.mark.parametrize(
    ("environ", "setting"),
    [({}, ""), ({"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"},
                "TRITON_INTERPRET=1 OMP_NUM_THREADS=1 ")],
    ids=["bare", "interpreter"],
)  # fmt: skip
def test_a_failing_drawn_case_is_printed_with_the_command_that_reruns_it_alone(
    environ, setting, monkeypatch, capsys
):
    for name in ("TRITON_INTERPRET", "OMP_NUM_THREADS"):  # read once, at startup: harmless here
        monkeypatch.delenv(name, raising=False)
        if name in environ:
            monkeypatch.setenv(name, environ[name])

    code = main(["--kernel", BROKEN, "--fuzz", "2", "--dtype", "float32", "--seed", "1"])

    out = capsys.readouterr().out
    (rerun,) = [line for line in out.splitlines() if "--fuzz-case" in line]
    case, command = rerun.split(": ", 1)
    assert code == 1 and case.startswith("fuzz0-")
    assert command.startswith(f"{setting}python -m parity_tests --kernel")
    assert main(shlex.split(command)[3 + len(environ) :]) == 1
    again = capsys.readouterr().out
    assert f"{BROKEN} on cpu: {case} float32" in again and "fuzz1-" not in again


def test_isolate_imports_the_kernel_by_the_name_given_so_its_shims_hold(tmp_path, monkeypatch):
    """``shim:f`` re-exports ``real.f`` after patching ``real``; pickled, ``f`` would be imported
    from ``real`` alone (its ``__module__``), unpatched, and raise in the child."""
    _module(tmp_path, monkeypatch, "real_kernel", """
        import torch.nn.functional as F
        PATCHED = False
        def f(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
            if not PATCHED:
                raise RuntimeError("the shim was not imported")
            return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                  is_causal, scale=scale)
    """)  # fmt: skip
    _module(tmp_path, monkeypatch, "shim_kernel", """
        import real_kernel
        real_kernel.PATCHED = True
        f = real_kernel.f
    """)  # fmt: skip
    path = tmp_path / "report.json"

    code = main(["--kernel", "shim_kernel:f", "--isolate", "--timeout", "60", "--case", "plain",
                 "--dtype", "float32", "--json", str(path)])  # fmt: skip

    report = json.loads(path.read_text())
    assert code == 0 and report["settings"]["timeout"] == 60
    assert [group["status"] for group in report["kernels"][0]["groups"]] == ["pass"]


def test_limits_from_the_command_line_are_reported_with_what_they_excluded(tmp_path, capsys):
    path = tmp_path / "report.json"
    argv = ["--kernel", SDPA, "--quick", "--features", "causal", "--dtype", "float32"]

    code = main([*argv, "--seqlen-multiple", "64", "--head-dims", "32,64", "--json", str(path)])

    (check,) = json.loads(path.read_text())["kernels"]
    excluded = check["limits"]["excluded"]
    assert code == 0 and check["limits"]["declared"] == {"head_dims": [32, 64],
                                                         "seqlen_multiple": 64}  # fmt: skip
    assert check["coverage"]["outside_limits"] == len(excluded) > 0
    assert {"case", "why", "instead"} == set(excluded[0])
    assert "outside the kernel's limits" in check["summary"]


# A kernel that takes its time, so that a run can be stopped after a few groups.
SLOW_KERNEL = """
    import time

    import torch.nn.functional as F


    def f(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
        time.sleep(0.1)
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                              scale=scale, enable_gqa=enable_gqa)
"""


def _written(path) -> tuple[str, int]:
    """The state of the JSON at ``path`` so far and how many groups it holds ("", 0: none)."""
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        return "", 0
    kernels = report["kernels"]
    return report["state"], len(kernels[0]["groups"]) if kernels else 0


def test_a_run_stopped_by_a_timeout_keeps_every_group_it_finished(tmp_path):
    (tmp_path / "slow_kernel.py").write_text(textwrap.dedent(SLOW_KERNEL))
    path = tmp_path / "report.json"
    argv = ["--kernel", "slow_kernel:f", "--fuzz", "100", "--forward-only", "--dtype", "float32",
            "--json", str(path)]  # fmt: skip
    command = [sys.executable, "-m", "parity_tests", *argv]
    process = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                               stdout=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while _written(path)[1] < 2 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    running = _written(path)  # what a run killed outright (SIGKILL) leaves

    process.terminate()  # SIGTERM, as `timeout` sends it
    err = process.communicate(timeout=120)[1]

    report = json.loads(path.read_text())
    (check,) = report["kernels"]
    assert running[0] == "running" and running[1] >= 2
    assert process.returncode == 143 and report["state"] == "interrupted", err
    assert report["verdict"] is None and len(check["groups"]) >= running[1]
    assert check["finished"] is False and check["summary"].startswith("unfinished: ")
    assert {group["status"] for group in check["groups"]} == {"pass"}
    assert "Traceback" not in err
    assert err.splitlines()[-1].endswith(f"terminated; {path} keeps every group finished")


# A Triton kernel as far as the checker can tell: its module imports Triton (by name: a module
# called "triton" among its globals, so that the test runs without Triton installed too).
TRITON_LIKE_KERNEL = """
    import types

    import torch.nn.functional as F

    triton = types.ModuleType("triton")


    def f(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                              scale=scale)
"""


def test_bfloat16_under_tritons_interpreter_is_one_warning_and_skipped(tmp_path, monkeypatch,
                                                                       capsys):  # fmt: skip
    _module(tmp_path, monkeypatch, "triton_like_kernel", textwrap.dedent(TRITON_LIKE_KERNEL))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    path = tmp_path / "report.json"

    code = main(["--kernel", "triton_like_kernel:f", "--case", "plain", "--case", "causal-n<m",
                 "--dtype", "float32", "--dtype", "bfloat16", "--json", str(path)])  # fmt: skip

    err = capsys.readouterr().err
    (check,) = json.loads(path.read_text())["kernels"]
    skipped = [group for group in check["groups"] if group["dtype"] == "bfloat16"]
    warnings = [line for line in err.splitlines() if "bfloat16" in line]
    assert code == 0 and check["verdict"] == "pass" and check["coverage"]["skipped"] == 2
    assert warnings == ["python -m parity_tests: warning: Triton's interpreter mishandles "
                        "bfloat16 (docs/triton-on-cpu.md): bfloat16 skipped"]  # fmt: skip
    assert [group["status"] for group in skipped] == ["skip", "skip"]
    assert skipped[0]["note"] == "Triton's interpreter mishandles bfloat16 (docs/triton-on-cpu.md)"
