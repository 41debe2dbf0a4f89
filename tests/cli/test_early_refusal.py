"""Bad input is refused before torch (or Triton, or an engine) is imported: detecting the platform
imports torch, so every other input is checked first and the platform last."""

import json
import os
import subprocess
import sys

from repo import ROOT

#: Runs each command line of argv[1] (JSON) in one process, in order, and prints per command its
#: exit status and whether torch / triton were imported by then: the first command that loads one
#: is the culprit (the later ones carry its import).
PROBE = """
import json, sys
from attnhal.cli import main
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    print(json.dumps([argv, code, "torch" in sys.modules, "triton" in sys.modules]))
"""

#: Bad input of every command that plans or runs, without --platform (so detection would import torch).
BAD = [
    ["plan", "--backend", "/nonexistent.toml"],
    ["plan", "--backend", "nosuch"],
    ["plan", "--target-backend", "docs/examples/triton-like.toml", "--draft-extend-backend", "/nonexistent.json"],
    ["plan", "--spec-steps", "1", "--topk", "3"],
    ["plan", "--spec-steps", "2", "--topk", "2", "--draft-tokens", "1000"],
    ["explain", "--backend", "/nonexistent.toml"],
    ["explain", "--backend", "sglang:nosuch"],
    ["conformance", "torch", "--platform", "bogus"],
    ["conformance", "nosuch"],
    ["demo", "--backend", "nosuch"],
    ["demo", "--topk", "2", "--draft-tokens", "30"],
    ["demo", "--spec-steps", "0"],
    ["demo", "--cases", "3", "--spec-steps", "2"],
    ["info", "--platform", "cuda"],
    ["plan", "--engine", "sglang", "--", "--attention-backend", "nosuch"],
    ["plan", "--engine", "sglang", "--", "--attention-backend", "fa3", "--nope", "1"],
    ["plan", "--engine", "sglang", "--", "--attention-backend", "fa3", "--json"],
    ["explain", "--engine", "vllm", "--", "--attention-backend", "FLASH_ATTN", "--speculative-config",
     '{"method": "eagle", "num_speculative_tokens": 1e400}'],
    ["advise", "--engine", "sglang", "--", "--attention-backend", "nosuch"],
    ["plan", "--engine", "vllm", "--", "--model-config", "docs/examples/triton-like.toml"],
    ["plan", "--engine", "sglang", "--model-config", "/nonexistent.json", "--", "--attention-backend", "fa3"],
    ["advise", "--engine", "vllm", "--model-config", "tests/engines/models", "--"],
]


def _probe(commands, **env):
    environ = {k: v for k, v in os.environ.items() if k != "ATTNHAL_PLATFORM"}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**environ, **env})
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[[")], proc.stderr


def test_bad_input_is_refused_before_torch_or_triton_loads():
    rows, err = _probe(BAD)
    assert len(rows) == len(BAD), err
    for argv, code, torch_loaded, triton_loaded in rows:
        assert code == 2, (argv, err)
        assert not torch_loaded and not triton_loaded, f"{argv} imported torch/triton before refusing it"
    assert len(err.strip().splitlines()) == len(BAD), err  # one line per refusal
    assert "--platform: platform='bogus'" in err and "backend=nosuch (supported" in err


def test_a_bad_platform_environment_is_refused_before_torch_loads():
    rows, err = _probe([["plan"], ["demo"]], ATTNHAL_PLATFORM="bogus")
    assert [(code, torch) for _, code, torch, _ in rows] == [(2, False), (2, False)], err
    assert "ATTNHAL_PLATFORM='bogus' (environment)" in err


def test_a_good_command_still_plans_with_the_detected_platform():
    """The reordering keeps the answer: without --platform the plan is for the detected device."""
    rows, err = _probe([["plan", "--backend", "docs/examples/triton-like.toml", "--spec-steps", "1", "--json"]])
    (argv, code, torch_loaded, _), = rows
    assert code == 0 and torch_loaded, err  # detection asked torch, after the inputs were read


#: Prints, after one command line (argv[1], JSON), its exit status and which of argv[2:] were imported.
MODULES = """
import json, sys
from attnhal.cli import main
code = main(json.loads(sys.argv[1]))
print(json.dumps([code, sorted(m for m in sys.argv[2:] if m in sys.modules)]))
"""

#: What a built-in command's usage error needs none of (benchmarks/usage_errors.py times them):
#: the entry-point machinery (plugin commands, engines; read when a name is looked up), the TOML
#: parser (when a file is read), the conformance kit's hypothesis (found, not imported, before the
#: kit runs) and the plugin commands' own modules.
NOT_NEEDED = ("importlib.metadata", "tomllib", "hypothesis", "attnhal_triton.compile_check")


def test_a_usage_error_imports_nothing_it_does_not_need():
    for argv in (["plan", "--backend", "/nonexistent.toml"], ["plan", "--spec-steps", "1", "--topk", "3"],
                 ["demo", "--topk", "2", "--draft-tokens", "30"], ["conformance", "torch", "--platform", "bogus"]):
        # conformance looks its backend's name up (the entry points) before the platform is read
        needed = {"importlib.metadata"} if argv[0] == "conformance" else set()
        environ = {k: v for k, v in os.environ.items() if k != "ATTNHAL_PLATFORM"}
        proc = subprocess.run([sys.executable, "-c", MODULES, json.dumps(argv), *NOT_NEEDED], capture_output=True,
                              text=True, timeout=300, cwd=ROOT, env=environ)
        code, imported = json.loads(proc.stdout.splitlines()[-1])
        assert (code, set(imported)) == (2, needed), (argv, imported, proc.stderr)
