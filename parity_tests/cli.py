"""``python -m parity_tests`` (or the ``parity-tests`` script): the layer parity registry and the
kernel checker, as one report.

By default it runs, on CPU and on CUDA when present, the layer registry (NumPy vs torch, float64
and float32) and the built-in kernel targets (``parity_tests.checker.targets``) on the default
battery in float32, float16 and bfloat16. It prints one table per part, the failing rows again at
the end, and a verdict line.

``--kernel module:function`` checks a user's kernel instead (no layers, no built-in targets), called
as ``--spec`` says (sdpa, flash, flash_varlen, flex, ring; ``checker.specs``), with ``--features``
(comma-separated; the spec's default set otherwise), ``--forward-only``, ``--isolate [SECONDS]``
(each call in a child process) and ``--world-size`` (ring). ``--case NAME`` (repeatable) runs only
the named cases; ``--list-cases`` prints the cases of ``--spec``'s battery and exits.
``--stress`` adds the stress battery, whose results are findings, never part of the exit status.
``--calibrate SEEDS`` measures the tolerance policy over seeds (docs/kernel-verification.md).

Exit status: 0 when everything checked passed; 1 on a failure (a failing row, an expected failure
that passed, a kernel whose skips outnumber its passes); 2 on bad usage or nothing to check,
decided before any work (an unwritable ``--json``, a ``--kernel`` that cannot be imported, a seed
outside [0, 2**64), an unknown spec, feature or case, a case the spec cannot express); 130 when
interrupted. A run of the stress battery alone judges nothing: it prints its findings and exits 0
with "no verdict".

Tests: tests/parity/test_cli.py
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from .checker import specs
from .checker.battery import DEFAULT, RING, STRESS
from .checker.kernels import DEFAULT_DTYPES, DTYPES, battery_for, check_seed
from .checker.render import (
    SCHEMA_VERSION,
    check_entry,
    environment,
    failing_lines,
    jsonable,
    print_checks,
    row_dict,
)
from .checker.ring import check_world_size
from .checker.targets import Target, builtin_targets

PROG = "python -m parity_tests"
LAYER_DTYPES = ("float64", "float32")


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Entry point of ``python -m parity_tests``; ``prog`` names the program in its messages."""
    try:
        return _main(argv, prog)
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 1


def _main(argv: Sequence[str] | None, prog: str) -> int:
    parser = _parser(prog)
    args = parser.parse_args(argv)
    if args.list_cases:
        return _list_cases(parser, args)
    devices = _devices(parser, args.device)
    _check_parts(parser, args)
    _check_kernel_options(parser, args)
    if args.json:
        _check_writable(parser, args.json)
    dtypes = tuple(args.dtype or DEFAULT_DTYPES)
    kernels = [_load_kernel(parser, spec, dtypes, args) for spec in args.kernel or []]
    progress = _Progress(sys.stderr)
    try:
        if args.calibrate is not None:
            from .checker.calibration import calibrate

            battery = "quick" if args.quick else "default"
            return calibrate(args.calibrate, devices[0], dtypes, battery, progress, print)
        return _run(args, list(sys.argv[1:] if argv is None else argv), devices, kernels, progress)
    except KeyboardInterrupt:
        progress.done()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
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
        help="check this kernel (the signature of --spec) instead of the built-in targets; "
        "repeatable; skips the layer registry",
    )
    parser.add_argument(
        "--spec",
        choices=specs.SPECS,
        default="sdpa",
        help="how --kernel is called: the signature and layout of SDPA (default), flash-attn's "
        "flash_attn_func or flash_attn_varlen_func, FlexAttention, or ring_attention",
    )
    parser.add_argument(
        "--features",
        metavar="A,B,...",
        help=f"the options --kernel supports, comma-separated ({', '.join(specs.FEATURES)}); "
        "default: every option of the spec; cases needing others are not run",
    )
    parser.add_argument(
        "--forward-only",
        action="store_true",
        help="judge --kernel's output (and lse) only, with inputs that do not require grad",
    )
    parser.add_argument(
        "--isolate",
        nargs="?",
        const=True,
        type=_seconds,
        metavar="SECONDS",
        help="run each call of --kernel in a child process (a crash or a hang is an error "
        "verdict); SECONDS is the time limit per call",
    )
    parser.add_argument(
        "--world-size", type=int, metavar="W", help="ranks of the ring spec (default 2)"
    )
    parser.add_argument(
        "--case",
        action="append",
        metavar="NAME",
        help="run only this case (repeatable; --list-cases names them)",
    )
    parser.add_argument(
        "--list-cases",
        action="store_true",
        help="print the cases of --spec's battery (--quick, --stress: that battery) and exit",
    )
    parser.add_argument(
        "--dtype",
        action="append",
        choices=sorted(DTYPES),
        help="kernel dtypes (repeatable; default: float32, float16, bfloat16)",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write every row to PATH as JSON (checked first)"
    )
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
    parser.add_argument(
        "--seed", type=_seed, default=0, help="seed of the kernel battery, in [0, 2**64)"
    )
    parser.add_argument(
        "--calibrate",
        type=int,
        metavar="SEEDS",
        help="measure the tolerance policy over SEEDS seeds and exit",
    )
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from exc
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"a time limit must be > 0 seconds, got {text}")
    return value


def _seed(text: str) -> int:
    try:
        return check_seed(int(text))
    except (TypeError, ValueError) as exc:
        message = str(exc) if "2**64" in str(exc) else f"not an integer: {text!r}"
        raise argparse.ArgumentTypeError(message) from exc


def _devices(parser: argparse.ArgumentParser, asked: list[str] | None) -> list[str]:
    import torch

    devices = asked or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        try:
            parsed = torch.device(device)
        except RuntimeError as exc:
            parser.error(f"--device {device}: {exc}")
        if parsed.type == "cuda" and not torch.cuda.is_available():
            parser.error(f"--device {device}: CUDA is not available here")
        if parsed.type not in ("cpu", "cuda"):
            parser.error(f"--device {device}: only cpu and cuda are supported")
    return devices


def _check_parts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse combinations that would check nothing, or ignore an option silently."""
    if args.calibrate is not None:
        if args.calibrate < 1 or args.kernel:
            parser.error("--calibrate takes a number of seeds >= 1 and measures built-in targets")
        if args.json:
            parser.error("--calibrate prints Markdown tables; it writes no --json")
        if args.case:
            parser.error("--calibrate measures a whole battery (--quick or the default), no --case")
        return
    if args.no_kernels and not args.stress:
        if args.kernel:
            parser.error("nothing to check: --no-kernels with --kernel (add --stress for findings)")
        if args.no_layers:
            parser.error("nothing to check: --no-layers and --no-kernels")


def _check_kernel_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options of ``--kernel`` need one; features and cases must exist and fit the spec."""
    given = [
        name
        for name, value in (
            ("--spec", args.spec != "sdpa"),
            ("--features", args.features is not None),
            ("--forward-only", args.forward_only),
            ("--isolate", args.isolate is not None),
            ("--world-size", args.world_size is not None),
        )
        if value
    ]
    if given and not args.kernel:
        verb = "applies" if len(given) == 1 else "apply"
        parser.error(f"{', '.join(given)} {verb} to --kernel; the built-in targets have their own")
    if args.world_size is not None and args.spec != "ring":
        parser.error("--world-size is for --spec ring")
    if args.world_size is not None and args.world_size < 1:
        parser.error(f"--world-size must be >= 1, got {args.world_size}")
    try:
        args.feature_set = _features(args)
        if args.case:
            known = {case.name for case in DEFAULT + STRESS + RING}
            unknown = [name for name in args.case if name not in known]
            if unknown:
                raise ValueError(f"unknown case {unknown[0]!r}; --list-cases names them")
            if args.kernel:
                battery_for(args.spec, args.case)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    if args.kernel and args.spec == "ring":
        world = 2 if args.world_size is None else args.world_size
        try:
            check_world_size(battery_for("ring", args.case or None), world)
        except ValueError as exc:
            parser.error(f"--world-size {world}: {exc}")


def _features(args: argparse.Namespace) -> frozenset[str] | None:
    if args.features is None:
        return None
    names = [name.strip() for name in args.features.split(",") if name.strip()]
    return specs.resolve_features(args.spec, names)


def _list_cases(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print the cases of the spec's battery (for ``--features``, when given): name, shape,
    options it needs; then its coverage, computed from the cases: every pair of its factors'
    values, how many cases hold each value, the size requirements met; then the named cases,
    each with whether the spec can run it."""
    from .checker import battery as batteries
    from .checker import pairs

    name = "stress" if args.stress else "quick" if args.quick else "default"
    try:
        features = _features(args)
        cases = battery_for(args.spec, name, features)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    if args.spec == "ring" and name != "stress":
        name = "ring"
    width = max(20, *(len(case.name) for case in cases + batteries.NAMED))
    claimed = "" if features is None else f", features {','.join(sorted(features))}"
    print(f"{name} battery, {args.spec} spec{claimed}: {len(cases)} cases")
    print(f"{'case':{width}} {'B':>4} {'H':>4} {'N':>4} {'M':>4} {'D':>4} {'Dv':>4}  needs")
    for case in cases:
        _print_case(case, width, features, args.spec)
    if name != "stress":
        held = [case for case in cases if features is None or not case.needs - features]
        found = pairs.coverage(args.spec, held, features)
        met = batteries.size_coverage(args.spec, held, features)
        print(f"pair coverage: {found.required - len(found.missing)} of {found.required} pairs "
              f"of values of {len(found.counts)} factors meet in a case "
              f"({found.fraction:.0%}); cases holding each value:")  # fmt: skip
        for factor, counts in found.counts.items():
            print(f"  {factor}: " + ", ".join(f"{value} {count}" for value, count in
                                             counts.items()))  # fmt: skip
        for first, second in sorted(found.missing):
            print(f"  missing: {first[0]}={first[1]} with {second[0]}={second[1]}")
        if met:
            print(f"size requirements: {sum(met.values())} of {len(met)} met")
            for line in batteries.size_summary(args.spec, held, features):
                print(f"  {line}")
    print("named cases (not in the battery; run one with --case NAME):")
    for case in batteries.NAMED:
        _print_case(case, width, features, args.spec)
    return 0


def _print_case(case: Any, width: int, features: Any, spec: str) -> None:
    """One line of ``--list-cases``: name, shape, needs, and why the spec does not run it."""
    shape = " ".join(f"{value:>4}" for value in case.shape.values())
    needs = ", ".join(sorted(case.needs)) or "-"
    reason = specs.cannot_express(spec, case)
    note = f"  (not in this spec: {reason})" if reason else ""
    if not reason and features is not None and case.needs - features:
        note = "  (not run: needs features not declared)"
    print(f"{case.name:{width}} {shape}  {needs}{note}")


def _check_writable(parser: argparse.ArgumentParser, path: str) -> None:
    """Open ``path`` for appending now (and remove it again if it did not exist), so that a path
    that cannot be written fails before the run, not after it."""
    existed = os.path.lexists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        parser.error(f"--json {path}: cannot write there: {exc.strerror or exc}")
    if not existed:
        os.remove(path)


def _load_kernel(
    parser: argparse.ArgumentParser, spec: str, dtypes: tuple[str, ...], args: argparse.Namespace
) -> Target:
    """``module:function`` (dots allowed in both parts) as a target in ``dtypes``, called as the
    options say. Whatever the import raises (a syntax error, an exception, ``sys.exit``) is bad
    usage: its message, no traceback."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        parser.error(f"--kernel {spec!r}: expected MODULE:FUNCTION, e.g. mypkg.attn:my_sdpa")
    try:
        kernel: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            kernel = getattr(kernel, part)
    except (Exception, SystemExit) as exc:  # not KeyboardInterrupt: Ctrl-C stops the run
        parser.error(f"--kernel {spec!r}: {type(exc).__name__}: {exc}")
    if not callable(kernel):
        parser.error(f"--kernel {spec!r} is a {type(kernel).__name__}, not a function")
    return Target(
        spec,
        kernel,
        dtypes,
        spec=args.spec,
        features=args.feature_set,
        forward_only=args.forward_only,
        isolate=False if args.isolate is None else args.isolate,
        world_size=args.world_size,
    )


def _run(
    args: argparse.Namespace,
    argv: list[str],
    devices: list[str],
    kernels: list[Target],
    progress: _Progress,
) -> int:
    """Run the parts asked for, print the tables and the verdict, write the JSON."""
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": "parity_tests",
        "argv": argv,
        "environment": environment(devices),
        "settings": {
            "devices": devices,
            "dtypes": list(args.dtype or DEFAULT_DTYPES),
            "seed": args.seed,
            "quick": args.quick,
            "stress": args.stress,
            "cases": args.case,
            "spec": args.spec,
            "features": None if args.feature_set is None else sorted(args.feature_set),
            "forward_only": args.forward_only,
            "isolate": args.isolate,
        },
        "verdict": None,
        "layers": None,
        "kernels": None,
        "stress": None,
    }
    verdicts, failing = [], []
    battery: str | list[str] = args.case or ("quick" if args.quick else "default")
    if not args.no_layers and not kernels:
        rows = _run_layers(devices, args.quick, progress)
        layer_failures = _print_layers(rows)
        failing += layer_failures
        result["layers"] = {"verdict": "fail" if layer_failures else "pass", "rows": rows}
        verdicts.append(result["layers"]["verdict"])
    if not args.no_kernels:
        checks = _run_kernels(args, devices, kernels, battery, progress, judged=True)
        print_checks(checks, "kernels", print)
        failing += failing_lines(checks)
        result["kernels"] = checks
        verdicts += [check["verdict"] for check in checks]
    if args.stress:
        findings = _run_kernels(args, devices, kernels, "stress", progress, judged=False)
        print_checks(findings, "stress battery (findings, not part of the verdict)", print)
        result["stress"] = findings
    progress.done()
    if failing:
        print(f"== failing rows ({len(failing)}) ==")
        for line in failing:
            print(line)
    if verdicts:
        result["verdict"] = "pass" if all(v == "pass" for v in verdicts) else "fail"
    if result["verdict"] is None:
        print("\nno verdict: the stress battery's findings only, nothing judged")
    else:
        failed = f"{verdicts.count('fail')} of {len(verdicts)} parts failed"
        print("\nOK" if result["verdict"] == "pass" else f"\nFAILED ({failed})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(jsonable(result), stream, indent=1, allow_nan=False)
    return 1 if result["verdict"] == "fail" else 0


def _run_layers(devices: list[str], quick: bool, progress: _Progress) -> list[dict[str, Any]]:
    from .registry import run_registry

    rows = []
    for device in devices:
        progress.start(f"layer registry on {device}")
        for row in run_registry(
            device=device, dtypes=LAYER_DTYPES, quick=quick, progress=progress.update
        ):
            rows.append(row_dict(row))
    return rows


def _run_kernels(
    args: argparse.Namespace,
    devices: list[str],
    kernels: list[Target],
    battery: str | list[str],
    progress: _Progress,
    *,
    judged: bool,
) -> list[dict[str, Any]]:
    """One check per (device, target): the user's kernels, or every built-in target (those that
    run none of the cases asked for are left out)."""
    checks = []
    name = battery if isinstance(battery, str) else "cases"
    for device in devices:
        for target in kernels or builtin_targets(device, tuple(args.dtype or DEFAULT_DTYPES)):
            progress.start(f"{target.name} on {device} ({name} battery)")
            report = target.check(device, battery, args.seed, progress.update)
            if report is not None:
                checks.append(
                    check_entry(
                        report, target=target.name, battery=name, judged=judged, spec=target.spec
                    )
                )
    return checks


def _print_layers(rows: list[dict[str, Any]]) -> list[str]:
    """One line per (device, layer case, dtype, backend): its worst tensor. Returns one line
    per failing row, for the summary at the end."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["device"], row["case"], row["dtype"], row["backend"])
        groups.setdefault(key, []).append(row)
    print("== layers: NumPy vs torch (norm-wise relative error, bound) ==")
    print(
        f"{'device':7} {'case':44} {'dtype':8} {'backend':8} {'worst':18} "
        f"{'error':>9} {'bound':>9}  verdict"
    )
    failing = 0
    for (device, case, dtype, backend), members in groups.items():
        worst = max(members, key=lambda r: math.inf if not r["bound"] else r["error"] / r["bound"])
        verdict = "pass" if all(r["verdict"] == "pass" for r in members) else "fail"
        failing += verdict == "fail"
        print(
            f"{device:7} {case:44} {dtype:8} {backend:8} {worst['tensor']:18} "
            f"{worst['error']:9.2e} {worst['bound']:9.2e}  {verdict}"
        )
    print(f"layers: {len(groups)} groups, {failing} failing\n")
    return [
        f"layers on {row['device']}: {row['case']} {row['dtype']} {row['backend']}: "
        f"{row['tensor']} {tuple(row['shape'])} {row['verdict']}: error {row['error']:.2e}, "
        f"bound {row['bound']:.2e}"
        for row in rows
        if row["verdict"] != "pass"
    ]


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
