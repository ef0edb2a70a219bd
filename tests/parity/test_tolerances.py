"""The tolerance policy of parity_tests/tolerances.py: each constant admits what correct code
produces and flags what a bug produces.

float16: results computed in float32 and rounded once to float16 (the NumPy core's float16 path)
are within FLOAT16_RTOL of the float64 golden computed on the same float16 inputs, and a wrong
mask is not.

Tests: tests/parity/test_tolerances.py (this file).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numpy_attention.functional import attention_backward, attention_forward
from parity_tests.tolerances import FLOAT16_RTOL, rtol_for

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
