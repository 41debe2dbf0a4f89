"""attnhal's entry points as this clone declares them, visible to ``importlib.metadata`` for a while.

The engine environments are shared by clones (``tests/engines/setup.sh``): the attnhal installed
there carries the entry-point tables of whichever clone reinstalled it last. A tier test that
loads the plugins through the engine's own loader wants this clone's tables: :func:`overlay`
writes a distribution record named ``attnhal`` with them into a temporary directory put first on
``sys.path``, so ``entry_points()`` finds it before the installed one (the first distribution of a
name wins), and removes it afterwards. Whether the installed environment registers the plugins
is a separate test, which reads the environment as it is.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def entry_points_txt(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The ``entry_points.txt`` of pyproject's ``[project.entry-points.*]`` and ``[project.scripts]``."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    tables = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    return "".join(f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items()) + "\n"
                   for group, entries in tables.items() if entries)


@contextlib.contextmanager
def overlay() -> Iterator[Path]:
    """This clone's entry points first on ``sys.path`` for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="attnhal-entry-points-") as folder:
        record = Path(folder) / "attnhal-0.0.0+clone.dist-info"
        record.mkdir()
        (record / "METADATA").write_text("Metadata-Version: 2.1\nName: attnhal\nVersion: 0.0.0+clone\n")
        (record / "entry_points.txt").write_text(entry_points_txt())
        sys.path.insert(0, folder)
        importlib.invalidate_caches()
        try:
            yield record
        finally:
            sys.path.remove(folder)
            importlib.invalidate_caches()
