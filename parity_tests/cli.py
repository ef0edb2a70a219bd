"""``python -m parity_tests`` (or the ``parity-tests`` script): the layer parity registry and the
kernel checker, as one report.

By default it runs, on CPU and on CUDA when present, the layer registry (NumPy vs torch, float64
and float32) and the built-in kernel targets (``parity_tests.checker.targets``) on the default
battery in float32, float16 and bfloat16. It prints a compact table per part: one line per layer
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
not be written. 130 when interrupted (Ctrl-C), as shells report it. A run of the stress battery
alone judges nothing: it prints its findings and exits 0 with "no verdict".

Tests: tests/parity/test_cli.py
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from . import __version__

PROG = "python -m parity_tests"
LAYER_DTYPES = ("float64", "float32")
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
    parser = _parser(prog)
    args = parser.parse_args(argv)
    if args.list_cases:
        return _list_cases(parser, args)
    devices = _devices(parser, args.device)
    _check_parts(parser, args)
    _check_kernel_options(parser, args)
    if args.json:
        _check_writable(parser, args.json)
    args.spec = args.spec or "sdpa"
    args.seed = 0 if args.seed is None else args.seed
    dtypes = tuple(args.dtype or _kernels().DEFAULT_DTYPES)
    kernels = [_load_kernel(parser, spec, dtypes, args) for spec in args.kernel or []]
    progress = _Progress(sys.stderr)
    try:
        if args.calibrate is not None:
            from .checker.calibration import calibrate

            battery = "quick" if args.quick else "default"
            return calibrate(args.calibrate, devices[0], dtypes, battery, progress, print,
                             first_seed=args.seed)  # fmt: skip
        return _run(args, argv, devices, kernels, progress, prog)
    except KeyboardInterrupt:
        progress.done()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


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
        return f"torch cannot be imported ({_first_line(str(exc))}): {INSTALL_TORCH}"
    return None


def _kernels() -> Any:
    """``checker.kernels`` (imports torch: loaded once torch is known to be there)."""
    return importlib.import_module(".checker.kernels", __package__)


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line: ``prog: error: message``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_first_line(message)} (--help: usage)\n")


def _first_line(message: str) -> str:
    return next((line.strip() for line in message.splitlines() if line.strip()), message)


def _parser(prog: str) -> argparse.ArgumentParser:
    from .checker import specs

    dtypes = _kernels().DTYPES
    parser = _Parser(
        prog=prog,
        description="NumPy vs torch layer parity and attention kernel checks.",
    )
    parser.add_argument("--version", action="version", version=VERSION)
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
        help="run each call of --kernel in a child process that imports it as MODULE:FUNCTION "
        "(a crash or a hang is an error verdict); --isolate SECONDS is the older spelling of "
        "--isolate --timeout SECONDS",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="with --isolate: the time limit of one call; a child past it is ended, the case "
        "an error (default 300)",
    )
    parser.add_argument(
        "--head-dims",
        type=_widths,
        metavar="D,D,...",
        help="the head widths --kernel takes (D and Dv), e.g. 16,32,64,128; cases with others "
        "are not run, and their nearest cases inside the limits are",
    )
    parser.add_argument(
        "--seqlen-multiple",
        type=int,
        metavar="K",
        help="--kernel takes lengths that are multiples of K only (others: as --head-dims)",
    )
    parser.add_argument(
        "--equal-lengths",
        action="store_true",
        help="--kernel takes N = M only (others: as --head-dims)",
    )
    parser.add_argument(
        "--contiguous-only",
        action="store_true",
        help="--kernel takes contiguous q, k, v only (others: as --head-dims)",
    )
    parser.add_argument(
        "--fuzz",
        type=int,
        metavar="N",
        help="judge --kernel on N random cases drawn from its spec's options, sizes and "
        "layouts (with --seed); each failing one is printed with the command that reruns it",
    )
    parser.add_argument(
        "--fuzz-case",
        type=int,
        metavar="I",
        help="judge --kernel on drawn case I of --fuzz (the same --seed) alone",
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
        help="print the cases of --spec's battery (--quick, --stress: that battery; --case: "
        "those cases) and exit",
    )
    parser.add_argument(
        "--dtype",
        action="append",
        choices=sorted(dtypes),
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
        "--seed", type=_seed, help="seed of the kernel battery, in [0, 2**64) (default 0)"
    )
    parser.add_argument(
        "--calibrate",
        type=int,
        metavar="SEEDS",
        help="measure the tolerance policy over SEEDS seeds and exit",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print every group's row, each exception's traceback and what isolated "
        "kernels' processes wrote (--json holds them either way)",
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


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(part) for part in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from exc
    if min(widths) < 1:
        raise argparse.ArgumentTypeError(f"head widths must be >= 1, got {text!r}")
    return widths


def _seed(text: str) -> int:
    try:
        return _kernels().check_seed(int(text))
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


def _given(args: argparse.Namespace) -> set[str]:
    """The options given on the command line (before any default is filled in)."""
    values = {
        "--device": args.device,
        "--kernel": args.kernel,
        "--spec": args.spec,
        "--features": args.features,
        "--forward-only": args.forward_only,
        "--isolate": args.isolate,
        "--timeout": args.timeout,
        "--head-dims": args.head_dims,
        "--seqlen-multiple": args.seqlen_multiple,
        "--equal-lengths": args.equal_lengths,
        "--contiguous-only": args.contiguous_only,
        "--fuzz": args.fuzz,
        "--fuzz-case": args.fuzz_case,
        "--world-size": args.world_size,
        "--case": args.case,
        "--dtype": args.dtype,
        "--json": args.json,
        "--quick": args.quick,
        "--stress": args.stress,
        "--no-layers": args.no_layers,
        "--no-kernels": args.no_kernels,
        "--seed": args.seed,
        "--calibrate": args.calibrate,
        "--verbose": args.verbose,
        "--list-cases": args.list_cases,
    }
    return {name for name, value in values.items() if value is not None and value is not False}


def _refuse(parser: argparse.ArgumentParser, options: set[str], why: str) -> None:
    """Bad usage if any of ``options`` was given: ``why`` says what ignores them."""
    if options:
        verb = "does" if len(options) == 1 else "do"
        parser.error(f"{why}: {', '.join(sorted(options))} {verb} not apply")


def _check_parts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse combinations that would check nothing, or ignore an option silently."""
    given = _given(args)
    if args.calibrate is not None:
        if args.calibrate < 1 or args.kernel:
            parser.error("--calibrate takes a number of seeds >= 1 and measures built-in targets")
        if args.json:
            parser.error("--calibrate prints Markdown tables; it writes no --json")
        if args.case:
            parser.error("--calibrate measures a whole battery (--quick or the default), no --case")
        if args.device is not None and len(args.device) > 1:
            parser.error("--calibrate measures one --device")
        why = "--calibrate measures the built-in targets over seeds --seed.. (default 0..)"
        _refuse(parser, given - {"--calibrate", "--quick", "--dtype", "--device", "--seed"}, why)
        return
    if args.no_kernels and not args.stress:
        if args.kernel:
            parser.error("nothing to check: --no-kernels with --kernel (add --stress for findings)")
        if args.no_layers:
            parser.error("nothing to check: --no-layers and --no-kernels")
        why = "--no-kernels runs the layer registry alone (its own dtypes and inputs)"
        _refuse(parser, given & {"--dtype", "--seed", "--case"}, why)
    if args.no_kernels and args.case:
        parser.error("--case names kernel cases; --no-kernels --stress runs the stress battery")
    layers_run = not (args.kernel or args.no_layers)
    if args.quick and args.case and not layers_run:
        parser.error("--quick chooses a battery and --case names the cases: give one of them")


# The options of --kernel (the built-in targets have their own).
KERNEL_OPTIONS = (
    "--spec", "--features", "--forward-only", "--isolate", "--timeout", "--world-size",
    "--head-dims", "--seqlen-multiple", "--equal-lengths", "--contiguous-only", "--fuzz",
    "--fuzz-case",
)  # fmt: skip
LIMIT_OPTIONS = ("--head-dims", "--seqlen-multiple", "--equal-lengths", "--contiguous-only")


def _check_kernel_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options of ``--kernel`` need one; features, limits and cases must exist and fit the spec,
    the cases asked for must lie inside the limits; the cases --fuzz draws are drawn here."""
    given = [name for name in KERNEL_OPTIONS if name in _given(args)]
    if given and not args.kernel:
        verb = "applies" if len(given) == 1 else "apply"
        parser.error(f"{', '.join(given)} {verb} to --kernel; the built-in targets have their own")
    spec = args.spec or "sdpa"
    if args.world_size is not None and spec != "ring":
        parser.error("--world-size is for --spec ring")
    if args.world_size is not None and args.world_size < 1:
        parser.error(f"--world-size must be >= 1, got {args.world_size}")
    _check_isolation(parser, args, spec)
    from .checker import specs

    kernels = _kernels()
    try:
        args.feature_set = _features(spec, args.features)
        args.limits = _limits(spec, args)
        if args.case:
            _named_cases(args.case, spec if args.kernel else None, args.feature_set)
            if args.kernel and spec not in specs.DECODE_SPECS:
                claimed = specs.resolve_features(spec, args.feature_set)
                kernels.within_limits(spec, args.case, claimed, args.limits)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    args.drawn = _drawn(parser, args, spec)
    if args.kernel and spec == "ring":
        from .checker.ring import check_world_size

        world = 2 if args.world_size is None else args.world_size
        try:
            check_world_size(kernels.battery_for("ring", args.case or None), world)
        except ValueError as exc:
            parser.error(f"--world-size {world}: {exc}")


def _check_isolation(parser: argparse.ArgumentParser, args: argparse.Namespace, spec: str) -> None:
    """--timeout limits an isolated call, given once; the ring and decode specs run their own
    way."""
    from .checker import specs

    if args.timeout is not None and args.isolate is None:
        parser.error("--timeout limits an isolated call: add --isolate")
    if args.timeout is not None and args.isolate is not True:
        parser.error("give the time limit once: --isolate --timeout SECONDS")
    if args.isolate is not None and (spec == "ring" or spec in specs.DECODE_SPECS):
        how = "in spawned ranks of its own" if spec == "ring" else "in this process"
        parser.error(f"--isolate does not apply to --spec {spec}: it runs {how}")


def _limits(spec: str, args: argparse.Namespace) -> Any:
    """The ``KernelLimits`` the limit options declare (None: none given), checked for the spec."""
    from .checker.limits import KernelLimits, check_spec

    if not set(LIMIT_OPTIONS) & _given(args):
        return None
    multiple = 1 if args.seqlen_multiple is None else args.seqlen_multiple
    limits = KernelLimits(args.head_dims, multiple, args.equal_lengths, args.contiguous_only)
    check_spec(spec, limits)
    return limits


def _drawn(parser: argparse.ArgumentParser, args: argparse.Namespace, spec: str) -> Any:
    """The cases --fuzz N (or --fuzz-case I) draws for --kernel, or None."""
    if args.fuzz is None and args.fuzz_case is None:
        return None
    from .checker.fuzz import fuzz_case, fuzz_cases

    if args.fuzz is not None and args.fuzz_case is not None:
        parser.error("--fuzz draws cases and --fuzz-case reruns one of them: give one")
    if args.fuzz is not None and args.fuzz < 1:
        parser.error(f"--fuzz takes a number of cases >= 1, got {args.fuzz}")
    option = "--fuzz" if args.fuzz is not None else "--fuzz-case"
    _refuse(parser, _given(args) & {"--case", "--quick", "--stress"}, f"{option} draws its cases")
    seed = 0 if args.seed is None else args.seed
    try:
        if args.fuzz is not None:
            return fuzz_cases(spec, args.fuzz, seed, args.feature_set, args.limits)
        return (fuzz_case(spec, args.fuzz_case, seed, args.feature_set, args.limits),)
    except ValueError as exc:
        parser.error(f"{option}: {exc}")


def _features(spec: str, features: str | None) -> frozenset[str] | None:
    from .checker import specs

    if features is None:
        return None
    names = [name.strip() for name in features.split(",") if name.strip()]
    return specs.resolve_features(spec, names)


def _named_cases(
    names: list[str], spec: str | None = None, features: frozenset[str] | None = None
) -> tuple[Any, ...]:
    """The cases with these names, in this order: of ``spec``'s batteries for ``features`` first
    (a decode spec: of its own battery), else of any battery, decode ones included; a ValueError
    for an unknown name."""
    from .checker import specs
    from .checker.battery import lookup
    from .checker.decode_battery import DECODE_BATTERIES, resolve_decode

    if spec in specs.DECODE_SPECS:
        return resolve_decode(spec, names)
    decode = {case.name: case for cases in DECODE_BATTERIES.values() for case in cases}
    if spec is None:
        return tuple(decode[name] if name in decode else lookup(name) for name in names)
    return tuple(lookup(name, spec, features) for name in names)


def _list_cases(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print the cases of the spec's battery (for ``--features``, when given), or the cases
    ``--case`` names: name, shape, options it needs, whether the spec runs it; for a battery then
    its coverage, computed from the cases (every pair of its factors' values, how many cases hold
    each value, the size requirements met), then the named cases. Only --spec, --features,
    --quick, --stress and --case apply."""
    from .checker import battery as batteries
    from .checker import pairs, specs
    from .checker.limits import allowed_pairs

    allowed = {"--list-cases", "--spec", "--features", "--quick", "--stress", "--case",
               *LIMIT_OPTIONS}  # fmt: skip
    _refuse(parser, _given(args) - allowed, "--list-cases prints the cases and exits")
    spec = args.spec or "sdpa"
    if spec in specs.DECODE_SPECS:
        return _list_decode_cases(parser, args, spec)
    kernels = _kernels()
    try:
        features = _features(spec, args.features)
        limits = _limits(spec, args)
        claimed = specs.resolve_features(spec, features)
        if args.case:
            _refuse(parser, _given(args) & {"--quick", "--stress"}, "--case names the cases")
            named = _named_cases(args.case, spec, features)
            if limits is not None:
                kernels.within_limits(spec, list(args.case), claimed, limits)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    if args.case:
        width = max(20, *(len(case.name) for case in named))
        print(f"named cases, {spec} spec: {len(named)} cases")
        _print_header(width)
        for case in named:
            _print_case(case, width, features, spec)
        return 0
    name = "stress" if args.stress else "quick" if args.quick else "default"
    try:
        cases, excluded = kernels.within_limits(spec, name, claimed, limits)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    if spec == "ring" and name != "stress":
        name = "ring"
    width = max(20, *(len(case.name) for case in cases + batteries.NAMED))
    said = "" if features is None else f", features {','.join(sorted(features))}"
    said += "" if limits is None else f", limits {limits.declared}"
    print(f"{name} battery, {spec} spec{said}: {len(cases)} cases")
    _print_header(width)
    for case in cases:
        _print_case(case, width, features, spec, excluded)
    if name != "stress":
        held = [case for case in cases if case.needs <= claimed and case.name not in excluded]
        found = pairs.coverage(spec, held, features)
        met = batteries.size_coverage(spec, held, features)
        owed = allowed_pairs(spec, limits, features)
        missing = found.missing & owed
        share = f"{1 - len(missing) / max(len(owed), 1):.0%}"
        share += "" if limits is None else f"; the limits allow {len(owed)} of {found.required}"
        print(f"pair coverage: {len(owed) - len(missing)} of {len(owed)} pairs of values of "
              f"{len(found.counts)} factors meet in a case ({share}); cases holding each "
              "value:")  # fmt: skip
        for factor, counts in found.counts.items():
            print(f"  {factor}: " + ", ".join(f"{value} {count}" for value, count in
                                             counts.items()))  # fmt: skip
        for first, second in sorted(missing):
            print(f"  missing: {first[0]}={first[1]} with {second[0]}={second[1]}")
        if met:
            print(f"size requirements: {sum(met.values())} of {len(met)} met")
            for line in batteries.size_summary(spec, held, features):
                print(f"  {line}")
    print("named cases (not in the battery; run one with --case NAME):")
    for case in batteries.NAMED:
        _print_case(case, width, features, spec)
    return 0


def _list_decode_cases(parser: argparse.ArgumentParser, args: argparse.Namespace, spec: str) -> int:
    """``--list-cases`` for a decode spec: its own battery (or the cases ``--case`` names), each
    case's shape and needs; for flash_kvcache the pairs of option values its covering array
    meets."""
    from .checker import decode_battery

    _refuse(parser, _given(args) & {"--features", "--quick", "--stress"},
            f"the {spec} spec has one battery")  # fmt: skip
    try:
        cases = decode_battery.resolve_decode(spec, args.case or None)
    except ValueError as exc:
        parser.error(str(exc))
    keys = tuple(cases[0].shape)
    width = max(20, *(len(case.name) for case in cases))
    print(f"{'named cases' if args.case else 'battery'}, {spec} spec: {len(cases)} cases")
    print(f"{'case':{width}} " + " ".join(f"{key:>5}" for key in keys) + "  needs")
    for case in cases:
        shape = " ".join(f"{case.shape[key]:>5}" for key in keys)
        print(f"{case.name:{width}} {shape}  {', '.join(sorted(case.needs)) or '-'}")
    if spec == "flash_kvcache" and not args.case:
        rows = decode_battery.covering_cases()
        required = decode_battery.required_pairs()
        covered = set().union(*(decode_battery.covered_pairs(row) for row in rows)) & required
        print(f"pair coverage: {len(covered)} of {len(required)} allowed pairs of option values "
              f"meet in a case ({len(covered) / len(required):.0%})")  # fmt: skip
    return 0


def _print_header(width: int) -> None:
    print(f"{'case':{width}} {'B':>4} {'H':>4} {'N':>4} {'M':>4} {'D':>4} {'Dv':>4}  needs")


def _print_case(
    case: Any, width: int, features: Any, spec: str, excluded: dict | None = None
) -> None:
    """One line of ``--list-cases``: name, shape, needs, and why the spec does not run it (or
    the kernel's features or limits)."""
    from .checker import specs

    shape = " ".join(f"{value:>4}" for value in case.shape.values())
    needs = ", ".join(sorted(case.needs)) or "-"
    reason = specs.cannot_express(spec, case)
    note = f"  (not in this spec: {reason})" if reason else ""
    if not reason and features is not None and case.needs - features:
        note = "  (not run: needs features not declared)"
    elif not reason and excluded and case.name in excluded:
        why, instead = excluded[case.name]
        note = f"  (not run, outside the kernel's limits: {why}; judged instead: {instead})"
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
) -> Any:
    """``module:function`` (dots allowed in both parts) as a target in ``dtypes``, called as the
    options say. Whatever the import raises (a syntax error, an exception, ``sys.exit``) is bad
    usage: its message, no traceback."""
    from .checker.targets import Target

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
        what = type(kernel).__name__
        parser.error(f"--kernel {spec!r}: {attribute} is not callable (its type is {what})")
    return Target(
        spec,
        spec,  # by its name: an isolated call's child imports it as the user named it
        dtypes,
        spec=args.spec,
        features=args.feature_set,
        forward_only=args.forward_only,
        isolate=False if args.isolate is None else args.isolate,
        world_size=args.world_size,
        limits=args.limits,
        timeout=args.timeout,
    )


def _run(
    args: argparse.Namespace,
    argv: list[str],
    devices: list[str],
    kernels: list[Any],
    progress: _Progress,
    prog: str,
) -> int:
    """Run the parts asked for, print the tables (``--verbose``: every group too), the failing
    rows, the totals and the verdict; write the JSON."""
    from .checker import render

    result: dict[str, Any] = {
        "schema_version": render.SCHEMA_VERSION,
        "tool": "parity_tests",
        "project": render.project(),
        "argv": argv,
        "environment": render.environment(devices),
        "settings": {
            "devices": devices,
            "dtypes": list(args.dtype or _kernels().DEFAULT_DTYPES),
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
        rows = _run_layers(devices, args.quick, progress)
        progress.done()
        if args.verbose:
            _print_layers(rows)
        layer_failures = _layer_failures(rows)
        totals.append("layers: " + _print_layer_summary(rows))
        failing += layer_failures
        result["layers"] = {"verdict": "fail" if layer_failures else "pass", "rows": rows}
        verdicts.append(result["layers"]["verdict"])
    if not args.no_kernels:
        checks = _run_kernels(args, devices, kernels, battery, progress, judged=True)
        progress.done()
        if args.verbose:
            render.print_checks(checks, "kernels: error / bound per tensor (above 1 fails)", print)
        render.print_summary(checks, "kernels: each target against the float64 golden", print)
        totals.append("kernels: " + render.total_line(checks))
        failing += render.failing_lines(checks)
        result["kernels"] = checks
        verdicts += [check["verdict"] for check in checks]
    if args.stress:
        findings = _run_kernels(args, devices, kernels, "stress", progress, judged=False)
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
    reruns = _reruns(prog, args, checks)
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


def _reruns(prog: str, args: argparse.Namespace, checks: list[dict[str, Any]]) -> list[str]:
    """For each drawn case that failed, the one command that reruns it alone (its target,
    device and failing dtypes, the same options and seed, ``--fuzz-case``)."""
    if not args.drawn:
        return []
    from .checker.report import FAILED_GROUPS

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
            options = _rerun_options(args, check["target"], check["device"], dtypes)
            lines.append(f"{case}: {prog} {shlex.join(options)} --fuzz-case {index[case]}")
    return lines


def _rerun_options(
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


def _run_layers(devices: list[str], quick: bool, progress: _Progress) -> list[dict[str, Any]]:
    from .checker.render import row_dict
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
    kernels: list[Any],
    battery: str | list[str],
    progress: _Progress,
    *,
    judged: bool,
) -> list[dict[str, Any]]:
    """One check per (device, target): the user's kernels, or every built-in target (those that
    run none of the cases asked for are left out)."""
    from .checker.render import check_entry
    from .checker.targets import builtin_targets

    checks = []
    name = battery if isinstance(battery, str) else "fuzz" if args.drawn else "cases"
    dtypes = tuple(args.dtype or _kernels().DEFAULT_DTYPES)
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


def _layer_groups(rows: list[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """The rows of each (device, layer case, dtype, backend), in the order run."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["device"], row["case"], row["dtype"], row["backend"])
        groups.setdefault(key, []).append(row)
    return groups


def _ratio(row: dict[str, Any]) -> float:
    return math.inf if not row["bound"] else row["error"] / row["bound"]


def _print_layers(rows: list[dict[str, Any]]) -> None:
    """One line per (device, layer case, dtype, backend): its worst tensor (``--verbose``)."""
    print("== layers: NumPy vs torch (norm-wise relative error, bound) ==")
    print(
        f"{'device':7} {'case':44} {'dtype':8} {'backend':8} {'worst':18} "
        f"{'error':>9} {'bound':>9}  verdict"
    )
    groups = _layer_groups(rows)
    for (device, case, dtype, backend), members in groups.items():
        worst = max(members, key=_ratio)
        verdict = "pass" if all(r["verdict"] == "pass" for r in members) else "fail"
        print(
            f"{device:7} {case:44} {dtype:8} {backend:8} {worst['tensor']:18} "
            f"{worst['error']:9.2e} {worst['bound']:9.2e}  {verdict}"
        )
    print()


def _print_layer_summary(rows: list[dict[str, Any]]) -> str:
    """One line per (device, layer): its verdict, its (case, dtype, backend) groups judged and
    failing, its largest error / bound. Returns the line of the total."""
    from .checker.render import SUMMARY_HEADER, summary_line

    layers: dict[tuple[str, str], list[bool]] = {}  # (device, layer) -> each group failed
    worst: dict[tuple[str, str], float] = {}
    for (device, *_), members in _layer_groups(rows).items():
        key = (device, members[0]["layer"])
        layers.setdefault(key, []).append(any(row["verdict"] != "pass" for row in members))
        worst[key] = max([worst.get(key, 0.0)] + [_ratio(row) for row in members])
    print("== layers: NumPy layer vs torch twin, output and every gradient, per layer ==")
    print(SUMMARY_HEADER.replace("target", "layer ", 1))
    for (device, layer), failed in layers.items():
        verdict = "fail" if any(failed) else "pass"
        counts = _layer_counts(len(failed), sum(failed))
        print(summary_line(device, layer, verdict, counts, worst[(device, layer)]))
    print()
    passed = sum(not any(failed) for failed in layers.values())
    groups = sum(len(failed) for failed in layers.values())
    failing = sum(sum(failed) for failed in layers.values())
    devices = ", ".join(dict.fromkeys(device for device, _ in layers)) or "no device"
    verdict = "fail" if failing else "pass"
    return (
        f"{verdict}, {passed} of {len(layers)} layers on {devices} pass; {groups} groups "
        f"(case, dtype, backend) judged, {failing} failing"
    )


def _layer_counts(groups: int, failing: int) -> dict[str, int]:
    """A layer's groups counted as a kernel check's are: every group is judged, a failing one
    flagged (the registry has no expected failures, skips, features or refusals)."""
    return {
        "judged": groups,
        "failing": failing,
        "flagged": failing,
        "refused": 0,
        "error": 0,
        "expected_failures": 0,
        "skipped": 0,
        "not_run": 0,
        "total": groups,
    }


def _layer_failures(rows: list[dict[str, Any]]) -> list[str]:
    """One line per failing layer row, for the summary at the end."""
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
