"""The command line of ``python -m parity_tests``: its parser, and the checks that refuse bad
usage before any work (exit status 2, one line on stderr): options that another option makes
meaningless, options of ``--kernel`` without one, an unknown spec, feature, case or limit, a
case the spec cannot express or outside the kernel's limits, a ``--kernel`` that does not
import, an unwritable ``--json``. ``cli`` dispatches what they leave.

Tests: tests/parity/test_cli.py
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
from typing import Any, NoReturn

from .checker.specs import resolve_features


def pipeline() -> Any:
    """``checker.pipeline`` (imports torch: loaded once torch is known to be there)."""
    return importlib.import_module(".checker.pipeline", __package__)


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line: ``prog: error: message``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {first_line(message)} (--help: usage)\n")


def first_line(message: str) -> str:
    return next((line.strip() for line in message.splitlines() if line.strip()), message)


def parser_for(prog: str, version: str) -> argparse.ArgumentParser:
    from .checker import specs
    from .checker.golden import DTYPES as dtypes

    parser = _Parser(
        prog=prog,
        description="NumPy vs torch layer parity and attention kernel checks.",
    )
    parser.add_argument("--version", action="version", version=version)
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
        type=_spec_names,
        help="how --kernel is called: the signature and layout of a spec, "
        f"{', '.join(specs.SPECS)} (default: sdpa); with --calibrate, the specs to measure "
        "(comma-separated)",
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
        "--page-sizes",
        type=_widths,
        metavar="P,P,...",
        help="the page sizes a decode --kernel takes, e.g. 16,64 (others: as --head-dims)",
    )
    parser.add_argument(
        "--nondeterministic",
        action="store_true",
        help="--kernel may give other bits from call to call on identical inputs: each case is "
        "called once, not compared with a second call",
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


def _spec_names(text: str) -> list[str]:
    """A spec's name, or (for --calibrate) several, comma-separated."""
    from .checker import specs

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in specs.SPECS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from {', '.join(specs.SPECS)})"
        )
    return names


def _seed(text: str) -> int:
    try:
        return pipeline().check_seed(int(text))
    except (TypeError, ValueError) as exc:
        message = str(exc) if "2**64" in str(exc) else f"not an integer: {text!r}"
        raise argparse.ArgumentTypeError(message) from exc


def devices(parser: argparse.ArgumentParser, asked: list[str] | None) -> list[str]:
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


def given(args: argparse.Namespace) -> set[str]:
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
        "--page-sizes": args.page_sizes,
        "--nondeterministic": args.nondeterministic,
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


def refuse(parser: argparse.ArgumentParser, options: set[str], why: str) -> None:
    """Bad usage if any of ``options`` was given: ``why`` says what ignores them."""
    if options:
        verb = "does" if len(options) == 1 else "do"
        parser.error(f"{why}: {', '.join(sorted(options))} {verb} not apply")


def check_parts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse combinations that would check nothing, or ignore an option silently."""
    asked = given(args)
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
        kept = {"--calibrate", "--quick", "--dtype", "--device", "--seed", "--spec"}
        refuse(parser, asked - kept, why)
        args.spec_list, args.spec = args.spec, None
        return
    if args.no_kernels and not args.stress:
        if args.kernel:
            parser.error("nothing to check: --no-kernels with --kernel (add --stress for findings)")
        if args.no_layers:
            parser.error("nothing to check: --no-layers and --no-kernels")
        why = "--no-kernels runs the layer registry alone (its own dtypes and inputs)"
        refuse(parser, asked & {"--dtype", "--seed", "--case"}, why)
    if args.no_kernels and args.case:
        parser.error("--case names kernel cases; --no-kernels --stress runs the stress battery")
    layers_run = not (args.kernel or args.no_layers)
    if args.quick and args.case and not layers_run:
        parser.error("--quick chooses a battery and --case names the cases: give one of them")


# The options of --kernel (the built-in targets have their own).
KERNEL_OPTIONS = (
    "--spec", "--features", "--forward-only", "--isolate", "--timeout", "--world-size",
    "--head-dims", "--seqlen-multiple", "--equal-lengths", "--contiguous-only", "--page-sizes",
    "--nondeterministic", "--fuzz", "--fuzz-case",
)  # fmt: skip
LIMIT_OPTIONS = (
    "--head-dims", "--seqlen-multiple", "--equal-lengths", "--contiguous-only", "--page-sizes",
    "--nondeterministic",
)  # fmt: skip


def check_kernel_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options of ``--kernel`` need one; features, limits, the spec's own options and cases
    must exist and fit the spec, the cases asked for must lie inside the limits; the cases
    --fuzz draws are drawn here."""
    args.spec_list = getattr(args, "spec_list", None)
    mine = [name for name in KERNEL_OPTIONS if name in given(args)]
    if mine and not args.kernel:
        verb = "applies" if len(mine) == 1 else "apply"
        parser.error(f"{', '.join(mine)} {verb} to --kernel; the built-in targets have their own")
    spec = one_spec(parser, args)
    if args.world_size is not None and args.world_size < 1:
        parser.error(f"--world-size must be >= 1, got {args.world_size}")
    _check_isolation(parser, args, spec)
    try:
        args.feature_set = features_of(spec, args.features)
        args.limits = limits_of(spec, args)
        if args.case:
            named_cases(args.case, spec if args.kernel else None, args.feature_set)
        if args.kernel:
            found = spec_of(spec)
            claimed = resolve_features(found, args.feature_set)
            battery, _ = pipeline().within_limits(found, args.case or None, claimed, args.limits)
            given_options = {} if args.world_size is None else {"world_size": args.world_size}
            found.check_options(battery, found.options(given_options))
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    args.drawn = _drawn(parser, args, spec)


def spec_of(name: str) -> Any:
    from .checker.specs import get

    return get(name)


def one_spec(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The one spec ``--spec`` names (several only for --calibrate)."""
    if args.spec is None:
        return "sdpa"
    if len(args.spec) > 1:
        parser.error(f"--spec names one spec for --kernel and --list-cases, got {args.spec}")
    args.spec = args.spec[0]
    return args.spec


def _check_isolation(parser: argparse.ArgumentParser, args: argparse.Namespace, spec: str) -> None:
    """--timeout limits an isolated call, given once; a spec whose calls run on ranks of their
    own cannot isolate them one by one."""
    if args.timeout is not None and args.isolate is None:
        parser.error("--timeout limits an isolated call: add --isolate")
    if args.timeout is not None and args.isolate is not True:
        parser.error("give the time limit once: --isolate --timeout SECONDS")
    if args.isolate is not None and not spec_of(spec).isolatable:
        parser.error(f"--isolate does not apply to --spec {spec}: it runs in spawned ranks of "
                     "its own")  # fmt: skip


def limits_of(spec: str, args: argparse.Namespace) -> Any:
    """The ``KernelLimits`` the limit options declare (None: none given), checked for the spec."""
    from .checker.battery.limits import KernelLimits

    if not set(LIMIT_OPTIONS) & given(args):
        return None
    multiple = 1 if args.seqlen_multiple is None else args.seqlen_multiple
    limits = KernelLimits(args.head_dims, multiple, args.equal_lengths, args.contiguous_only,
                          args.page_sizes, args.nondeterministic)  # fmt: skip
    spec_of(spec).check_limits(limits)
    return limits


def _drawn(parser: argparse.ArgumentParser, args: argparse.Namespace, spec: str) -> Any:
    """The cases --fuzz N (or --fuzz-case I) draws for --kernel, or None."""
    if args.fuzz is None and args.fuzz_case is None:
        return None
    from .checker.battery.fuzz import fuzz_case, fuzz_cases

    if args.fuzz is not None and args.fuzz_case is not None:
        parser.error("--fuzz draws cases and --fuzz-case reruns one of them: give one")
    if args.fuzz is not None and args.fuzz < 1:
        parser.error(f"--fuzz takes a number of cases >= 1, got {args.fuzz}")
    option = "--fuzz" if args.fuzz is not None else "--fuzz-case"
    refuse(parser, given(args) & {"--case", "--quick", "--stress"}, f"{option} draws its cases")
    seed = 0 if args.seed is None else args.seed
    try:
        if args.fuzz is not None:
            return fuzz_cases(spec, args.fuzz, seed, args.feature_set, args.limits)
        return (fuzz_case(spec, args.fuzz_case, seed, args.feature_set, args.limits),)
    except ValueError as exc:
        parser.error(f"{option}: {exc}")


def features_of(spec: str, features: str | None) -> frozenset[str] | None:
    if features is None:
        return None
    names = [name.strip() for name in features.split(",") if name.strip()]
    return resolve_features(spec, names)


def named_cases(
    names: list[str], spec: str | None = None, features: frozenset[str] | None = None
) -> tuple[Any, ...]:
    """The cases with these names, in this order: of ``spec``'s cases for ``features`` first,
    else of any spec's; a ValueError for an unknown name."""
    from .checker.battery.catalog import resolve

    return resolve(names, spec, features)


def interpreter_warning(kernels: list[Any]) -> str:
    """The one line that says which dtypes the checks of ``kernels`` (``Target``s) skip under
    Triton's interpreter (``checker.running.interpreter``), "" when none: the CLI says it once,
    before the run."""
    from .checker.running.calls import load_kernel
    from .checker.running.interpreter import interpreter_skips, skip_warning

    skipped: dict[str, str] = {}
    for target in kernels:
        skipped.update(interpreter_skips(load_kernel(target.kernel), target.dtypes))
    return skip_warning(skipped)


def check_writable(parser: argparse.ArgumentParser, path: str) -> None:
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


def load_kernel(
    parser: argparse.ArgumentParser, spec: str, dtypes: tuple[str, ...], args: argparse.Namespace
) -> Any:
    """``module:function`` (dots allowed in both parts) as a target in ``dtypes``, called as the
    options say. Whatever the import raises (a syntax error, an exception, ``sys.exit``) is bad
    usage: its message, no traceback."""
    from .checker.targets.builtin import Target

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
