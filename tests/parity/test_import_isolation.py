"""numpy_attention must import, every submodule of it, with torch and scipy unavailable."""

from __future__ import annotations

import subprocess
import sys

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
