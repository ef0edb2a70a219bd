"""Every registry case: NumPy layer vs torch layer, output and every gradient, by name.

float64 within FLOAT64_RTOL, float32 within FLOAT32_RTOL (parity_tests/tolerances.py), each tensor
on its own scale, on each torch backend the case can use, on CPU and (when present) CUDA; which
cases see one key per query (the structural zeros of tolerances.structural_floors).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_tests.registry import (
    BACKENDS,
    CASES,
    DTYPES,
    LayerCase,
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


def test_every_layer_is_in_the_registry():
    from parity_tests.registry import LAYERS

    assert {case.layer for case in CASES} == set(LAYERS) and len(LAYERS) == 12


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


GROUPED = [case for case in CASES if case.layer == "GroupedQueryAttention"]


def test_every_option_of_the_grouped_layer_is_covered():
    options = [dict(case.kwargs) for case in GROUPED]
    heads = {(case.args[1], case.args[2]) for case in GROUPED}
    assert any(h > h_kv > 1 for h, h_kv in heads)  # GQA
    assert any(h > 1 and h_kv == 1 for h, h_kv in heads)  # MQA
    assert any(h == h_kv > 1 for h, h_kv in heads)  # MHA
    for name in ("bias", "out_bias", "qk_norm", "window", "softcap", "sinks", "scaling"):
        assert any(option.get(name) for option in options), name
    assert any(option.get("rope_interleaved") for option in options)
    assert any(option.get("rope_attention_factor", 1.0) != 1.0 for option in options)
    assert any(case.padded for case in GROUPED) and any(case.train for case in GROUPED)
    assert any(case.n == 37 and "window" in dict(case.kwargs) for case in GROUPED)  # N > window


def test_every_option_of_the_latent_layer_is_covered():
    latent = [case for case in CASES if case.layer == "MultiHeadLatentAttention"]
    options = [dict(case.kwargs) for case in latent]
    forms = {(case.name.split("-", 1)[1], dict(case.call)["absorb"]) for case in latent}

    assert forms == {(name, absorb) for name, _ in forms for absorb in (False, True)}  # both forms
    for name in ("q_lora_rank", "bias", "scaling", "latent_scale", "query_temperature", "dropout"):
        assert any(option.get(name) for option in options), name
    assert any(option.get("rope_interleave") is False for option in options)
    assert any(case.padded for case in latent) and any(case.train for case in latent)


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


@pytest.mark.parametrize(
    "case",
    [case for case in GROUPED if not case.applies_to("sdpa")],
    ids=lambda case: case.name,
)
def test_a_case_left_off_sdpa_is_one_that_sdpa_refuses(case):
    """Not applied means refused: the layer on SDPA raises, naming the option, rather than
    compute something else; no case is left off for any other reason."""
    data = make_data(case, "float64")
    _, torch_layer = build_layers(case, "float64", "cpu", "sdpa")
    kwargs = {name: torch.from_numpy(value) for name, value in data.forward_kwargs.items()}

    with pytest.raises(ValueError, match="backend='sdpa' cannot compute"):
        torch_layer(torch.from_numpy(data.inputs[0]), **kwargs)


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
