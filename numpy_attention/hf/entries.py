"""One layer's entries in a Hugging Face state dict, found and checked the same way by every reader
that loads a layer from any prefix (``latent_from_hf``, ``kimi_delta_from_hf``,
``lightning_from_hf``, ``gated_deltanet_from_hf``): the prefixes before a key only that layer has
(the "marker"), the layer number a prefix carries, the entries under the chosen prefix, and those
entries checked against the shapes the config gives, as NumPy arrays. Each reader passes in the
words its messages use (the layer it reads, the form of key it expects); how a reader chooses
among several prefixes is its own where its errors differ (KDA's and gated DeltaNet's).

Every check runs before an array is returned, so a reader builds nothing from a bad state dict.
NumPy only.

Tests: tests/numpy_attention/hf/test_entries.py; through each reader in
tests/numpy_attention/hf/test_latent.py, tests/numpy_attention/test_kimi_delta.py,
test_lightning.py and test_gated_deltanet.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from .. import validation
from ..module import _to_numpy

# name under the prefix -> (its shape, the config fields that give it, as the message names them)
Expected = Mapping[str, tuple[tuple[int, ...], str]]


def marked_prefixes(
    fn: str, state_dict: Mapping[str, Any], marker: str, hint: str, *, absent: str = ""
) -> list[str]:
    """The sorted prefixes before ``marker`` among the keys ('' for the module's own state dict).

    Raises:
        TypeError: state_dict is not a mapping.
        KeyError: no key ends in ``marker`` (``absent`` says what that means, then ``hint``).
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"{fn}: state_dict must be a mapping, got {type(state_dict).__name__}")
    prefixes = sorted(
        key.removesuffix(marker)
        for key in state_dict
        if key == marker or key.endswith("." + marker)
    )
    if not prefixes:
        raise KeyError(f"{fn}: the state dict has no {marker!r}{absent}; {hint}")
    return prefixes


def prefix_numbers(prefix: str) -> list[int]:
    """The numbers in a prefix's dotted path: ``model.layers.3.self_attn.1.`` -> [3, 1]."""
    return [int(n) for n in re.findall(r"(?:^|\.)(\d+)(?=\.)", prefix)]


def layer_number(prefix: str) -> int | None:
    """The layer a prefix names, its last number: ``model.layers.3.self_attn.`` -> 3; None
    without one (a decoder layer's or the module's own state dict)."""
    numbers = prefix_numbers(prefix)
    return numbers[-1] if numbers else None


def entries_under(state_dict: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The entries whose key starts with ``prefix``, the prefix removed."""
    return {
        key.removeprefix(prefix): value
        for key, value in state_dict.items()
        if key.startswith(prefix)
    }


def layer_entries(
    fn: str,
    state_dict: Mapping[str, Any],
    marker: str,
    layer_idx: int,
    *,
    layers: str,
    hint: str,
    number: Callable[[str], int | None] = layer_number,
) -> tuple[str, dict[str, Any]]:
    """The prefix before ``marker`` for layer_idx, and the entries under it (prefix removed): the
    only one (unnumbered, or numbered layer_idx), or the one of several numbered layer_idx.

    Args:
        fn: the reader's name, first in every message.
        layers: what the marked layers are, for the message ("attention layers").
        hint: the form of key expected, last in every KeyError.
        number: the layer a prefix names (``layer_number``, or a model's own numbering).

    Raises:
        TypeError: state_dict is not a mapping.
        ValueError: the only marked layer is numbered, but not layer_idx.
        KeyError: no marked layer, or several and not exactly one of them numbered layer_idx.
    """
    prefixes = marked_prefixes(fn, state_dict, marker, hint)
    numbered = {prefix: number(prefix) for prefix in prefixes}
    if len(prefixes) == 1:
        prefix = prefixes[0]
        if numbered[prefix] not in (None, layer_idx):
            raise ValueError(
                f"{fn}: the state dict holds layer {numbered[prefix]} "
                f"('{prefix}{marker}') but layer_idx is {layer_idx}"
            )
    else:
        chosen = [prefix for prefix in prefixes if numbered[prefix] == layer_idx]
        if len(chosen) != 1:
            shown = ", ".join(f"'{prefix}{marker}'" for prefix in prefixes[:3])
            raise KeyError(
                f"{fn}: the state dict holds {len(prefixes)} {layers} ({shown}, ...) "
                f"and {len(chosen)} of them for layer_idx {layer_idx}; {hint}"
            )
        prefix = chosen[0]
    return prefix, entries_under(state_dict, prefix)


def checked_arrays(
    fn: str,
    prefix: str,
    entries: Mapping[str, Any],
    expected: Expected,
    what: str,
    hint: str,
    *,
    optional: Collection[str] = (),
    optional_what: str = "",
) -> dict[str, np.ndarray]:
    """``entries`` as NumPy arrays, once their names are exactly ``expected``'s (those in
    ``optional`` may be absent) and each has the shape the config gives and a float dtype.

    Args:
        fn: the reader's name, first in every message.
        prefix: the prefix the entries were found under, named with every key.
        entries: name (prefix removed) -> array-like (NumPy arrays, torch tensors, ...).
        expected: name -> (shape, the config fields that give it).
        what: what the config's layer is, for the KeyError ("config's attention").
        hint: the form of key expected, last in the KeyError.
        optional: names that may be absent (listed after the others as ``optional_what``).
        optional_what: what the optional names are ("transformers' buffers").

    Raises:
        KeyError: missing or unexpected names, each with the prefix, and the expected ones.
        ValueError: an entry of another shape than the config gives (naming the key and fields).
        TypeError: an entry that is not floating point (naming the key).
    """
    missing = [prefix + name for name in expected if name not in entries and name not in optional]
    unexpected = sorted(prefix + name for name in entries if name not in expected)
    if missing or unexpected:
        listing = str(sorted(name for name in expected if name not in optional))
        if optional:
            listing += f", and {optional_what} {list(optional)},"
        raise KeyError(
            f"{fn}: missing keys {missing}, unexpected keys {unexpected} for this {what} "
            f"({listing} under the prefix '{prefix}'); {hint}"
        )
    arrays = {name: _to_numpy(value) for name, value in entries.items()}
    for name, (shape, fields) in expected.items():
        if name not in arrays:
            continue
        if arrays[name].shape != shape:
            raise ValueError(
                f"{fn}: {prefix}{name} has shape {arrays[name].shape}, but the config's "
                f"{fields} give {shape}"
            )
        validation.float_array(f"{fn}: {prefix}{name}", arrays[name])
    return arrays
