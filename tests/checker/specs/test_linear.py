"""The linear-attention spec ("fla_gdn"): its battery holds what gated-DeltaNet kernels got wrong
(lengths across 64-token chunks, a one-token sequence among packed ones, the gate -> 1 and
strongly negative, beta exactly 0 and 1, K != V), its correct target passes in every dtype, a
kernel is given only the options it claims, a result of the wrong shape is an error, and what
the third-party references show is pinned."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from parity_tests import check_kernel
from parity_tests.checker import specs
from parity_tests.checker.battery.linear import CHUNK, NEGATIVE_GATE, make_linear_inputs
from parity_tests.checker.golden.linear_baseline import plain_gated_delta_rule
from parity_tests.checker.targets.linear import twin_chunk_gated_delta_rule

ALL_DTYPES = ["float64", "float32", "float16", "bfloat16"]


def _battery():
    return specs.get("fla_gdn").default_battery()


def test_lengths_cross_the_chunk_edges_and_varlen_packs_a_one_token_sequence():
    battery = _battery()

    assert {1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 1} <= {c.seqlens[-1] for c in battery}
    packed = [c for c in battery if c.varlen]
    assert packed and all(c.batch == 1 and 1 in c.seqlens and len(c.seqlens) > 1 for c in packed)
    assert any(c.k != c.v for c in battery) and any(c.k == c.v for c in battery)


def test_the_gates_reach_near_zero_and_minus_20_and_beta_reaches_0_and_1():
    battery = _battery()
    drawn = {(c.gate, c.beta): make_linear_inputs(c, 0) for c in battery}

    gates = np.concatenate([d.g.ravel() for d in drawn.values()])
    betas = np.concatenate([d.beta.ravel() for d in drawn.values()])
    assert (np.abs(gates) < 1e-3).any() and (gates == NEGATIVE_GATE).any()
    assert (betas == 0).any() and (betas == 1).any()
    q = next(iter(drawn.values())).q
    assert np.allclose(np.linalg.norm(q, axis=-1), 1.0)  # L2-normalized as the layers make q


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_the_twin_s_chunked_form_passes_the_battery_with_every_gradient(dtype):
    report = check_kernel(twin_chunk_gated_delta_rule, spec="fla_gdn", dtypes=[dtype])

    assert report.passed, report.failures
    judged = {row.tensor for row in report.rows if row.verdict == "pass"}
    assert {"out", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state"} <= judged


def test_the_plain_kernel_of_the_pitfalls_is_correct_without_its_mistake():
    report = check_kernel(plain_gated_delta_rule, spec="fla_gdn", dtypes=["bfloat16"])

    assert report.passed, report.failures


def test_a_kernel_without_varlen_is_never_given_cu_seqlens_and_its_cases_are_not_run():
    given: list[set[str]] = []

    def no_varlen(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
        given.append({"initial_state"} if initial_state is not None else set())
        return twin_chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
                                           output_final_state)  # fmt: skip

    report = check_kernel(no_varlen, spec="fla_gdn", dtypes=["float32"],
                          features={"initial_state"})  # fmt: skip

    assert report.passed and {"initial_state"} in given and set() in given
    not_run = {row.case for row in report.rows if row.verdict == "not-run"}
    assert not_run and all("varlen" in name for name in not_run)


def test_a_result_of_the_wrong_shape_is_an_error_row():
    def transposed_state(q, k, v, g, beta, **options):
        out, final = twin_chunk_gated_delta_rule(q, k, v, g, beta, **options)
        return out, final.transpose(-1, -2)

    case = next(c for c in _battery() if c.k != c.v)
    report = check_kernel(transposed_state, spec="fla_gdn", dtypes=["float32"],
                          cases=[case.name])  # fmt: skip

    assert [row.verdict for row in report.failures] == ["error"]
    assert "final_state" in report.failures[0].detail


def test_a_failing_output_names_the_sequence_and_its_token():
    def last_token_bent(q, k, v, g, beta, **options):
        out, final = twin_chunk_gated_delta_rule(q, k, v, g, beta, **options)
        bent = out.clone()
        bent[:, -1] += 1e-2  # the last token: the last sequence's last
        return bent, final

    case = next(c for c in _battery() if c.varlen)
    report = check_kernel(last_token_bent, spec="fla_gdn", dtypes=["float64"],
                          cases=[case.name])  # fmt: skip

    row = next(row for row in report.failures if row.tensor == "out")
    assert f"sequence {len(case.seqlens) - 1}, token {case.seqlens[-1] - 1}," in row.detail


def _verdicts(kernel, dtype, features):
    report = check_kernel(kernel, spec="fla_gdn", dtypes=[dtype], features=features)
    found: Counter = Counter()
    for row in report.rows:
        if row.verdict != "not-run":
            scale = "scale" if row.case.endswith("-scale") else "default"
            found[scale, row.tensor, row.verdict] += 1
    return set(found)


def test_transformers_torch_chunk_gated_delta_rule_ignores_scale_and_is_right_elsewhere():
    # transformers 5.23's torch body (qwen3_next) takes no scale (its **kwargs swallow it) and no
    # cu_seqlens: with K^-0.5 it is right in float32 (o, final state, every gradient); with another
    # scale o and the gradients fail, the final state (which no scale touches) passes.
    pytest.importorskip("transformers.models.qwen3_next")
    from parity_tests.checker.targets.linear import transformers_chunk_gated_delta_rule

    verdicts = _verdicts(transformers_chunk_gated_delta_rule, "float32", {"initial_state"})

    assert {v for s, _, v in verdicts if s == "default"} == {"pass"}
    assert ("scale", "out", "fail") in verdicts and ("scale", "final_state", "pass") in verdicts
    assert ("scale", "out", "pass") not in verdicts


@pytest.mark.parametrize("name", ["fla_naive_chunk_gated_delta_rule",
                                  "fla_naive_recurrent_gated_delta_rule"])  # fmt: skip
def test_fla_s_naive_references_pass_in_float32_and_return_o_in_float32_for_bfloat16(name):
    # fla-core 0.6.0's references compute in float32 and return o in float32 whatever the inputs:
    # right in float32 (no cu_seqlens: varlen not claimed); in bfloat16 every o is a "dtype" row
    # and the rest passes.
    pytest.importorskip("fla.ops.gated_delta_rule.naive")
    from parity_tests.checker.targets import linear

    kernel = getattr(linear, name)
    assert {v for _, _, v in _verdicts(kernel, "float32", {"initial_state"})} == {"pass"}
    half = _verdicts(kernel, "bfloat16", {"initial_state"})
    assert {v for _, t, v in half if t == "out"} == {"dtype"}
    assert {v for _, t, v in half if t != "out"} == {"pass"}
