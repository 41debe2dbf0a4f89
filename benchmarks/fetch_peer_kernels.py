"""Fetch the engines' Triton attention kernel files from their released wheels into a cache.

    python benchmarks/fetch_peer_kernels.py [--dir DIR] [--peers sglang,vllm] [--from-python PYTHON]

For each peer of :data:`peer_kernels.PEERS`: ``pip download --no-deps ENGINE==VERSION``
into a temporary folder, then extract only the listed kernel files to
``DIR/ENGINE-VERSION/`` (plus ``WHEEL.txt`` naming the wheel and each file's sha256).
``--from-python PYTHON`` copies the same files from the engine that interpreter has installed
instead (an engine tier's venv, ``tests/engines/setup.sh``; its version must be the peer's),
offline: the engine is located, not imported (vLLM without a GPU driver replaces ``triton``
with a placeholder when imported, so its kernels run from such a copy).
``DIR`` defaults to ``$ATTNHAL_PEER_KERNELS``, else ``~/.cache/attnhal/peer-kernels``.
Needs the network once (the vLLM wheel is ~340 MB); ``gpu_peers.py`` then reads the
cache offline. Nothing is written inside the repository unless ``DIR`` points there.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_kernels import PEERS, PeerSpec, default_peers_dir


def download(spec: PeerSpec, into: Path) -> Path:
    """The engine's wheel for this Python, downloaded with pip (no dependencies)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                    f"{spec.engine}=={spec.version}", "-d", str(into)], check=True)
    wheels = sorted(into.glob(f"{spec.engine}-{spec.version}-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download of {spec.engine}=={spec.version} left no wheel in {into}")
    return wheels[0]


def write_files(spec: PeerSpec, origin: str, members: dict[str, bytes], dest: Path) -> list[str]:
    """Write ``spec.files`` (from ``members``: name -> bytes) into ``dest``; returns manifest lines."""
    missing = [f for f in spec.files if f not in members]
    if missing:
        raise RuntimeError(f"{origin} lacks {', '.join(missing)}: the kernels moved; update peer_kernels.PEERS")
    lines = [origin]
    for name in spec.files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(members[name])
        lines.append(f"{hashlib.sha256(members[name]).hexdigest()}  {name}")
    return lines


def extract(spec: PeerSpec, wheel: Path, dest: Path) -> list[str]:
    """Extract ``spec.files`` from ``wheel`` into ``dest``; returns manifest lines."""
    with zipfile.ZipFile(wheel) as archive:
        present = set(archive.namelist())
        members = {f: archive.read(f) for f in spec.files if f in present}
    return write_files(spec, f"wheel {wheel.name}", members, dest)


_LOCATE = """import importlib.metadata, importlib.util, sys
spec = importlib.util.find_spec(sys.argv[1])
print(importlib.metadata.version(sys.argv[1]))
print(spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else '')"""


def copy_installed(spec: PeerSpec, python: str, dest: Path) -> list[str]:
    """Copy ``spec.files`` from the engine ``python`` has installed (located, not imported) into
    ``dest``; refuses another version than the peer's. Returns manifest lines."""
    found = subprocess.run([python, "-c", _LOCATE, spec.engine], capture_output=True, text=True, check=False)
    version, _, package = found.stdout.strip().partition("\n")
    if found.returncode != 0 or not package:
        raise RuntimeError(f"--from-python {python}: {spec.engine} is not installed there "
                           f"({found.stderr.strip().splitlines()[-1] if found.stderr.strip() else 'not found'})")
    if version != spec.version:
        raise RuntimeError(f"--from-python {python}: {spec.engine} {version} is installed there "
                           f"(supported: {spec.engine} {spec.version}, the version the benchmark runs)")
    site = Path(package).parent
    members = {f: (site / f).read_bytes() for f in spec.files if (site / f).is_file()}
    return write_files(spec, f"installed {spec.engine} {version} at {site}", members, dest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="cache folder (default: %(default)s -> "
                        "$ATTNHAL_PEER_KERNELS or ~/.cache/attnhal/peer-kernels)")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated, of: " + ", ".join(PEERS))
    parser.add_argument("--from-python", metavar="PYTHON", help="copy the files from the engine this "
                        "interpreter has installed (offline) instead of downloading its wheel")
    args = parser.parse_args()
    root = (args.dir or default_peers_dir()).expanduser()
    names = [n for n in args.peers.split(",") if n]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        parser.error(f"--peers {','.join(unknown)} (supported: {', '.join(PEERS)})")
    for name in names:
        spec = PEERS[name]
        dest = root / spec.cache_name
        try:
            if args.from_python:
                lines = copy_installed(spec, args.from_python, dest)
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    lines = extract(spec, download(spec, Path(tmp)), dest)
        except RuntimeError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 2
        (dest / "WHEEL.txt").write_text("\n".join(lines) + "\n")
        print(f"{name}: {len(spec.files)} files from {lines[0]} -> {dest}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
