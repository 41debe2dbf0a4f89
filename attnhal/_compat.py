"""Former module paths: each stays importable and says where its names live now."""

from __future__ import annotations

import warnings


def moved(old: str, new: str) -> None:
    """Warn, once per importing module, that module ``old`` is now ``new``."""
    warnings.warn(f"{old} is deprecated: its names live in {new}; import them from there",
                  DeprecationWarning, stacklevel=3)
