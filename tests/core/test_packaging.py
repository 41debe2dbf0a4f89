"""What ``pip show attnhal`` and a package index see: the metadata the build writes from pyproject.toml."""

import re
import shutil
import subprocess
import sys
from email.parser import Parser
from importlib.metadata import version

import pytest

from attnhal.cli import main
from repo import ROOT

#: What the metadata build reads: the project files, no tests and no virtual environment.
SOURCES = ("pyproject.toml", "PACKAGE.md", "README.md", "MANIFEST.in", "attnhal", "backends", "engines", "docs")


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    """The METADATA setuptools writes for a wheel of a copy of the project (its own validation included)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("tests", "__pycache__", "*.egg-info"))
        else:
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("meta")
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    info = out / done.stdout.strip().splitlines()[-1] / "METADATA"
    return Parser().parsestr(info.read_text())


def test_metadata_names_authors_classifiers_and_no_invented_url(metadata):
    assert metadata["Name"] == "attnhal" and metadata["Author"] == "attnhal developers"
    classifiers = metadata.get_all("Classifier")
    assert "Development Status :: 3 - Alpha" in classifiers and "Typing :: Typed" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in classifiers)
    assert metadata["License-Expression"] == "Apache-2.0"
    urls = metadata.get_all("Project-URL") or []
    assert not any(re.search(r"example\.|TODO|placeholder|your-", u, re.I) for u in urls), urls


def test_the_long_description_has_no_relative_links(metadata):
    description = metadata.get_payload()
    assert "attnhal" in description and "pip install 'attnhal[kit]'" in description
    links = re.findall(r"\]\(([^)]+)\)", description) + re.findall(r'(?:href|src)="([^"]+)"', description)
    relative = [link for link in links if not re.match(r"https?://", link)]
    assert relative == [], f"relative links do not resolve on a package index: {relative}"


def test_version_flag_prints_the_installed_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"attnhal {version('attnhal')}"


def test_the_wheel_ships_no_test_folders():
    """The packages setuptools puts in the wheel (``[tool.setuptools.packages.find]``, namespace
    packages included): the kit (``attnhal.testing``) yes, the backends' ``tests`` folders no."""
    import tomllib

    from setuptools import find_namespace_packages

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = [p for where in found["where"] for p in find_namespace_packages(
        where=str(ROOT / where), include=found["include"], exclude=found.get("exclude", ()))]
    assert "attnhal.testing" in shipped and "attnhal_torch" in shipped
    assert [p for p in shipped if "tests" in p.split(".")] == []
    everything = find_namespace_packages(where=str(ROOT / "backends"), include=found["include"])
    assert "attnhal_torch.tests" in everything  # the exclusion is what keeps them out
