"""The import graph of attnhal: no circle, and every import runs down the documented layer order.

The order and the package map live in docs/architecture.md (the ``layers`` block and the module
table); this test reads them from there, so the document and the code cannot drift apart.
Every import counts: lazy ones (inside a function) and ``if TYPE_CHECKING:`` ones too, in attnhal
and in the engine packages beside it (``engines/attnhal_*``; only the hook entry points, which
import no attnhal, are left out: ``module_graph.HOOKS``).
"""

from __future__ import annotations

import re

import pytest
from module_graph import ENGINE_PACKAGES, HOOKS, circles, import_graph, modules
from repo import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def documented_layers(text: str) -> list[list[str]]:
    """The ``layers`` block of docs/architecture.md: one layer per line, lowest first."""
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    return [line.split("#")[0].split() for line in block.group(1).splitlines() if line.split("#")[0].strip()]


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """The layer of the longest documented prefix of ``module``."""
    best: tuple[int, int] | None = None
    for i, names in enumerate(layers):
        for prefix in names:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), i)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = layer_of(module, layers), layer_of(target, layers)
            if a is not None and b is not None and b > a:
                out.append(f"{module} (layer {a}) imports {target} (layer {b})")
    return out


GRAPH = import_graph()
LAYERS = documented_layers(ARCHITECTURE.read_text(encoding="utf-8"))


def test_the_tiers_are_six_to_eight_runs_of_the_layers_in_order():
    """Each tier of the ```tiers block starts at a line of the layers block, in the layers' order,
    so every layer falls in exactly one tier and imports run down the tiers as they run down the layers."""
    block = re.search(r"```tiers\n(.*?)```", ARCHITECTURE.read_text(encoding="utf-8"), re.S)
    assert block, "docs/architecture.md has no ```tiers block"
    tiers = [line.split() for line in block.group(1).splitlines() if line.strip()]
    assert 6 <= len(tiers) <= 8 and all(len(t) == 2 for t in tiers)
    starts = [next((i for i, names in enumerate(LAYERS) if names[0] == first), None) for _, first in tiers]
    assert None not in starts and starts[0] == 0 and starts == sorted(set(starts)), list(zip(tiers, starts))


def test_there_is_no_import_circle():
    assert circles(GRAPH) == []


def test_every_module_has_a_documented_layer():
    assert [m for m in GRAPH if layer_of(m, LAYERS) is None] == []


def test_imports_run_down_the_documented_layers():
    assert upward_imports(GRAPH, LAYERS) == []


def test_the_package_map_lists_every_package_and_top_level_module():
    table = ARCHITECTURE.read_text(encoding="utf-8").split("## Modules", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(attnhal[\w.]*)`", table, re.M))
    wanted = {m for m, p in modules().items() if m.split(".")[0] == "attnhal" and m.count(".") <= 1
              and not m.split(".")[-1].startswith("_")}
    assert sorted(wanted - listed) == []
    folders = set(re.findall(r"^\| `engines/(attnhal_\w+)`", table, re.M))
    assert folders == {*ENGINE_PACKAGES, *HOOKS}


def _copy(tmp_path):  # type: ignore[no-untyped-def]
    import shutil

    shutil.copytree(ROOT / "attnhal", tmp_path / "attnhal")
    for name in ENGINE_PACKAGES:
        shutil.copytree(ROOT / "engines" / name, tmp_path / "engines" / name)
    assert circles(import_graph(tmp_path)) == [] and upward_imports(import_graph(tmp_path), LAYERS) == []


@pytest.mark.parametrize("planted", ["circle", "type-only circle", "engine circle", "upward", "upward to an engine"])
def test_the_checks_catch_a_planted_defect(tmp_path, planted):
    """A copy of the packages with one planted import: the check that guards it must see it."""
    _copy(tmp_path)
    if planted == "circle":  # the lowest layer imports the highest module that imports it back
        victim = tmp_path / "attnhal" / "spec.py"
        victim.write_text(victim.read_text() + "\n\ndef _late():\n    import attnhal.cli\n")
        assert any("attnhal.spec" in group for group in circles(import_graph(tmp_path)))
    elif planted == "type-only circle":  # a type-only import back closes a circle too
        victim = tmp_path / "attnhal" / "engines" / "registry.py"
        victim.write_text(victim.read_text() + "\nif TYPE_CHECKING:\n    from attnhal.catalog import CatalogEntry\n")
        assert ["attnhal.catalog", "attnhal.engines.registry"] in circles(import_graph(tmp_path))
    elif planted == "engine circle":  # inside an engine package, as resolution <-> audit was
        victim = tmp_path / "engines" / "attnhal_sglang" / "audit.py"
        victim.write_text(victim.read_text() + "\nif TYPE_CHECKING:\n    from attnhal_sglang.config import x\n")
        assert any("attnhal_sglang.audit" in group for group in circles(import_graph(tmp_path)))
    elif planted == "upward to an engine":  # the core reaching into an adapter, as the CLI's kit once did
        victim = tmp_path / "attnhal" / "cli" / "conformance.py"
        victim.write_text(victim.read_text() + "\n\ndef _kit():\n    from attnhal_sglang.kit import runner\n")
        assert any(line.startswith("attnhal.cli.conformance ") and "attnhal_sglang" in line
                   for line in upward_imports(import_graph(tmp_path), LAYERS))
    else:
        victim = tmp_path / "attnhal" / "reasons.py"
        victim.write_text(victim.read_text() + "\nfrom attnhal.phases import Phase\n")
        assert any(line.startswith("attnhal.reasons ") for line in upward_imports(import_graph(tmp_path), LAYERS))
