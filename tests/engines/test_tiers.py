"""The engine tiers, run from the main suite: each in its own engine's environment, as a subprocess.

``tests/engines/setup.sh ENGINE`` builds the environment on first use (minutes) and reuses
it after (about a second); the tier's tests then run there with this clone first on
``PYTHONPATH``. The tier fails this test with its own output, and so does a tier that
collects no test (pytest's exit 5).

A tier that runs for minutes says so on the terminal while it runs (a line every
:data:`PROGRESS_EVERY_S`), and with ``ATTNHAL_TIER_TIMINGS=FILE`` each part appends one JSON line
(environment built or reused, its seconds, the tier's seconds) that ``.ci/run`` prints as a table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

import pytest

ENGINES_DIR = Path(__file__).resolve().parent
REPO = ENGINES_DIR.parents[1]
#: Building an environment downloads and installs a few hundred MB; the tier itself is minutes.
SETUP_TIMEOUT_S = 1800
TIER_TIMEOUT_S = 2400  # the kit part under load: up to about 17 minutes
PROGRESS_EVERY_S = 60.0


def _environment(engine: str) -> tuple[Path, dict[str, object]]:
    """The engine's environment, and how it was had: built (cold) or reused (warm), in seconds."""
    start = time.monotonic()
    done = subprocess.run(["bash", str(ENGINES_DIR / "setup.sh"), engine], capture_output=True, text=True,
                          timeout=SETUP_TIMEOUT_S, cwd=REPO)
    if done.returncode != 0:
        pytest.fail(f"tests/engines/setup.sh {engine} failed (exit {done.returncode}):\n{done.stderr[-6000:]}")
    sys.stderr.write(done.stderr)
    how = "built" if "engine env: building" in done.stderr else "reused"
    return Path(done.stdout.strip().splitlines()[-1]), {"env": how, "env_s": round(time.monotonic() - start, 1)}


def _tier_env(engine: str) -> dict[str, str]:
    env = dict(os.environ)
    env["ATTNHAL_ENGINE_TIER"] = engine
    # Subprocesses the engines start (vLLM inspects models in one) are outside the tier's socket
    # guard: the hubs' own offline switches cover them.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # This clone's attnhal, backends and engines first: the environment may have been built from another clone.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "backends"), str(REPO / "engines"),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


#: The tiers in parts that xdist runs side by side: the kit on SGLang's own backends (SGLang's
#: Triton kernels under the interpreter: minutes) apart from SGLang's decision tests.
PARTS = {
    "sglang": ("sglang", ["tests/engines/sglang", "--ignore=tests/engines/sglang/test_kit.py"]),
    "sglang-kit": ("sglang", ["tests/engines/sglang/test_kit.py"]),
    "vllm": ("vllm", ["tests/engines/vllm"]),
    "vllm-0.34": ("vllm-0.34", ["tests/engines/vllm"]),
}


@pytest.mark.parametrize("part", list(PARTS))
def test_engine_tier(part: str, record_property: Callable[[str, object], None],
                     capsys: pytest.CaptureFixture[str]) -> None:
    engine, selection = PARTS[part]
    environment, timing = _environment(engine)
    python = environment / "bin" / "python"
    # --confcutdir: the tier's conftests only (the main suite's root conftest is not the tier's);
    # -p no:attnhal: the conformance plugin's options are not used here.
    command = [str(python), "-m", "pytest", *selection, "-q", "-p", "no:attnhal",
               "--confcutdir", str(ENGINES_DIR), "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"]
    start = time.monotonic()
    with capsys.disabled():
        returncode, stdout, stderr = _run_with_progress(part, command, _tier_env(engine))
    timing.update(part=part, tier_s=round(time.monotonic() - start, 1), exit=returncode)
    _record_timing(timing)
    output = stdout + stderr
    record_property(f"{part}_tier", _closing_lines(stdout))
    if returncode == 5:
        pytest.fail(f"the {part} tier collected no tests:\n{output[-6000:]}")
    assert returncode == 0, f"the {part} tier failed (exit {returncode}):\n{output[-12000:]}"


def _run_with_progress(part: str, command: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run the tier, writing a line to the terminal every PROGRESS_EVERY_S while it runs (capture is
    off for the caller, also under xdist): otherwise a tier is minutes of silence."""
    env = {**env, "PYTHONUNBUFFERED": "1"}  # the tier's progress dots arrive as they are printed
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env) as process:
        sinks: tuple[list[bytes], list[bytes]] = ([], [])
        readers = [threading.Thread(target=_drain, args=(stream, sink), daemon=True)
                   for stream, sink in zip((process.stdout, process.stderr), sinks)]
        for reader in readers:
            reader.start()
        start = time.monotonic()
        while True:
            try:
                process.wait(timeout=PROGRESS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - start
                if elapsed > TIER_TIMEOUT_S:
                    process.kill()
                    process.wait()
                    sinks[1].append(f"\nattnhal: the {part} tier was stopped after {TIER_TIMEOUT_S} s".encode())
                    break
                sys.stderr.write(f"\n[attnhal {part} tier: {elapsed:.0f} s, {_progress(b''.join(sinks[0]))}]\n")
                sys.stderr.flush()
        for reader in readers:
            reader.join()
    out, err = (b"".join(sink).decode(errors="replace") for sink in sinks)
    return process.returncode, out, err


def _drain(stream: Any, sink: list[bytes]) -> None:
    while chunk := stream.read1(1 << 16):
        sink.append(chunk)


_RESULT_LINE = re.compile(r"^([.FEsxX]+)\s*(?:\[\s*(\d+)%\])?$")


def _progress(stdout: bytes) -> str:
    """How far pytest's quiet output says the tier is: tests done, and its percentage."""
    done, percent = 0, None
    for line in stdout.decode(errors="replace").splitlines():
        if match := _RESULT_LINE.match(line.strip()):
            done += len(match.group(1))
            percent = match.group(2) or percent
    return f"{done} tests done" + (f", {percent}%" if percent else "")


def _record_timing(timing: dict[str, object]) -> None:
    path = os.environ.get("ATTNHAL_TIER_TIMINGS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(timing) + "\n")


def _closing_lines(stdout: str) -> str:
    """The tier's grid section and its result line (what the main run's summary shows)."""
    lines = stdout.rstrip().splitlines()
    start = next((i for i, line in enumerate(lines) if "executed-engine grid" in line), max(len(lines) - 1, 0))
    return "\n".join(line for line in lines[start:] if not line.startswith("=") or "passed" in line or "failed" in line)


def test_progress_reads_pytest_quiet_output() -> None:
    assert _progress(b"") == "0 tests done"
    assert _progress(b"....F.s  [ 40%]\n...") == "10 tests done, 40%"
    assert _progress(b"engine env: reusing x\n..\nsome report line.\n.") == "3 tests done"


def test_ci_prints_each_tier_cost(tmp_path: Path) -> None:
    timings = tmp_path / "timings.jsonl"
    timings.write_text('{"part": "vllm", "env": "reused", "env_s": 1.2, "tier_s": 61, "exit": 0}\n'
                       '{"part": "sglang", "env": "built", "env_s": 72.5, "tier_s": 200, "exit": 1}\n')
    done = subprocess.run([sys.executable, str(REPO / ".ci" / "timings.py"), str(timings), "95", "700"],
                          capture_output=True, text=True, check=True)
    rows = done.stdout.strip().splitlines()[1:]  # after the title
    assert rows[2].split() == ["tier", "sglang", "built", "1:12", "3:20", "(exit", "1)"]
    assert rows[3].split() == ["tier", "vllm", "reused", "0:01", "1:01"]
    assert rows[-1].split() == ["total", "13:15"]
