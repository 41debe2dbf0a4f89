"""Fetch the engines' Triton attention kernel files from their released wheels into a cache.

    python benchmarks/fetch_peer_kernels.py [--dir DIR] [--peers sglang,vllm]

For each peer of :data:`peer_kernels.PEERS`: ``pip download --no-deps ENGINE==VERSION``
into a temporary folder, then extract only the listed kernel files to
``DIR/ENGINE-VERSION/`` (plus ``WHEEL.txt`` naming the wheel and each file's sha256).
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


def extract(spec: PeerSpec, wheel: Path, dest: Path) -> list[str]:
    """Extract ``spec.files`` from ``wheel`` into ``dest``; returns manifest lines."""
    lines = [f"wheel {wheel.name}"]
    with zipfile.ZipFile(wheel) as archive:
        members = set(archive.namelist())
        missing = [f for f in spec.files if f not in members]
        if missing:
            raise RuntimeError(f"{wheel.name} lacks {', '.join(missing)}: the kernels moved; "
                               "update peer_kernels.PEERS")
        for name in spec.files:
            data = archive.read(name)
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            lines.append(f"{hashlib.sha256(data).hexdigest()}  {name}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="cache folder (default: %(default)s -> "
                        "$ATTNHAL_PEER_KERNELS or ~/.cache/attnhal/peer-kernels)")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated, of: " + ", ".join(PEERS))
    args = parser.parse_args()
    root = (args.dir or default_peers_dir()).expanduser()
    names = [n for n in args.peers.split(",") if n]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        parser.error(f"--peers {','.join(unknown)} (supported: {', '.join(PEERS)})")
    for name in names:
        spec = PEERS[name]
        dest = root / spec.cache_name
        with tempfile.TemporaryDirectory() as tmp:
            wheel = download(spec, Path(tmp))
            lines = extract(spec, wheel, dest)
        (dest / "WHEEL.txt").write_text("\n".join(lines) + "\n")
        print(f"{name}: {len(spec.files)} files from {lines[0].split()[1]} -> {dest}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
