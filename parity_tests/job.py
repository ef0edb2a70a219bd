"""The main job, ``python -m parity_tests``: the layer registry (``parity.report``) and the kernel
checks (the built-in targets, or the user's ``--kernel``, through ``checker``) run as one report:
the tables, every failing row, the command that reruns each failing drawn case, the totals and
the verdict; the JSON report. ``cli`` parses the command line and calls ``run``.

Tests: tests/parity/test_cli.py
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from typing import Any


def run(
    args: argparse.Namespace,
    argv: list[str],
    devices: list[str],
    kernels: list[Any],
    progress: Progress,
    prog: str,
) -> int:
    """Run the parts asked for, print the tables (``--verbose``: every group too), the failing
    rows, the totals and the verdict; write the JSON."""
    from .checker.report import render
    from .parity import report as parity_report

    result: dict[str, Any] = {
        "schema_version": render.SCHEMA_VERSION,
        "tool": "parity_tests",
        "project": render.project(),
        "argv": argv,
        "environment": render.environment(devices),
        "settings": {
            "devices": devices,
            "dtypes": list(args.dtypes),
            "seed": args.seed,
            "quick": args.quick,
            "stress": args.stress,
            "cases": args.case,
            "spec": args.spec,
            "features": None if args.feature_set is None else sorted(args.feature_set),
            "forward_only": args.forward_only,
            "isolate": args.isolate,
            "timeout": args.timeout,
            "limits": None if args.limits is None else args.limits.declared,
            "fuzz": args.fuzz,
            "fuzz_case": args.fuzz_case,
        },
        "verdict": None,
        "layers": None,
        "kernels": None,
        "stress": None,
    }
    verdicts, failing, totals = [], [], []
    checks: list[dict[str, Any]] = []
    findings: list[dict[str, Any]] = []
    battery: str | list[str] | tuple = args.case or ("quick" if args.quick else "default")
    if args.drawn is not None:
        battery = args.drawn
    if not args.no_layers and not kernels:
        rows = parity_report.run_layers(devices, args.quick, progress)
        progress.done()
        if args.verbose:
            parity_report.print_layers(rows)
        layer_failures = parity_report.layer_failures(rows)
        totals.append("layers: " + parity_report.print_layer_summary(rows))
        failing += layer_failures
        result["layers"] = {"verdict": "fail" if layer_failures else "pass", "rows": rows}
        verdicts.append(result["layers"]["verdict"])
    if not args.no_kernels:
        checks = run_kernels(args, devices, kernels, battery, progress, judged=True)
        progress.done()
        if args.verbose:
            render.print_checks(checks, "kernels: error / bound per tensor (above 1 fails)", print)
        render.print_summary(checks, "kernels: each target against the float64 golden", print)
        totals.append("kernels: " + render.total_line(checks))
        failing += render.failing_lines(checks)
        result["kernels"] = checks
        verdicts += [check["verdict"] for check in checks]
    if args.stress:
        findings = run_kernels(args, devices, kernels, "stress", progress, judged=False)
        progress.done()
        title = "stress battery (findings, not part of the verdict)"
        if args.verbose:
            render.print_checks(findings, f"{title}: error / bound per tensor", print)
        render.print_summary(findings, title, print)
        totals.append("stress battery: " + render.total_line(findings))
        result["stress"] = findings
    if failing:
        print(f"== failing rows ({len(failing)}) ==")
        for line in failing:
            print(line)
        print()
    reruns = rerun_commands(prog, args, checks)
    if reruns:
        print(f"== each failing drawn case, rerun alone ({len(reruns)}) ==")
        for line in reruns:
            print(line)
        print()
    errors = sum(len(check["errors"]) for check in checks + findings)
    if errors and not args.verbose:
        print(
            f"{errors} distinct exceptions or crashes of kernels, expected failures' included: "
            "tracebacks and output with --verbose, or in the JSON report (--json)"
        )
    print("== totals ==")
    for line in totals:
        print(line)
    if verdicts:
        result["verdict"] = "pass" if all(v == "pass" for v in verdicts) else "fail"
    if result["verdict"] is None:
        print("\nno verdict: the stress battery's findings only, nothing judged")
    else:
        failed = f"{verdicts.count('fail')} of {len(verdicts)} parts failed"
        print("\nOK" if result["verdict"] == "pass" else f"\nFAILED ({failed})")
    if args.json:
        result["environment"]["packages"] = render.packages()
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(render.jsonable(result), stream, indent=1, allow_nan=False)
    return 1 if result["verdict"] == "fail" else 0


def rerun_commands(prog: str, args: argparse.Namespace, checks: list[dict[str, Any]]) -> list[str]:
    """For each drawn case that failed, the one command that reruns it alone (its target,
    device and failing dtypes, the same options and seed, ``--fuzz-case``)."""
    if not args.drawn:
        return []
    from .checker.report.rows import FAILED_GROUPS

    index = {case.name: i for i, case in enumerate(args.drawn)}
    if args.fuzz_case is not None:
        index = dict.fromkeys(index, args.fuzz_case)
    lines = []
    for check in checks:
        failed: dict[str, list[str]] = {}
        for group in check["groups"]:
            if group["status"] in FAILED_GROUPS:
                failed.setdefault(group["case"], []).append(group["dtype"])
        for case, dtypes in failed.items():
            options = rerun_options(args, check["target"], check["device"], dtypes)
            lines.append(f"{case}: {prog} {shlex.join(options)} --fuzz-case {index[case]}")
    return lines


def rerun_options(
    args: argparse.Namespace, target: str, device: str, dtypes: list[str]
) -> list[str]:
    """The options that made ``target``'s check, on ``device`` in ``dtypes`` only."""
    options = ["--kernel", target, "--spec", args.spec]
    if args.features is not None:
        options += ["--features", args.features]
    if args.forward_only:
        options.append("--forward-only")
    if args.isolate is not None:
        options += ["--isolate"] + ([] if args.isolate is True else [f"{args.isolate:g}"])
    if args.timeout is not None:
        options += ["--timeout", f"{args.timeout:g}"]
    declared = {} if args.limits is None else args.limits.declared
    if "head_dims" in declared:
        options += ["--head-dims", ",".join(map(str, declared["head_dims"]))]
    if "seqlen_multiple" in declared:
        options += ["--seqlen-multiple", str(declared["seqlen_multiple"])]
    options += [f"--{name.replace('_', '-')}" for name in ("equal_lengths", "contiguous_only")
                if name in declared]  # fmt: skip
    options += ["--device", device]
    for dtype in dtypes:
        options += ["--dtype", dtype]
    return options + ["--seed", str(args.seed)]


def run_kernels(
    args: argparse.Namespace,
    devices: list[str],
    kernels: list[Any],
    battery: str | list[str],
    progress: Progress,
    *,
    judged: bool,
) -> list[dict[str, Any]]:
    """One check per (device, target): the user's kernels, or every built-in target (those that
    run none of the cases asked for are left out)."""
    from .checker.report.render import check_entry
    from .checker.targets.builtin import builtin_targets

    checks = []
    name = battery if isinstance(battery, str) else "fuzz" if args.drawn else "cases"
    dtypes = tuple(args.dtypes)
    for device in devices:
        for target in kernels or builtin_targets(device, dtypes):
            progress.start(f"{target.name} on {device} ({name} battery)")
            report = target.check(device, battery, args.seed, progress.update)
            if report is not None:
                checks.append(
                    check_entry(
                        report, target=target.name, battery=name, judged=judged, spec=target.spec
                    )
                )
    return checks


class Progress:
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
