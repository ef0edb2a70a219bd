"""numpy_attention.hf.entries: the prefix search and the key, shape and dtype checks that the
readers of one layer's weights share. Each reader's own words, through the reader:
tests/numpy_attention/hf/test_latent.py, tests/numpy_attention/test_kimi_delta.py,
test_lightning.py, test_gated_deltanet.py."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_attention.hf.entries import (
    checked_arrays,
    layer_entries,
    layer_number,
    marked_prefixes,
    prefix_numbers,
)

PREFIX = "model.layers.1.self_attn."
EXPECTED = {
    "w.weight": ((3, 2), "heads * head_dim, hidden_size"),
    "norm.weight": ((3,), "heads * head_dim"),
    "buffer": ((1, 3), "1, heads"),
}


def entries(**changed):
    arrays = {"w.weight": np.ones((3, 2)), "norm.weight": np.ones(3), "buffer": np.ones((1, 3))}
    return {name: value for name, value in (arrays | changed).items() if value is not None}


def check(found, **kwargs):
    return checked_arrays("reader", PREFIX, found, EXPECTED, "config's layer", "hint", **kwargs)


def test_the_entries_come_back_as_arrays_by_name():
    arrays = check({**entries(), "w.weight": [[1.0, 2.0]] * 3})

    assert set(arrays) == set(EXPECTED)
    assert isinstance(arrays["w.weight"], np.ndarray) and arrays["w.weight"].shape == (3, 2)


def test_missing_and_unexpected_keys_are_named_with_the_prefix_and_the_expected_names():
    found = entries(buffer=None, extra=np.ones(1))

    with pytest.raises(KeyError) as error:
        check(found)

    assert error.value.args[0] == (
        "reader: missing keys ['model.layers.1.self_attn.buffer'], unexpected keys "
        "['model.layers.1.self_attn.extra'] for this config's layer (['buffer', 'norm.weight', "
        "'w.weight'] under the prefix 'model.layers.1.self_attn.'); hint"
    )


def test_optional_names_may_be_absent_and_are_listed_after_the_others():
    assert set(check(entries(buffer=None), optional=("buffer",))) == {"w.weight", "norm.weight"}

    with pytest.raises(KeyError) as error:
        check(entries(**{"buffer": None, "norm.weight": None}), optional=["buffer"],
              optional_what="buffers")  # fmt: skip

    assert "(['norm.weight', 'w.weight'], and buffers ['buffer'], under the prefix" in str(
        error.value
    )


def test_a_wrong_shape_names_the_key_and_the_config_fields_before_the_dtype_is_read():
    message = (r"reader: model\.layers\.1\.self_attn\.norm\.weight has shape \(4,\), but the "
               r"config's heads \* head_dim give \(3,\)")  # fmt: skip
    with pytest.raises(ValueError, match=message):
        check(entries(**{"norm.weight": np.ones(4, dtype=np.int64)}))


def test_an_integer_entry_is_refused_naming_its_whole_key():
    with pytest.raises(TypeError, match=r"reader: model\.layers\.1\.self_attn\.buffer must be a "
                       "floating-point array, got dtype int64"):  # fmt: skip
        check(entries(buffer=np.ones((1, 3), dtype=np.int64)))


def test_prefixes_before_the_marker_and_their_layer_numbers():
    state = {"model.layers.3.attn.marker": 0, "marker": 0, "model.layers.3.attn.other": 0}

    assert marked_prefixes("reader", state, "marker", "hint") == ["", "model.layers.3.attn."]
    assert prefix_numbers("model.layers.3.self_attn.1.") == [3, 1]
    assert layer_number("model.layers.3.self_attn.1.") == 1
    assert layer_number("self_attn.") is None
    with pytest.raises(TypeError, match="reader: state_dict must be a mapping, got list"):
        marked_prefixes("reader", [], "marker", "hint")
    with pytest.raises(KeyError, match="reader: the state dict has no 'marker' .no layer.; hint"):
        marked_prefixes("reader", {"x": 0}, "marker", "hint", absent=" (no layer)")


def test_the_layer_s_entries_are_the_ones_numbered_layer_idx():
    state = {f"model.layers.{i}.attn.{name}": i for i in range(3) for name in ("marker", "w")}

    prefix, found = layer_entries("reader", state, "marker", 2, layers="layers", hint="hint")

    assert (prefix, found) == ("model.layers.2.attn.", {"marker": 2, "w": 2})
    with pytest.raises(KeyError, match=r"holds 3 layers \('model\.layers\.0\.attn\.marker', .*"
                       r"and 0 of them for layer_idx 5; hint"):  # fmt: skip
        layer_entries("reader", state, "marker", 5, layers="layers", hint="hint")


def test_one_numbered_layer_must_be_layer_idx_and_a_model_may_number_its_own():
    state = {"model.layers.1.attn.0.marker": 0}

    with pytest.raises(ValueError, match="holds layer 0 .* but layer_idx is 2"):
        layer_entries("reader", state, "marker", 2, layers="layers", hint="hint")
    prefix, _ = layer_entries("reader", state, "marker", 2, layers="layers", hint="hint",
                              number=lambda p: 2 * prefix_numbers(p)[0])  # fmt: skip
    assert prefix == "model.layers.1.attn.0."
    assert layer_entries("reader", {"marker": 1}, "marker", 7, layers="l", hint="h") == (
        "",
        {"marker": 1},
    )
