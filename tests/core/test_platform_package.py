"""The platform and graphs packages behind their old names: as_platform, re-exports, light imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

import attnhal.platform as platform
from attnhal.platform import Platform, Vendor, as_platform, current, parse
from repo import ROOT

#: Every public name the single module ``attnhal.platform`` had (before it became a package).
OLD_NAMES = ("ArchFacts", "ArchKey", "ArchSet", "ENV_VAR", "Fp8Flavor", "GraphKind", "Platform", "PlatformSpecError",
             "UnknownArchWarning", "VENDORS", "Vendor", "VendorRow", "arch_at_least", "arch_sets", "current",
             "detect", "normalize_arch", "parse")


def test_as_platform_takes_a_platform_a_spec_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    hip = parse("hip:gfx942")
    assert as_platform(hip) is hip
    assert as_platform("hip:gfx942") == hip and as_platform("cpu,nographs") == parse("cpu,nographs")
    monkeypatch.setenv("ATTNHAL_PLATFORM", "cuda:sm90")
    assert as_platform() == as_platform(None) == parse("cuda:sm90")  # None detects
    with pytest.raises(TypeError, match=r"platform=3 \(supported: a Platform, a spec string"):
        as_platform(3)  # type: ignore[arg-type]


def test_current_is_the_old_name_of_as_platform() -> None:
    assert current is as_platform


def test_every_old_name_is_still_importable() -> None:
    missing = [name for name in OLD_NAMES if not hasattr(platform, name)]
    assert not missing
    assert set(OLD_NAMES) | {"as_platform"} >= set(platform.__all__) >= {"ENV_VAR", "arch_sets", "normalize_arch"}
    assert callable(platform.detect) and platform.detect().vendor in Vendor  # the function, not a module


def test_the_submodules_hold_one_concept_each() -> None:
    from attnhal.platform import archs, detection, facts, vendors

    assert platform.Platform is facts.Platform and platform.parse is facts.parse
    assert platform.VENDORS is vendors.VENDORS and platform.ArchSet is archs.ArchSet
    assert platform.detect is detection.detect and isinstance(parse("cpu"), Platform)


def test_torch_version_moved_next_to_detection() -> None:
    from attnhal.graphs.runner import torch_version as old_path
    from attnhal.platform.detection import torch_version

    assert old_path is torch_version and torch_version("2.9.0+rocm6.4") == (2, 9)


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_platform_package_and_detection_by_env_import_no_torch() -> None:
    done = _fresh("import os, sys\nos.environ['ATTNHAL_PLATFORM'] = 'hip:gfx942'\n"
                  "import attnhal.platform as p\nassert p.detect().arch == 'gfx942'\n"
                  "print('torch' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# The two ends of the circles the split removed (graphs/__init__ <-> runner, contract <-> validate),
# and the module that may import torch.
@pytest.mark.parametrize("module", ["attnhal.graphs.runner", "attnhal.backend.validate", "attnhal.platform.detection"])
def test_a_submodule_imports_first(module: str) -> None:
    """No submodule depends on its package's ``__init__`` having run to some line first."""
    done = _fresh(f"import {module}")
    assert done.returncode == 0, done.stderr


def test_graph_step_names() -> None:
    from attnhal.graphs import InputSpec, StepInput
    from attnhal.graphs.runner import InputSpec as old_path

    assert InputSpec is StepInput is old_path
    import torch

    assert StepInput("token", (2, 8), torch.float32).per == "token"
