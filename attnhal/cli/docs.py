"""``attnhal docs``: write (or ``--check``) the capability matrix generated from the registered descriptors."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attnhal.cli.app import UsageError

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser("docs", help="write the generated capability matrix (docs/capabilities.md)")
    p.add_argument("--path", default="docs/capabilities.md",
                   help="the file to write or check, relative to the current folder")
    p.add_argument("--check", action="store_true", help="exit 1 if the file is not current (write nothing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 1 when ``--check`` finds the file stale."""
    from attnhal.docgen import capability_matrix

    path = Path(args.path)
    if path.is_dir():
        raise UsageError(f"--path={path} is a folder (supported: a file path)")
    if args.check and not path.exists():
        raise UsageError(f"--path={path}: no such file (supported: an existing file; run in the repository "
                         "root or give --path)")
    if not args.check and not path.parent.is_dir():
        raise UsageError(f"--path={path}: folder {path.parent} does not exist (supported: a path in an "
                         "existing folder)")
    text = capability_matrix() + "\n"
    if args.check:
        if path.read_text(encoding="utf-8", errors="replace") != text:
            print(f"attnhal docs: {path} is stale: run `attnhal docs --path {path}`", file=sys.stderr)
            return 1
        print(f"{path} is current")
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0
