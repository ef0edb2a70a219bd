"""parity_tests/parity/cases.py: the registry holds every layer, and every option of each layer is
covered by some case; a case is left off SDPA only where SDPA refuses it.
"""

from __future__ import annotations

import pytest
import torch

from parity_tests.parity.cases import CASES, LAYERS
from parity_tests.parity.run import build_layers, make_data

GROUPED = [case for case in CASES if case.layer == "GroupedQueryAttention"]


def test_every_layer_is_in_the_registry():
    assert {case.layer for case in CASES} == set(LAYERS) and len(LAYERS) == 12


def test_every_option_is_covered():
    assert any(c.padded for c in CASES) and any(c.train for c in CASES)
    assert any(c.batch is None for c in CASES) and any(c.batch == 1 for c in CASES)
    assert any(c.m is not None and c.m != c.n for c in CASES)
    assert any(c.n in (37, 113) or c.m in (37, 113) for c in CASES)
    assert any(c.heads == 1 and c.spec.module == "fused" for c in CASES)
    assert any(dict(c.kwargs).get("causal") for c in CASES)


def test_every_option_of_the_grouped_layer_is_covered():
    options = [dict(case.kwargs) for case in GROUPED]
    heads = {(case.args[1], case.args[2]) for case in GROUPED}
    assert any(h > h_kv > 1 for h, h_kv in heads)  # GQA
    assert any(h > 1 and h_kv == 1 for h, h_kv in heads)  # MQA
    assert any(h == h_kv > 1 for h, h_kv in heads)  # MHA
    for name in ("bias", "out_bias", "qk_norm", "window", "softcap", "sinks", "scaling"):
        assert any(option.get(name) for option in options), name
    for name in ("query_temperature", "differential", "value_norm"):  # ..., Gemma 3n
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
