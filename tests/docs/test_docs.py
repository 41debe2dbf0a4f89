"""Generated docs are current; the README opens with the two fresh-machine commands."""

import re

import pytest

from attnhal.cli import main
from attnhal.docgen import capability_matrix
from repo import ROOT



def test_capability_matrix_is_current():
    assert (ROOT / "docs/capabilities.md").read_text() == capability_matrix() + "\n", \
        "docs/capabilities.md is stale: run `attnhal docs`"


def test_descriptor_key_table_is_current_and_lists_every_key_of_the_schema():
    from attnhal.capabilities.fields import FIELDS
    from attnhal.capabilities.schema import KEYS
    from attnhal.docgen import descriptor_fields

    assert (ROOT / "docs/descriptor_fields.md").read_text() == descriptor_fields() + "\n", \
        "docs/descriptor_fields.md is stale: run `attnhal docs`"
    assert sorted(f.key for f in FIELDS) == sorted(KEYS)  # a new key of the schema needs its row


def test_docs_check_command(tmp_path, capsys):
    stale = tmp_path / "capabilities.md"
    stale.write_text("old")
    assert main(["docs", "--path", str(stale), "--check"]) == 1
    assert main(["docs", "--path", str(stale)]) == 0
    assert main(["docs", "--path", str(stale), "--check"]) == 0
    assert (tmp_path / "descriptor_fields.md").exists()  # the key table is written beside the matrix


def test_readme_starts_with_install_and_test_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block and text.index("```bash") < 20
    install, tests = block.group(1).strip().splitlines()
    assert "torch==2.13.0" in install and install.endswith("attnhal demo")
    assert tests == ".venv/bin/python -m pytest -q -n 2"
    assert tests in (ROOT / ".ci/run").read_text()


def test_docs_link_to_existing_files():
    for md in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#]+\.(?:md|toml|json))\)", md.read_text()):
            assert (md.parent / target).exists(), f"{md.name} links to missing {target}"


FAKE_BACKEND = '''
from attnhal.capabilities import BackendCapabilities
from attnhal.registry import BackendPlugin

PLUGIN = BackendPlugin(BackendCapabilities(name="thirdparty", vendors={"cpu"}, phases={"decode"}),
                       "thirdparty_backend:Missing")
'''


@pytest.fixture
def third_party_backend(tmp_path, monkeypatch):
    """A backend another distribution registers (a dist-info on sys.path), seen by a fresh registry."""
    import attnhal.registry

    (tmp_path / "thirdparty_backend.py").write_text(FAKE_BACKEND)
    info = tmp_path / "thirdparty_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[attnhal.backends]\nthirdparty = thirdparty_backend:PLUGIN\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(attnhal.registry, "_DEFAULT", None)
    assert "thirdparty" in attnhal.registry.default_registry().names()
    yield


def test_the_matrix_covers_the_shipped_backends_only(third_party_backend, capsys):
    text = capability_matrix()
    assert "thirdparty" not in text and "(cpu, torch, triton)" in text
    assert text + "\n" == (ROOT / "docs/capabilities.md").read_text()
    assert main(["docs", "--check", "--path", str(ROOT / "docs/capabilities.md")]) == 0


def test_cli_doc_lists_the_compile_check_targets_of_the_code():
    from attnhal_triton.compile_check import DEFAULT_TARGETS

    section = (ROOT / "docs/cli.md").read_text().split("## `attnhal compile-check`")[1].split("\n## ")[0]
    listed = re.search(r"for the targets `([^`]+)`", section)
    assert listed and tuple(listed.group(1).split()) == tuple(DEFAULT_TARGETS), \
        "docs/cli.md: the compile-check target list differs from DEFAULT_TARGETS"


def test_backends_doc_gives_the_per_phase_signature_of_the_code():
    import inspect

    from attnhal.backend import AttentionBackend
    from attnhal.phases import Phase

    text = (ROOT / "docs/backends.md").read_text()
    for phase in Phase:
        params = tuple(inspect.signature(getattr(AttentionBackend, f"forward_{phase.value}")).parameters)
        assert params == ("self", "q", "layer", "batch"), phase
    assert "(self, q, layer, batch) -> Tensor" in text
    assert tuple(inspect.signature(AttentionBackend.forward).parameters) == ("self", "q", "k", "v", "layer", "batch")
    assert "def forward(self, q, k, v, layer, batch) -> Tensor                 # base: checks, writes k/v" in text
