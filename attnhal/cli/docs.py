"""``attnhal docs``: write (or ``--check``) the generated docs: the capability matrix of the
shipped descriptors, and beside it the table of descriptor file keys with their bounds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attnhal.cli.app import UsageError

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser("docs", help="write the generated docs (docs/capabilities.md, docs/descriptor_fields.md)")
    p.add_argument("--path", default="docs/capabilities.md",
                   help="the capability matrix to write or check, relative to the current folder; the key table "
                        f"goes beside it, as {FIELDS_FILE}")
    p.add_argument("--check", action="store_true", help="exit 1 if the file is not current (write nothing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 1 when ``--check`` finds the file stale."""
    path = Path(args.path)
    if path.is_dir():
        raise UsageError(f"--path={path} is a folder (supported: a file path)")
    if args.check and not path.exists():
        raise UsageError(f"--path={path}: no such file (supported: an existing file; run in the repository "
                         "root or give --path)")
    if not args.check and not path.parent.is_dir():
        raise UsageError(f"--path={path}: folder {path.parent} does not exist (supported: a path in an "
                         "existing folder)")
    stale = [target for target, text in _generated(path) if _write_or_check(target, text, args.check)]
    if stale:
        print(f"attnhal docs: {', '.join(map(str, stale))} stale: run `attnhal docs --path {path}`", file=sys.stderr)
        return 1
    return 0


#: The key table's file name, in the folder of the capability matrix.
FIELDS_FILE = "descriptor_fields.md"


def _generated(path: Path) -> list[tuple[Path, str]]:
    from attnhal.docgen import capability_matrix, descriptor_fields

    return [(path, capability_matrix() + "\n"), (path.parent / FIELDS_FILE, descriptor_fields() + "\n")]


def _write_or_check(path: Path, text: str, check: bool) -> bool:
    """Write ``path`` (or with ``check`` compare it); True when it is stale."""
    if check:
        current = path.exists() and path.read_text(encoding="utf-8", errors="replace") == text
        print(f"{path} is {'current' if current else 'stale'}")
        return not current
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return False
