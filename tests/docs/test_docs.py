"""Generated docs are current; the README opens with the two fresh-machine commands."""

import re

from attnhal.cli import main
from attnhal.docgen import capability_matrix
from repo import ROOT



def test_capability_matrix_is_current():
    assert (ROOT / "docs/capabilities.md").read_text() == capability_matrix() + "\n", \
        "docs/capabilities.md is stale: run `attnhal docs`"


def test_docs_check_command(tmp_path, capsys):
    stale = tmp_path / "capabilities.md"
    stale.write_text("old")
    assert main(["docs", "--path", str(stale), "--check"]) == 1
    assert main(["docs", "--path", str(stale)]) == 0
    assert main(["docs", "--path", str(stale), "--check"]) == 0


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
