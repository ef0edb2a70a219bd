"""numpy_attention must import, every submodule of it, with torch and scipy unavailable; and no
module of numpy_attention, torch_attention or parity_tests takes part in an import cycle, not even
through an import inside a function."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

PACKAGES = ("numpy_attention", "torch_attention", "parity_tests")

BLOCKED_IMPORT = r"""
import importlib, pkgutil, sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "scipy"):
            raise ImportError(f"blocked import of {name}")

sys.meta_path.insert(0, Block())
import numpy_attention
for info in pkgutil.walk_packages(numpy_attention.__path__, "numpy_attention."):
    importlib.import_module(info.name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "scipy"))
assert not loaded, loaded
print("ok", len(list(pkgutil.walk_packages(numpy_attention.__path__))))
"""


def test_numpy_attention_imports_without_torch_or_scipy():
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT], capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_the_blocker_really_blocks():
    code = BLOCKED_IMPORT.replace("import numpy_attention\n", "import numpy_attention, torch\n")

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )

    assert result.returncode != 0 and "blocked import of torch" in result.stderr


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package at ``root`` by dotted name (a package by its own name), its
    subpackages included."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports anywhere in its file (a function's
    body included), relative imports resolved; ``from p import m`` names the submodule p.m where
    there is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.update(
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            )
    return found & modules.keys()


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each set of modules that reach one another (a strongly
    connected component of more than one module, or one that imports itself), sorted."""
    reach = {name: _reachable(graph, name) for name in graph}
    cycles = {
        tuple(sorted(other for other in reach[name] if name in reach[other]))
        for name in graph
        if name in reach[name]
    }
    return sorted(list(cycle) for cycle in cycles)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules that ``start`` imports, directly or through others."""
    seen: set[str] = set()
    stack = list(graph[start])
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(graph[name])
    return seen


def test_no_module_takes_part_in_an_import_cycle():
    modules = {}
    for package in PACKAGES:
        root = Path(importlib.util.find_spec(package).origin).parent
        modules.update(_modules(root, package))

    cycles = _cycles(_graph(modules))

    assert "parity_tests.checker.pipeline" in modules
    assert cycles == []


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    root = tmp_path / "loop"
    (root / "inner").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "inner" / "__init__.py").write_text("")
    (root / "inner" / "low.py").write_text("def late():\n    from ..high import x\n")
    (root / "high.py").write_text("from .inner import low\nx = 1\n")
    (root / "side.py").write_text("import loop.high\n")

    cycles = _cycles(_graph(_modules(root, "loop")))

    assert cycles == [["loop.high", "loop.inner.low"]]
