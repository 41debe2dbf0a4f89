"""The suite the attnhal pytest plugin collects for ``--attnhal-backend NAME``.

Not a test file of this repository (no ``test_`` prefix): the plugin adds it to the
collection only when the option is given.
"""

from __future__ import annotations

from typing import ClassVar

from attnhal.testing.conformance import BackendConformance


class TestAttnhalConformance(BackendConformance):
    """Every claim of the backend named by ``--attnhal-backend``."""

    from_option: ClassVar[bool] = True
