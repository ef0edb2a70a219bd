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

Tests: tests/parity/ (the version: tests/parity/test_version.py), tests/checker/
"""

from __future__ import annotations

import importlib
import json
from importlib import metadata
from pathlib import Path
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
    "Case": "battery",
    "FEATURES": "specs",
    "KernelReport": "report",
    "KernelRow": "report",
    "KernelUnsupported": "report",
    "SPECS": "specs",
    "check_kernel": "kernels",
    "plan_groups": "kernels",
    "Group": "kernels",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f".checker.{_EXPORTS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'parity_tests' has no attribute {name!r}")
