"""The documented module paths of before the decode/ and hf/ subpackages (numpy_attention's
``_MOVED`` table): each old dotted name still imports, as the new module itself, and no file of
the project imports it (its own code names the new modules). The torch twin's table:
tests/torch_attention/test_layout.py."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

import numpy_attention

ROOT = Path(__file__).resolve().parents[2]
SEARCHED = ("numpy_attention", "torch_attention", "parity_tests", "tests")
OLD = {  # old dotted name -> new: the documented paths, written out here as the docs wrote them
    "numpy_attention.paged": "numpy_attention.decode.paged",
    "numpy_attention.pages": "numpy_attention.decode.pages",
    "numpy_attention.paged_cache": "numpy_attention.decode.cache",
    "numpy_attention.paged_checks": "numpy_attention.decode.checks",
    "numpy_attention.hf_families": "numpy_attention.hf.families",
    "numpy_attention.hf_layouts": "numpy_attention.hf.layouts",
    "numpy_attention.hf_rope": "numpy_attention.hf.rope",
    "numpy_attention.hf_latent": "numpy_attention.hf.latent",
}


def import_patterns(package: str, old: list[str]) -> list[re.Pattern[str]]:
    """Regexes of the statements that import one of the ``old`` submodules of ``package``:
    ``import p.old``, ``from p.old import ...``, ``from p import ..., old`` (a parenthesised
    list too)."""
    names = "|".join(re.escape(name) for name in old)
    return [
        re.compile(rf"^\s*(?:import|from)\s+{package}\.(?:{names})\b", re.MULTILINE),
        re.compile(
            rf"^\s*from\s+{package}\s+import\s+(?:\([^)]*|[^\n]*)\b(?:{names})\b", re.MULTILINE
        ),
    ]


def relative_patterns(old: list[str]) -> list[re.Pattern[str]]:
    """Regexes of relative imports of the ``old`` submodules from a module of the package root:
    ``from .old import ...``, ``from . import ..., old``."""
    names = "|".join(re.escape(name) for name in old)
    return [
        re.compile(rf"^\s*from\s+\.(?:{names})\b", re.MULTILINE),
        re.compile(rf"^\s*from\s+\.\s+import\s+(?:\([^)]*|[^\n]*)\b(?:{names})\b", re.MULTILINE),
    ]


def old_imports(package: str, old: list[str], skip: Path) -> list[str]:
    """Every file of the project (``skip`` aside) that imports one of ``package``'s old paths,
    with the statement."""
    found = []
    absolute = import_patterns(package, old)
    relative = relative_patterns(old)
    for folder in SEARCHED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == skip:
                continue
            text = path.read_text()
            patterns = absolute
            if path.parent == ROOT / package:  # a relative import there names the package root
                patterns = absolute + relative
            found += [f"{path.relative_to(ROOT)}: {m.group(0).strip()}" for p in patterns
                      for m in p.finditer(text)]  # fmt: skip
    return found


def moved(package: ModuleType) -> dict[str, str]:
    """A package's ``_MOVED`` table as whole dotted names, old -> new."""
    name = package.__name__
    return {f"{name}.{old}": f"{name}.{new}" for old, new in package._MOVED.items()}


def imports_as(package: ModuleType, old: str, new: str) -> bool:
    """Whether the old dotted name imports, and is the package's attribute, as the new module."""
    module = importlib.import_module(new)
    attribute = getattr(package, old.rpartition(".")[2])
    return importlib.import_module(old) is module and attribute is module


def test_the_table_is_the_documented_list():
    assert moved(numpy_attention) == OLD


@pytest.mark.parametrize("old", sorted(OLD))
def test_an_old_path_imports_as_the_new_module(old):
    assert imports_as(numpy_attention, old, OLD[old])


def test_the_old_paths_serve_from_imports_too():
    from numpy_attention.hf_latent import latent_from_hf
    from numpy_attention.paged import kvcache_attention_forward

    assert kvcache_attention_forward is numpy_attention.decode.paged.kvcache_attention_forward
    assert latent_from_hf is numpy_attention.hf.latent.latent_from_hf


def test_no_file_of_the_project_imports_an_old_path():
    old = [name.rpartition(".")[2] for name in OLD]

    assert old_imports("numpy_attention", old, skip=Path(__file__).resolve()) == []


@pytest.mark.parametrize(
    "source",
    [
        "from numpy_attention.paged import kvcache_attention_forward\n",
        "import numpy_attention.hf_rope as rope\n",
        "from numpy_attention import (\n    convert,\n    paged_cache,\n)\n",
    ],
)
def test_the_search_finds_each_form_of_import(source):
    old = [name.rpartition(".")[2] for name in OLD]

    found = [m for p in import_patterns("numpy_attention", old) for m in p.finditer(source)]

    assert found
