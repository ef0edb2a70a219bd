"""parity_tests/parity/report.py, the layer part of ``python -m parity_tests``, on hand-made rows:
the registry run as the JSON report's rows, a group per (device, case, dtype, backend), a layer
failing when one of its groups fails, and a line per failing row. The whole command is tested in
tests/parity/test_cli.py."""

from __future__ import annotations

import math

from parity_tests.parity import report, run
from parity_tests.parity.run import ParityRow


def _row(case: str, tensor: str, error: float, dtype: str = "float64") -> dict:
    bound = 1e-10 if dtype == "float64" else 2e-5
    verdict = "pass" if error <= bound else "fail"
    layer = case.split("/")[0]
    return {"case": case, "layer": layer, "dtype": dtype, "device": "cpu", "backend": "math",
            "tensor": tensor, "error": error, "bound": bound, "verdict": verdict,
            "shape": [2, 5]}  # fmt: skip


ROWS = [
    _row("Good/N5", "out", 1e-16),
    _row("Good/N5", "dx", 5e-11),
    _row("Bad/N5", "out", 1e-16),
    _row("Bad/N5", "dx", 1e-3, dtype="float32"),
    _row("Bad/N7", "out", 1e-12),
]


def test_run_layers_gives_the_rows_of_each_device_as_dicts(monkeypatch):
    def fake_registry(*, device, dtypes, quick, progress):
        progress(f"{device} {dtypes} {quick}")
        return [ParityRow("A/N5", "A", "float64", device, "math", "out", 0.0, 1e-10, True, (5,))]

    class Progress:
        def __init__(self):
            self.lines = []

        def start(self, message):
            self.lines.append(message)

        update = start

    progress = Progress()
    monkeypatch.setattr(run, "run_registry", fake_registry)

    rows = report.run_layers(["cpu", "meta"], True, progress)

    assert [(row["device"], row["verdict"], row["shape"]) for row in rows] == [
        ("cpu", "pass", (5,)),
        ("meta", "pass", (5,)),
    ]
    assert progress.lines == [
        "layer registry on cpu",
        "cpu ('float64', 'float32') True",
        "layer registry on meta",
        "meta ('float64', 'float32') True",
    ]


def test_a_group_is_a_case_in_a_dtype_on_a_backend():
    groups = report.layer_groups(ROWS)

    assert list(groups) == [
        ("cpu", "Good/N5", "float64", "math"),
        ("cpu", "Bad/N5", "float64", "math"),
        ("cpu", "Bad/N5", "float32", "math"),
        ("cpu", "Bad/N7", "float64", "math"),
    ]
    assert report.ratio(ROWS[1]) == 0.5 and report.ratio(ROWS[1] | {"bound": 0.0}) == math.inf


def test_the_summary_fails_a_layer_by_its_groups(capsys):
    total = report.print_layer_summary(ROWS)

    lines = capsys.readouterr().out.splitlines()
    good = next(line for line in lines if line.startswith("cpu     Good"))
    bad = next(line for line in lines if line.startswith("cpu     Bad"))
    assert good.split()[2:5] == ["pass", "1", "0"]  # verdict, groups judged, flagged
    assert bad.split()[2:5] == ["fail", "3", "1"]
    assert bad.endswith("50")  # its worst error / bound: 1e-3 / 2e-5
    assert total == (
        "fail, 1 of 2 layers on cpu pass; 4 groups (case, dtype, backend) judged, 1 failing"
    )


def test_verbose_prints_each_group_by_its_worst_tensor(capsys):
    report.print_layers(ROWS)

    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1::4] for line in lines[2:-1]] == [
        ["Good/N5", "5.00e-11"],
        ["Bad/N5", "1.00e-16"],
        ["Bad/N5", "1.00e-03"],
        ["Bad/N7", "1.00e-12"],
    ]


def test_each_failing_row_is_one_line():
    assert report.layer_failures(ROWS) == [
        "layers on cpu: Bad/N5 float32 math: dx (2, 5) fail: error 1.00e-03, bound 2.00e-05"
    ]
