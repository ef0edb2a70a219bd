"""The module paths documented before the parity suite and the benchmarks got folders of their own
(``parity_tests._MOVED``): each old path imports as the module it became, ``python -m`` on an old
path runs the new one, importing ``parity_tests`` imports none of them (nor torch), and the
project's own code never uses an old path (this file aside)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from parity_tests import _MOVED

ROOT = Path(__file__).resolve().parents[2]
OLD = sorted(f"parity_tests.{old}" for old in _MOVED)
COMMANDS = ["bench_distributed", "bench_triton"]  # the old paths that were commands


@pytest.mark.parametrize("old", sorted(_MOVED))
def test_an_old_path_imports_as_the_new_module(old):
    new = importlib.import_module(f"parity_tests.{_MOVED[old]}")

    assert importlib.import_module(f"parity_tests.{old}") is new
    parent, _, leaf = f"parity_tests.{old}".rpartition(".")
    assert sys.modules[f"parity_tests.{old}"] is new and getattr(sys.modules[parent], leaf) is new


def test_the_documented_names_of_the_registry_are_there():
    from parity_tests.registry import CASES, case_tensors, make_data, run_registry

    assert CASES and all(map(callable, (case_tensors, make_data, run_registry)))


def test_importing_the_package_imports_no_moved_module_and_no_torch():
    moved = [f"parity_tests.{name}" for pair in _MOVED.items() for name in pair]
    code = (
        "import sys, parity_tests\n"
        f"print(sorted(m for m in sys.modules if m in {moved} or m.split('.')[0] == 'torch'))"
    )

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


@pytest.mark.parametrize("old", COMMANDS)
def test_python_m_on_an_old_path_runs_the_new_command(old):
    def help_of(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", f"parity_tests.{name}", "--help"],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip

    result, expected = help_of(old), help_of(_MOVED[old])

    assert result.returncode == expected.returncode == 0, result.stderr
    assert result.stdout == expected.stdout and f"python -m parity_tests.{_MOVED[old]}" in (
        result.stdout
    )


def test_an_unknown_name_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("parity_tests.bench_nothing")


def _old_paths_used(path: Path, package: str) -> list[str]:
    """The old paths that the Python file ``path`` (a module of ``package``, its dotted name
    relative imports resolve against) imports, or names in a string, with their lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = node.value.split()
        for name in names:
            if any(name == old or name.startswith(f"{old}.") for old in OLD):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return found


def _package_of(path: Path) -> str:
    """The dotted package a file under ROOT belongs to (``tests.parity`` for this one)."""
    return ".".join(path.relative_to(ROOT).parent.parts)


def test_no_module_of_the_project_uses_an_old_path():
    files = sorted((ROOT / "parity_tests").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))

    used = [
        line
        for path in files
        if path != Path(__file__).resolve()
        for line in _old_paths_used(path, _package_of(path))
    ]

    assert len(files) > 100 and used == []


@pytest.mark.parametrize(
    ("source", "where"),
    [
        ("import parity_tests.registry\n", "parity_tests.registry"),
        ("from parity_tests import bench_triton\n", "parity_tests.bench_triton"),
        ("from ..registry import CASES\n", "parity_tests.registry"),
        ("def late():\n    from .. import bench_decode\n", "parity_tests.bench_decode"),
        ("ARGV = ['-m', 'parity_tests.bench_distributed']\n", "parity_tests.bench_distributed"),
    ],
)
def test_an_old_path_is_found_however_it_is_written(source, where, tmp_path, monkeypatch):
    path = tmp_path / "parity_tests" / "inner" / "module.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)

    used = _old_paths_used(path, "parity_tests.inner")

    assert used and all(line.endswith(where) or f"{where}." in line for line in used)
