"""parity_tests: weight transfer, NumPy vs torch parity, tolerance policy, kernel checker.

``check_kernel``, ``KernelReport``, ``KernelRow`` and ``KernelUnsupported`` (from
``parity_tests.checker``), ``Case`` (a case of the checker's battery) and ``SPECS`` and
``FEATURES`` (the signatures the checker calls kernels with, and the options a kernel may claim)
are loaded on first use, so that importing the package (the tolerance constants, say) does not
import torch.

``__version__`` is the version of the installed distribution "attention-parity" (its metadata,
``importlib.metadata``) when that distribution is the code being imported: installed from a
wheel, or an editable install of this very source tree. Code imported from a source tree that
is not what the installed metadata describes (a clone on ``PYTHONPATH``, never installed, or
beside another copy that is) has no version it can prove: ``__version__`` is then
``UNKNOWN_VERSION``, "0+unknown", a PEP 440 version below every release
(docs/kernel-verification.md, "The JSON report").

The module paths documented before the suite and the benchmarks got folders of their own
(``parity_tests.registry``, ``parity_tests.bench_triton``, ...) still import, as the modules they
became, and still run with ``python -m`` (``_MOVED``).

Tests: tests/parity/ (the version: tests/parity/test_version.py; the moved paths:
tests/parity/test_moved_paths.py), tests/checker/
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
from importlib import metadata
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any
from urllib.parse import unquote, urlparse

DISTRIBUTION = "attention-parity"
UNKNOWN_VERSION = "0+unknown"


def _version(distribution: str = DISTRIBUTION, package: Path | None = None) -> str:
    """The installed version of ``distribution`` if it installs ``package`` (this package's
    directory by default), else ``UNKNOWN_VERSION``."""
    package = (package or Path(__file__).parent).resolve()
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION
    return dist.version if _installs(dist, package) else UNKNOWN_VERSION


def _installs(dist: metadata.Distribution, package: Path) -> bool:
    """Whether ``dist`` is the code in ``package``: an editable install of the source tree that
    holds it (pip's direct_url.json names the tree), or a regular install whose files include
    its ``__init__.py``."""
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):
        source = Path(unquote(urlparse(direct.get("url", "")).path))
        return source.resolve() == package.parent
    init = package / "__init__.py"
    return any(
        Path(str(dist.locate_file(file))).resolve() == init
        for file in dist.files or []
        if file.name == "__init__.py"
    )


__version__ = _version()

_EXPORTS = {
    "Case": "battery.attention.case",
    "FEATURES": "specs",
    "KernelLimits": "battery.limits",
    "KernelReport": "report.rows",
    "KernelRow": "report.rows",
    "KernelUnsupported": "report.rows",
    "SPECS": "specs",
    "SPEC_FEATURES": "specs",
    "check_kernel": "pipeline",
    "plan_groups": "pipeline",
    "Group": "pipeline",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f".checker.{_EXPORTS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'parity_tests' has no attribute {name!r}")


# The documented module paths of before the layout change (old name -> new name, both under
# parity_tests), kept for users: never imported by the project's own code.
_MOVED = {
    "bench_decode": "bench.decode",
    "bench_distributed": "bench.distributed",
    "bench_latent": "bench.latent",
    "bench_options": "bench.options",
    "bench_triton": "bench.triton",
    "registry": "parity.run",
    "checker.adapters": "checker.targets.adapters",
    "checker.decode_calibration": "checker.calibration.decode",
    "checker.reference": "checker.golden.attention_baseline",
    "checker.third_party": "checker.targets.third_party",
}


class _MovedPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``parity_tests.<old>`` for each old name of ``_MOVED``. Importing it imports the new
    module, only then (a benchmark's torch is not imported with this package), and binds the old
    name to that very module; ``python -m parity_tests.<old>`` runs ``python -m`` on the new
    name."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, old = fullname.partition(".")
        if package != __name__ or old not in _MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(_new_name(spec.name))

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: ``create_module`` gave the new module, already imported."""

    def get_code(self, fullname: str) -> CodeType:
        """What ``python -m`` runs for an old name: the new module, as ``__main__``."""
        new = _new_name(fullname)
        run = f"import runpy\nrunpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n"
        return compile(run, fullname, "exec")


def _new_name(fullname: str) -> str:
    return f"{__name__}.{_MOVED[fullname.partition('.')[2]]}"


sys.meta_path.append(_MovedPaths())
