"""attnhal's import graph from its source, the engine packages beside it included: which module
imports which, counting every import (lazy ones inside functions and ``if TYPE_CHECKING:`` ones
too), and its circles.

Left out by name: :data:`HOOKS`, the engine-side entry points that must not import attnhal (a
test in tests/engines checks that they do not)."""

from __future__ import annotations

import ast
from pathlib import Path

from repo import ROOT

__all__ = ["ENGINE_PACKAGES", "HOOKS", "circles", "import_graph", "modules"]

#: The engine adapters' packages, beside the core (``engines/<name>``).
ENGINE_PACKAGES = ("attnhal_sglang", "attnhal_vllm")
#: The engines' plugin entry points: they import no attnhal, so no circle can pass through them.
HOOKS = ("attnhal_hooks",)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the attnhal package and the engine packages."""
    out = {}
    trees = [(root, root / "attnhal")] + [(root / "engines", root / "engines" / name) for name in ENGINE_PACKAGES]
    for base, tree in trees:
        for path in sorted(tree.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


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
    """Module -> the attnhal (and engine package) modules it imports, every import counted."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
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
