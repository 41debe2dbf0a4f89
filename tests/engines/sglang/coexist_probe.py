"""Run in a fresh process by ``test_plugin_coexist.py``: attnhal's SGLang plugin and a second plugin
hooking the same methods, loaded by SGLang's ``load_plugins()`` in the order ``argv[1]`` names
(``attnhal-first`` or ``other-first``: the order of their distributions on ``sys.path``, which is
the order ``entry_points()`` yields them). The worker modules are not imported before
``load_plugins()``: SGLang's ``apply_hooks()`` imports them to apply the other plugin's hooks,
which is when attnhal's lazy loader registers its own. Prints one JSON line: per hooked method,
the plugins whose wrappers it carries (outermost first), and per plugin the hook calls made by
one execution of SGLang's ``EagleDraftWorker._capture_cuda_graphs`` (the seed case, audit).
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "helpers")]

from entry_point_overlay import overlay  # noqa: E402

CALLS: collections.Counter[str] = collections.Counter()
OTHER = '''
import collections
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
CALLS = collections.Counter()
TARGETS = {targets!r}

def _hook(target):
    def around(original, *args, **kwargs):
        CALLS[target] += 1
        return original(*args, **kwargs)
    around.attnhal_probe_plugin = "other"
    return around

def register():
    for target in TARGETS:
        HookRegistry.register(target, _hook(target), HookType.AROUND)
'''


def _dist(folder: Path, name: str, group_line: str) -> None:
    record = folder / f"{name.replace('-', '_')}-1.0.dist-info"  # metadata reads the name up to the first "-"
    record.mkdir()
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (record / "entry_points.txt").write_text(f"[sglang.srt.plugins]\n{group_line}\n")


def _counted_hooks() -> None:
    """attnhal's hook factories, each hook counting its calls and marked as attnhal's."""
    from attnhal_sglang import plugin

    def counted(target: str, make):  # type: ignore[no-untyped-def]
        def factory(mode: str):  # type: ignore[no-untyped-def]
            hook = make(mode)

            def around(original, *args, **kwargs):  # type: ignore[no-untyped-def]
                CALLS[f"attnhal {target}"] += 1
                return hook(original, *args, **kwargs)
            around.attnhal_probe_plugin = "attnhal"  # type: ignore[attr-defined]
            return around
        return factory

    plugin.HOOKS = {t: counted(t, make) for t, make in plugin.HOOKS.items()}


def _chain(function) -> list[str]:  # type: ignore[no-untyped-def]
    """The plugins whose wrappers ``function`` carries, outermost first (SGLang's ``_wrap_fn``
    wrappers keep the hook in their closure and the wrapped function in ``__wrapped__``)."""
    out = []
    while hasattr(function, "__wrapped__"):
        cells = [c.cell_contents for c in function.__closure__ or ()]
        out.append(next((getattr(c, "attnhal_probe_plugin", "?") for c in cells if callable(c)
                         and hasattr(c, "attnhal_probe_plugin")), "?"))
        function = function.__wrapped__
    return out


def main(order: str) -> None:
    from attnhal_sglang.plugin import HOOKS

    os.environ["ATTNHAL_SGLANG_GRAPHS"] = "audit"
    _counted_hooks()
    with tempfile.TemporaryDirectory() as tmp, overlay() as record:
        other = Path(tmp)
        (other / "attnhal_probe_other.py").write_text(OTHER.format(targets=sorted(HOOKS)))
        _dist(other, "attnhal-probe-other", "other = attnhal_probe_other:register")
        # entry_points() yields distributions in sys.path order; the overlay put attnhal's first.
        at = 0 if order == "other-first" else sys.path.index(str(record.parent)) + 1
        sys.path.insert(at, str(other))
        importlib.invalidate_caches()
        assert not any(m.startswith("sglang.srt.speculative.") for m in sys.modules)
        from sglang.srt.plugins import load_plugins, load_plugins_by_group

        loaded = list(load_plugins_by_group("sglang.srt.plugins"))
        load_plugins()
        import attnhal_probe_other

        chains = {}
        for target in sorted(HOOKS):
            import pkgutil

            owner, _, name = target.rpartition(".")
            chains[target] = _chain(vars(pkgutil.resolve_name(owner))[name])
        calls = _capture_once()
        calls.update({f"other {t}": n for t, n in attnhal_probe_other.CALLS.items()})
    print(json.dumps({"order": loaded, "chains": chains, "calls": dict(calls)}))


def _capture_once() -> collections.Counter[str]:
    """One execution of the hooked ``_capture_cuda_graphs`` (the tier's seed case)."""
    import engine_tier
    import harness
    from sglang_grid import Case

    engine_tier.isolate()
    harness.import_engine()
    case = Case("aiter", "hip:gfx942", "mha", 1, 1)
    resolution = harness.resolve(case.args(), case.platform, case.model)
    os.environ["ATTNHAL_PLATFORM"] = case.platform
    CALLS.clear()
    harness.draft_graphs(resolution, case.platform, worker=harness.WORKERS[case.algorithm])
    return CALLS


if __name__ == "__main__":
    main(sys.argv[1])
