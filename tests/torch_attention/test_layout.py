"""The documented module paths of before the decode/ subpackage (torch_attention's ``_MOVED``
table): each old dotted name still imports, as the new module itself, and no file of the project
imports it. The NumPy twin's table, and the search: tests/numpy_attention/test_layout.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import torch_attention

from ..numpy_attention.test_layout import imports_as, moved, old_imports

OLD = {  # old dotted name -> new: the documented paths, written out here as the docs wrote them
    "torch_attention.paged": "torch_attention.decode.paged",
    "torch_attention.pages": "torch_attention.decode.pages",
    "torch_attention.paged_cache": "torch_attention.decode.cache",
    "torch_attention.paged_checks": "torch_attention.decode.checks",
}


def test_the_table_is_the_documented_list():
    assert moved(torch_attention) == OLD


@pytest.mark.parametrize("old", sorted(OLD))
def test_an_old_path_imports_as_the_new_module(old):
    assert imports_as(torch_attention, old, OLD[old])


def test_the_old_paths_serve_from_imports_too():
    from torch_attention.paged import kvcache_attention

    assert kvcache_attention is torch_attention.decode.paged.kvcache_attention


def test_no_file_of_the_project_imports_an_old_path():
    old = [name.rpartition(".")[2] for name in OLD]

    assert old_imports("torch_attention", old, skip=Path(__file__).resolve()) == []
