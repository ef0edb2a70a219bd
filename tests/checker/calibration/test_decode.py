"""The decode specs' calibration command: calibration restricted to their targets and pitfalls,
with the caches and lse in its tables, and refusing a seed count below 1."""

from __future__ import annotations

import pytest

from parity_tests.checker.calibration import calibrate as calibration
from parity_tests.checker.calibration import decode as decode_calibration
from parity_tests.checker.pitfalls.flash_kvcache import PITFALLS as DECODE_PITFALLS
from parity_tests.checker.specs import get
from parity_tests.checker.targets import decode as decode_kernels
from parity_tests.checker.targets.builtin import Target


def test_it_measures_the_decode_targets_and_pitfalls_alone(monkeypatch, capsys):
    twin = Target("twin", decode_kernels.flash_attn_with_kvcache, ("float32",), "flash_kvcache",
                  cases=(get("flash_kvcache").default_battery()[0].name,))  # fmt: skip
    sdpa = Target("sdpa", lambda *args, **kwargs: None, ("float32",))  # never run: another spec
    monkeypatch.setattr(calibration, "builtin_targets", lambda device, dtypes: [twin, sdpa])
    monkeypatch.setattr(
        calibration, "all_pitfalls", lambda: {"no_append": DECODE_PITFALLS["no_append"]}
    )

    code = decode_calibration.main(["1", "--dtype", "float32"])

    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert any(line.startswith("| float32 | k_cache |") for line in lines)
    assert any(line.startswith("| float32 | lse |") for line in lines)
    assert not any(line.startswith("| float32 | dq |") for line in lines)  # not measured
    assert any(line.startswith("| no_append |") for line in lines)


def test_a_seed_count_below_one_is_refused():
    with pytest.raises(SystemExit):
        decode_calibration.main(["0"])
