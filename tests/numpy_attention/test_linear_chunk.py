"""numpy_attention.linear_chunk: the chunk form of the gated delta rule, KDA and simple GLA equal to
the recurrent form to FORMS_RTOL (out, the final state and every gradient, T a multiple of the
chunk or not, and packed sequences), and at extreme gates (g = 0, and -20, whose cumulative decay
underflows within a chunk) finite and equal to the recurrence. The inputs and the recurrence
written out per head are test_linear_attention.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention import linear_attention as la
from parity_tests.tolerances import rel_error

from ..conftest import assert_close
from .test_linear_attention import (
    CU_SEQLENS,
    FORMS,
    VARIANTS,
    B,
    H,
    V,
    grads_of,
    inputs,
    recurrence,
    run,
    state,
)


def assert_forms_equal(recurrent, chunk, name):
    error = rel_error(chunk, recurrent)
    assert error <= la.FORMS_RTOL, f"{name}: recurrent vs chunk {error:.3e} > {la.FORMS_RTOL:.0e}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    ("tokens", "chunk_size", "cu_seqlens"),
    [(1, 16, None), (16, 16, None), (37, 16, None), (70, 16, None), (70, 64, None),
     (13, 4, CU_SEQLENS), (40, 16, np.array([0, 1, 18, 19, 40]))],
)  # fmt: skip
def test_recurrent_equals_chunk(rng, variant, tokens, chunk_size, cu_seqlens):
    """out, final_state and every gradient, T a multiple of the chunk or not, and varlen."""
    batch = 1 if cu_seqlens is not None else B
    arrays = inputs(rng, variant, batch=batch, tokens=tokens)
    s0 = state(rng, batch if cu_seqlens is None else len(cu_seqlens) - 1)
    dout = rng.standard_normal((batch, tokens, H, V))
    dfinal = rng.standard_normal(s0.shape)
    kwargs = {"initial_state": s0, "output_final_state": True, "cu_seqlens": cu_seqlens,
              "chunk_size": chunk_size}  # fmt: skip

    results = {form: run(variant, arrays, form=form, **kwargs) for form in FORMS}
    grads = {form: grads_of(variant, results[form], dout, dfinal) for form in FORMS}

    assert_forms_equal(results["recurrent"].out, results["chunk"].out, "out")
    assert_forms_equal(results["recurrent"].final_state, results["chunk"].final_state, "final")
    for name, recurrent, chunk in zip(la.LinearGrads._fields, *grads.values(), strict=True):
        if recurrent is not None:
            assert_forms_equal(recurrent, chunk, name)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("gate", [-1e-9, 0.0, -20.0])
def test_extreme_gates_stay_finite_and_forms_agree(rng, variant, gate):
    """a -> 1 (g = 0: no forgetting) and a = exp(-20) (the state all but erased each token, its
    cumulative decay underflowing to 0 within a chunk of 64) keep every value finite."""
    arrays = inputs(rng, variant, tokens=70, gate=gate)
    s0 = state(rng)
    dout, dfinal = rng.standard_normal((B, 70, H, V)), rng.standard_normal(s0.shape)
    kwargs = {"initial_state": s0, "output_final_state": True}

    results = {form: run(variant, arrays, form=form, **kwargs) for form in FORMS}
    grads = {form: grads_of(variant, results[form], dout, dfinal) for form in FORMS}

    out, final = recurrence(*arrays, initial_state=s0)
    for form in FORMS:
        assert_close(results[form].out, out, name=f"{form} out")
        assert_close(results[form].final_state, final, name=f"{form} final_state")
        assert all(np.all(np.isfinite(x)) for x in grads[form] if x is not None)
    for name, recurrent, chunk in zip(la.LinearGrads._fields, *grads.values(), strict=True):
        if recurrent is not None:
            assert_forms_equal(recurrent, chunk, name)
