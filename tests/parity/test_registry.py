"""Every registry case: NumPy layer vs torch layer, output and every gradient, by name.

float64 within FLOAT64_RTOL, float32 within FLOAT32_RTOL (parity_tests/tolerances.py), each tensor
on its own scale, on each torch backend the case can use, on CPU and (when present) CUDA; which
cases see one key per query (the structural zeros of tolerances.structural_floors).
"""

from __future__ import annotations

import pytest
import torch

from parity_tests.registry import (
    BACKENDS,
    CASES,
    DTYPES,
    LayerCase,
    make_data,
    one_key_per_query,
    run_case,
)

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device present"),
    ),
]
RUNS = [
    pytest.param(case, backend, id=f"{case.name}-{backend}")
    for case in CASES
    for backend in BACKENDS
    if case.applies_to(backend)
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("case", "backend"), RUNS)
def test_layer_parity(case, backend, dtype, device):
    rows = run_case(case, dtype=dtype, device=device, backend=backend)

    failed = [f"{r.tensor}: {r.error:.3e} > {r.bound:.1e}" for r in rows if not r.passed]
    assert not failed, f"{case.name} [{dtype}, {backend}, {device}]: " + "; ".join(failed)
    names = {row.tensor for row in rows}
    assert {"out", "dx"} <= names and (not case.spec.cross or "dy" in names)


def test_every_layer_is_in_the_registry():
    from parity_tests.registry import LAYERS

    assert {case.layer for case in CASES} == set(LAYERS) and len(LAYERS) == 10


def test_every_option_is_covered():
    assert any(c.padded for c in CASES) and any(c.train for c in CASES)
    assert any(c.batch is None for c in CASES) and any(c.batch == 1 for c in CASES)
    assert any(c.m is not None and c.m != c.n for c in CASES)
    assert any(c.n in (37, 113) or c.m in (37, 113) for c in CASES)
    assert any(c.heads == 1 and c.spec.module == "fused" for c in CASES)
    assert any(dict(c.kwargs).get("causal") for c in CASES)


@pytest.mark.parametrize(
    ("causal", "n", "m", "expected"),
    [
        (False, 5, 1, True),  # one key
        (False, 5, 7, False),
        (True, 1, 7, True),  # causal, top-left: the one query sees key 0 only
        (True, 5, 7, False),  # query 0 sees one key, the others more
    ],
)
def test_one_key_per_query(causal, n, m, expected):
    case = LayerCase("test", "CrossAttention", (8, 2), 8, 2, n=n, m=m, kwargs=(("causal", causal),))

    assert one_key_per_query(case, make_data(case, "float64")) is expected


def test_one_key_per_query_reads_the_padding_mask():
    case = LayerCase("test", "CrossAttention", (8, 2), 8, 2, n=5, m=3, padded=True)
    data = make_data(case, "float64")
    data.forward_kwargs["mask"][:] = [True, False, True]  # every element keeps key 1 only

    assert one_key_per_query(case, data) is True
