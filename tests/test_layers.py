"""The import graph of attnhal: no circle, and every import runs down the documented layer order.

The order and the package map live in docs/architecture.md (the ``layers`` block and the module
table); this test reads them from there, so the document and the code cannot drift apart.
Run-time imports count, lazy ones (inside a function) included; ``if TYPE_CHECKING:`` imports
do not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the attnhal package."""
    out = {}
    for path in sorted((root / "attnhal").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    # ``from pkg import sub`` imports the module ``pkg.sub``; ``from pkg import name`` runs pkg's __init__.
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    return subs if len(subs) == len(node.names) else [base, *subs]


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the attnhal modules it imports at run time."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                for target in _targets(name, path, node, known):
                    while target not in known and "." in target:  # ``attnhal.x.Name`` -> ``attnhal.x``
                        target = target.rsplit(".", 1)[0]
                    if target in known and target != name:
                        graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


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


def test_there_is_no_import_circle():
    assert circles(GRAPH) == []


def test_every_module_has_a_documented_layer():
    assert [m for m in GRAPH if layer_of(m, LAYERS) is None] == []


def test_imports_run_down_the_documented_layers():
    assert upward_imports(GRAPH, LAYERS) == []


def test_the_package_map_lists_every_package_and_top_level_module():
    table = ARCHITECTURE.read_text(encoding="utf-8").split("## Modules", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(attnhal[\w.]*)`", table, re.M))
    wanted = {m for m, p in modules().items() if m.count(".") <= 1 and not m.split(".")[-1].startswith("_")}
    assert sorted(wanted - listed) == []


@pytest.mark.parametrize("planted", ["circle", "upward"])
def test_the_checks_catch_a_planted_defect(tmp_path, planted):
    """A copy of the package with one planted import: the check that guards it must see it."""
    import shutil

    shutil.copytree(ROOT / "attnhal", tmp_path / "attnhal")
    if planted == "circle":  # the lowest layer imports the highest module that imports it back
        victim = tmp_path / "attnhal" / "spec.py"
        victim.write_text(victim.read_text() + "\n\ndef _late():\n    import attnhal.cli\n")
        assert any("attnhal.spec" in group for group in circles(import_graph(tmp_path)))
    else:
        victim = tmp_path / "attnhal" / "reasons.py"
        victim.write_text(victim.read_text() + "\nfrom attnhal.phases import Phase\n")
        assert any(line.startswith("attnhal.reasons ") for line in upward_imports(import_graph(tmp_path), LAYERS))
