"""The main job, ``python -m parity_tests``: the layer registry (``parity.report``) and the kernel
checks (the built-in targets, or the user's ``--kernel``, through ``checker``) run as one report:
the tables, every failing row with what the failing groups of each check have in common, the
command that reruns each failing drawn case (with the environment it needs), the totals and the
verdict; the JSON report, written as the groups finish (``checker.report.json_file``), so that
a run stopped keeps them. ``cli`` parses the command line and calls ``run``.

Tests: tests/parity/test_cli.py
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .progress import Progress

if TYPE_CHECKING:
    from .checker.report.json_file import JsonFile

# The environment variables that change how a kernel runs, carried by a rerun command: Triton's
# interpreter, and the CPU thread count (torch's CPU kernels split their work, and so their
# rounding, by it: docs/kernel-verification.md, "The fuzzer").
RERUN_ENVIRONMENT = ("TRITON_INTERPRET", "OMP_NUM_THREADS")


def run(
    args: argparse.Namespace,
    argv: list[str],
    devices: list[str],
    kernels: list[Any],
    progress: Progress,
    prog: str,
) -> int:
    """Run the parts asked for, print the tables (``--verbose``: every group too), the failing
    rows, the totals and the verdict; write the JSON as the run goes (interrupted: with every
    group finished, and saying so)."""
    from .checker.report import render
    from .checker.report.json_file import JsonFile

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
        "state": "running",
        "layers": None,
        "kernels": None,
        "stress": None,
    }
    file = JsonFile(args.json, result) if args.json else None
    try:
        code = _run(args, devices, kernels, progress, prog, result, file)
    except BaseException as exc:  # Ctrl-C, SIGTERM (cli), a bug: keep what was measured
        if file is not None and (isinstance(exc, KeyboardInterrupt) or file.written):
            file.write("interrupted")
        raise
    if file is not None:
        file.write("finished")
    return code


def _run(
    args: argparse.Namespace,
    devices: list[str],
    kernels: list[Any],
    progress: Progress,
    prog: str,
    result: dict[str, Any],
    file: JsonFile | None,
) -> int:
    """``run``'s parts, filling ``result`` in as they finish (``file`` writes it as it goes)."""
    from .checker.report import render
    from .parity import report as parity_report

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
        if file is not None:
            file.running("layers", None)
    if not args.no_kernels:
        result["kernels"] = checks
        run_kernels(args, devices, kernels, battery, progress, checks, file, judged=True)
        progress.done()
        if args.verbose:
            render.print_checks(checks, "kernels", print)
        render.print_summary(checks, "kernels: each target against the float64 golden", print)
        totals.append("kernels: " + render.total_line(checks))
        failing += render.failing_lines(checks)
        verdicts += [check["verdict"] for check in checks]
    if args.stress:
        result["stress"] = findings
        run_kernels(args, devices, kernels, "stress", progress, findings, file, judged=False)
        progress.done()
        title = "stress battery (findings, not part of the verdict)"
        if args.verbose:
            render.print_checks(findings, title, print)
        render.print_summary(findings, title, print)
        totals.append("stress battery: " + render.total_line(findings))
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
    return 1 if result["verdict"] == "fail" else 0


def rerun_commands(
    prog: str,
    args: argparse.Namespace,
    checks: list[dict[str, Any]],
    environ: Mapping[str, str] = os.environ,
) -> list[str]:
    """For each drawn case that failed, the one command that reruns it alone (its target,
    device and failing dtypes, the same options and seed, ``--fuzz-case``), after the
    variables of ``RERUN_ENVIRONMENT`` set in ``environ`` (``TRITON_INTERPRET=1 python -m
    parity_tests ...``)."""
    if not args.drawn:
        return []
    from .checker.report.rows import FAILED_GROUPS

    setting = [f"{name}={shlex.quote(environ[name])} " for name in RERUN_ENVIRONMENT
               if environ.get(name)]  # fmt: skip
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
            command = f"{prog} {shlex.join(options)} --fuzz-case {index[case]}"
            lines.append(f"{case}: {''.join(setting)}{command}")
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
    options += [f"--{name.replace('_', '-')}" for name in ("equal_lengths", "contiguous_only",
                "nondeterministic") if name in declared]  # fmt: skip
    options += ["--device", device]
    for dtype in dtypes:
        options += ["--dtype", dtype]
    return options + ["--seed", str(args.seed)]


def run_kernels(
    args: argparse.Namespace,
    devices: list[str],
    kernels: list[Any],
    battery: str | list[str] | tuple[Any, ...],
    progress: Progress,
    checks: list[dict[str, Any]],
    file: JsonFile | None,
    *,
    judged: bool,
) -> None:
    """One check per (device, target), added to ``checks`` as it finishes: the user's kernels,
    or every built-in target (those that run none of the cases asked for are left out). While
    a check runs, ``progress`` counts its groups and ``file`` (a ``JsonFile``, or None) gets
    the groups finished."""
    from .checker.report.render import check_entry
    from .checker.targets.builtin import builtin_targets

    name = battery if isinstance(battery, str) else "fuzz" if args.drawn else "cases"
    key = "kernels" if judged else "stress"
    dtypes = tuple(args.dtypes)
    for device in devices:
        for target in kernels or builtin_targets(device, dtypes):
            progress.start(f"{target.name} on {device} ({name} battery)")

            def entry(report: Any, target: Any = target) -> dict[str, Any]:
                return check_entry(
                    report, target=target.name, battery=name, judged=judged, spec=target.spec
                )

            watch = GroupProgress(progress, file, key, entry)
            report = target.check(device, battery, args.seed, watch)
            if report is not None:
                checks.append(entry(report))
            if file is not None:
                file.running(key, None)


class GroupProgress:
    """The progress of one check, as ``check_kernel`` calls it: each message goes to the
    display; after each group judged, its count does, and the check so far to the JSON file
    (``entry`` renders it)."""

    def __init__(
        self,
        progress: Progress,
        file: JsonFile | None,
        key: str,
        entry: Callable[[Any], dict[str, Any]],
    ) -> None:
        self.progress, self.file, self.key, self.entry = progress, file, key, entry

    def __call__(self, message: str) -> None:
        self.progress.update(message)

    def group_done(self, report: Any, done: int, total: int) -> None:
        from .checker.report.json_file import unfinished

        self.progress.advance(done, total)
        if self.file is not None:
            self.file.running(self.key, lambda: unfinished(self.entry(report), total))
