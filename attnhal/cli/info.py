"""``attnhal info``: the platform, the Triton distribution, the registered backends and their capabilities,
and the engine releases attnhal supports next to the installed ones."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnhal.capabilities import AttentionRequest, BackendCapabilities
from attnhal.cli.inputs import resolve_platform
from attnhal.cli.output import cell, print_json, table, yes_no
from attnhal.engines import versions
from attnhal.platform import ENV_VAR, Platform
from attnhal.registry import BackendEntry, Registry

__all__ = ["backend_status", "capability_summary", "register", "run", "triton_info", "triton_status"]


def register(sub: Any) -> None:
    p = sub.add_parser("info", help="platform, Triton, registered backends and their capabilities")
    p.add_argument("--platform", help=f"simulate a platform (default: ${ENV_VAR}, else the detected device)")
    p.add_argument("--json", action="store_true", help="print the same content as JSON")
    p.add_argument("--build", action="store_true", help="also build/load native kernels and print their build time")
    p.set_defaults(func=run)


def triton_status() -> dict[str, Any]:
    """Which distribution provides ``triton``, its version and vendor backends — without importing it."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return {"installed": False, "distributions": {}, "vendor_backends": [],
                "hint": "pip install 'attnhal[triton]'; on ROCm it comes with torch as pytorch-triton-rocm"}
    dists: dict[str, str] = {}
    for dist in packages_distributions().get("triton", []):
        try:
            dists[dist] = version(dist)
        except PackageNotFoundError:
            dists[dist] = "unknown"
    backends_dir = Path(next(iter(spec.submodule_search_locations))) / "backends"
    vendors = sorted(d.name for d in backends_dir.iterdir() if d.is_dir() and not d.name.startswith("_")) \
        if backends_dir.is_dir() else []
    return {"installed": True, "distributions": dists, "vendor_backends": vendors}


def triton_info() -> str:
    """The ``triton:`` line of ``info``: distribution, version, vendor backends (or how to install it)."""
    status = triton_status()
    if not status["installed"]:
        return f"not installed ({status['hint']})"
    dists = ", ".join(f"{d} {v}" for d, v in status["distributions"].items()) or "unknown distribution"
    return f"{dists}; backends: {', '.join(status['vendor_backends']) or 'none'}"


def capability_summary(c: BackendCapabilities) -> dict[str, Any]:
    """The capability columns of ``info`` (text and JSON share them)."""
    def names(xs: Any) -> list[str]:
        return sorted(str(getattr(x, "value", x)) for x in xs)
    return {"vendors": names(c.vendors), "phases": names(c.phases), "graph": names(c.graph),
            "multi_step": c.multi_step is not None, "dtypes": names(c.dtypes),
            "head_sizes": sorted(int(h) for h in c.head_sizes), "features": names(c.features)}


def backend_status(entry: BackendEntry, platform: Platform) -> dict[str, Any]:
    """One backend as ``info`` reports it: available on this platform or why not."""
    reasons = entry.reasons(AttentionRequest(), platform)
    caps = entry.capabilities
    return {"available": not reasons, "reasons": [r.to_dict() for r in reasons], "source": entry.source,
            "capabilities": capability_summary(caps) if caps is not None else None}


def run(args: argparse.Namespace) -> int:
    """Always exit 0: ``info`` reports, it does not judge."""
    p = resolve_platform(args.platform)
    backends = {e.name: backend_status(e, p) for e in args.registry.ordered(p)}
    builds = native_builds(args.registry, p) if args.build else None
    engines = versions.table()
    if args.json:
        print_json({"platform": p.name, "device": p.device_name, "simulated": p.simulated,
                    "vendor": p.vendor.value, "arch": p.arch, "warp_size": p.warp_size,
                    "fp8": p.fp8_flavor.value, "graph_api": p.has_graph_api, "graph_kind": p.graph_kind.value,
                    "graph_device": p.graph_device, "graph_device_error": p.graph_device_error,
                    "torch_device": p.torch_device, "triton": triton_status(), "backends": backends,
                    "engines": [row.to_dict() for row in engines],
                    **({"builds": builds} if builds is not None else {})})
        return 0
    print(f"platform: {p.name} ({p.device_name}{', simulated' if p.simulated else ''})")
    print(f"  vendor={p.vendor.value} arch={p.arch} warp_size={p.warp_size} fp8={p.fp8_flavor.value} "
          f"graph_api={yes_no(p.has_graph_api)} graph_kind={p.graph_kind.value} device={p.torch_device}")
    print(f"  graph_device={p.graph_device or '-'}"
          + (f": cannot capture here ({p.graph_device_error}); every phase plans eager" if p.graph_device_error
             else ""))
    print(f"triton: {triton_info()}")
    rows = [(name, "available" if b["available"] else "unavailable",
             "; ".join(f"[{r['code']}] {r['message']}" for r in b["reasons"]) or "-", b["source"])
            for name, b in backends.items()]
    print("\nbackends:\n" + table(("name", "status", "reasons", "source"), rows))
    caps = [(name, *(cell(v) for v in b["capabilities"].values()))
            for name, b in backends.items() if b["capabilities"] is not None]
    print("\ncapabilities:\n" + table(("name", "vendors", "phases", "graph", "multi_step", "dtypes",
                                       "head_sizes", "features"), caps))
    print("\nengines (what each plugin does on a release not listed as supported: its status):\n"
          + table(("engine", "supported", "installed", "status"),
                  [(e.engine, ", ".join(e.supported) or "-", e.installed or "-", e.status) for e in engines]))
    if builds is not None:
        print("\nnative builds (first use builds, later runs load the cache):\n"
              + table(("name", "build"), list(builds.items()) or [("-", "none")]))
    return 0


def native_builds(registry: Registry, platform: Platform) -> dict[str, str]:
    """Backend name -> its native build's state (built, building, failed, ...), for those that build."""
    infos = {e.name: e.backend.build_info() for e in registry.ordered(platform) if e.backend is not None}
    return {name: info for name, info in infos.items() if info is not None}
