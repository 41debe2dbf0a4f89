"""The example engine's former package name: see :mod:`attnhal.example_engine`.

``attnhal.reference.worker`` and the other former submodule paths import the same modules.
"""

import importlib
import sys

from attnhal._compat import moved

moved("attnhal.reference", "attnhal.example_engine")

for _name in ("demo", "model", "stress", "tree", "worker"):
    sys.modules[f"{__name__}.{_name}"] = globals()[_name] = importlib.import_module(f"attnhal.example_engine.{_name}")
