"""A third engine plugs in with no edit to attnhal: the recipe of docs/engine.md, followed out of tree.

The fake engine is a package written to ``tmp_path`` (``flags``, ``config``, ``adapter``, a
catalogue folder) and registered by a ``*.dist-info/entry_points.txt`` of its own in the
``attnhal.engines`` group; the CLI runs in a subprocess with that folder on ``PYTHONPATH``.
The command line knows no engine by name (checked on its source here too). Its worker is shaped
like TensorRT-LLM's one-model drafter: the draft steps and the verify run as ONE captured graph,
which it says as data (``StepLayout`` with a ``GraphGroup``), and the plan gives that graph one answer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repo import ROOT

FLAGS = '''
from attnhal.engines.flags import Flag, one_of, parse_cli, positive, truth

VERSION = "1.0"
FLAGS = {"backend": Flag(one_of(("fast", "full"))), "draft_steps": Flag(positive),
         "no_graphs": Flag(truth, boolean=True)}
HARMLESS = frozenset({"port"})
FIELD_FLAGS = {"num_steps": (("--draft-steps", "--draft-steps"),)}


def parse(argv):
    return parse_cli(argv, FLAGS)
'''

CONFIG = '''
from attnhal.catalog import load
from attnhal.engines.base import EngineConfig
from attnhal.engines.flags import check, model_kind
from attnhal.phases import GraphGroup, Phase, StepLayout, phases_run
from attnhal.planner import GraphPolicy, PhaseBackends
from attnhal.spec import RequestContext, SpecConfig

from fake_engine.flags import FLAGS, HARMLESS, VERSION

# The one-model drafter: draft extend, the draft steps and the verify are one captured graph.
ONE_MODEL = StepLayout(graph_groups=(
    GraphGroup("one_model", {Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE, Phase.TARGET_VERIFY}),))


def resolve(args, platform, own):
    values, ignored = check(args, FLAGS, HARMLESS, "fake_engine.flags.HARMLESS")
    steps = values.get("draft_steps")
    spec = SpecConfig.eagle(steps) if steps else SpecConfig()
    name = values.get("backend", "fast")
    runs = phases_run(spec) | {Phase.PREFILL, Phase.DECODE}
    return EngineConfig(engine="fake", version=VERSION, spec=spec,
                        backends=PhaseBackends.same(load("fake:" + name).descriptor, spec),
                        policy=GraphPolicy(enabled=not values.get("no_graphs", False)),
                        context=RequestContext(model=model_kind(own.get("model"))),
                        roles={p.value: name if p in runs else None for p in Phase}, ignored=ignored,
                        layout=ONE_MODEL)
'''

ADAPTER = '''
from fake_engine import config, flags as vocabulary


class FakeAdapter:
    name = "fake"
    version = vocabulary.VERSION
    flags = vocabulary.FLAGS
    harmless = vocabulary.HARMLESS
    own_flags = ()
    field_flags = vocabulary.FIELD_FLAGS
    catalog = "fake_engine.catalog"

    def parse(self, argv):
        return vocabulary.parse(argv)

    def resolve(self, values, platform, own):
        return config.resolve(values, platform, own)


ADAPTER = FakeAdapter()
'''

FAST_TOML = '''
schema_version = 2
name = "fake:fast"
vendors = ["cuda", "hip"]
phases = ["prefill", "decode", "draft_decode", "draft_extend", "target_verify"]
models = ["mha", "gqa"]
dtypes = ["float16", "bfloat16"]
page_sizes = [16]
multi_step = { max_topk = 1 }
[graph]
decode = {}
draft_decode = {}
target_verify = {}

[catalog]
engine = "fake"
version = "1.0"
summary = "the fake engine's lean backend: no draft-extend graph"
'''

FULL_TOML = FAST_TOML.replace('"fake:fast"', '"fake:full"').replace(
    "target_verify = {}\n", "target_verify = {}\ndraft_extend = {}\n", 1).replace("lean backend: no", "full backend: every")


@pytest.fixture(scope="module")
def fake_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake_engine_site")
    package = root / "fake_engine"
    (package / "catalog").mkdir(parents=True)
    for name, text in {"__init__.py": "", "flags.py": FLAGS, "config.py": CONFIG, "adapter.py": ADAPTER,
                       "catalog/__init__.py": "", "catalog/fast.toml": FAST_TOML,
                       "catalog/full.toml": FULL_TOML}.items():
        (package / name).write_text(text.lstrip(), encoding="utf-8")
    info = root / "fake_engine-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-engine\nVersion: 1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[attnhal.engines]\nfake = fake_engine.adapter:ADAPTER\n", encoding="utf-8")
    return root


def _attnhal(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), str(ROOT / "backends"), str(ROOT / "engines")])}
    env.pop("ATTNHAL_PLATFORM", None)
    return subprocess.run([sys.executable, "-m", "attnhal", *argv], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_plan_explain_and_catalog_take_an_engine_registered_out_of_tree(fake_engine: Path) -> None:
    flags = ["--", "--draft-steps", "3", "--port", "8000", "--platform", "cuda:sm90", "--model", "gqa"]
    done = _attnhal(fake_engine, "plan", "--engine", "fake", *flags)
    assert done.returncode == 0, done.stderr
    assert "engine: fake 1.0 flags -> roles: prefill=fast, decode=fast, draft_decode=fast" in done.stdout
    assert re.search(r"draft_extend\s+yes\s+no\s+fake:fast", done.stdout), done.stdout
    # target_verify's own backend captures it, but it is one graph with draft_extend, which is not captured
    assert re.search(r"target_verify\s+yes\s+no\s+fake:fast[^\n]*\[graph_group\] graph=one_model", done.stdout)
    assert "one graph 'one_model': draft_decode, draft_extend, target_verify -> eager" in done.stdout
    assert "ignored (cannot change an attention-graph decision): --port" in done.stdout

    done = _attnhal(fake_engine, "plan", "--engine", "fake", "--json", *flags)
    data = json.loads(done.stdout)
    assert data["engine"] == "fake" and data["version"] == "1.0" and data["roles"]["draft_extend"] == "fast"
    assert data["plan"]["valid"] is True
    assert data["plan"]["layout"] == {"draft_steps": "decode", "graph_groups": {
        "one_model": ["draft_decode", "draft_extend", "target_verify"]}}
    assert [data["plan"]["phases"][p]["graph"] for p in ("decode", "draft_decode", "target_verify")] == \
        [None, "one_model", "one_model"]
    verify = data["plan"]["phases"]["target_verify"]
    assert not verify["capture"] and verify["reasons"][-1]["code"] == "graph_group"

    done = _attnhal(fake_engine, "explain", "--engine", "fake", "--json", *flags)
    data = json.loads(done.stdout)
    assert done.returncode == 0 and [b["backend"] for b in data["backends"]] == ["fake:fast"]
    assert data["backends"][0]["fits"] and "target_verify" in data["backends"][0]["roles"]
    assert data["plan"]["layout"]["graph_groups"] == {"one_model": ["draft_decode", "draft_extend", "target_verify"]}
    done = _attnhal(fake_engine, "explain", "--engine", "fake", *flags)
    assert "one graph 'one_model': draft_decode, draft_extend, target_verify -> eager" in done.stdout

    done = _attnhal(fake_engine, "plan", "--engine", "fake", "--json", *flags, "--backend", "full")
    phases = json.loads(done.stdout)["plan"]["phases"]
    fused = [phases[p] for p in ("draft_decode", "draft_extend", "target_verify")]
    assert all(p["capture"] and p["graph"] == "one_model" for p in fused)
    assert len({tuple(p["capture_sizes"]) for p in fused}) == 1  # one graph, one set of batch sizes
    done = _attnhal(fake_engine, "plan", "--engine", "fake", *flags, "--backend", "full")
    assert "one graph 'one_model': draft_decode, draft_extend, target_verify -> captured together" in done.stdout

    done = _attnhal(fake_engine, "catalog", "--json")
    assert {"name": "fake:fast", "engine": "fake", "version": "1.0"}.items() <= next(
        e for e in json.loads(done.stdout) if e["engine"] == "fake").items()
    assert {e["engine"] for e in json.loads(done.stdout)} >= {"fake", "sglang", "vllm"}


def test_the_out_of_tree_engine_is_checked_in_its_own_words(fake_engine: Path) -> None:
    done = _attnhal(fake_engine, "plan", "--engine", "fake", "--", "--draft-steps", "100", "--platform", "cuda:sm90")
    assert done.returncode == 2 and "--draft-steps=100 (supported: 1..64)" in done.stderr, done.stderr
    done = _attnhal(fake_engine, "plan", "--engine", "fake", "--", "--draft-steps", "2", "--trtllm-cubins", "no")
    assert done.returncode == 2 and "--trtllm-cubins=no (supported: with --engine vllm)" in done.stderr
    done = _attnhal(fake_engine, "plan", "--engine", "fake", "--", "--beam-width", "2")
    assert done.returncode == 2 and "--beam-width is not modelled by attnhal" in done.stderr
    done = _attnhal(fake_engine, "plan", "--engine", "nope", "--", "--x")
    assert done.returncode == 2 and "fake" in done.stderr and "sglang" in done.stderr


@pytest.mark.parametrize("module", ["engine.py", "advise.py"])
def test_the_command_line_names_no_engine(module: str) -> None:
    source = (ROOT / "attnhal" / "cli" / module).read_text(encoding="utf-8").lower()
    assert "sglang" not in source and "vllm" not in source


def test_advise_refuses_an_engine_whose_adapter_gives_no_advice_by_name(fake_engine: Path) -> None:
    """Advice is optional in the adapter protocol (``attnhal.engines.advice.Adviser``): the fake
    adapter has none, so ``advise --engine fake`` exits 2 naming it and the engines that advise."""
    done = _attnhal(fake_engine, "advise", "--engine", "fake", "--", "--draft-steps", "3", "--platform", "cuda:sm90")
    assert done.returncode == 2, done.stderr
    assert ("--engine='fake': the fake adapter gives no advice (supported: sglang, vllm; "
            "`attnhal plan --engine fake` plans its flags)") in done.stderr
    done = _attnhal(fake_engine, "advise", "--help")
    assert "(fake, sglang, vllm)" in " ".join(done.stdout.split())  # names only: no adapter is loaded


def test_both_shipped_adapters_satisfy_the_protocol_and_resolve_to_the_shared_record() -> None:
    from attnhal.engines import registry
    from attnhal.engines.base import EngineAdapter, EngineConfig
    from attnhal.platform import parse

    argv = {"sglang": ["--attention-backend", "triton"], "vllm": ["--attention-backend", "TRITON_ATTN"]}
    for adapter in registry.adapters():
        assert isinstance(adapter, EngineAdapter)
        config = adapter.resolve(adapter.parse(argv[adapter.name]), parse("cuda:sm90"),
                                 {"platform": "cuda:sm90", "model": "mha"})
        assert isinstance(config, EngineConfig) and config.engine == adapter.name
        assert config.roles["decode"] is not None and config.plan("cuda:sm90").valid


def test_a_registered_object_that_is_not_an_adapter_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    from attnhal.engines import registry

    monkeypatch.setattr(registry, "_entry_points",
                        lambda: {"bad": EntryPoint("bad", "attnhal.errors:AttnhalError", registry.GROUP)})
    registry._load.cache_clear()
    try:
        with pytest.raises(registry.EngineUnavailable, match="attnhal.errors:AttnhalError is not an EngineAdapter"):
            registry.get("bad")
        with pytest.raises(registry.UnknownEngine, match=r"engine='x' \(supported: bad\)"):
            registry.get("x")
    finally:
        registry._load.cache_clear()


#: The recipe's layout (docs/engine.md, step 1): required in every engine package, and the optional
#: files each shipped engine has.
REQUIRED = ("flags.py", "config.py", "adapter.py")
OPTIONAL = {"attnhal_sglang": ("advice.py", "audit.py", "plugin.py", "executed.py", "kit"),
            "attnhal_vllm": ("advice.py", "audit.py", "plugin.py")}


@pytest.mark.parametrize("package", sorted(OPTIONAL))
def test_both_shipped_engines_have_the_recipes_layout_file_for_file(package: str) -> None:
    import importlib

    folder = ROOT / "engines" / package
    assert [f for f in (*REQUIRED, *OPTIONAL[package]) if not (folder / f).exists()] == []
    config = importlib.import_module(f"{package}.config")
    assert callable(getattr(config, "from_server_args", None) or getattr(config, "from_engine_args", None))
    assert importlib.import_module(f"{package}.adapter").ADAPTER.name == package.removeprefix("attnhal_")
    assert callable(importlib.import_module(f"{package}.flags").parse_cli)
    recipe = (ROOT / "docs" / "engine.md").read_text(encoding="utf-8").split("### Recipe: a third engine")[1]
    assert all(f"`{name}" in recipe for name in (*REQUIRED, *OPTIONAL[package]))
