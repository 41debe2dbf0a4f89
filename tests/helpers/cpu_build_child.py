"""A build of a tiny native library through ``attnhal_cpu.buildcache``, run as a child
process by ``backends/attnhal_cpu/tests/test_build.py`` so that the test can kill it at a chosen stage.

Each progress stage is printed as one JSON line on stdout; the last line is the outcome
(``{"compiled": bool, "answer": int}`` or ``{"error": str}``). Switches:

``--kill-at STAGE``   SIGKILL this process when the build reports STAGE (the compiler or
                      linker of that stage is running then);
``--pause-at STAGE``  at STAGE, wait (at most 60 s) until the file ``--until`` exists;
``--touch-at STAGE``  at STAGE, create the file ``--touch``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

from attnhal_cpu.buildcache import BuildError, LibrarySpec, ensure_built, locate

HEADER = "#pragma once\nconstexpr int kAnswer = {answer};\n"
SOURCE = '#include "tiny.h"\nextern "C" int tiny_answer() { return kAnswer; }\n'


def write_sources(directory: Path, answer: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tiny.h").write_text(HEADER.format(answer=answer))
    (directory / "tiny.cpp").write_text(SOURCE)
    return directory


def tiny_spec(directory: Path) -> LibrarySpec:
    return LibrarySpec(name="tiny", tag="test", sources=(directory / "tiny.cpp",), headers=(directory / "tiny.h",),
                       cflags=("-O1",), ldflags=())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--kill-at")
    p.add_argument("--pause-at")
    p.add_argument("--until", type=Path)
    p.add_argument("--touch-at")
    p.add_argument("--touch", type=Path)
    args = p.parse_args()

    def progress(stage: str, message: str) -> None:
        print(json.dumps({"stage": stage, "message": message}), flush=True)
        if stage == args.touch_at:
            args.touch.touch()
        if stage == args.pause_at:
            deadline = time.monotonic() + 60
            while not args.until.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if stage == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    entry = locate(tiny_spec(args.src), args.root)
    try:
        compiled = ensure_built(entry, progress, args.timeout)
    except BuildError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    answer = ctypes.CDLL(str(entry.library)).tiny_answer()
    print(json.dumps({"compiled": compiled, "answer": answer}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
