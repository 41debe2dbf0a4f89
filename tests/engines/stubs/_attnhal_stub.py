"""Stand-in packages for the engine test environments (not the real packages).

Some packages the engines import at module level cannot be installed on a CPU-only machine
(torchvision: only CUDA builds for this torch; sgl_kernel and flash_mla: CUDA kernels). The
engine tiers never run their code: they execute the engines' configuration and graph-decision
code, which imports these modules but calls nothing from them. A stand-in answers every
``import NAME.X`` and every attribute with an inert placeholder; calling a placeholder raises,
so a test that reaches the real package's code fails loudly instead of passing on a fake.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class Placeholder:
    """An attribute of a stand-in: usable as a base class, a decorator target or a default value."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "Placeholder":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: stand-in of the attnhal engine test environment, not the real package")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class StandInModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every submodule of one stand-in package a stand-in module."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.package + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def stand_in(package: str, version: str) -> None:
    """Turn the package being imported into a stand-in (called from its ``__init__``)."""
    module = sys.modules[package]
    module.__class__ = StandInModule
    module.__version__ = version  # type: ignore[attr-defined]
    sys.meta_path.insert(0, _Finder(package))
