"""The attention specs (``specs._attention`` and its subclasses): each calls a kernel with the real
library's signature and layout (flash-attn's ``deterministic=True`` where the kernel claims the
feature), passes a correct kernel, turns a kernel of the wrong layout or lse into a verdict, and
refuses specs, features and cases that do not exist or do not fit."""

from __future__ import annotations

import math

import pytest
import torch

from parity_tests import check_kernel
from parity_tests.checker import specs
from parity_tests.checker.battery.attention.case import Case
from parity_tests.checker.battery.attention.handwritten import NAMED
from parity_tests.checker.specs import get
from parity_tests.checker.targets import adapters

BY_NAME = {case.name: case for case in NAMED}


def test_the_flex_spec_builds_masks_and_mods_for_flexattention():
    from torch.nn.attention.flex_attention import flex_attention

    cases = ["dead-rows-float", "window-tl", "alibi-bh-causal", "softcap", "gqa-1of4-causal"]

    report = check_kernel(flex_attention, spec="flex", dtypes=["float32"], cases=cases,
                          forward_only=True)  # fmt: skip

    assert report.passed, report.failures
    assert {row.tensor for row in report.rows} == {"out", "lse"}


@pytest.mark.parametrize("spec", ["flash", "flash_varlen"])
def test_each_spec_runs_the_cases_it_can_express(spec):
    names = {case.name for case in NAMED if get(spec).cannot_express(case) is None}

    assert {"causal-br-n<m", "decode-n1", "window-br", "softcap", "alibi-bh-causal"} <= names
    assert {"dropout"} <= names  # judged by draws: flash-attn returns no mask
    assert not names & {"causal-n<m", "bool-mask", "window-tl"}
    assert ("varlen" in names) == (spec == "flash_varlen")


def test_sdpa_runs_top_left_causal_and_gqa_and_nothing_it_has_no_argument_for():
    names = {c.name for c in NAMED if get("sdpa").cannot_express(c) is None}

    assert {"causal-n<m", "gqa-2of4", "dropout", "bool-mask"} <= names
    assert not names & {"causal-br-n<m", "window-causal", "softcap", "alibi-h", "varlen"}


def test_sdpa_takes_a_mask_or_is_causal_and_flex_both():
    both = Case("both", 1, 2, 9, 9, 8, causal=True, mask="bool")

    assert "not both" in get("sdpa").cannot_express(both)
    assert get("flex").cannot_express(both) is None


@pytest.mark.parametrize("spec", ["sdpa", "flash", "flash_varlen", "flex"])
def test_every_spec_runs_its_own_default_battery(spec):
    assert all(get(spec).cannot_express(case) is None for case in get(spec).default_battery())


@pytest.mark.parametrize("name", ["causal-br-n>m", "gqa-2of4", "dv<d"])
@pytest.mark.parametrize("spec", ["flash", "flash_varlen"])
def test_layout_round_trips(spec, name):
    case = BY_NAME[name]
    q = torch.randn(case.batch, case.heads, case.n, case.d)

    moved = get(spec).layout(case, q)

    assert moved.shape[-2:] == (case.heads, case.d)
    assert torch.equal(get(spec).unlayout(case, moved, case.heads), q)


def _sdpa_layout(q, k, v, **kwargs):
    """flash-attn's signature, but the output left in SDPA's (B, H, N, D) layout."""
    out, lse, _ = adapters.flash_attn_func(q, k, v, **kwargs)
    return out.transpose(1, 2), lse, None


def _bf16_lse(q, k, v, **kwargs):
    out, lse, _ = adapters.flash_attn_func(q, k, v, **kwargs)
    return out, lse.to(q.dtype), None


def _finite_dead_lse(q, k, v, **kwargs):
    out, lse, _ = adapters.flash_attn_func(q, k, v, **kwargs)
    return out, torch.nan_to_num(lse, neginf=0.0), None


def _plus_inf_dead_lse(q, k, v, **kwargs):
    out, lse, _ = adapters.flash_attn_func(q, k, v, **kwargs)
    return out, torch.where(torch.isneginf(lse), math.inf, lse), None


@pytest.mark.parametrize(
    ("kernel", "dtype", "verdict", "detail"),
    [
        (_sdpa_layout, "float32", "error", "expected a tensor of shape (1, 37, 2, 64)"),
        (_bf16_lse, "bfloat16", "dtype", "lse is bfloat16, the libraries return float32"),
        (_finite_dead_lse, "float32", "fail", "must have lse -inf"),
    ],
)
def test_a_kernel_of_the_wrong_layout_or_lse_gets_a_failing_verdict(kernel, dtype, verdict, detail):
    report = check_kernel(kernel, spec="flash", dtypes=[dtype], cases=["causal-br-n>m"]
                          if verdict == "fail" else ["causal-br-n<m"])  # fmt: skip

    assert verdict in {row.verdict for row in report.failures}
    assert any(detail in row.detail for row in report.failures)
    assert not report.passed


def test_plus_inf_on_a_dead_row_is_accepted_as_flash_attn_writes_it():
    report = check_kernel(_plus_inf_dead_lse, spec="flash", dtypes=["float32"],
                          cases=["causal-br-n>m"])  # fmt: skip

    assert report.passed, report.failures


def _mutates_offsets(q, k, v, cu_seqlens_q, cu_seqlens_k, *args, **kwargs):
    out = adapters.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, *args, **kwargs)
    cu_seqlens_q[1] += 1  # reused as scratch space after the call
    return out


def test_a_varlen_kernel_that_changes_its_offsets_is_caught():
    report = check_kernel(_mutates_offsets, spec="flash_varlen", dtypes=["float32"],
                          cases=["varlen"])  # fmt: skip

    (row,) = [row for row in report.rows if row.verdict == "inplace"]
    assert row.tensor == "cu_seqlens_q" and row.error == 1.0
    assert not report.passed


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"spec": "xformers"}, "spec must be one of"),
        ({"features": ["causal", "telepathy"]}, "unknown features"),
        ({"spec": "sdpa", "features": ["lse"]}, "cannot express the features"),
        ({"spec": "flash", "cases": ["causal-n<m"]}, "aligns causal, windows and ALiBi bottom"),
        ({"spec": "sdpa", "cases": ["varlen"]}, "packed sequences need the flash_varlen spec"),
        ({"world_size": 2}, "world_size is not an argument of the flash spec"),
    ],
)
def test_specs_features_and_cases_that_do_not_exist_or_fit_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_kernel(adapters.flash_attn_func, dtypes=["float32"], **{"spec": "flash", **kwargs})


def test_features_must_be_a_collection_of_names():
    with pytest.raises(TypeError, match="collection of names"):
        specs.resolve_features("flash", "causal")


def test_a_case_needing_undeclared_features_is_not_run_and_never_passes():
    cases = ["causal-br-n<m", "softcap", "alibi-h"]

    report = check_kernel(adapters.flash_attn_func, spec="flash", dtypes=["float32"],
                          features={"causal"}, cases=cases)  # fmt: skip

    assert report.groups == {
        ("causal-br-n<m", "float32"): "pass",
        ("softcap", "float32"): "not-run",
        ("alibi-h", "float32"): "not-run",
    }
    assert report.passed and report.coverage == pytest.approx(1 / 3)
    assert report.summary == (
        "pass: 1 of 3 case-dtype groups judged (33%), 2 not run (features not declared)"
    )
    assert "lse" not in {row.tensor for row in report.rows}


def test_a_packed_case_is_built_from_lengths_never_offsets():
    with pytest.raises(ValueError, match="lengths >= 0"):
        Case("bad", 2, 1, 3, 3, 4, seqlens=((5, 1), (-2, 2)))
    with pytest.raises(ValueError, match="must be S, T_q, T_k"):
        Case("bad", 2, 1, 3, 9, 4, seqlens=((1, 1), (2, 2)))


def test_flexattention_in_float64_gets_its_alibi_bias_formed_in_float64():
    # The flex spec's score_mod formed -slope * |p_i - j| in float32: FlexAttention in float64
    # then failed every ALiBi case by 1e-8 of the output (the float64 calibration, every seed).
    from parity_tests.checker.targets.builtin import builtin_targets

    flex = next(t for t in builtin_targets("cpu", ("float64",)) if t.name == "flex")

    report = flex.check("cpu", ["alibi-128x129-d64"], 0)

    assert report.passed, report.failures


@pytest.mark.parametrize(
    ("spec", "library"),
    [("flash", adapters.flash_attn_func), ("flash_varlen", adapters.flash_attn_varlen_func)],
)
def test_flash_attn_gets_deterministic_true_when_the_kernel_claims_it(spec, library):
    seen = []

    def kernel(*args, **kwargs):
        seen.append(kwargs.get("deterministic", False))
        return library(*args, **kwargs)

    claimed = check_kernel(kernel, spec=spec, dtypes=["float32"], cases=["softcap"],
                           features={"softcap", "deterministic"})  # fmt: skip
    calls = len(seen)  # the call and the second call, which runs the backward too
    unclaimed = check_kernel(kernel, spec=spec, dtypes=["float32"], cases=["softcap"],
                             features={"softcap"})  # fmt: skip

    assert claimed.passed and unclaimed.passed
    assert seen[:calls] == [True, True] and seen[calls:] == [False, False]
