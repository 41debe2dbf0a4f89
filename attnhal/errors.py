"""The root of attnhal's errors: ``except attnhal.AttnhalError`` catches every error attnhal raises on purpose.

Each error also keeps its builtin base (``ValueError`` for bad input, ``LookupError`` for a
name that resolves to nothing, ``RuntimeError`` for a failed run, ...), so code that
catches those goes on working.
"""

from __future__ import annotations

__all__ = ["AttnhalError"]


class AttnhalError(Exception):
    """Base of attnhal's errors (mixed in beside each one's builtin base)."""
