"""The kernel checker inside a project's own pytest run: ``pytest --check-kernel
mypkg.attn:my_sdpa`` collects one test item per (case, dtype) group of the spec's battery, each
passing or failing with the checker's verdict on that group alone (docs/checker-in-pytest.md).

A plugin in the shape of pytest's own (``src/_pytest/``: hooks, and the nodes they add),
registered by the package's ``pytest11`` entry point. Without ``--check-kernel`` it adds
nothing: no item, no output, no import of torch or of ``parity_tests.checker`` (imported inside
the hooks that run only when the option is given); its other options without it are a usage
error.

Node ids: ``check[SPEC]::CASE[DTYPE]``, one per group in the order ``check_kernel`` runs them
(``plan_groups``), then ``check[SPEC]::coverage``. A group fails on any failing row (flagged,
refused or an error; the message lists them, with each exception's first line); a group the
checker does not run (a feature not claimed, outside the kernel's limits) and a "skip" verdict
(``KernelUnsupported``) are pytest skips with the reason. The coverage item fails naming each
feature the kernel claims that no group that runs exercises (``Group.needs``; "lse", asked for
in every call, is exercised by any group that runs), so a claim never passes on nothing. Bad
options (a kernel that does not import, an unknown spec, feature, dtype or battery, limits the
spec cannot honour) are a ``pytest.UsageError`` from ``pytest_configure``: exit status 4, one
line.

Tests: tests/parity/test_pytest_plugin.py
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SEED_LIMIT = 2**64  # seeds are in [0, 2**64), what check_kernel takes
# Each option: (name, metavar, help); metavar None for a flag.
OPTIONS = (
    ("--check-kernel", "MODULE:FUNCTION", "judge this attention kernel, one test per (case, "
     "dtype) group of its spec's battery (docs/checker-in-pytest.md)"),
    ("--check-spec", "SPEC", "the kernel's signature: sdpa (default), flash, flash_varlen, flex, "
     "ring, flash_kvcache, flash_mla"),
    ("--check-features", "A,B,...", "the options the kernel claims (default: every option of "
     "the spec); groups needing others are skipped as not run"),
    ("--check-dtypes", "D,D,...", "kernel dtypes (default: float32,float16,bfloat16)"),
    ("--check-cases", "BATTERY", "the battery: default, quick or stress (default: default)"),
    ("--check-head-dims", "D,D,...", "the head widths the kernel takes (D and Dv)"),
    ("--check-seqlen-multiple", "K", "the kernel takes lengths that are multiples of K only"),
    ("--check-equal-lengths", None, "the kernel takes N = M only"),
    ("--check-contiguous-only", None, "the kernel takes contiguous q, k, v only"),
    ("--check-page-sizes", "P,P,...", "the page sizes a decode kernel takes"),
    ("--check-forward-only", None, "judge the output (and lse) only, no backward"),
    ("--check-device", "DEVICE", "where the inputs live: cpu (default), cuda, cuda:1, ..."),
    ("--check-seed", "SEED", "seed of the inputs, in [0, 2**64) (default 0)"),
    ("--check-isolate", None, "run each kernel call in a child process (a crash or a hang "
     "fails its group)"),
    ("--check-timeout", "SECONDS", "with --check-isolate: the time limit of one call"),
)  # fmt: skip


@dataclass(frozen=True)
class CheckOptions:
    """The ``--check-*`` options, parsed: ``check_kernel``'s arguments but ``dtypes`` and
    ``cases`` (one group's, per item), and the battery and dtypes to plan."""

    kernel: str
    spec: str
    features: frozenset[str] | None
    dtypes: tuple[str, ...] | None
    cases: str
    limits: Any  # a parity_tests.KernelLimits, or None
    device: str
    forward_only: bool
    isolate: bool
    timeout: float | None
    seed: int


@dataclass(frozen=True)
class KernelCheck:
    """What ``pytest_configure`` found: the options and the battery's groups, in order."""

    options: CheckOptions
    groups: tuple[Any, ...]  # parity_tests.Group


CHECK = pytest.StashKey[KernelCheck]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("check-kernel", "attention kernel checker (parity_tests)")
    for name, metavar, text in OPTIONS:
        if metavar is None:
            group.addoption(name, action="store_true", default=False, help=text)
        else:
            group.addoption(name, metavar=metavar, default=None, help=text)


def pytest_configure(config: pytest.Config) -> None:
    """With ``--check-kernel``: the options parsed, the kernel imported, its groups planned, or a
    usage error naming what is wrong. Without it: nothing (other ``--check-*`` options are a
    usage error)."""
    options = read_options(config)
    if options is None:
        return
    where = str(config.invocation_params.dir)
    if "" not in sys.path and where not in sys.path:  # ./mymodule.py is found, as with python -m
        sys.path.insert(0, where)
    load_kernel(options.kernel)
    check_device(options.device)
    config.stash[CHECK] = KernelCheck(options, plan(options))


def pytest_report_header(config: pytest.Config) -> str | None:
    check = config.stash.get(CHECK, None)
    if check is None:
        return None
    options, groups = check.options, check.groups
    not_run = sum(not group.runs for group in groups)
    return (f"parity_tests checker: {options.kernel} ({options.spec} spec, {options.cases} "
            f"battery, {options.device}): {len(groups)} groups, {not_run} not run")  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: they must see these items
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    check = config.stash.get(CHECK, None)
    if check is None:
        return
    name = f"check[{check.options.spec}]"
    collector = KernelCollector.from_parent(session, name=name, nodeid=name)
    # Collected as pytest collects a file (its report counted in "collected N items").
    report = collector.ihook.pytest_make_collect_report(collector=collector)
    collector.ihook.pytest_collectreport(report=report)
    items.extend(report.result)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """A skip of a group is reported under its node id (``-rs``: ``SKIPPED [1]
    check[sdpa]::CASE[DTYPE]: reason``), not at the line of this module that raised it: every
    group's item runs the same code."""
    outcome = yield
    report = outcome.get_result()
    if isinstance(item, GroupItem) and report.skipped and isinstance(report.longrepr, tuple):
        report.longrepr = (item.nodeid, None, report.longrepr[2])


class KernelCollector(pytest.Collector):
    """``check[SPEC]``: one ``GroupItem`` per group of the battery, then the ``CoverageItem``;
    the same items in the same order in every process (pytest-xdist's workers collect apart)."""

    def collect(self) -> list[pytest.Item]:
        items: list[pytest.Item] = []
        for group in self.config.stash[CHECK].groups:
            name = f"{group.case}[{group.dtype}]"
            # The id in full, as pytest reads an id back (its cache, for --lf): DTYPE the params.
            nodeid = f"{self.nodeid}::{name}"
            items.append(GroupItem.from_parent(self, name=name, nodeid=nodeid, group=group))
        items.append(CoverageItem.from_parent(self, name="coverage"))
        return items


class CheckItem(pytest.Item):
    """An item of no source line: its node id names it in pytest's reports."""

    def reportinfo(self) -> tuple[Path, None, str]:
        return self.path, None, self.nodeid


class GroupItem(CheckItem):
    """One (case, dtype) group judged alone: ``check_kernel(..., cases=[case], dtypes=[dtype])``,
    the verdict it has inside the whole battery."""

    def __init__(self, *, group: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group = group

    def runtest(self) -> None:
        if not self.group.runs:
            pytest.skip(f"not run: {self.group.detail}")
        from parity_tests import check_kernel

        options = self.config.stash[CHECK].options
        refused = ""
        try:
            report = check_kernel(
                options.kernel,
                spec=options.spec,
                features=options.features,
                device=options.device,
                dtypes=[self.group.dtype],
                cases=[self.group.case],
                limits=options.limits,
                forward_only=options.forward_only,
                isolate=options.isolate,
                timeout=options.timeout,
                seed=options.seed,
            )
        except (ValueError, TypeError) as exc:  # the options, refused; never the kernel's own
            refused = f"check_kernel refused to run this group: {exc}"
        if refused:  # failed outside the except clause: no chained exception in the message
            pytest.fail(refused, pytrace=False)
        for error in report.errors:
            self.add_report_section("call", f"kernel exception #{error.number}", error.traceback)
        judge(report, options, self.group)


def judge(report: Any, options: CheckOptions, group: Any) -> None:
    """Fail on any failing row, skip on a "skip" or "not-run" row, else pass (a report with
    nothing judged fails: ``report.passed`` is then False)."""
    failures = report.failures
    unjudged = [row for row in report.rows if row.verdict in ("skip", "not-run")]
    if failures:
        pytest.fail(failure_message(report, options, group, failures), pytrace=False)
    if unjudged:
        pytest.skip(f"{unjudged[0].verdict}: {unjudged[0].detail}")
    if not report.passed:
        pytest.fail(f"{options.kernel}: {group.case} {group.dtype}: {report.summary}",
                    pytrace=False)  # fmt: skip


def failure_message(report: Any, options: CheckOptions, group: Any, failures: list) -> str:
    """The failing tensors and verdicts (the line pytest's summary shows), the kernel and the
    case's shape, one line per failing row (tensor, verdict, error / bound, detail), and the
    first line of each exception the kernel raised."""
    case = report.cases.get(group.case)
    shape = " ".join(f"{k}={v}" for k, v in case.shape.items()) if case is not None else ""
    lines = [
        f"{group.case} {group.dtype}: {', '.join(map(what_failed, failures))}",
        f"{options.kernel} ({options.spec} spec, {options.device}), {shape}:",
    ]
    for row in failures:
        measured = row.verdict == "bias"
        error, bound = (row.rms_error, row.rms_bound) if measured else (row.error, row.bound)
        numbers = "-" if math.isnan(error) else f"{'rms ' if measured else ''}error {error:.2e}"
        numbers += "" if math.isnan(bound) else f" / bound {bound:.2e}"
        lines.append(f"  {row.tensor:<6} {row.verdict:<9} {numbers:<34} {row.detail}".rstrip())
    for error in report.errors:
        first = error.message.splitlines()[0] if error.message else ""
        lines.append(f"  exception #{error.number} ({error.kind}): {first}".rstrip(": "))
    return "\n".join(lines)


def what_failed(row: Any) -> str:
    """ "dq fail", say; "error" for a row of no tensor (the kernel raised)."""
    return row.verdict if row.tensor == "-" else f"{row.tensor} {row.verdict}"


class CoverageItem(CheckItem):
    """``check[SPEC]::coverage``: fails naming each claimed feature that no group that runs
    exercises (computed from the plan, whatever ``-k`` selects)."""

    def runtest(self) -> None:
        check = self.config.stash[CHECK]
        options = check.options
        claimed = options.features
        if claimed is None:
            claimed = spec_features(options.spec)
        gap = coverage_gap(claimed, check.groups)
        if gap:
            declared = options.limits.declared if options.limits is not None else {}
            limits = ", ".join(f"{name}={value}" for name, value in declared.items()) or "none"
            pytest.fail(
                f"{gap} ({options.kernel}, the {options.cases} battery, limits: {limits}); "
                "claim less (--check-features) or take more (the limits)",
                pytrace=False,
            )


def coverage_gap(claimed: frozenset[str], groups: Sequence[Any]) -> str:
    """Why the claims are not all checked, "" when they are: no group runs at all, or the
    claimed features that no group that runs needs ("lse" is asked for in every call, so any
    group that runs exercises it)."""
    running = [group for group in groups if group.runs]
    if not running:
        return f"no group runs, so no claim is checked: {', '.join(sorted(claimed)) or 'none'}"
    missing = sorted(claimed - {"lse"}.union(*(group.needs for group in running)))
    if not missing:
        return ""
    them = "them" if len(missing) > 1 else "it"
    return f"not covered: {', '.join(missing)}, claimed, but no group that runs exercises {them}"


def spec_features(spec: str) -> frozenset[str]:
    """The features ``spec`` can express, its default claim."""
    from parity_tests import SPEC_FEATURES

    return SPEC_FEATURES[spec]


def read_options(config: pytest.Config) -> CheckOptions | None:
    """The options parsed, None without ``--check-kernel``; a usage error for a value that
    does not parse, or for options given without ``--check-kernel``."""
    given = {name: config.getoption(dest(name)) for name, _, _ in OPTIONS}
    given = {name: value for name, value in given.items() if value not in (None, False)}
    kernel = given.pop("--check-kernel", None)
    if kernel is None:
        if given:
            raise pytest.UsageError(f"{', '.join(given)} without --check-kernel MODULE:FUNCTION")
        return None
    isolate = bool(given.get("--check-isolate"))
    timeout = given.get("--check-timeout")
    features, dtypes = given.get("--check-features"), given.get("--check-dtypes")
    if timeout is not None and not isolate:
        raise pytest.UsageError("--check-timeout limits an isolated call: add --check-isolate")
    return CheckOptions(
        kernel=kernel,
        spec=given.get("--check-spec", "sdpa"),
        features=features if features is None else frozenset(names(features)),
        dtypes=dtypes if dtypes is None else names(dtypes),
        cases=given.get("--check-cases", "default"),
        limits=read_limits(given),
        device=given.get("--check-device", "cpu"),
        forward_only=bool(given.get("--check-forward-only")),
        isolate=isolate,
        timeout=None if timeout is None else seconds(timeout),
        seed=read_seed(given.get("--check-seed", "0")),
    )


def read_limits(given: dict[str, Any]) -> Any:
    """A ``KernelLimits`` of the limit options given, None for none of them."""
    if not {"--check-head-dims", "--check-seqlen-multiple", "--check-equal-lengths",
            "--check-contiguous-only", "--check-page-sizes"} & set(given):  # fmt: skip
        return None
    from parity_tests import KernelLimits

    widths = given.get("--check-head-dims")
    head_dims = (
        None if widths is None else [integer("--check-head-dims", w) for w in widths.split(",")]
    )
    sizes = given.get("--check-page-sizes")
    page_sizes = (
        None if sizes is None else [integer("--check-page-sizes", p) for p in sizes.split(",")]
    )
    multiple = integer("--check-seqlen-multiple", given.get("--check-seqlen-multiple", "1"))
    try:
        return KernelLimits(
            head_dims=head_dims,
            seqlen_multiple=multiple,
            equal_lengths=bool(given.get("--check-equal-lengths")),
            contiguous_only=bool(given.get("--check-contiguous-only")),
            page_sizes=page_sizes,
        )
    except (ValueError, TypeError) as exc:
        raise pytest.UsageError(f"--check-* limits: {exc}") from None


def load_kernel(reference: str) -> None:
    """A usage error unless ``reference`` is "module:function" naming a callable that imports
    (whatever the import raises, ``sys.exit`` included, is its message)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise pytest.UsageError(
            f"--check-kernel {reference!r}: expected MODULE:FUNCTION, e.g. mypkg.attn:my_sdpa"
        )
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (Exception, SystemExit) as exc:  # not KeyboardInterrupt: Ctrl-C stops the run
        raise pytest.UsageError(f"--check-kernel {reference!r}: {first_line(exc)}") from None
    if not callable(found):
        raise pytest.UsageError(
            f"--check-kernel {reference!r}: {attribute} is not callable (its type is "
            f"{type(found).__name__})"
        )


def check_device(device: str) -> None:
    """A usage error unless torch can place a tensor on ``device``."""
    import torch

    try:
        torch.empty(0, device=device)
    except (RuntimeError, ValueError, AssertionError) as exc:
        raise pytest.UsageError(f"--check-device {device!r}: {first_line(exc)}") from None


def plan(options: CheckOptions) -> tuple[Any, ...]:
    """The battery's groups (``plan_groups``), or a usage error naming what it refused."""
    from parity_tests import FEATURES, SPECS, plan_groups

    if options.spec not in SPECS:
        raise pytest.UsageError(f"--check-spec {options.spec!r}: not a spec; one of {list(SPECS)}")
    unknown = sorted((options.features or set()) - set(FEATURES))
    if unknown:
        raise pytest.UsageError(f"--check-features: unknown {unknown}; known: {list(FEATURES)}")
    planned: dict[str, Any] = {} if options.dtypes is None else {"dtypes": options.dtypes}
    try:
        groups = plan_groups(options.spec, features=options.features, cases=options.cases,
                             limits=options.limits, **planned)  # fmt: skip
    except (ValueError, TypeError) as exc:
        raise pytest.UsageError(f"--check-* options: {str(exc).splitlines()[0]}") from None
    return tuple(groups)


def dest(option: str) -> str:
    return option.removeprefix("--").replace("-", "_")


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names in its order, spaces, empty entries and repeats dropped
    (an order that no hash seed changes: every xdist worker must plan the same groups)."""
    return tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))


def integer(option: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise pytest.UsageError(f"{option}: not an integer: {text!r}") from None


def read_seed(text: str) -> int:
    seed = integer("--check-seed", text)
    if not 0 <= seed < SEED_LIMIT:
        raise pytest.UsageError(f"--check-seed: {seed} is outside [0, 2**64)")
    return seed


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise pytest.UsageError(f"--check-timeout: a time limit in seconds > 0, got {text!r}")
    return value


def first_line(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
