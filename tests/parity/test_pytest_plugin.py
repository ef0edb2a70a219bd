"""The kernel checker as a pytest plugin (parity_tests/pytest_plugin.py), run by pytester: one item
per (case, dtype) group under the documented node ids, verdicts as passes, failures and skips, the
coverage item, usage errors (exit status 4, one line), and nothing at all without
``--check-kernel``.

The runs are in this process (torch is imported once), with pytest-xdist's workers in their own;
the plain run, whose imports are the point, is a subprocess. The runs in this process leave out
hypothesis' plugin: its summary imports hypothesis anew in each of them (seconds). The kernels:
``torch.nn.functional.scaled_dot_product_attention`` (correct) and
tests/parity/pytest_plugin_kernels.py (broken ones).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from parity_tests import Group, KernelLimits, plan_groups
from parity_tests.pytest_plugin import coverage_gap
from tests.parity import pytest_plugin_kernels

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
SDPA = "torch.nn.functional:scaled_dot_product_attention"
KERNELS = pytest_plugin_kernels.__name__
WRONG_SCALE = f"{KERNELS}:wrong_scale"
QUICK = ("--check-cases", "quick", "--check-dtypes", "float32")
INNER = ("-p", "no:hypothesispytest")


def run(pytester, *args):
    """pytest run in this process with ``args``: its output and exit status."""
    return pytester.runpytest_inprocess(*args, *INNER)


def outcomes(pytester, *args) -> dict[str, tuple[str, str]]:
    """pytest run in this process with ``args``: (outcome, message) of each item run, by node
    id (a skip's message is its reason)."""
    found = {}
    for report in pytester.inline_run(*args, *INNER).getreports("pytest_runtest_logreport"):
        if report.when == "call" or report.outcome != "passed":
            message = report.longrepr[2] if report.skipped else str(report.longrepr or "")
            found[report.nodeid] = (report.outcome, message)
    return found


def node_ids(groups, spec: str = "sdpa") -> list[str]:
    """The documented node ids: ``check[SPEC]::CASE[DTYPE]`` per group, then the coverage item."""
    return [f"check[{spec}]::{g.case}[{g.dtype}]" for g in groups] + [f"check[{spec}]::coverage"]


def selectable(groups) -> list:
    """The groups whose case names ``-k`` takes (its words hold no "<" or ">", as "dv<" does)."""
    return [group for group in groups if re.fullmatch(r"[\w.-]+", group.case)]


def test_one_item_per_group_under_the_documented_node_ids(pytester):
    groups = plan_groups("sdpa", dtypes=["float32", "float16"], cases="quick")

    result = run(
        pytester, "--check-kernel", SDPA, "--check-cases", "quick",
        "--check-dtypes", "float32,float16", "--collect-only", "-q",
    )  # fmt: skip

    assert result.ret == pytest.ExitCode.OK
    assert [line for line in result.outlines if line.startswith("check[")] == node_ids(groups)


def test_a_correct_kernel_passes_every_group_and_the_coverage(pytester):
    groups = plan_groups("sdpa", dtypes=["float32"], cases="quick")

    found = outcomes(pytester, "--check-kernel", SDPA, *QUICK)

    assert all(group.runs for group in groups)
    assert found == dict.fromkeys(node_ids(groups), ("passed", ""))


def test_a_broken_kernel_fails_with_its_rows_verdicts_and_error_over_bound(pytester):
    groups = plan_groups("sdpa", dtypes=["float32"], cases="quick")
    case = selectable(groups)[0].case

    result = run(pytester, "--check-kernel", WRONG_SCALE, *QUICK, "-k", f"{case} or coverage")

    result.assert_outcomes(passed=1, failed=1, deselected=len(groups) - 1)
    result.stdout.fnmatch_lines([
        f"*check[[]sdpa[]]::{case}[[]float32[]]*",
        f"{case} float32: out fail, dq fail, dk fail, dv fail",
        f"{WRONG_SCALE} (sdpa spec, cpu), B=* H=* N=* M=* D=* Dv=*:",
        "  out    fail      error *e-0* / bound *e-0*",
        "  dq     fail      error *e-0* / bound *e-0*",
        "  dk     fail      error *e-0* / bound *e-0*",
        "  dv     fail      error *e-0* / bound *e-0*",
        f"FAILED check[[]sdpa[]]::{case}[[]float32[]] - Failed: *",
    ])  # fmt: skip


def test_forward_only_and_the_seed_reach_check_kernel(pytester):
    case = selectable(plan_groups("sdpa", dtypes=["float32"], cases="quick"))[0].case
    args = ("--check-kernel", WRONG_SCALE, *QUICK, "-k", case)

    forward = run(pytester, *args, "--check-forward-only")
    seeds = [run(pytester, *args, "--check-seed", seed) for seed in ("0", "1")]

    forward.stdout.fnmatch_lines([f"{case} float32: out fail"])
    first, second = ([line for line in r.outlines if line.startswith("  out ")] for r in seeds)
    assert first and second and first != second  # other inputs, other errors


def test_k_selects_x_stops_at_the_first_failure_and_lf_reruns_it(pytester):
    groups = plan_groups("sdpa", dtypes=["float32"], cases="quick")
    plain = [g for g in groups if "plain" in g.case]

    selected = run(pytester, "--check-kernel", SDPA, *QUICK, "-k", "plain", "--collect-only", "-q")
    stopped = run(pytester, "--check-kernel", WRONG_SCALE, *QUICK, "-x")
    again = run(pytester, "--check-kernel", WRONG_SCALE, *QUICK, "--lf")

    assert plain
    assert [line for line in selected.outlines if line.startswith("check[")] == node_ids(plain)[:-1]
    stopped.assert_outcomes(failed=1)
    again.assert_outcomes(failed=1, deselected=len(groups))
    again.stdout.fnmatch_lines(["run-last-failure: rerun previous 1 failure*"])


def test_groups_not_run_and_kernel_opt_outs_are_skips_with_their_reasons(pytester):
    groups = plan_groups("sdpa", features={"mask", "causal"}, dtypes=["float32"], cases="quick")
    not_run = [g for g in groups if not g.runs]
    causal = [g for g in groups if g.runs and "causal" in g.needs and "mask" not in g.needs]

    found = outcomes(
        pytester, "--check-kernel", f"{KERNELS}:no_causal_no_mask", *QUICK,
        "--check-features", "mask,causal",
    )  # fmt: skip

    assert not_run and causal
    for group, nodeid in zip(not_run, node_ids(not_run), strict=False):
        assert found[nodeid] == ("skipped", f"Skipped: not run: {group.detail}")
    for nodeid in node_ids(causal)[:-1]:
        assert found[nodeid] == (
            "skipped",
            "Skipped: skip: causal attention is not implemented here",
        )


def test_an_exception_fails_its_group_with_its_first_line_and_traceback(pytester):
    groups = plan_groups("sdpa", features={"mask"}, dtypes=["float32"], cases="quick")
    masked = next(g for g in selectable(groups) if g.runs and g.needs == {"mask"})

    result = run(
        pytester, "--check-kernel", f"{KERNELS}:no_causal_no_mask", *QUICK,
        "--check-features", "mask", "-k", masked.case,
    )  # fmt: skip

    result.assert_outcomes(failed=1, deselected=len(groups))
    result.stdout.fnmatch_lines([
        f"{masked.case} float32: error",
        "  -      error     -  * RuntimeError: masks are not implemented here",
        "  exception #1 (RuntimeError): masks are not implemented here",
        "*Captured kernel exception #1 call*",
        "*in no_causal_no_mask*",
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("options", "outcome", "named"),
    [
        # every claim exercised by a group that runs
        ((), "passed", ""),
        # flash claims lse by default: asked for in every call, so any group that runs covers it
        (("--check-spec", "flash"), "passed", ""),
        # (one head width, where no group has Dv != D and "dv" is claimed by default, is a
        # usage error before any group: test_bad_options_are_a_usage_error_of_one_line_naming_them)
        (("--check-head-dims", "64", "--check-features", "mask,causal,dropout,gqa"), "passed", ""),
    ],
)
def test_coverage_fails_for_a_claim_no_group_that_runs_exercises(pytester, options, outcome, named):
    found = outcomes(pytester, "--check-kernel", WRONG_SCALE, *QUICK, *options, "-k", "coverage")

    [(result, message)] = found.values()
    assert result == outcome
    assert named in message


@pytest.mark.parametrize(
    ("claimed", "runs", "gap"),
    [
        ({"mask", "lse"}, (True, False), ""),  # lse: asked for in every call that runs
        ({"mask", "dv"}, (False, True), "not covered: mask, claimed, but no group that runs"),
        ({"mask", "dv", "gqa"}, (True, False), "not covered: dv, gqa, claimed, but no group"),
        (set(), (False, False), "no group runs, so no claim is checked: none"),
    ],
)
def test_coverage_gap_names_the_claims_no_group_that_runs_needs(claimed, runs, gap):
    groups = [
        Group("bool-mask", "float32", runs[0], "", frozenset({"mask"})),
        Group("gqa-dv", "float32", runs[1], "", frozenset({"gqa", "dv"})),
    ]

    found = coverage_gap(frozenset(claimed), groups)

    assert found.startswith(gap) and bool(found) == bool(gap)


def test_limits_leave_groups_outside_them_not_run(pytester):
    limits = KernelLimits(head_dims=(64, 128))
    outside = next(
        g
        for g in selectable(plan_groups("sdpa", dtypes=["float32"], cases="quick", limits=limits))
        if not g.runs
    )

    found = outcomes(pytester, "--check-kernel", SDPA, *QUICK, "--check-head-dims", "64,128",
                     "-k", outside.case)  # fmt: skip

    assert found == {node_ids([outside])[0]: ("skipped", f"Skipped: not run: {outside.detail}")}
    assert "outside the kernel's limits" in outside.detail


def test_a_case_that_limits_add_is_judged_alone(pytester):
    limits = KernelLimits(head_dims=(64, 128))
    groups = plan_groups("sdpa", dtypes=["float32"], cases="quick", limits=limits)
    instead = next(g for g in selectable(groups) if g.runs and f"judged instead: {g.case}" in
                   " ".join(group.detail for group in groups))  # fmt: skip

    found = outcomes(pytester, "--check-kernel", SDPA, *QUICK, "--check-head-dims", "64,128",
                     "-k", instead.case)  # fmt: skip

    assert found == {node_ids([instead])[0]: ("passed", "")}


def test_options_check_kernel_refuses_fail_each_group_with_its_message(pytester):
    case = plan_groups("ring", dtypes=["float32"], cases="quick")[0].case

    found = outcomes(
        pytester, "--check-kernel", SDPA, "--check-spec", "ring", *QUICK, "--check-isolate",
        "-k", case,
    )  # fmt: skip

    [(outcome, message)] = found.values()
    assert outcome == "failed"
    assert message.startswith("check_kernel refused to run this group: the ring spec")


def test_a_kernel_in_the_invocation_directory_is_found(pytester):
    pytester.makepyfile(local_kernel=Path(pytest_plugin_kernels.__file__).read_text())

    result = run(pytester, "--check-kernel", "local_kernel:wrong_scale", *QUICK, "--collect-only")

    assert result.ret == pytest.ExitCode.OK


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (("--check-kernel", "nosuch:fn"), "--check-kernel 'nosuch:fn': ModuleNotFoundError"),
        (("--check-kernel", "nosuch"), "--check-kernel 'nosuch': expected MODULE:FUNCTION"),
        (("--check-kernel", f"{KERNELS}:SCALE_ERROR"), "SCALE_ERROR is not callable"),
        (("--check-kernel", SDPA, "--check-spec", "nosuch"), "--check-spec 'nosuch'"),
        (("--check-kernel", SDPA, "--check-features", "mask,nosuch"), "unknown ['nosuch']"),
        (("--check-kernel", SDPA, "--check-features", "window"), "features ['window']"),
        (("--check-kernel", SDPA, "--check-dtypes", "float8"), "got 'float8'"),
        (("--check-kernel", SDPA, "--check-cases", "nosuch"), "got 'nosuch'"),
        (("--check-kernel", SDPA, "--check-head-dims", "16,x"), "--check-head-dims: not an"),
        (("--check-kernel", SDPA, "--check-seqlen-multiple", "0"), "seqlen_multiple must be"),
        (("--check-kernel", SDPA, "--check-head-dims", "64"), "claimed feature(s) dv: drop"),
        (("--check-kernel", SDPA, "--check-seed", "-1"), "--check-seed: -1 is outside"),
        (("--check-kernel", SDPA, "--check-timeout", "5"), "add --check-isolate"),
        (("--check-kernel", SDPA, "--check-isolate", "--check-timeout", "0"), "got '0'"),
        (("--check-kernel", SDPA, "--check-device", "nosuch"), "--check-device 'nosuch'"),
        (("--check-spec", "flash", "--check-forward-only"), "--check-spec, --check-forward-only"),
    ],
)
def test_bad_options_are_a_usage_error_of_one_line_naming_them(pytester, options, named):
    result = run(pytester, *options)

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    [line] = [line for line in result.errlines if line.strip()]
    assert line.startswith("ERROR: ") and named in line
    assert not [line for line in result.outlines if line.strip()]


def test_without_check_kernel_the_plugin_adds_nothing_and_imports_no_torch(pytester):
    pytester.makepyfile(
        test_trivial="""
        import sys

        def test_trivial():
            assert "torch" not in sys.modules
            assert "parity_tests.checker" not in sys.modules
        """
    )

    result = pytester.runpytest_subprocess("-v", *INNER)
    without = pytester.runpytest_subprocess("-v", *INNER, "-p", "no:parity_tests")

    def plain(lines: list[str]) -> list[str]:  # no plugin list, no time taken
        return [re.sub(r" in [\d.]+s ", " ", line) for line in lines if "plugins:" not in line]

    result.assert_outcomes(passed=1)
    assert any("attention-parity" in line for line in result.outlines if "plugins:" in line)
    assert plain(result.outlines) == plain(without.outlines)


def test_xdist_workers_collect_the_same_items_and_junitxml_reports_them(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers import the kernels' module
    # claimed features, built into a battery: in each worker, whatever its hash seed
    groups = plan_groups("sdpa", features={"mask", "causal"}, dtypes=["float32"], cases="quick")
    chosen = selectable([g for g in groups if g.runs])[:2]

    result = run(
        pytester, "--check-kernel", WRONG_SCALE, *QUICK, "--check-features", "causal,mask",
        "-n", "2", "-k", " or ".join(g.case for g in chosen), "--junitxml=report.xml",
    )  # fmt: skip

    assert len(chosen) == 2
    result.assert_outcomes(failed=len(chosen))
    cases = ET.parse(pytester.path / "report.xml").getroot().iter("testcase")
    found = {(case.get("classname"), case.get("name")): case.find("failure") for case in cases}
    assert set(found) == {("check[sdpa]", f"{g.case}[float32]") for g in chosen}
    assert all("out fail" in failure.get("message") for failure in found.values())
