"""``python -m parity_tests``: the layer parity registry and the kernel checker, as one report.

By default it runs, on CPU and on CUDA when present, the layer registry (NumPy vs torch, float64
and float32) and the built-in kernel targets (``parity_tests.targets``) on the default battery in
float32, float16 and bfloat16. It prints one table per part and a summary line, and exits 0 when
everything expected to pass passes, 1 otherwise, 2 on bad usage.

``--kernel module:function`` checks a user's kernel instead (no layers, no built-in targets).
``--stress`` adds the stress battery, whose results are findings, never part of the exit status.
``--calibrate SEEDS`` measures the tolerance policy over seeds (docs/kernel-verification.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from .checker.kernels import DTYPES, check_kernel
from .checker.targets import Target, builtin_targets, expected_failure

LAYER_DTYPES = ("float64", "float32")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m parity_tests`` and the ``parity-tests`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    import torch

    devices = args.device or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        _check_device(parser, device)
    dtypes = tuple(args.dtype or DTYPES)
    kernels = [_load_kernel(parser, spec, dtypes) for spec in args.kernel or []]
    progress = _Progress(sys.stderr)

    if args.calibrate is not None:
        if args.calibrate < 1 or kernels:
            parser.error("--calibrate takes a number of seeds >= 1 and measures built-in targets")
        from .checker.calibration import calibrate

        battery = "quick" if args.quick else "default"
        return calibrate(args.calibrate, devices[0], dtypes, battery, progress, print)

    result: dict[str, Any] = {"devices": devices, "dtypes": dtypes, "seed": args.seed}
    failures = 0
    if not args.no_layers and not kernels:
        rows = _run_layers(devices, args.quick, progress)
        failures += _print_layers(rows)
        result["layers"] = rows
    battery = "quick" if args.quick else "default"
    if not args.no_kernels:
        checks = []
        for device in devices:
            targets = kernels or builtin_targets(device, dtypes)
            checks += _run_kernels(targets, device, battery, args.seed, progress)
        failures += _print_kernels(checks, "kernels", judged=True)
        result["kernels"] = checks
    if args.stress:
        findings = [
            check
            for device in devices
            for check in _run_kernels(
                kernels or builtin_targets(device, dtypes), device, "stress", args.seed, progress
            )
        ]
        _print_kernels(findings, "stress battery (findings, not part of the verdict)", judged=False)
        result["stress"] = findings
    progress.done()
    verdict = "OK" if failures == 0 else f"FAILED ({failures} failing groups)"
    print(f"\n{verdict}")
    result["passed"] = failures == 0
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(_jsonable(result), stream, indent=1)
    return 0 if failures == 0 else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m parity_tests",
        description="NumPy vs torch layer parity and attention kernel checks.",
    )
    parser.add_argument(
        "--device",
        action="append",
        help="cpu, cuda, cuda:1 ... (repeatable; default: cpu, and cuda when present)",
    )
    parser.add_argument(
        "--kernel",
        action="append",
        metavar="MODULE:FUNCTION",
        help="check this kernel (SDPA signature) instead of the built-in targets; "
        "repeatable; skips the layer registry",
    )
    parser.add_argument(
        "--dtype",
        action="append",
        choices=sorted(DTYPES),
        help="kernel dtypes (repeatable; default: all three)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every row to PATH as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="the quick kernel battery and the quick layer registry"
    )
    parser.add_argument(
        "--stress", action="store_true", help="also run the stress battery and report its findings"
    )
    parser.add_argument("--no-layers", action="store_true", help="skip the layer registry")
    parser.add_argument(
        "--no-kernels", action="store_true", help="skip the kernel checks of the default battery"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the kernel battery")
    parser.add_argument(
        "--calibrate",
        type=int,
        metavar="SEEDS",
        help="measure the tolerance policy over SEEDS seeds and exit",
    )
    return parser


def _check_device(parser: argparse.ArgumentParser, device: str) -> None:
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError as exc:
        parser.error(f"--device {device}: {exc}")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {device}: CUDA is not available here")
    if parsed.type not in ("cpu", "cuda"):
        parser.error(f"--device {device}: only cpu and cuda are supported")


def _load_kernel(parser: argparse.ArgumentParser, spec: str, dtypes: tuple[str, ...]) -> Target:
    """``module:function`` (dots allowed in both parts) as a target in ``dtypes``."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        parser.error(f"--kernel {spec!r}: expected MODULE:FUNCTION, e.g. mypkg.attn:my_sdpa")
    try:
        kernel: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            kernel = getattr(kernel, part)
    except (ImportError, AttributeError) as exc:
        parser.error(f"--kernel {spec!r}: {exc}")
    if not callable(kernel):
        parser.error(f"--kernel {spec!r} is a {type(kernel).__name__}, not a function")
    return Target(spec, kernel, dtypes)


def _run_layers(devices: list[str], quick: bool, progress: _Progress) -> list[dict[str, Any]]:
    from .registry import run_registry

    rows = []
    for device in devices:
        progress.start(f"layer registry on {device}")
        for row in run_registry(
            device=device, dtypes=LAYER_DTYPES, quick=quick, progress=progress.update
        ):
            rows.append(vars(row).copy())
    return rows


def _run_kernels(
    targets: list[Target], device: str, battery: str, seed: int, progress: _Progress
) -> list[dict[str, Any]]:
    """One entry per target: its rows, grouped by (case, dtype), with the group's status."""
    checks = []
    for target in targets:
        progress.start(f"{target.name} on {device} ({battery} battery)")
        report = check_kernel(
            target.kernel,
            device=device,
            dtypes=target.dtypes,
            cases=battery,
            seed=seed,
            progress=progress.update,
        )
        groups: dict[tuple[str, str], list[Any]] = {}
        for row in report.rows:
            groups.setdefault((row.case, row.dtype), []).append(row)
        entries = []
        for (case, dtype), rows in groups.items():
            status, note = _status(target.name, case, dtype, device, rows, battery == "stress")
            entries.append(
                {
                    "case": case,
                    "dtype": dtype,
                    "status": status,
                    "note": note,
                    "rows": [vars(row).copy() for row in rows],
                }
            )
        checks.append(
            {"target": target.name, "device": device, "battery": battery, "groups": entries}
        )
    return checks


def _status(target, case, dtype, device, rows, stress: bool) -> tuple[str, str]:
    """pass / FAIL / SKIP, or XFAIL / XPASS against the expected-failure list."""
    failed = [row for row in rows if row.failed]
    if rows[0].verdict == "skip":
        return "SKIP", rows[0].detail
    expected = None if stress else expected_failure(target, case, dtype, device)
    if expected is not None:
        return (
            ("XFAIL", expected.reason)
            if failed
            else ("XPASS", "expected to fail: " + expected.reason)
        )
    if not failed:
        return "pass", ""
    notes = ", ".join(
        f"{row.tensor} {row.verdict}" + (f": {row.detail}" if row.detail else "") for row in failed
    )
    return "FAIL", notes


def _print_layers(rows: list[dict[str, Any]]) -> int:
    """One line per (device, layer case, dtype, backend): its worst tensor. Returns failures."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["device"], row["case"], row["dtype"], row["backend"])
        groups.setdefault(key, []).append(row)
    print("== layers: NumPy vs torch (norm-wise relative error, bound) ==")
    print(
        f"{'device':7} {'case':44} {'dtype':8} {'backend':8} {'worst':18} "
        f"{'error':>9} {'bound':>9}  verdict"
    )
    failures = 0
    for (device, case, dtype, backend), members in groups.items():
        worst = max(members, key=lambda r: math.inf if not r["bound"] else r["error"] / r["bound"])
        passed = all(r["passed"] for r in members)
        failures += not passed
        print(
            f"{device:7} {case:44} {dtype:8} {backend:8} {worst['tensor']:18} "
            f"{worst['error']:9.2e} {worst['bound']:9.2e}  {'pass' if passed else 'FAIL'}"
        )
    print(f"layers: {len(groups)} groups, {failures} failing\n")
    return failures


def _print_kernels(checks: list[dict[str, Any]], title: str, *, judged: bool) -> int:
    """The kernel table: error/bound of out, dq, dk, dv per (case, dtype). Returns failures."""
    print(f"== {title}: max|K - G| / bound per tensor ==")
    failures = 0
    for check in checks:
        print(f"-- {check['target']} on {check['device']} --")
        print(
            f"{'case':18} {'dtype':9}"
            + "".join(f" {t:>19}" for t in ("out", "dq", "dk", "dv"))
            + "  verdict"
        )
        counts: dict[str, int] = {}
        reasons: dict[str, None] = {}  # the notes of XFAIL, XPASS and SKIP, once each
        for group in check["groups"]:
            status, note = group["status"], group["note"]
            counts[status] = counts.get(status, 0) + 1
            cells = {row["tensor"]: _cell(row) for row in group["rows"]}
            line = f"{group['case']:18} {group['dtype']:9}" + "".join(
                f" {cells.get(t, '-'):>19}" for t in ("out", "dq", "dk", "dv")
            )
            if status in ("XFAIL", "XPASS", "SKIP"):
                reasons[f"{status} {group['case']}: {note}"] = None
                note = ""
            print(f"{line}  {status}" + (f" ({note})" if note else ""))
        failures += counts.get("FAIL", 0) + counts.get("XPASS", 0) if judged else 0
        print("   " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        for reason in reasons:
            print(f"   {reason}")
    print(f"{title}: {len(checks)} targets, {failures} failing groups\n" if judged else "")
    return failures


def _cell(row: dict[str, Any]) -> str:
    if row["verdict"] == "nonfinite":
        return f"NaN/inf / {row['bound']:.1e}"
    return f"{row['error']:.1e} / {row['bound']:.1e}"


def _jsonable(value: Any) -> Any:
    """Plain JSON: non-finite floats as the strings "inf", "-inf", "nan"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


class _Progress:
    """A one-line progress display on a terminal; one line per part elsewhere."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.tty = stream, stream.isatty()
        self.started = time.monotonic()

    def start(self, message: str) -> None:
        if not self.tty:
            print(f"[{time.monotonic() - self.started:6.1f}s] {message}", file=self.stream)
        self.update(message)

    def update(self, message: str) -> None:
        if self.tty:
            elapsed = time.monotonic() - self.started
            print(f"\r\033[K[{elapsed:6.1f}s] {message}"[:120], end="", file=self.stream)

    def done(self) -> None:
        if self.tty:
            print("\r\033[K", end="", file=self.stream)
