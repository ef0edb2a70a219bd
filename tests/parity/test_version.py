"""``parity_tests.__version__``: the installed distribution's version when it is the code being
imported (a regular install, or an editable install of this source tree), "0+unknown" for a
source tree that no installed metadata describes."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest

import parity_tests
from parity_tests import UNKNOWN_VERSION, _version

HERE = Path(parity_tests.__file__).resolve().parent


def _distribution(site: Path, *, files: list[str], editable_of: Path | None = None):
    """A distribution "attention-parity" 9.9 installed in ``site``, listing ``files``; with
    ``editable_of``, an editable install of that source tree (pip's direct_url.json)."""
    info = site / "attention_parity-9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: attention-parity\nVersion: 9.9\n")
    (info / "RECORD").write_text("".join(f"{name},,\n" for name in files))
    if editable_of is not None:
        url = editable_of.as_uri()
        (info / "direct_url.json").write_text(
            json.dumps({"url": url, "dir_info": {"editable": True}})
        )
    return metadata.PathDistribution(info)


@pytest.fixture
def installed(monkeypatch):
    """Make ``metadata.distribution`` find the given distribution."""

    def install(dist):
        monkeypatch.setattr(metadata, "distribution", lambda name: dist)

    return install


def test_a_regular_install_gives_its_version_for_its_own_package(tmp_path, installed):
    package = tmp_path / "site" / "parity_tests"
    package.mkdir(parents=True)
    (package / "__init__.py").touch()
    installed(_distribution(tmp_path / "site", files=["parity_tests/__init__.py"]))

    assert _version(package=package) == "9.9"
    assert _version(package=HERE) == UNKNOWN_VERSION  # another copy is installed


def test_an_editable_install_gives_its_version_for_its_source_tree(tmp_path, installed):
    installed(_distribution(tmp_path / "site", files=[], editable_of=HERE.parent))

    assert _version(package=HERE) == "9.9"
    assert _version(package=tmp_path / "elsewhere" / "parity_tests") == UNKNOWN_VERSION


def test_no_installed_distribution_gives_the_unknown_version():
    assert _version("attention-parity-that-was-never-installed") == UNKNOWN_VERSION == "0+unknown"


def test_the_package_version_is_the_installed_one_or_unknown():
    """This checkout is either what the installed metadata describes or not."""
    try:
        installed = metadata.version(parity_tests.DISTRIBUTION)
    except metadata.PackageNotFoundError:
        installed = UNKNOWN_VERSION
    assert parity_tests.__version__ in (installed, UNKNOWN_VERSION)
    assert parity_tests.__version__ == _version()
