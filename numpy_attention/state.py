"""State files: state dicts and whole layers in ``.npz`` files that are safe to open.

A state dict is stored as a zip archive with one ``.npy`` member per key, ``<key>.npy``, without
compression, as ``np.savez`` writes it (so ``np.load`` reads it too). Keys are kept as they are
(dots included), in order, with their dtypes.

Loading trusts nothing in the file: it never unpickles, and a file that is not an ``.npz`` (a
directory, another format, a truncated or corrupt archive, a member that is not an array) is a
``ValueError`` naming the path. Each array's size, as its ``.npy`` header claims it, is checked
against the bytes the archive holds for it before any array is allocated, so a crafted header
cannot make the loader allocate terabytes.

A module file (``save_module`` / ``load_module``) is a state file with one more member,
``module.json``: the layer's class name and constructor arguments (``Module.constructor_args()``,
as JSON). It loads back only into a layer built with the same arguments, or rebuilds that layer.
Decisions behind these rules: docs/state-files.md.

Tests: tests/numpy_attention/test_state.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from . import (
    attention,
    fused,
    gated_deltanet,
    grouped,
    kimi_delta,
    latent,
    layers,
    lightning,
    norms,
)
from .module import Module, _to_numpy

MODULE_MEMBER = "module.json"  # the module description; not an .npy member, so never a key

# The layers load_module may rebuild from a file: the public Module classes of this package's
# layer files, and nothing else (a file names a class; it must not be able to name any callable).
LAYERS: dict[str, type[Module]] = {
    name: cls
    for source in (
        layers,
        norms,
        attention,
        fused,
        grouped,
        latent,
        gated_deltanet,
        kimi_delta,
        lightning,
    )  # fmt: skip
    for name, cls in vars(source).items()
    if isinstance(cls, type)
    and issubclass(cls, Module)
    and cls.__module__ == source.__name__
    and not name.startswith("_")
}

_SUFFIX = ".npy"
# Deflate's best case is about 1032:1; a deflated member claiming to unpack to more is crafted.
_MAX_DEFLATE_RATIO = 1032
_MAX_DESCRIPTION_BYTES = 2**20
# What a damaged or crafted archive makes zipfile and np.lib.format raise while reading it.
_READ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, struct.error)

# -- state dicts ------------------------------------------------------------------------------


def save_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write a state dict to an ``.npz`` file at exactly ``path`` (no suffix is added).

    Keys are kept as they are (dots included), in order; dtypes are kept (torch bfloat16 becomes
    float32, which NumPy lacks). Everything is checked before the file is opened.

    Args:
        path: the file to write.
        state: name -> array-like (NumPy arrays, lists, CPU or GPU torch tensors).

    Raises:
        TypeError: a key that is not a non-empty str, or an object array (it would need pickling).
        ValueError: a key holding a NUL character (a zip member name cannot), or two keys that
            would collide on disk: ``np.load`` finds member ``"x.npy"`` under both ``"x"`` and
            ``"x.npy"``, so keys ``"x"`` and ``"x.npy"`` would read back as one array.
    """
    _write(path, _arrays_to_save("save_state", state), description=None)


def load_state(
    path: str | os.PathLike[str], keys: Iterable[str] | None = None
) -> dict[str, np.ndarray]:
    """Read a state dict written by ``save_state``, ``save_module`` or ``np.savez``.

    Never unpickles. A module file's description is not part of the state: the result loads into
    the layer with ``load_state_dict``.

    Args:
        path: the ``.npz`` file.
        keys: read only these keys, in this order (the others are not read at all); None reads
            every array, in the order the file holds them.

    Returns:
        name -> ``np.ndarray``.

    Raises:
        ValueError: naming the path, for a directory, a file that is not an ``.npz``, a truncated
            or corrupt one, an array whose header claims another size than the data the file
            holds, an object array, or a requested key the file does not hold.
    """
    name = os.fspath(path)
    if isinstance(keys, str):
        raise TypeError(f"load_state: keys must be a list of keys, not the str {keys!r}")
    with _open(name) as archive:
        return _read_arrays(name, archive, keys)


# -- modules ----------------------------------------------------------------------------------


def save_module(path: str | os.PathLike[str], module: Module) -> None:
    """Write a layer's state dict and its constructor arguments to an ``.npz`` file.

    The arguments (``module.constructor_args()``, ``rng`` left out) are stored as JSON in the
    member ``module.json``, beside the weights; ``load_state`` still reads the file.

    Raises:
        TypeError: a constructor argument that JSON cannot hold (a bool, int, float, str, None,
            or lists and dicts of them), naming it; and the errors of ``save_state``.
    """
    cls = type(module).__name__
    args = module.constructor_args()
    for name, value in args.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"save_module: {cls}'s argument {name} = {value!r} cannot be stored as JSON "
                "(bool, int, float, str, None, or lists and dicts of them)"
            ) from error
    description = json.dumps({"class": cls, "args": args}, allow_nan=False)
    _write(path, _arrays_to_save("save_module", module.state_dict()), description)


def load_module(path: str | os.PathLike[str], module: Module | None = None) -> Module:
    """Load a file written by ``save_module``, into ``module`` or into a layer rebuilt from it.

    Args:
        path: the ``.npz`` file.
        module: a layer built with the arguments the file holds: its weights are replaced (cast
            to its dtype, as ``load_state_dict`` does). None rebuilds the layer from the class
            name and arguments in the file (only this package's layers, ``state.LAYERS``), in
            the dtype of the stored parameters, in train mode like any new layer, with a fresh
            dropout generator.

    Returns:
        The loaded module (``module`` itself when one was given).

    Raises:
        ValueError: naming the path, for a file without a module description, a description
            that is not valid, a class other than ``module``'s, constructor arguments that differ
            from ``module``'s (naming each one), and the errors of ``load_state``. Nothing is
            changed unless everything fits.
    """
    name = os.fspath(path)
    with _open(name) as archive:
        cls_name, args = _read_description(name, archive)
        state = _read_arrays(name, archive, None)
    if module is None:
        module = _rebuild(name, cls_name, args, state)
    else:
        _check_matches(name, module, cls_name, args)
    module.load_state_dict(state)
    return module


def _rebuild(
    path: str, cls_name: str, args: dict[str, Any], state: dict[str, np.ndarray]
) -> Module:
    """The layer the description names, built from its arguments, in the stored weights' dtype."""
    cls = LAYERS.get(cls_name)
    if cls is None:
        raise ValueError(
            f"{path!r}: {cls_name!r} is not a layer of numpy_attention that load_module can "
            f"rebuild ({', '.join(LAYERS)}); build it yourself and pass it as module="
        )
    try:
        module = cls(**args)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{path!r}: the stored arguments do not build a {cls_name}: {error}"
        ) from error
    dtypes = {state[key].dtype for key in module.named_parameters() if key in state}
    if len(dtypes) == 1 and module.dtype is not None:
        (dtype,) = dtypes
        if np.issubdtype(dtype, np.floating) and dtype != module.dtype:
            module.astype(dtype)
    return module


def _check_matches(path: str, module: Module, cls_name: str, args: dict[str, Any]) -> None:
    """``ValueError`` unless ``module`` is of the class and built with the arguments stored."""
    if type(module).__name__ != cls_name:
        raise ValueError(
            f"{path!r} holds a {cls_name}, which does not load into a {type(module).__name__}"
        )
    # Through JSON, as the file holds them: a tuple argument reads back as a list.
    current = json.loads(json.dumps(module.constructor_args()))
    differing = [name for name in {**current, **args} if current.get(name) != args.get(name)]
    if differing:
        listed = "; ".join(
            f"{name}: {args.get(name, '<absent>')!r} in the file, "
            f"{current.get(name, '<absent>')!r} in the module"
            for name in differing
        )
        raise ValueError(
            f"{path!r} holds a {cls_name} built with other arguments than this one ({listed}); "
            "its weights would load but compute something else"
        )


# -- writing ----------------------------------------------------------------------------------


def _arrays_to_save(fn: str, state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``state`` as plain arrays, every key checked, before any file is touched."""
    arrays = {}
    for key, value in state.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{fn}: keys must be non-empty str, got key {key!r}")
        if "\0" in key:
            raise ValueError(f"{fn}: key {key!r} holds a NUL character, which a zip file cannot")
        array = _to_numpy(value)
        if array.dtype.hasobject:
            raise TypeError(
                f"{fn}: {key!r} has dtype {array.dtype}; only plain arrays are stored (an object "
                "array would need pickling, which load_state never does)"
            )
        arrays[key] = array
    members = {f"key {key!r}": key + _SUFFIX for key in arrays}
    _check_no_collisions(fn, {**members, "the module description": MODULE_MEMBER})
    return arrays


def _check_no_collisions(fn: str, members: Mapping[str, str]) -> None:
    """``ValueError`` if two members could read back as one: ``np.load`` looks a name up as a
    member, then with ``.npy`` added, and Windows turns ``\\`` into ``/`` in member names."""
    owners: dict[str, str] = {}
    for label, member in members.items():
        name = member.replace("\\", "/")
        for alias in {name, name.removesuffix(_SUFFIX)}:
            other = owners.setdefault(alias, label)
            if other != label:
                raise ValueError(
                    f"{fn}: {other} and {label} would collide in the .npz file (both read back "
                    f"as {alias!r}); rename one"
                )


def _write(
    path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray], description: str | None
) -> None:
    # np.savez takes the keys as keyword arguments, so a key named "file" would collide with its
    # own argument; writing the archive directly keeps every key.
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for key, array in arrays.items():
            with archive.open(key + _SUFFIX, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
        if description is not None:
            archive.writestr(MODULE_MEMBER, description)


# -- reading ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _open(path: str) -> Iterator[zipfile.ZipFile]:
    """The archive at ``path``; ``ValueError`` naming it for anything but a readable zip file."""
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a directory, not an .npz file")
    try:
        archive = zipfile.ZipFile(path)
    except _READ_ERRORS as error:
        raise ValueError(
            f"{path!r} is not an .npz file (a zip archive of .npy arrays): {error}"
        ) from error
    with archive:
        yield archive


def _read_arrays(
    path: str, archive: zipfile.ZipFile, keys: Iterable[str] | None
) -> dict[str, np.ndarray]:
    """The arrays ``keys`` (all when None), each size checked before anything is allocated."""
    members = _array_members(path, archive)
    if keys is None:
        keys = list(members)
    else:
        keys = list(keys)
        missing = [key for key in keys if key not in members]
        if missing:
            raise ValueError(f"{path!r} holds no key {missing}; its keys are {list(members)}")
    file_size = os.path.getsize(path)
    for key in keys:
        _check_member(path, archive, key, members[key], file_size)
    return {key: _read_array(path, archive, key, members[key]) for key in keys}


def _array_members(path: str, archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """key -> member, for every ``.npy`` member; any other member but the description is refused."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        if info.filename == MODULE_MEMBER:
            continue
        if info.is_dir() or not info.filename.endswith(_SUFFIX):
            raise ValueError(f"{path!r}: member {info.filename!r} is not an .npy array")
        key = info.filename.removesuffix(_SUFFIX)
        if key in members:
            raise ValueError(f"{path!r} holds member {info.filename!r} twice")
        members[key] = info
    return members


def _check_member(
    path: str, archive: zipfile.ZipFile, key: str, info: zipfile.ZipInfo, file_size: int
) -> None:
    """``ValueError`` unless the member's data is all in the file and exactly the size its
    ``.npy`` header claims, the dtype needs no unpickling; reads the header alone."""
    if info.header_offset + info.compress_size > file_size:
        raise ValueError(f"{path!r}: {key!r} runs past the end of the file (truncated?)")
    if info.compress_type == zipfile.ZIP_STORED:
        stored_ok = info.compress_size == info.file_size
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        stored_ok = info.file_size <= _MAX_DEFLATE_RATIO * info.compress_size + 2**10
    else:
        raise ValueError(f"{path!r}: {key!r} is compressed with method {info.compress_type}")
    if not stored_ok:
        raise ValueError(
            f"{path!r}: {key!r} claims {info.file_size} bytes from {info.compress_size} stored"
        )
    try:
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise ValueError(f".npy format version {version} is not supported")
            header_size = member.tell()
    except _READ_ERRORS as error:
        raise ValueError(f"{path!r}: {key!r} is not a valid .npy array: {error}") from error
    if dtype.hasobject:
        raise ValueError(
            f"{path!r}: {key!r} holds an object array ({dtype}), which only unpickling could "
            "read (allow_pickle=False: load_state never unpickles)"
        )
    if any(size < 0 for size in shape):
        raise ValueError(f"{path!r}: {key!r} claims the shape {shape}")
    claimed = math.prod(shape) * dtype.itemsize
    if header_size + claimed != info.file_size:
        raise ValueError(
            f"{path!r}: {key!r} claims shape {shape} of {dtype} ({claimed} bytes) but the file "
            f"holds {info.file_size - header_size} bytes for it"
        )


def _read_array(path: str, archive: zipfile.ZipFile, key: str, info: zipfile.ZipInfo) -> np.ndarray:
    """The member's array. Its size was checked, so this reads the member to its end, where
    zipfile checks the CRC (a corrupt byte is a ``BadZipFile``, turned into a ``ValueError``)."""
    try:
        with archive.open(info) as member:
            array = np.lib.format.read_array(member, allow_pickle=False)
    except _READ_ERRORS as error:
        raise ValueError(f"{path!r}: {key!r} cannot be read: {error}") from error
    return array


def _read_description(path: str, archive: zipfile.ZipFile) -> tuple[str, dict[str, Any]]:
    """The class name and constructor arguments that ``save_module`` stored."""
    try:
        info = archive.getinfo(MODULE_MEMBER)
    except KeyError:
        raise ValueError(
            f"{path!r} holds a state dict without a module description ({MODULE_MEMBER}): write "
            "it with save_module, or read the weights alone with load_state"
        ) from None
    if info.file_size > _MAX_DESCRIPTION_BYTES:
        raise ValueError(f"{path!r}: {MODULE_MEMBER} claims {info.file_size} bytes")
    try:
        description = json.loads(archive.read(info).decode("utf-8"))
    except _READ_ERRORS as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path!r}: {MODULE_MEMBER} is not valid JSON: {error}") from error
    if not isinstance(description, dict):
        raise ValueError(f"{path!r}: {MODULE_MEMBER} must hold a JSON object")
    cls_name, args = description.get("class"), description.get("args")
    if not isinstance(cls_name, str) or not isinstance(args, dict):
        raise ValueError(
            f"{path!r}: {MODULE_MEMBER} needs 'class' (a str) and 'args' (an object), got "
            f"{description!r}"
        )
    return cls_name, args
