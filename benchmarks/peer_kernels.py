"""Load the engines' own Triton attention kernels: from the installed engine, else from a cache.

Each peer is a released engine whose attention kernels are plain Python files in its
wheel. :func:`load_peer` imports them from the installed engine when it is importable;
otherwise from the cache folder that ``benchmarks/fetch_peer_kernels.py`` fills
(``DIR/<engine>-<version>/<the files below>``), beside the stand-ins of
:mod:`peer_standins`. Nothing of the engines is committed to this repository.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

__all__ = ["PEERS", "LoadedPeer", "PeerSpec", "default_peers_dir", "load_peer"]


@dataclass(frozen=True)
class PeerSpec:
    """A released engine and the kernel files the benchmark runs from it.

    modules: what the benchmark imports from the engine (kernels, and vLLM's quant-mode enum);
    files: the wheel members those modules need (the modules and what they import).
    """

    engine: str
    version: str
    modules: tuple[str, ...]
    files: tuple[str, ...]

    @property
    def cache_name(self) -> str:
        return f"{self.engine}-{self.version}"


PEERS: dict[str, PeerSpec] = {
    "sglang": PeerSpec(
        "sglang", "0.5.23",
        # extend_attention: its Triton backend's target_verify (and MLA verify) kernel.
        modules=("sglang.kernels.ops.attention.decode_attention", "sglang.kernels.ops.attention.metadata",
                 "sglang.kernels.ops.attention.extend_attention"),
        files=("sglang/kernels/ops/attention/decode_attention.py", "sglang/kernels/ops/attention/metadata.py",
               "sglang/kernels/ops/attention/score_mod.py", "sglang/kernels/ops/attention/extend_attention.py")),
    "vllm": PeerSpec(
        "vllm", "0.33.0",
        modules=("vllm.v1.attention.ops.triton_unified_attention", "vllm.v1.kv_cache_interface",
                 "vllm.v1.attention.ops.triton_decode_attention"),  # the last: TRITON_MLA's kernel
        files=("vllm/v1/attention/ops/triton_unified_attention.py",
               "vllm/v1/attention/ops/triton_attention_helpers.py",
               "vllm/v1/attention/ops/triton_decode_attention.py")),
}


@dataclass
class LoadedPeer:
    """One peer's modules, or why it is not available (``modules`` empty then)."""

    spec: PeerSpec
    source: str  # "loaded from installed engine sglang 0.5.23", "loaded from cache DIR", "not available: <reason>"
    modules: dict[str, ModuleType] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return bool(self.modules)

    def module(self, name: str) -> ModuleType:
        return self.modules[name]


def default_peers_dir() -> Path:
    """``$ATTNHAL_PEER_KERNELS``, else ``~/.cache/attnhal/peer-kernels``."""
    return Path(os.environ.get("ATTNHAL_PEER_KERNELS") or Path.home() / ".cache" / "attnhal" / "peer-kernels")


def _installed_version(engine: str) -> str | None:
    try:
        importlib.import_module(engine)
        return importlib.metadata.version(engine)
    except Exception:  # noqa: BLE001 - any failure means "not usable as installed"
        return None


def _import_all(spec: PeerSpec) -> dict[str, ModuleType]:
    return {name: importlib.import_module(name) for name in spec.modules}


def load_peer(name: str, peers_dir: Path | None = None) -> LoadedPeer:
    """Peer ``name``'s kernel modules: installed engine first, then ``peers_dir``'s cache.

    Never raises for a missing or broken peer: the result says why it is not available.
    """
    spec = PEERS[name]
    version = _installed_version(spec.engine)
    if version is not None:
        note = "" if version == spec.version else f" (benchmark written for {spec.version})"
        try:
            return LoadedPeer(spec, f"loaded from installed engine {spec.engine} {version}{note}", _import_all(spec))
        except Exception as exc:  # noqa: BLE001 - reported
            return LoadedPeer(spec, f"not available: installed {spec.engine} {version}: "
                                    f"{type(exc).__name__}: {exc}")
    root = (peers_dir or default_peers_dir()).expanduser() / spec.cache_name
    missing = [f for f in spec.files if not (root / f).is_file()]
    if missing:
        return LoadedPeer(spec, f"not available: {spec.engine} not installed and {root} lacks "
                                f"{', '.join(missing)} (run benchmarks/fetch_peer_kernels.py)")
    from peer_standins import install

    try:
        install(spec.engine, root)
        return LoadedPeer(spec, f"loaded from cache {root}", _import_all(spec))
    except Exception as exc:  # noqa: BLE001 - reported
        for module in [m for m in sys.modules if m == spec.engine or m.startswith(spec.engine + ".")]:
            del sys.modules[module]
        return LoadedPeer(spec, f"not available: loading from {root}: {type(exc).__name__}: {exc}")
