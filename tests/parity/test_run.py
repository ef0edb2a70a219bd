"""parity_tests/parity/run.py on every registry case: NumPy layer vs torch layer, output and every
gradient, by name.

float64 within FLOAT64_RTOL, float32 within FLOAT32_RTOL (parity_tests/tolerances.py), each tensor
on its own scale, on each torch backend the case can use, on CPU and (when present) CUDA; which
cases see one key per query (the structural zeros of tolerances.structural_floors).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_tests.parity.cases import CASES, LayerCase
from parity_tests.parity.run import (
    BACKENDS,
    DTYPES,
    build_layers,
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


def test_every_row_carries_the_shape_of_its_tensor():
    case = next(c for c in CASES if c.layer == "CrossAttention")

    rows = {row.tensor: row.shape for row in run_case(case, dtype="float64", backend="math")}

    assert rows["out"] == rows["dx"] == (case.batch, case.n, case.width)
    assert rows["dy"] == (case.batch, case.m, case.width)
    assert rows["d[Wkv.weight]"] == (2 * case.width, case.width)


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


GROUPED = [case for case in CASES if case.layer == "GroupedQueryAttention"]


def test_left_padding_passes_the_positions_a_tokenizer_gives():
    case = next(case for case in GROUPED if case.padded and not case.train)

    data = make_data(case, "float64")

    padding = data.forward_kwargs["key_padding_mask"]
    assert padding[-1, 0] and not padding[:-1].any()  # the last element is padded on the left
    first_real = int(np.argmin(padding[-1]))
    assert data.forward_kwargs["positions"][-1, first_real] == 0
    assert (data.forward_kwargs["positions"][0] == np.arange(case.n)).all()


def test_parameters_that_start_constant_are_drawn_at_random():
    case = next(case for case in GROUPED if dict(case.kwargs).get("sinks"))

    np_layer, torch_layer = build_layers(case, "float64", "cpu", "math")

    assert len(np.unique(np_layer.state_dict()["sinks"])) == case.heads
    assert np.array_equal(torch_layer.sinks.detach().numpy(), np_layer.state_dict()["sinks"])


def test_one_key_per_query_reads_the_window():
    window = dict(GROUPED[0].kwargs) | {"window": (0, 0)}
    case = LayerCase(
        "test", "GroupedQueryAttention", (16, 4, 2), 16, 4, kwargs=tuple(window.items())
    )
    wider = LayerCase(
        "test", "GroupedQueryAttention", (16, 4, 2), 16, 4, kwargs=(("window", (1, 0)),)
    )

    assert one_key_per_query(case, make_data(case, "float64")) is True
    assert one_key_per_query(wider, make_data(wider, "float64")) is False
