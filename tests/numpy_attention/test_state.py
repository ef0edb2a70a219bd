"""State files (numpy_attention.state): ``.npz`` state dicts that never unpickle, refuse keys that
collide on disk and files they cannot trust, and module files that store the constructor
arguments beside the weights and load back only into a matching module."""

from __future__ import annotations

import json
import tracemalloc
import zipfile

import numpy as np
import pytest
import torch

from numpy_attention import convert, state
from numpy_attention.attention import CausalAttention, MultiHeadAttention
from numpy_attention.state import load_module, load_state, save_module, save_state

from .test_module import LAYERS, build


def assert_same_state(actual, expected):
    """Same keys in the same order, and every array identical in value, shape and dtype."""
    assert list(actual) == list(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def write_raw_npz(path, members):
    """An .npz written member by member: name -> (npy header dict, raw data bytes)."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, (header, data) in members.items():
            with archive.open(name, "w") as member:
                np.lib.format.write_array_header_1_0(member, header)
                member.write(data)


def header(shape, descr="<f8"):
    return {"descr": descr, "fortran_order": False, "shape": shape}


# -- state dicts in .npz files ----------------------------------------------------------------


def test_save_load_round_trip_keeps_keys_order_and_dtypes(tmp_path, rng):
    saved = {
        "heads.0.W_query.weight": rng.standard_normal((2, 3)).astype(np.float32),
        "out_proj.bias": rng.standard_normal(4),
        "half": rng.standard_normal(3).astype(np.float16),
        "mask": np.triu(np.ones((4, 4), dtype=np.float32), k=1),
        "padding": np.array([True, False]),
        "fortran": np.asfortranarray(rng.standard_normal((3, 2))),
        "empty": np.zeros((0, 3)),
        "file": np.arange(3.0),  # names np.savez would take as its own arguments
        "allow_pickle": np.zeros(1),
        "tensor": torch.ones(2, dtype=torch.bfloat16),
    }
    path = tmp_path / "state.npz"

    save_state(path, saved)
    loaded = load_state(path)

    assert loaded["tensor"].dtype == np.float32  # NumPy has no bfloat16
    assert_same_state(loaded, {**saved, "tensor": np.ones(2, dtype=np.float32)})


def test_convert_still_offers_save_state_and_load_state():
    assert convert.save_state is save_state and convert.load_state is load_state


def test_load_state_reads_only_the_requested_keys(tmp_path, rng):
    saved = {"a": rng.standard_normal(2), "b": rng.standard_normal(3), "c": np.arange(4)}
    path = tmp_path / "state.npz"
    save_state(path, saved)

    loaded = load_state(path, keys=["c", "a"])

    assert_same_state(loaded, {"c": saved["c"], "a": saved["a"]})


def test_a_missing_requested_key_names_the_path_and_the_key(tmp_path):
    path = tmp_path / "state.npz"
    save_state(path, {"a": np.zeros(2)})

    with pytest.raises(ValueError, match=r"state\.npz.*'b'"):
        load_state(path, keys=["a", "b"])


@pytest.mark.parametrize(("first", "second"), [("x", "x.npy"), ("w.npy", "w.npy.npy")])
def test_save_refuses_keys_that_collide_on_disk(tmp_path, first, second):
    """np.load finds member "x.npy" under both "x" and "x.npy": the two would read back as one."""
    path = tmp_path / "state.npz"

    with pytest.raises(ValueError, match=f"'{first}'.*'{second}'"):
        save_state(path, {first: np.zeros(2), second: np.ones(3)})

    assert not path.exists()


@pytest.mark.parametrize(("key", "error"), [("", TypeError), (3, TypeError), ("a\0b", ValueError)])
def test_save_refuses_keys_a_zip_file_cannot_hold(tmp_path, key, error):
    with pytest.raises(error, match="key"):
        save_state(tmp_path / "state.npz", {key: np.zeros(2)})


def test_save_refuses_object_arrays(tmp_path):
    with pytest.raises(TypeError, match="weights.*object"):
        save_state(tmp_path / "out.npz", {"weights": np.array([None], dtype=object)})


def test_load_refuses_pickled_arrays_without_unpickling(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, weights=np.array([{"a": 1}], dtype=object))

    with pytest.raises(ValueError, match=r"pickled\.npz.*weights.*object array.*unpickl"):
        load_state(path)


def _truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def _flipped_data_byte(path):
    """One bit of the array data flipped: only the zip's CRC can tell."""
    data = bytearray(path.read_bytes())
    data[data.index(bytes(range(16))) + 7] ^= 1
    path.write_bytes(bytes(data))


def _bad_npy_magic(path):
    data = bytearray(path.read_bytes())
    start = data.index(b"\x93NUMPY")
    data[start + 1 : start + 6] = b"NOTPY"
    path.write_bytes(bytes(data))


def _single_npy(path):
    path.unlink()
    with open(path, "wb") as file:
        np.save(file, np.zeros(3))


def _text(path):
    path.write_text("W_query.weight = [[1, 2], [3, 4]]\n")


def _directory(path):
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize(
    "damage", [_truncated, _flipped_data_byte, _bad_npy_magic, _single_npy, _text, _directory]
)
def test_a_file_load_state_cannot_trust_is_a_value_error_naming_it(tmp_path, damage):
    path = tmp_path / "state.npz"
    save_state(path, {"w": np.arange(256, dtype=np.uint8), "b": np.ones(3)})
    damage(path)

    with pytest.raises(ValueError, match=r"state\.npz"):
        load_state(path)


@pytest.mark.parametrize(
    ("shape", "data"),
    [((10**12,), np.zeros(1).tobytes()), ((3,), np.zeros(5).tobytes())],
    ids=["claims-1e12-elements", "claims-fewer-than-stored"],
)
def test_array_sizes_are_checked_against_the_file_before_allocating(tmp_path, shape, data):
    path = tmp_path / "crafted.npz"
    write_raw_npz(path, {"w.npy": (header(shape), data)})

    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"crafted\.npz.*'w'.*holds"):
            load_state(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < 2**20  # nothing near the claimed 8 TB (or even 1 MiB) was allocated


def test_load_refuses_members_that_are_not_arrays(tmp_path):
    path = tmp_path / "state.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "hello")

    with pytest.raises(ValueError, match=r"state\.npz.*notes\.txt"):
        load_state(path)


# -- modules with their constructor arguments -------------------------------------------------


def test_load_module_rebuilds_exactly_the_layers_of_the_package():
    assert sorted(state.LAYERS) == sorted(LAYERS)


@pytest.mark.parametrize("name", list(LAYERS))
def test_module_round_trip_rebuilds_the_layer(tmp_path, rng, name):
    layer, inputs = build(name, rng)
    path = tmp_path / f"{name}.npz"

    save_module(path, layer)
    rebuilt = load_module(path)
    into_twin = load_module(path, build(name, np.random.default_rng(0))[0])

    assert type(rebuilt) is type(layer)
    assert rebuilt.constructor_args() == layer.constructor_args()
    assert_same_state(rebuilt.state_dict(), layer.state_dict())
    assert_same_state(into_twin.state_dict(), layer.state_dict())
    np.testing.assert_array_equal(rebuilt.eval()(*inputs), layer(*inputs))


def test_a_module_file_loads_only_into_a_module_built_the_same_way(tmp_path, rng):
    """Today's silent failure: 4 heads saved, 2 heads loaded, outputs off by 0.18."""
    path = tmp_path / "mha.npz"
    save_module(path, MultiHeadAttention(8, 8, 6, 0.1, 4, rng=rng))
    other = MultiHeadAttention(8, 8, 6, 0.0, 2, rng=rng)
    before = other.state_dict()

    with pytest.raises(ValueError, match=r"mha\.npz.*dropout.*0\.1.*0\.0.*num_heads.*4.*2"):
        load_module(path, other)

    assert_same_state(other.state_dict(), before)


def test_a_module_file_refuses_another_class(tmp_path, rng):
    path = tmp_path / "mha.npz"
    save_module(path, MultiHeadAttention(4, 4, 6, 0.1, 2, rng=rng))

    with pytest.raises(ValueError, match="MultiHeadAttention.*CausalAttention"):
        load_module(path, CausalAttention(4, 4, 6, 0.1, rng=rng))


def test_a_float64_module_comes_back_in_float64(tmp_path, rng):
    layer = MultiHeadAttention(4, 4, 6, 0.1, 2, rng=rng).astype(np.float64)
    path = tmp_path / "mha.npz"

    save_module(path, layer)

    assert load_module(path).dtype == np.float64
    assert_same_state(load_module(path).state_dict(), layer.state_dict())


def test_a_module_file_is_also_a_state_file(tmp_path, rng):
    layer = MultiHeadAttention(4, 4, 6, 0.1, 2, rng=rng)
    path = tmp_path / "mha.npz"
    save_module(path, layer)

    assert_same_state(load_state(path), layer.state_dict())
    assert sorted(np.load(path).files) == sorted([*layer.state_dict(), "module.json"])


def test_load_module_needs_a_module_file(tmp_path, rng):
    path = tmp_path / "state.npz"
    save_state(path, MultiHeadAttention(4, 4, 6, 0.1, 2, rng=rng).state_dict())

    with pytest.raises(ValueError, match=r"state\.npz.*save_module"):
        load_module(path)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"class": "Module", "args": {}}, "not a layer of numpy_attention"),
        ({"class": "system", "args": {"command": "true"}}, "not a layer of numpy_attention"),
        ({"class": "Linear", "args": {"in_features": 4, "out_feat": 2}}, "Linear"),
        ({"class": "Linear", "args": {"in_features": 0, "out_features": 2}}, "in_features"),
        ({"class": "Linear"}, "args"),
        ([1, 2], "object"),
    ],
)
def test_a_module_file_with_a_bad_description_is_refused(tmp_path, config, match):
    path = tmp_path / "bad.npz"
    save_state(path, {})
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(state.MODULE_MEMBER, json.dumps(config))

    with pytest.raises(ValueError, match=rf"bad\.npz.*{match}"):
        load_module(path)


def test_save_module_refuses_arguments_json_cannot_hold(tmp_path, rng):
    from numpy_attention import ModuleList

    with pytest.raises(TypeError, match="ModuleList.*modules"):
        save_module(tmp_path / "list.npz", ModuleList([build("Linear", rng)[0]]))
