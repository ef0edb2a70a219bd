"""The tolerance policy of parity_tests/tolerances.py: each constant admits what correct code
produces and flags what a bug produces, each tensor judged on its own scale.

Per-tensor rule: a bug on the query path of a layer, whose gradients are ~100 times smaller than
the largest gradient of the run, is flagged by the float32 registry run alone; the old rule (every
gradient on the run's largest) let a 1e-4 error there pass. float16: results computed in float32
and rounded once to float16 (the NumPy core's float16 path) are within FLOAT16_RTOL of the float64
golden computed on the same float16 inputs, and a wrong mask is not. Structural-zero floors name
exactly the tensors they should; rel_error keeps its documented contract.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_attention.fused
from numpy_attention.functional import attention_backward, attention_forward
from parity_tests.parity.cases import CASES
from parity_tests.parity.run import case_tensors, make_data, run_case
from parity_tests.tolerances import (
    FLOAT16_RTOL,
    FLOAT32_RTOL,
    at_most_one_key,
    rel_error,
    rtol_for,
    structural_floors,
)
from torch_attention.functional import attention

from ..conftest import assert_close

B, H, N, M, D, DV = 2, 3, 37, 113, 16, 8


def float16_problem(rng: np.random.Generator, option: str):
    """float16 q (B, H, N, D), k (B, H, M, D), v (B, H, M, Dv), dout (B, H, N, Dv), options."""
    q = rng.standard_normal((B, H, N, D)).astype(np.float16)
    k = rng.standard_normal((B, H, M, D)).astype(np.float16)
    v = rng.standard_normal((B, H, M, DV)).astype(np.float16)
    dout = rng.standard_normal((B, H, N, DV)).astype(np.float16)
    options: dict = {}
    if option == "causal":
        options["causal"] = True
    elif option == "padding":
        options["key_padding_mask"] = rng.random((B, M)) < 0.3
    elif option == "dropout":
        options["dropout_p"] = 0.2
        options["dropout_mask"] = rng.random((B, H, N, M)) >= 0.2
    return (q, k, v), dout, options


def run(q, k, v, dout, options) -> dict[str, np.ndarray]:
    out, _, ctx = attention_forward(q, k, v, **options)
    dq, dk, dv = attention_backward(dout, ctx)[:3]
    return {"out": out, "dq": dq, "dk": dk, "dv": dv}


@pytest.mark.parametrize("dtype", [np.float16, "float16", torch.float16])
def test_rtol_for_knows_float16(dtype):
    assert rtol_for(dtype) == FLOAT16_RTOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, "int32"])
def test_rtol_for_refuses_dtypes_without_a_parity_tolerance(dtype):
    with pytest.raises(ValueError, match="kernel checker"):
        rtol_for(dtype)


def test_one_rounding_to_float16_is_within_the_tolerance(rng):
    golden = rng.standard_normal((B, H, N, DV))

    assert_close(golden.astype(np.float16), golden, dtype=np.float16, name="rounded golden")


@pytest.mark.parametrize("option", ["none", "causal", "padding", "dropout"])
def test_the_float16_core_is_within_the_tolerance_of_its_float64_golden(rng, option):
    (q, k, v), dout, options = float16_problem(rng, option)

    results = run(q, k, v, dout, options)
    golden = run(*(t.astype(np.float64) for t in (q, k, v, dout)), options)

    for name, result in results.items():
        assert result.dtype == np.float16, name
        assert_close(result, golden[name], dtype=np.float16, name=name)


def test_the_float16_tolerance_flags_one_query_seeing_one_future_key(rng):
    (q, k, v), dout, _ = float16_problem(rng, "none")
    allowed = np.tril(np.ones((N, M), dtype=bool))  # causal, top-left
    allowed[N - 1, N] = True  # the wrong mask: the last query also sees the next key

    results = run(q, k, v, dout, {"attn_mask": allowed})
    golden = run(*(t.astype(np.float64) for t in (q, k, v, dout)), {"causal": True})

    for name, result in results.items():
        with pytest.raises(AssertionError, match=name):
            assert_close(result, golden[name], dtype=np.float16, name=name)


# -- The per-tensor rule, on the case where the old run-wide rule was loosest -------------------
# In CrossAttention/causal-train-dropout-N5-M7 the query path (dx, Wq) has gradients of ~0.06,
# the largest gradient of the run (d[Wo.bias]) is 6.35: judged on that, the query path was 110
# times looser than FLOAT32_RTOL.
CASE = next(case for case in CASES if case.name == "CrossAttention/causal-train-dropout-N5-M7")
QUERY_PATH = {"dx", "d[Wq.weight]", "d[Wq.bias]"}  # x feeds only the queries in cross attention


class HalfPrecisionGrad(torch.autograd.Function):
    """Identity forward; the backward rounds the gradient to float16, as a kernel that keeps its
    dq accumulator in half precision does."""

    @staticmethod
    def forward(x):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad.to(torch.float16).to(grad.dtype)


def dq_in_float16(q, k, v, **options):
    """Attention whose forward and dk, dv are right, and whose dq is rounded to float16."""
    return attention(HalfPrecisionGrad.apply(q), k, v, **options)


def dq_with_wrong_masks(wrong):
    """Attention whose forward and dk, dv are right, and whose dq is computed with the masks
    ``wrong(options)`` returns: a kernel whose dq pass rebuilds the mask wrongly."""

    def broken(q, k, v, **options):
        right = attention(q.detach(), k, v, **options)  # the output, dk and dv
        query_path = attention(q, k.detach(), v.detach(), **{**options, **wrong(options)})
        return right + (query_path - query_path.detach())  # adds exactly 0; dq from query_path

    return broken


WRONG_MASKS = {
    "causal mask dropped": lambda options: {"causal": False},
    "key padding dropped": lambda options: {"key_padding_mask": None},
    "dropout keep-mask dropped": lambda options: {
        "dropout_mask": torch.ones_like(options["dropout_mask"])
    },
}


def flagged(rows) -> set[str]:
    return {row.tensor for row in rows if not row.passed}


def test_the_correct_layer_passes_the_case_in_float32():
    assert flagged(run_case(CASE, dtype="float32", backend="math")) == set()


def test_a_query_path_bug_far_below_the_runs_largest_gradient_is_flagged(monkeypatch):
    monkeypatch.setattr(torch_attention.fused, "attention", dq_in_float16)

    rows = run_case(CASE, dtype="float32", backend="math")
    tensors = case_tensors(
        CASE, make_data(CASE, "float32"), dtype="float32", device="cpu", backend="math"
    )

    assert flagged(rows) == QUERY_PATH
    # The old rule judged every gradient on the run's largest, and passed this bug (~1e-6 there).
    run_max = max(np.max(np.abs(ref)) for name, (ref, _) in tensors.items() if name != "out")
    for name in QUERY_PATH:
        expected, actual = tensors[name]
        assert rel_error(actual, expected, scale=run_max) <= FLOAT32_RTOL, name


@pytest.mark.parametrize("wrong", WRONG_MASKS.values(), ids=WRONG_MASKS.keys())
def test_a_wrong_mask_on_the_query_path_is_flagged_by_float32_alone(monkeypatch, wrong):
    monkeypatch.setattr(torch_attention.fused, "attention", dq_with_wrong_masks(wrong))

    rows = run_case(CASE, dtype="float32", backend="math")

    assert flagged(rows) == QUERY_PATH


@pytest.mark.parametrize(
    ("allowed", "m", "expected"),
    [
        (None, 1, True),
        (None, 2, False),
        (np.eye(3, 4, dtype=bool), 4, True),
        (np.tri(3, 4, dtype=bool), 4, False),  # causal: query 1 sees keys 0 and 1
        (np.zeros((2, 1, 3, 4), dtype=bool), 4, True),  # every row fully masked
    ],
)
def test_at_most_one_key(allowed, m, expected):
    assert at_most_one_key(allowed, m) is expected


def grads_named(*names):
    """Reference gradients by name, each of its own size (1, 2, 3, ...)."""
    return {name: np.full((2, 3), float(size)) for size, name in enumerate(names, start=1)}


def test_only_the_key_bias_has_a_floor_when_queries_see_several_keys():
    grads = grads_named(
        "dx", "heads.0.W_query.weight", "heads.0.W_key.weight", "heads.0.W_key.bias",
        "heads.1.W_key.weight", "heads.1.W_key.bias", "W_value.bias", "out_proj.bias",
    )  # fmt: skip

    floors = structural_floors(grads, one_key=False)

    # each head's key bias on its own key weight's scale
    assert floors == {"heads.0.W_key.bias": 3.0, "heads.1.W_key.bias": 5.0}


def test_one_key_floors_the_query_and_key_paths_on_the_value_path():
    book = grads_named("dx", "W_query", "W_key", "W_value")
    cross = grads_named("dx", "dy", "Wq.weight", "Wq.bias", "Wkv.weight", "Wo.bias")

    assert structural_floors(book, one_key=True) == {"W_query": 4.0, "W_key": 4.0}
    assert structural_floors(cross, one_key=True) == {
        "dx": 2.0,  # x feeds only the queries of cross attention: floored on dy
        "Wq.weight": 5.0,
        "Wq.bias": 5.0,
    }


# -- rel_error's contract -------------------------------------------------------------------------


def test_rel_error_is_norm_wise_on_the_expected_tensors_own_scale():
    expected = np.array([4.0, -2.0, 0.0])

    assert rel_error(expected + [0.0, 0.0, 0.004], expected) == pytest.approx(1e-3)
    assert rel_error(expected + [0.0, 0.0, 0.004], expected, scale=40.0) == pytest.approx(1e-4)
    assert rel_error(expected + [0.0, 0.0, 0.004], expected, scale=0.4) == pytest.approx(1e-3)


@pytest.mark.parametrize(
    ("actual", "expected", "error"),
    [
        ([0.0, 0.0], [0.0, 0.0], 0.0),  # both exactly zero
        ([1e-20, 0.0], [0.0, 0.0], np.inf),  # nonzero against an all-zero expected, no floor
        ([np.nan, 1.0], [1.0, 1.0], np.inf),  # NaN where expected is finite
        ([np.inf, 1.0], [1.0, 1.0], np.inf),
    ],
)
def test_rel_error_edges(actual, expected, error):
    assert rel_error(np.array(actual), np.array(expected)) == error


@pytest.mark.parametrize("expected", [[np.nan, 1.0], [np.inf, 1.0]])
def test_a_non_finite_expected_is_never_within_a_tolerance(expected):
    assert not rel_error(np.array(expected), np.array(expected)) <= FLOAT16_RTOL


def test_rel_error_refuses_different_shapes():
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        rel_error(np.zeros(2), np.zeros(3))
