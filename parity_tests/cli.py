"""``python -m parity_tests`` (or the ``parity-tests`` script): the layer parity registry and the
kernel checker, as one report.

By default it runs, on CPU and on CUDA when present, the layer registry (NumPy vs torch, float64
and float32) and the built-in kernel targets (``checker.targets``) on the default battery in
float32, float16 and bfloat16. It prints a compact table per part: one line per layer
and per kernel target (its verdict, and its groups judged, failing, expected failures, skipped,
not run), each expected failure on one line with its reason; then every failing row, the totals
over the layers and over the kernel targets, and a verdict line. ``--verbose`` also prints every
group's row (each tensor's error / bound) and each exception's traceback, with what isolated
kernels' processes wrote; ``--json PATH`` writes all of it, whatever ``--verbose`` says.

``--kernel module:function`` checks a user's kernel instead (no layers, no built-in targets), called
as ``--spec`` says (sdpa, flash, flash_varlen, flex, ring; ``checker.specs``), with ``--features``
(comma-separated; the spec's default set otherwise), ``--forward-only``, ``--isolate [SECONDS]``
(each call in a child process) and ``--world-size`` (ring). ``--case NAME`` (repeatable) runs only
the named cases; ``--list-cases`` prints the cases of ``--spec``'s battery (with ``--case``, only
those) and exits. ``--stress`` adds the stress battery, whose results are findings, never part
of the exit status. ``--calibrate SEEDS`` measures the tolerance policy over seeds
(docs/kernel-verification.md). ``--version`` prints the project's version
(``parity_tests.__version__``).

Exit status, the same for every option: 0 when everything checked passed; 1 on a failure (a
failing row, an expected failure that passed, a kernel whose skips outnumber its passes, a
calibration whose constants do not hold); 2 on bad usage or an environment that cannot run the
checks, decided before any work, with one line on stderr: an unknown or misplaced option, an
option that the others would ignore, an unwritable ``--json``, a ``--kernel`` that cannot be
imported, a seed outside [0, 2**64), an unknown spec, feature or case, a case the spec cannot
express, nothing to check, a device that is not there, torch not installed (the line names what
to install); also 2 when the reader of the output goes away (``| head``), since the report could
not be written. 130 when interrupted (Ctrl-C), 143 when terminated (SIGTERM, as ``timeout``
sends it), as shells report them; either way the ``--json`` report keeps every group finished
and says the run was interrupted. A run of the stress battery alone judges nothing: it prints
its findings and exits 0 with "no verdict".

Long runs say where they are on stderr (``progress``): groups done of how many, the time spent
and the time left. A Triton kernel checked under Triton's interpreter (``TRITON_INTERPRET=1``)
skips bfloat16, which the interpreter mishandles, said in one line
(``checker.running.interpreter``).

Tests: tests/parity/test_cli.py
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from . import __version__, arguments
from .checker.specs import resolve_features

PROG = "python -m parity_tests"
INSTALL_TORCH = 'pip install ".[torch]"'
VERSION = f"attention-parity {__version__}"


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Entry point of ``python -m parity_tests``; ``prog`` names the program in its messages."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv), prog)
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 2


def _main(argv: list[str], prog: str) -> int:
    missing = _torch_missing()
    if missing is not None:  # nothing but --version works without torch
        if "--version" in argv:
            print(VERSION)
            return 0
        print(f"{prog}: error: {missing}", file=sys.stderr)
        return 2
    parser = arguments.parser_for(prog, VERSION)
    args = parser.parse_args(argv)
    if args.list_cases:
        return _list_cases(parser, args)
    devices = arguments.devices(parser, args.device)
    arguments.check_parts(parser, args)
    arguments.check_kernel_options(parser, args)
    if args.json:
        arguments.check_writable(parser, args.json)
    args.spec = args.spec or "sdpa"
    args.seed = 0 if args.seed is None else args.seed
    args.dtypes = tuple(args.dtype or arguments.pipeline().DEFAULT_DTYPES)
    kernels = [arguments.load_kernel(parser, spec, args.dtypes, args) for spec in args.kernel or []]
    from .checker.running.interpreter import InterpreterWarning
    from .progress import Progress

    skipped = arguments.interpreter_warning(kernels)
    if skipped:
        print(f"{prog}: warning: {skipped}", file=sys.stderr)
    progress = Progress(sys.stderr)
    kept = f"; {args.json} keeps every group finished" if args.json else ""
    try:
        with _terminated_as_interrupt(), warnings.catch_warnings():
            warnings.simplefilter("ignore", InterpreterWarning)  # said above, in one line
            return _run(args, argv, devices, kernels, progress, prog)
    except Terminated:
        progress.done()
        print(f"{prog}: terminated{kept}", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        progress.done()
        print(f"{prog}: interrupted{kept}", file=sys.stderr)
        return 130


def _run(
    args: argparse.Namespace,
    argv: list[str],
    devices: list[str],
    kernels: list[Any],
    progress: Any,
    prog: str,
) -> int:
    from . import job

    if args.calibrate is not None:
        from .checker.calibration.calibrate import calibrate

        battery = "quick" if args.quick else "default"
        specs = None if args.spec_list is None else tuple(args.spec_list)
        return calibrate(args.calibrate, devices[0], args.dtypes, battery, progress, print,
                         specs=specs, first_seed=args.seed)  # fmt: skip
    return job.run(args, argv, devices, kernels, progress, prog)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, as Ctrl-C's ``KeyboardInterrupt`` is: the checker lets
    both through a kernel's call (any other exception there is the kernel's error), and the
    run stops keeping what it measured."""


@contextmanager
def _terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` while the run goes on (a second one ends the process at
    once); the handler before is restored after. Only the main thread receives signals: in
    another (a caller's thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(number: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated

    before = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def exit_without_torch(prog: str) -> None:
    """Exit with status 2 and one line naming what to install when torch cannot be imported: the
    guard of the ``python -m parity_tests.bench*`` entry points, run before they import torch."""
    missing = _torch_missing()
    if missing is not None:
        print(f"{prog}: error: {missing}", file=sys.stderr)
        sys.exit(2)


def _torch_missing() -> str | None:
    """Why torch cannot be imported here (one line naming what to install), or None."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        if exc.name == "torch":
            return f"torch is not installed, and this command needs it: {INSTALL_TORCH}"
        return f"torch cannot be imported ({arguments.first_line(str(exc))}): {INSTALL_TORCH}"
    return None


def _list_cases(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print the cases of the spec's battery (for ``--features``, when given, within the
    limits), or the cases ``--case`` names, with their coverage (``checker.report.listing``).
    Only --spec, --features, --quick, --stress, --case and the limits apply."""
    from .checker.report.listing import list_cases

    allowed = {"--list-cases", "--spec", "--features", "--quick", "--stress", "--case",
               *arguments.LIMIT_OPTIONS}  # fmt: skip
    asked = arguments.given(args)
    arguments.refuse(parser, asked - allowed, "--list-cases prints the cases and exits")
    spec = arguments.spec_of(arguments.one_spec(parser, args))
    name = "stress" if args.stress else "quick" if args.quick else "default"
    try:
        features = arguments.features_of(spec.name, args.features)
        limits = arguments.limits_of(spec.name, args)
        claimed = resolve_features(spec, features)
        if args.case:
            arguments.refuse(parser, asked & {"--quick", "--stress"}, "--case names the cases")
            named = arguments.named_cases(args.case, spec.name, features)
            if limits is not None:
                arguments.pipeline().within_limits(spec, list(args.case), claimed, limits)
        else:
            cases, excluded = arguments.pipeline().within_limits(spec, name, claimed, limits)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    if args.case:
        list_cases(spec, named, f"named cases, {spec.name} spec", print, features=features,
                   coverage=False)  # fmt: skip
        return 0
    said = "" if features is None else f", features {','.join(sorted(features))}"
    said += "" if limits is None else f", limits {limits.declared}"
    list_cases(spec, cases, f"{name} battery, {spec.name} spec{said}", print, features=features,
               limits=limits, excluded=excluded, coverage=name != "stress")  # fmt: skip
    named = spec.named_cases()
    if named:
        title = "named cases (not in the battery; run one with --case NAME)"
        list_cases(spec, named, title, print, features=features, coverage=False)
    return 0
