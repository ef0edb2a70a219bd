"""What the failing cases of a check have in common: a planted bug named exactly, conjunctions
found where no single value sets the failing groups apart, the most specific first, dtypes and
decode sizes among the facts, and no diagnosis where the groups do not support one."""

from __future__ import annotations

import pytest
import torch.nn.functional as F

from parity_tests import check_kernel
from parity_tests.checker.report.diagnosis import case_facts, diagnose, sentence
from parity_tests.checker.specs import get


def _wrong_where_m_is_not_a_multiple_of_16_and_not_causal(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
    enable_gqa=False,
):  # fmt: skip
    out = F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                         scale=scale, enable_gqa=enable_gqa)  # fmt: skip
    return out * 1.01 if key.shape[-2] % 16 and not is_causal else out


def test_a_planted_bug_is_named_exactly():
    report = check_kernel(_wrong_where_m_is_not_a_multiple_of_16_and_not_causal,
                          dtypes=["float32"], forward_only=True)  # fmt: skip

    assert not report.passed
    assert sorted(report.diagnosis) == ["M % 16 != 0", "causal = off"]


def _shape(m: int) -> dict[str, int]:
    return {"B": 2, "H": 2, "N": 37, "M": m, "D": 64, "Dv": 64}


# Eighteen cases: causal on or off, three masks, M a multiple of 16 (48, but not of 32) or not.
CASES = {
    f"{causal}-{mask}-{m}": ({"causal": causal, "mask": mask}, _shape(m))
    for causal in ("on", "off")
    for mask in ("none", "bool", "float")
    for m in (113, 48, 97)
}


# One more case, of another head width, that only a check of nearly every case holds apart.
ODD = {"odd": ({"causal": "on", "mask": "none"}, {**_shape(48), "D": 32, "Dv": 32})}


def _diagnose(statuses: dict[tuple[str, str], str]) -> list[str]:
    cases = {**CASES, **ODD}
    factors = {name: values for name, (values, _) in cases.items()}
    shapes = {name: shape for name, (_, shape) in cases.items()}
    return diagnose(statuses, factors, shapes)


def _statuses(wrong, dtypes=("float32",), status="fail") -> dict[tuple[str, str], str]:
    """Each case's group in each dtype: ``status`` where ``wrong(values, M)``, else "pass"."""
    return {
        (name, dtype): status if wrong(values, shape["M"]) else "pass"
        for name, (values, shape) in CASES.items()
        for dtype in dtypes
    }


def test_values_no_single_one_of_which_sets_the_failing_cases_apart_are_named_together():
    statuses = _statuses(lambda values, m: values["causal"] == "off" and m % 16 != 0)

    diagnosis = _diagnose(statuses)

    assert diagnosis == ["causal = off", "M % 16 != 0"]  # held by 9 and 12 cases of 18
    assert sentence(diagnosis) == "every failing case: causal = off and M % 16 != 0"


@pytest.mark.parametrize(
    ("wrong", "diagnosis"),
    [
        (lambda values, m: values["mask"] == "float", ["mask = float"]),
        (lambda values, m: values["mask"] != "none", ["mask != none"]),
        (
            lambda values, m: values["mask"] == "float" and values["causal"] == "on",
            ["mask = float", "causal = on"],
        ),
    ],
    ids=["a-value", "not-a-value", "most-specific-first"],
)
def test_a_value_or_what_it_is_not_most_specific_first(wrong, diagnosis):
    assert _diagnose(_statuses(wrong)) == diagnosis


def test_a_dtype_is_a_value_like_any_other():
    statuses = _statuses(lambda values, m: False, dtypes=("float32", "bfloat16"))
    statuses.update({(name, "bfloat16"): "error" for name in CASES})

    assert _diagnose(statuses) == ["dtype = bfloat16"]


@pytest.mark.parametrize(
    "statuses",
    [
        _statuses(lambda values, m: values["mask"] == "float" and m == 113
                  and values["causal"] == "on"),  # one failing case: all its values "separate" it
        {**_statuses(lambda values, m: True), ("odd", "float32"): "pass"},  # "D = 64": 18 of 19
        {**_statuses(lambda values, m: values["mask"] == "float"),
         ("on-none-48", "float32"): "fail"},  # no few values hold every failing case alone
    ],
    ids=["one-case", "nearly-all", "no-separation"],
)  # fmt: skip
def test_no_diagnosis_where_the_groups_do_not_support_one(statuses):
    assert _diagnose(statuses) == []


def test_groups_not_judged_take_no_part():
    statuses = _statuses(lambda values, m: values["causal"] == "off" and m % 16 != 0)
    statuses.update({("off-none-48", "float32"): "skip", ("off-bool-48", "float32"): "xfail",
                     ("off-float-48", "float32"): "not-run"})  # fmt: skip

    assert _diagnose(statuses) == ["causal = off"]  # no passing case holds it now


def test_a_decode_case_names_its_page_size_queries_new_tokens_and_heads():
    case = next(c for c in get("flash_kvcache").default_battery() if c.page_size == 16)

    facts = case_facts({}, case.shape)

    assert "P = 16" in facts and f"s_q = {case.s_q}" in facts and f"s_new = {case.s_new}" in facts
    assert f"H = {case.heads}" in facts and f"H_kv = {case.heads_kv}" in facts
    assert not any("%" in fact for fact in facts)
