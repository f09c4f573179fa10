"""The release metadata agrees with the one source of the version, ``gaugebook.__version__``.

The README's release procedure names every place that must say the version; this test fails until
they all do. (``make test-package`` builds the sdist and wheel themselves and runs ``twine check``.)
"""
import re
from pathlib import Path

import pytest

import gaugebook

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
VERSION = gaugebook.__version__


def test_version_is_semantic():
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION


def test_pyproject_reads_the_version_from_the_package():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"], "the version belongs in gaugebook/__init__.py"
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gaugebook.__version__"}


def test_citation_and_changelog_name_the_version_and_its_date():
    citation = (ROOT / "CITATION.cff").read_text()
    assert re.search(rf"^version: {re.escape(VERSION)}$", citation, re.M), "CITATION.cff version"
    released = re.search(r'^date-released: "?(\d{4}-\d{2}-\d{2})"?$', citation, re.M)
    assert released, "CITATION.cff needs date-released"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{VERSION}] - {released.group(1)}" in changelog, "CHANGELOG.md section"
    assert f"[{VERSION}]: https://github.com/gaugebook/gaugebook/releases/tag/v{VERSION}" in changelog


def test_readme_installs_and_links_the_release_tag():
    readme = (ROOT / "README.md").read_text()
    installs = set(re.findall(r"github\.com/gaugebook/gaugebook@(v[\w.]+)", readme))
    links = set(re.findall(r"github/gaugebook/gaugebook/blob/(v[\w.]+)/", readme))
    assert installs == links == {f"v{VERSION}"}, (installs, links)


def test_py_typed_is_shipped():
    assert (ROOT / "gaugebook" / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["gaugebook"]
