"""The linear-attention specs ("fla_gdn", "fla_kda"): their batteries hold what gated-DeltaNet and
KDA kernels got wrong (lengths across 64-token chunks, a one-token sequence among packed ones,
the gate -> 1 and strongly negative, for KDA a gate that differs across key channels, beta
exactly 0 and 1, K != V), their correct targets pass, every KDA pitfall is flagged in float32,
float16 and bfloat16, a kernel is given only the options it claims, a result of the wrong shape
is an error, and what the third-party references and kernels show is pinned.

fla's Triton kernels run under Triton's interpreter only when ``CHECK_FLA_TRITON=1`` is set (with
``TRITON_INTERPRET=1``, which tests/conftest.py sets on a machine without a GPU): slow there, a
few cases each here, the whole battery by the commands of docs/kernel-verification.md
("Linear-attention kernels")."""

from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np
import pytest

from parity_tests import check_kernel
from parity_tests.checker import specs
from parity_tests.checker.battery.linear import (
    CHUNK,
    NEAR_ZERO_GATE,
    NEGATIVE_GATE,
    LinearCase,
    make_linear_inputs,
)
from parity_tests.checker.golden.linear_baseline import plain_gated_delta_rule
from parity_tests.checker.pitfalls.fla_kda import PITFALLS as KDA_PITFALLS
from parity_tests.checker.targets.linear import twin_chunk_gated_delta_rule, twin_chunk_kda

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


def _verdicts(kernel, dtype, features, spec="fla_gdn", cases=None, forward_only=False):
    report = check_kernel(kernel, spec=spec, dtypes=[dtype], features=features, cases=cases,
                          forward_only=forward_only)  # fmt: skip
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


# -- fla_kda ------------------------------------------------------------------------------------

TRITON = pytest.mark.skipif(
    os.environ.get("CHECK_FLA_TRITON") != "1" or os.environ.get("TRITON_INTERPRET") != "1",
    reason="fla's Triton kernels under the interpreter are slow: CHECK_FLA_TRITON=1 runs them",
)


def _kda_cases(*wanted):
    """The first case of fla_kda's battery meeting each predicate, by name."""
    battery = _battery_of("fla_kda")
    return [next(c.name for c in battery if want(c)) for want in wanted]


def _battery_of(spec):
    return specs.get(spec).default_battery()


def _scaled(case):
    return case.scale is not None


def test_kda_gates_are_per_key_channel_and_one_kind_differs_across_channels():
    battery = _battery_of("fla_kda")
    case = next(c for c in battery if c.gate == "channels" and c.tokens > CHUNK)

    g = make_linear_inputs(case, 0).g

    assert g.shape == (case.batch, case.tokens, case.heads, case.k)
    # in one token and head, channels near 0 (nothing forgotten) beside channels wiped
    token = g[0, :, 0]  # (T, K)
    assert ((np.abs(token) <= 2 * abs(NEAR_ZERO_GATE)) & (token == NEGATIVE_GATE).any(-1)[:, None]
            ).any()  # fmt: skip
    # each wiped channel forgets at its own tokens
    wiped = {tuple(np.flatnonzero(token[:, c] == NEGATIVE_GATE)) for c in range(case.k)}
    assert len(wiped - {()}) > 1
    assert {c.gate for c in battery} == {"typical", "near_zero", "negative", "channels"}
    assert all(c.name.startswith("kda-") for c in battery)


def test_the_twin_s_chunked_kda_passes_the_battery_with_every_gradient():
    # float32, where the bounds are tightest against the chunked form's rounding; float16 and
    # bfloat16 by the calibration (docs/pitfalls.md)
    report = check_kernel(twin_chunk_kda, spec="fla_kda", dtypes=["float32"])

    assert report.passed, report.failures
    judged = {row.tensor for row in report.rows if row.verdict == "pass"}
    assert {"out", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state"} <= judged


KDA_FLAGS = [
    pytest.param(name, dtype, id=f"{name}-{dtype}")
    for name, pitfall in sorted(KDA_PITFALLS.items())
    for dtype in ("float32", "float16", "bfloat16")
    if dtype in pitfall.dtypes
]


@pytest.mark.parametrize(("name", "dtype"), KDA_FLAGS)
def test_every_kda_pitfall_is_flagged_on_its_case_in_each_dtype(name, dtype):
    pitfall = KDA_PITFALLS[name]

    report = check_kernel(pitfall.kernel, spec="fla_kda", dtypes=[dtype], cases=[pitfall.case])

    assert (pitfall.case, dtype, pitfall.tensor) in {
        (row.case, row.dtype, row.tensor) for row in report.failures
    }


def test_the_kda_state_in_half_is_a_mistake_only_below_float32():
    assert KDA_PITFALLS["kda_state_in_half"].dtypes == ("float16", "bfloat16")
    assert all(p.dtypes[-3:] == ("float32", "float16", "bfloat16")
               for name, p in KDA_PITFALLS.items() if name != "kda_state_in_half")  # fmt: skip


@pytest.mark.parametrize("name", ["transformers_chunk_kda", "transformers_recurrent_kda",
                                  "transformers_recurrent_gated_delta_rule"])  # fmt: skip
def test_transformers_torch_kda_and_recurrent_gdn_ignore_scale_and_are_right_elsewhere(name):
    # transformers 5.23's Kimi Linear fallbacks (chunk_kimi_delta_attention,
    # recurrent_kimi_delta_attention) and qwen3_next's torch_recurrent_gated_delta_rule, as its
    # torch_chunk_gated_delta_rule above: with K^-0.5 right in float32 (o, final state, every
    # gradient); with scale 0.7 (swallowed by **kwargs) o and the gradients fail, the final
    # state passes. Over the whole battery: 6 scale cases of 20 fail for KDA, 5 of 16 for GDN.
    pytest.importorskip("transformers.models.kimi_linear")
    from parity_tests.checker.targets import linear

    spec = "fla_gdn" if "gated_delta_rule" in name else "fla_kda"
    battery = _battery_of(spec)
    cases = [  # a scale of 0.7 with an initial state; the default scale past a chunk
        next(c.name for c in battery if not c.varlen and c.scale is not None and c.initial_state),
        next(c.name for c in battery if c.scale is None and c.tokens > CHUNK and not c.varlen
             and c.gate == ("channels" if spec == "fla_kda" else "negative")),
    ]  # fmt: skip

    verdicts = _verdicts(getattr(linear, name), "float32", {"initial_state"}, spec, cases)

    assert {v for s, _, v in verdicts if s == "default"} == {"pass"}
    assert ("scale", "out", "fail") in verdicts and ("scale", "final_state", "pass") in verdicts
    assert ("scale", "out", "pass") not in verdicts


def test_fla_s_naive_recurrent_kda_passes_in_float32_and_bfloat16():
    # fla-core 0.6.0's naive_recurrent_kda computes in float32 and returns o in v's dtype (its
    # gated-delta-rule sibling returns float32): every row passes, varlen not claimed
    pytest.importorskip("fla.ops.kda.naive")
    from parity_tests.checker.targets.linear import fla_naive_recurrent_kda

    cases = _kda_cases(lambda c: c.gate == "channels" and c.tokens > CHUNK and not c.varlen,
                       lambda c: c.initial_state and not c.varlen and c.tokens > 1)  # fmt: skip
    for dtype in ("float32", "bfloat16"):
        verdicts = _verdicts(fla_naive_recurrent_kda, dtype, {"initial_state"}, "fla_kda", cases)
        assert {v for _, _, v in verdicts} == {"pass"}


def test_fla_s_naive_chunk_kda_has_nan_gradients_where_a_chunk_s_gate_sum_passes_minus_88():
    # fla-core 0.6.0's naive_chunk_kda forms exp(G_i - G_j) (G the cumulative log-gate) for
    # every pair of a chunk, j > i too, and masks those after the exp: where a channel's gates
    # summed over part of a chunk fall below -88 (the "channels" gate: -20 every 8th token) exp
    # overflows float32 to inf, the forward masks it to 0, and the backward multiplies that inf
    # by 0: dq, dk, dg and dbeta NaN; o, the final state and dv pass (over the whole battery
    # every row of the other gates passes too: with -20 every 32nd token a chunk's sum stays
    # above -88)
    pytest.importorskip("fla.ops.kda.naive")
    from parity_tests.checker.targets.linear import fla_naive_chunk_kda

    (wiped,) = _kda_cases(lambda c: c.gate == "channels" and c.tokens > CHUNK and not c.varlen)
    report = check_kernel(fla_naive_chunk_kda, spec="fla_kda", dtypes=["float32"],
                          features={"initial_state"}, cases=[wiped])  # fmt: skip

    failing = {(row.case, row.tensor, row.verdict) for row in report.failures}
    assert failing == {(wiped, name, "nonfinite") for name in ("dq", "dk", "dg", "dbeta")}
    judged = {(row.case, row.tensor) for row in report.rows if row.verdict == "pass"}
    assert {(wiped, "out"), (wiped, "final_state"), (wiped, "dv")} <= judged


@TRITON
@pytest.mark.parametrize(("spec", "name"), [
    ("fla_kda", "fla_fused_recurrent_kda"),
    ("fla_gdn", "fla_fused_recurrent_gated_delta_rule"),
])  # fmt: skip
def test_fla_s_triton_fused_recurrent_kernels_pass_forward_only_under_the_interpreter(spec, name):
    # fla-core 0.6.0's fused_recurrent_kda and fused_recurrent_gated_delta_rule run under
    # Triton 3.9's interpreter; they have no backward (the KDA one returns no graph, the GDN one
    # raises NotImplementedError), so forward only: o and the final state pass in float32 on
    # every case, varlen and initial_state claimed (here the varlen cases and one with a scale)
    from parity_tests.checker.targets import linear

    battery = _battery_of(spec)
    cases = [c.name for c in battery if c.varlen][:2]
    cases += [next(c.name for c in battery if c.scale is not None and not c.varlen)]

    verdicts = _verdicts(getattr(linear, name), "float32", {"varlen", "initial_state"}, spec,
                         cases, forward_only=True)  # fmt: skip

    assert {(t, v) for _, t, v in verdicts} == {("out", "pass"), ("final_state", "pass")}


@TRITON
@pytest.mark.parametrize("kernel", ["fla.ops.kda:chunk_kda",
                                    "fla.ops.gated_delta_rule:chunk_gated_delta_rule"])  # fmt: skip
def test_fla_s_chunked_triton_kernels_do_not_run_under_the_interpreter(kernel):
    # Triton 3.9's interpreter runs `for i_t in range(NT)` with Python ints, and fla's
    # chunk_gated_delta_rule_fwd_kernel_h_blockdim64 (which chunk_kda calls too) writes
    # i_t.to(tl.int64): an error on the first case, once the autotuner is given one
    # configuration (with several it benchmarks, which needs a GPU driver)
    from triton.runtime.autotuner import Autotuner, KernelInterface

    from parity_tests.checker.running.calls import load_kernel

    found = load_kernel(kernel)
    for module in [m for n, m in sys.modules.items() if n.startswith("fla.")]:
        for value in list(vars(module).values()):
            while isinstance(value, KernelInterface) and not isinstance(value, Autotuner):
                value = getattr(value, "fn", None)
            if isinstance(value, Autotuner):
                value.configs = value.configs[:1]
    spec = "fla_kda" if "kda" in kernel else "fla_gdn"
    case = _battery_of(spec)[0].name

    report = check_kernel(found, spec=spec, dtypes=["float32"], cases=[case])

    assert [row.verdict for row in report.failures] == ["error"]
    assert "has no attribute 'to'" in report.failures[0].detail


# -- the chunk allowance (judge.linear): what a correct chunked kernel may add ----------------


@pytest.mark.parametrize(
    ("varlen", "expected"),
    [(False, 64 * 2.0), (True, 17 * 2.0)],  # batch rows: a 64-token window; packed: 17 at most
)
def test_chunk_allowance_is_twice_eps_times_the_largest_chunk_sum_of_gates(
    monkeypatch, varlen, expected
):
    from parity_tests.checker.judge import linear as judge_linear

    seqlens = (17, 1, 20) if varlen else (100, 100)
    case = LinearCase("c", "fla_gdn", seqlens, varlen, 1, 4, 4)
    tokens = sum(seqlens) if varlen else 100
    g = np.full((1 if varlen else 2, tokens, 1), -0.5)
    g[0, :17] = -2.0  # the packed case's first sequence (a window never spans two sequences)
    if not varlen:
        g[1, :] = -2.0  # row 1: 64 tokens of -2 in a window

    class Drawn:
        pass

    drawn = Drawn()
    drawn.g = g
    monkeypatch.setattr(judge_linear, "make_linear_inputs", lambda case, seed: drawn)

    allowance = judge_linear.chunk_allowance(case, "float32", 0)

    eps = float(np.finfo(np.float32).eps)
    largest = expected if not varlen else max(expected, 20 * 0.5)
    assert allowance == pytest.approx(judge_linear.CHUNK_ALLOWANCE * eps * largest, rel=1e-12)
    assert judge_linear.chunk_allowance(case, "float64", 0) == pytest.approx(
        judge_linear.CHUNK_ALLOWANCE * float(np.finfo(np.float64).eps) * largest, rel=1e-12
    )
