"""Every repository path the docs, the catalogue files, the docstrings and the comments cite exists.

A path is cited as ``attnhal/...``, ``backends/...``, ``engines/attnhal_*/...``, ``tests/...``, ``docs/...``,
``benchmarks/...`` or ``.ci/...`` ending in a file extension (a ``*`` in it must match a file).
Engine source citations (``layers/attention/aiter_backend.py:12``) name the engines' wheels,
not this repository, and are not read.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from repo import ROOT

CITED = re.compile(r"(?<![\w./-])((?:attnhal|backends|engines(?=/attnhal_)|tests|docs|benchmarks|\.ci)/[\w/.*-]*"
                   r"\.(?:py|md|toml|txt|sh|json|jsonl|cpp|h|yml|yaml|cfg))\b")

#: Paths cited on purpose that are not this repository's: the file a backend author writes in
#: their own package, and a name the catalogue test shows is not a catalogue name.
NOT_OURS = frozenset({"tests/test_attnhal_conformance.py", "tests/test_conformance.py", "docs/examples/x.toml"})


def _sources(root: Path) -> list[Path]:
    patterns = ("*.md", "docs/**/*.md", "tests/**/*.md", "attnhal/**/*.toml", "attnhal/**/*.py", "backends/**/*.py",
                "engines/**/*.toml", "engines/**/*.py",
                "tests/**/*.py", "benchmarks/**/*.py")
    this = Path(__file__).resolve()  # its planted paths are the self-test's
    return sorted({p for pattern in patterns for p in root.glob(pattern) if ".venv" not in p.parts and p.resolve() != this})


def stale_paths(root: Path) -> dict[str, list[str]]:
    """Cited path -> the files citing it, for each cited path that does not exist under ``root``."""
    out: dict[str, list[str]] = {}
    for source in _sources(root):
        for cited in CITED.findall(source.read_text(encoding="utf-8", errors="replace")):
            if cited in NOT_OURS:
                continue
            found = glob.glob(str(root / cited)) if "*" in cited else (root / cited).exists()
            if not found:
                out.setdefault(cited, []).append(str(source.relative_to(root)))
    return out


def test_every_cited_repository_path_exists() -> None:
    assert stale_paths(ROOT) == {}


def test_a_planted_stale_path_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "attnhal" / "engines").mkdir(parents=True)
    (tmp_path / "attnhal" / "engines" / "base.py").write_text('"""See attnhal/engines/base.py."""\n')
    (tmp_path / "docs" / "a.md").write_text("Read `attnhal/engines/vllm.py` and attnhal/engines/base.py and "
                                            "backends/x/tests/test_*.py; sglang/srt/server_args.py is SGLang's.\n")
    assert stale_paths(tmp_path) == {"attnhal/engines/vllm.py": ["docs/a.md"],
                                     "backends/x/tests/test_*.py": ["docs/a.md"]}
